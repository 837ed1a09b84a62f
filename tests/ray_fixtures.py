"""Helpers for the `--use-ray` end-to-end tests: `sidecar-ops run` as a real driver process, Ray clusters of
several nodes on this machine, what Ray's state API says a driver's tasks did, and cleanup of every process a
test started (found by a tag in its environment, never by name: other people run Ray on this machine too).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAG = "SIDECAR_OPS_TEST_TAG"
RUN_TIMEOUT = 240


def new_tag() -> str:
    return uuid.uuid4().hex


def driver_env(tag: str, prefect_home: Path, api_url: str | None, **extra: str) -> dict[str, str]:
    """The environment of a driver: the test's (moto endpoint, test credentials), a fresh PREFECT_HOME,
    the given Prefect API or none at all, and the tag its children inherit."""
    env = {**os.environ, TAG: tag, "PREFECT_HOME": str(prefect_home), **extra}
    env.pop("PREFECT_API_URL", None)
    env.pop("RAY_ADDRESS", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def start_run(argv: list[str], env: dict[str, str], log_dir: Path) -> tuple[subprocess.Popen, Path, Path]:
    """`sidecar-ops run ARGV` in its own session (a terminal's Ctrl-C reaches the whole group); output to files."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out, err = log_dir / "stdout.txt", log_dir / "stderr.txt"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", *map(str, argv)], cwd=REPO, env=env,
                                stdout=o, stderr=e, start_new_session=True, preexec_fn=default_sigint)
    return proc, out, err


def default_sigint() -> None:
    """Ctrl-C (and a hang-up) as in a terminal: a test runner started in the background (`cmd &`, nohup)
    inherits SIGINT (SIGHUP) ignored, and an ignored signal stays ignored across exec, so the run would never
    see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def finish(proc: subprocess.Popen, out: Path, err: Path, timeout: float = RUN_TIMEOUT) -> tuple[int, str, str]:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"sidecar-ops run did not finish within {timeout}s:\n{err.read_text()[-3000:]}")
    return proc.returncode, out.read_text(), err.read_text()


def run(argv: list[str], env: dict[str, str], log_dir: Path) -> tuple[int, str, str]:
    return finish(*start_run(argv, env, log_dir))


# ----------------------------------------------------------------- processes, straight from /proc (Linux)

@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    cmdline: tuple[str, ...]
    env: dict[str, str]

    @property
    def title(self) -> str:
        return " ".join(self.cmdline)


def read_proc(pid: int) -> Proc | None:
    try:
        base = Path(f"/proc/{pid}")
        stat = (base / "stat").read_text()
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        cmdline = tuple(a.decode(errors="replace") for a in (base / "cmdline").read_bytes().split(b"\0") if a)
        env = dict(kv.decode(errors="replace").partition("=")[::2]
                   for kv in (base / "environ").read_bytes().split(b"\0") if b"=" in kv)
    except (OSError, ValueError, IndexError):
        return None  # gone, a zombie, or not ours to read
    return Proc(pid, ppid, cmdline, env)


def processes() -> list[Proc]:
    found = (read_proc(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit())
    return [p for p in found if p is not None]


def tagged(tag: str) -> list[Proc]:
    """Live processes carrying `tag` in their environment: a driver and everything it started."""
    return [p for p in processes() if p.env.get(TAG) == tag]


def kill_tagged(tag: str) -> list[str]:
    """SIGKILL what is left of a tagged run; returns what had to be killed (for messages)."""
    left = tagged(tag)
    for proc in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(read_proc(p.pid) for p in left):
        time.sleep(0.1)
    return [p.title[:120] for p in left]


def no_errors(out: str, err: str) -> None:
    text = out + err
    for bad in ("Traceback", "ERROR", "Error logging to API"):
        assert bad not in text, f"{bad!r} in the run's output:\n{text[-4000:]}"


# ----------------------------------------------------------------- Ray clusters on this machine

@contextlib.contextmanager
def ray_cluster(head: dict, workers: list[dict], hide_env: tuple[str, ...] = ()):
    """A `ray.cluster_utils.Cluster`: a head and worker nodes, each a real raylet. Variables in `hide_env` are
    kept out of the nodes' environment (as on a real cluster, whose nodes never saw the driver's shell)."""
    from ray.cluster_utils import Cluster

    from flows.compat import ray_address_file

    address_file = ray_address_file()
    previous = address_file.read_text() if address_file.exists() else None
    hidden = {k: os.environ.pop(k) for k in hide_env if k in os.environ}
    try:
        cluster = Cluster(initialize_head=True, head_node_args=head)
        for args in workers:
            cluster.add_node(**args)
        cluster.wait_for_nodes()
    finally:
        os.environ.update(hidden)
        # Cluster() points every later address-less `ray.init()` on this machine at it; undo that.
        if previous is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(previous)
    try:
        yield cluster
    finally:
        cluster.shutdown()


def raylet_pids(cluster) -> set[int]:
    nodes = [cluster.head_node, *cluster.worker_nodes]
    return {info.process.pid for node in nodes for info in node.all_processes.get("raylet", [])}


def busy_workers(cluster, task_name: str) -> list[Proc]:
    """Worker processes of this cluster executing a task named `task_name` right now (Ray sets the title)."""
    raylets = raylet_pids(cluster)
    return [p for p in processes() if p.ppid in raylets and p.title.split()[:1] == [f"ray::{task_name}"]]


def driver_tasks(address: str, driver_pid: int, names=("merge-shard",), until=lambda tasks: True) -> list:
    """Every attempt of the named tasks the driver with `driver_pid` ran on the cluster (Ray's state API), once
    every attempt seen has ended and `until(attempts)` holds, or after 30 s."""
    from ray.util.state import list_jobs, list_tasks

    jobs = [j for j in list_jobs(address=address) if j.driver_info and int(j.driver_info.pid) == driver_pid]
    assert len(jobs) == 1, f"expected one Ray job of driver {driver_pid}, got {jobs}"
    deadline = time.monotonic() + 30
    while True:  # task events reach the GCS a little after the tasks end
        tasks = [t for t in list_tasks(address=address, filters=[("job_id", "=", jobs[0].job_id)], detail=True,
                                       limit=10_000, raise_on_missing_output=False) if t.name in names]
        ended = all(t.state in ("FINISHED", "FAILED") for t in tasks)
        if (ended and until(tasks)) or time.monotonic() > deadline:
            return tasks
        time.sleep(1)
