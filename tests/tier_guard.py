"""The two test tiers, and the guard that makes the fast one a checked property (a pytest plugin loaded by
tests/conftest.py).

A test with none of the HEAVY markers is marked `fast`. A fast test starts no process: not in its body, not in a
fixture of any scope it is the first to need, not from a worker thread. One audit hook (sys.addaudithook) sees
every process start of the interpreter; it consults the state the pytest hooks below keep (which test runs, which
fixture is being set up) and, when a fast test starts a process, refuses the start and fails the test at the end
of that phase, naming the command and the markers. Audit hooks cannot be removed: outside a fast test the hook
returns at once. Exceptions are named below, each with its reason: ALLOWED_FIXTURES, ALLOWED_TESTS and
ALLOWED_COMMANDS.
"""
from __future__ import annotations

import multiprocessing.util
import os
import sys
import threading
from dataclasses import dataclass, field

import pytest

HEAVY = ("slow", "ray", "cluster", "postgres", "ui")

# Fixtures whose set-up may start a process although a fast test is the first to need them.
ALLOWED_FIXTURES = {
    # One Prefect API server (a uvicorn subprocess of prefect_test_harness) for the whole session, started once:
    # every in-process `sidecar-ops run` of the fast tier talks to it instead of starting a server of its own.
    "prefect_api": "the session's one Prefect API server",
}

# Fast tests that start a process of their own: each is cheap and needs a process for what it checks.
ALLOWED_TESTS = {
    "tests/test_write_path.py::test_sweep_removes_a_dead_writers_temp_file_only":
        "`true`, reaped: the pid of a writer that has exited",
    "tests/test_run_database.py::test_leftovers_that_cannot_be_removed_do_not_fail_the_sweep_or_the_cleanup":
        "`true`, reaped: the pid of a run that has exited",
    "tests/test_dry_run.py::test_dry_run_starts_no_prefect_server":
        "a dry run in a fresh interpreter, to prove that it starts no Prefect server",
    "tests/test_deploy.py::test_image_entrypoint_hands_sidecar_ops_arguments_and_other_commands_on":
        "the image's entrypoint.sh with `--help` and a dry run: starts no server",
    "tests/test_streaming.py::test_a_streamed_shard_holds_a_window_not_the_shard":
        "arrow's peak memory of one shard needs a fresh interpreter per measurement",
    "tests/test_tier_guard.py::test_a_heavy_test_and_the_allowed_fixture_may_start_processes":
        "its inner session's slow test and allowed fixture each start a two-line shell script",
}

# Commands a fast test may start wherever it is first to import what runs them: the probe that starts is cheap.
ALLOWED_COMMANDS = {
    # platform.architecture() asks `file` about the interpreter; prefect's vendored croniter calls it on import,
    # so whichever fast test first imports prefect.server would fail alone, or in a run without a flow test.
    f"file -b {os.path.realpath(sys.executable)}": "platform.architecture()'s probe of the interpreter",
}

# Every audit event that starts a process (os.fork covers multiprocessing's default start method, os.spawn*,
# pty.spawn goes through os.forkpty). SPAWNV_EVENT is raised by the shim below.
SPAWNV_EVENT = "tier_guard.spawnv_passfds"
EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty",
                    "os.spawn", SPAWNV_EVENT})


@dataclass(eq=False)
class Guard:
    """What one pytest session is doing now, as far as starting processes goes."""
    test: str | None = None            # the nodeid of the fast test whose setup, call or teardown runs now
    fixtures: list[tuple[str, str]] = field(default_factory=list)   # (name, scope) being set up, innermost last
    violations: list[str] = field(default_factory=list)
    ray_was_up: bool = False           # Ray was initialized when the test began (by a heavy test's fixture)

    def check(self, event: str, args: tuple) -> None:
        if self.test is None or any(name in ALLOWED_FIXTURES for name, _ in self.fixtures):
            return
        command = command_line(event, args)
        if command in ALLOWED_COMMANDS:
            return
        message = f"a fast test starts `{command}`{self.where()}: " \
                  f"mark it with one of {', '.join(HEAVY)}"
        self.violations.append(message)
        raise pytest.fail.Exception(message, pytrace=False)

    def where(self) -> str:
        places = [event_thread()] if event_thread() else []
        if self.fixtures:
            name, scope = self.fixtures[-1]
            places.append(f"in {scope}-scoped fixture `{name}`")
        return f" ({', '.join(places)})" if places else ""


def event_thread() -> str:
    thread = threading.current_thread()
    return "" if thread is threading.main_thread() else f"from thread {thread.name}"


def command_line(event: str, args: tuple) -> str:
    """The command an audited process start runs, as one line (at most 200 characters)."""
    if event == "subprocess.Popen":
        argv = args[1]
    elif event == "os.system":
        argv = args[0]
    elif event in ("os.posix_spawn", "os.exec", SPAWNV_EVENT):
        argv = args[1]
    elif event == "os.spawn":
        argv = args[2]
    else:
        return f"{event}()"
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    words = [w.decode(errors="replace") if isinstance(w, bytes) else os.fspath(w) for w in argv]
    return " ".join(words)[:200]


GUARD = pytest.StashKey[Guard]()
# One guard a pytest session of this interpreter: pytester's in-process runs nest sessions, the innermost last.
GUARDS: list[Guard] = []


def on_audit_event(event: str, args: tuple) -> None:
    # Called for every audited operation (each open, import, ...): return at once unless a process starts.
    if event in EVENTS:
        for guard in reversed(GUARDS):   # a process may start only if every session running allows it
            guard.check(event, args)


def audited(spawnv_passfds):
    """multiprocessing's spawn and forkserver start methods call _posixsubprocess directly, which raises no
    audit event: the function returned raises one."""
    def spawn(path, args, passfds):
        sys.audit(SPAWNV_EVENT, path, args)
        return spawnv_passfds(path, args, passfds)
    spawn.audited = True
    return spawn


# Each import of this module watches its own GUARDS (a stale copy's stays empty).
sys.addaudithook(on_audit_event)
if not getattr(multiprocessing.util.spawnv_passfds, "audited", False):
    multiprocessing.util.spawnv_passfds = audited(multiprocessing.util.spawnv_passfds)


# ----------------------------------------------------------------- the pytest hooks that keep the state

def pytest_configure(config):
    config.stash[GUARD] = Guard()
    GUARDS.append(config.stash[GUARD])


def pytest_unconfigure(config):
    if GUARD in config.stash:
        GUARDS.remove(config.stash[GUARD])


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(name) for name in HEAVY):
            item.add_marker(pytest.mark.fast)


def watched(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("fast")) and item.nodeid.split("[")[0] not in ALLOWED_TESTS


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """From the first fixture set up for this test to the last torn down, a fast test is watched."""
    guard = item.config.stash[GUARD]
    guard.test = item.nodeid if watched(item) else None
    guard.ray_was_up = ray_is_up()
    try:
        return (yield)
    finally:
        guard.test = None


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    fixtures = request.config.stash[GUARD].fixtures
    fixtures.append((fixturedef.argname, fixturedef.scope))
    try:
        return (yield)
    finally:
        fixtures.pop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A phase (setup, call, teardown) during which a watched test started a process fails, whatever thread
    started it and whatever the test did with the exception the refusal raised."""
    report = yield
    guard = item.config.stash[GUARD]
    if call.when == "call" and guard.test and not guard.ray_was_up and ray_is_up():
        guard.violations.append(f"a fast test started Ray: mark it with one of {', '.join(HEAVY)}")
    if guard.violations:
        fail(report, guard.violations)
        guard.violations.clear()
    return report


def fail(report: pytest.TestReport, violations: list[str]) -> None:
    text = "\n".join(dict.fromkeys(violations))
    if report.failed and report.longreprtext.strip() not in violations:
        text += "\n\n" + report.longreprtext
    report.outcome = "failed"
    report.longrepr = text
    if hasattr(report, "wasxfail"):
        del report.wasxfail


def ray_is_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()
