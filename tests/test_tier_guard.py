"""The fast tier's guard (tests/tier_guard.py): a fast test that starts a process fails, naming the markers.

Each case runs one inner test session in this process (pytester's in-process run, so no process is started
here) under this project's own conftest. Its fake `ray` stands for any heavy command: it only leaves a file
behind, so a test can tell that the guard refused the start rather than reported it afterwards.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from tier_guard import ALLOWED_TESTS, HEAVY

HERE = Path(__file__).parent
FAKE_RAY = "#!/bin/sh\ntouch started\n"
MARKERS = f"mark it with one of {', '.join(HEAVY)}"

# Every way around the old guard issue 26 found, fork, and multiprocessing's spawn start method (no audit event of
# its own): the inner test file, and the command the failure names.
BYPASSES = {
    "module_fixture": ("""
import subprocess
import pytest

@pytest.fixture(scope="module")
def server():
    subprocess.run(["./ray", "start"])

def test_it(server):
    pass
""", "./ray start"),
    "bash_c": ("""
import subprocess

def test_it():
    subprocess.run(["bash", "-c", "./ray start"])
""", "bash -c ./ray start"),
    "python_c": ("""
import subprocess
import sys

def test_it():
    subprocess.run([sys.executable, "-c", "import os; os.system('./ray start')"])
""", "-c import os; os.system('./ray start')"),
    "os_system": ("""
import os

def test_it():
    os.system("./ray start")
""", "./ray start"),
    "posix_spawn": ("""
import os

def test_it():
    os.waitpid(os.posix_spawn("./ray", ["./ray", "start"], dict(os.environ)), 0)
""", "./ray start"),
    "worker_thread": ("""
import subprocess
import threading

def test_it():
    thread = threading.Thread(target=subprocess.run, args=(["./ray", "start"],))
    thread.start()
    thread.join()
""", "./ray start` (from thread"),
    "fork": ("""
import os

def test_it():
    pid = os.fork()
    if pid == 0:
        open("started", "w").close()
        os._exit(0)
    os.waitpid(pid, 0)
""", "os.fork()"),
    "multiprocessing_spawn": ("""
import multiprocessing
import os

def test_it():
    process = multiprocessing.get_context("spawn").Process(target=os.system, args=("./ray start",))
    process.start()
    process.join()
""", "-c from multiprocessing."),   # its resource tracker or its child, whichever starts first
}


def inner_session(pytester: pytest.Pytester, test_file: str) -> pytest.RunResult:
    """One test file run in this process under the project's conftest, beside an executable fake `ray`."""
    pytester.makeconftest((HERE / "conftest.py").read_text())
    ray = pytester.path / "ray"
    ray.write_text(FAKE_RAY)
    ray.chmod(0o755)
    pytester.makepyfile(test_it=test_file)
    return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")


@pytest.mark.parametrize("bypass", BYPASSES)
def test_a_fast_test_that_starts_a_process_fails_naming_the_markers(pytester, bypass):
    test_file, command = BYPASSES[bypass]
    result = inner_session(pytester, test_file)
    if bypass == "module_fixture":
        result.assert_outcomes(errors=1)   # the first test to need the fixture fails at its setup
        command += "` (in module-scoped fixture `server`)"
    else:
        result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*a fast test starts `*{command}*: {MARKERS}"])
    assert not (pytester.path / "started").exists(), "the guard reported the process but let it start"


def test_a_fast_test_that_swallows_the_refusal_still_fails(pytester):
    result = inner_session(pytester, """
import subprocess

def test_it():
    try:
        subprocess.run(["./ray", "start"])
    except BaseException:
        pass
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*a fast test starts `./ray start`: {MARKERS}"])


def test_a_fast_test_that_connects_to_ray_fails(pytester):
    """Ray initialized in a fast test without a process of its own (as joining a running cluster would be)."""
    result = inner_session(pytester, """
import sys
import types

def test_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*a fast test started Ray: {MARKERS}"])


def test_a_heavy_test_and_the_allowed_fixture_may_start_processes(pytester):
    result = inner_session(pytester, """
import os
import subprocess
import pytest

@pytest.fixture(scope="session")
def prefect_api():   # named like the session's Prefect API fixture: allowed by name
    subprocess.run(["./ray", "start"], check=True)

def test_fast_with_the_allowed_fixture(prefect_api):
    pass

@pytest.mark.slow
def test_slow():
    subprocess.run(["bash", "-c", "./ray start"], check=True)
    assert os.path.exists("started")
""")
    result.assert_outcomes(passed=2)


def test_every_allowed_test_exists():
    for nodeid in ALLOWED_TESTS:
        path, name = nodeid.split("::")
        # Text, not ast.parse: CPython 3.11.7's AST constructor can fail at random here ("recursion depth
        # mismatch", seen once in the fast tier) after a RecursionError elsewhere in the session.
        assert re.search(rf"^def {re.escape(name)}\(", (HERE.parent / path).read_text(), re.M), nodeid
