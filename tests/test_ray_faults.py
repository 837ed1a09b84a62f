"""Faults under `--use-ray`, for real: a Ray worker SIGKILLed while it runs a shard task; a run interrupted
with Ctrl-C (SIGINT to its process group); a driver SIGKILLed. Runs join a one-node Ray cluster owned by this
module (so the test can find its worker processes), except the Ctrl-C run, which starts its own local Ray as
on a laptop.

Throughout, output shards appear whole or not at all: a watcher reads every *.parquet it sees while the runs
work. After a fault, `--skip-existing` reruns only what is missing (inode + mtime tell rewritten shards apart).
"""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from core_fixtures import build, expected_output, merge_dag, read_table
from ray_fixtures import (
    busy_workers,
    driver_env,
    driver_tasks,
    finish,
    kill_tagged,
    new_tag,
    ray_cluster,
    run,
    start_run,
    tagged,
)

from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job
from tasks.verification import verify

pytestmark = pytest.mark.ray

COLUMNS = [("dqm", "dqm_d1_v6_1"), ("aes", "ernie_image_aes"), ("watermark", "watermark")]


HOOKS = Path(__file__).resolve().parent / "barrier"


@pytest.fixture(scope="module")
def hold(tmp_path_factory):
    """The folder of the cluster's hold (tests/barrier/sitecustomize.py): a test arms it, the first shard read
    on any worker then holds there, named in `held`."""
    return tmp_path_factory.mktemp("hold")


@pytest.fixture(scope="module")
def cluster(hold):
    env = {"PYTHONPATH": os.pathsep.join([str(HOOKS), str(HOOKS.parents[1]), os.environ.get("PYTHONPATH", "")]),
           "SIDECAR_OPS_TEST_HOLD": str(hold), "SIDECAR_OPS_TEST_HOLD_ARMED": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the nodes' processes inherit it; this test process never reads a shard itself
    try:
        with ray_cluster(head={"num_cpus": 2}, workers=[]) as c:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            yield c
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


class WholeShards(threading.Thread):
    """Reads every *.parquet under an output folder, over and over: each must read fully, with the base's rows."""

    def __init__(self, out: Path, rows: int):
        super().__init__(daemon=True)
        self.out, self.rows = out, rows
        self.reads = 0
        self.problems: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for path in self.out.rglob("*.parquet") if self.out.exists() else []:
                try:
                    rows = pq.read_table(path).num_rows
                except FileNotFoundError:
                    continue  # replaced between listing and opening (a rerun rewriting it): fine
                except Exception as exc:  # noqa: BLE001 - a partial or corrupt shard was visible
                    self.problems.append(f"{path}: {type(exc).__name__}: {exc}")
                    continue
                self.reads += 1
                if rows != self.rows:
                    self.problems.append(f"{path}: {rows} rows, expected {self.rows}")
            time.sleep(0.02)


def identities(out: Path) -> dict[str, tuple[int, int]]:
    """relpath -> (inode, mtime_ns): changes whenever the shard is rewritten (atomic replace = new inode)."""
    return {str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


def summary_counts(out: str) -> tuple[int, ...]:
    m = re.search(r"shards: (\d+) total, (\d+) merged, (\d+) skipped \(already complete\), (\d+) failed", out)
    assert m, out
    return tuple(int(x) for x in m.groups())


def assert_complete_and_verified(setup, shards: int) -> None:
    out = setup.output
    assert sorted(identities(Path(out))) == sorted(relpaths(shards)), "missing shards or stray files"
    for rel in relpaths(shards):
        cols = COLUMNS if rel != relpaths(shards)[-1] else COLUMNS[:2]  # the watermark job skipped the last one
        assert read_table(out + rel).replace_schema_metadata(None).equals(expected_output(setup, rel, cols)), rel
    report = verify(Job(load_pipeline(str(setup.pipeline)), out), samples=shards, all_shards=True)
    assert report.ok, report.to_dict()


def wait_for_shards(out: Path, proc, at_least: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(list(out.rglob("*.parquet"))) < at_least:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, f"fewer than {at_least} shards after {timeout}s"
        time.sleep(0.02)


def shard_identities(out: Path) -> dict:
    """Identities of the complete output shards: a killed writer's temp file (never *.parquet) is not one; the
    next run sweeps it."""
    return {rel: ident for rel, ident in identities(out).items() if rel.endswith(".parquet")}


def rerun_only_missing(setup, before: dict, cluster, env: dict, logs: Path, shards: int) -> None:
    """`--skip-existing` after a fault: the complete shards stay untouched, exactly the others are written."""
    code, out, err = run([setup.pipeline, "--output-prefix", setup.output, "--skip-existing", "--use-ray",
                          "--ray-address", cluster.address], env, logs)
    assert code == 0, err
    assert summary_counts(out) == (shards, shards - len(before), len(before), 0)
    after = identities(Path(setup.output))
    assert {rel: after[rel] for rel in before} == before, "a complete shard was rewritten"
    assert sorted(after) == sorted(relpaths(shards))
    assert_complete_and_verified(setup, shards)


# ----------------------------------------------------------------- item 8: a worker dies mid-run

def test_killed_worker_retries_its_shard_task_and_every_shard_verifies(cluster, hold, prefect_api, tmp_path):
    shards, rows = 16, 20_000
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=shards, rows=rows)
    watcher = WholeShards(Path(setup.output), rows)
    tag = new_tag()
    env = driver_env(tag, tmp_path / "prefect-home", prefect_api)
    proc, out, err = start_run([setup.pipeline, "--output-prefix", setup.output, "--use-ray",
                                "--ray-address", cluster.address, "--max-inflight", "4"], env, tmp_path / "logs")
    watcher.start()
    (hold / "armed").touch()  # the first shard read on the cluster holds: its worker is killed right there
    try:
        deadline = time.monotonic() + 180
        while not (hold / "held").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no worker reached a shard read"
            time.sleep(0.02)
        (hold / "armed").unlink()
        victim = int((hold / "held").read_text().split()[0])
        # (other workers may be running other shards' tasks at this moment: --max-inflight 4)
        assert victim in [p.pid for p in busy_workers(cluster, "merge-shard")], "the held worker runs a shard task"
        os.kill(victim, signal.SIGKILL)
        code, stdout, stderr = finish(proc, out, err)
    finally:
        watcher.done.set()
        kill_tagged(tag)
    watcher.join()
    assert code == 0, stderr
    assert "Traceback" not in stdout + stderr
    assert summary_counts(stdout) == (shards, shards, 0, 0)

    # The owner (the driver) reports the failed attempt; its worker_pid comes from the worker's own task events,
    # flushed every second, so a worker killed sooner leaves an attempt without one.
    attempts = driver_tasks(cluster.address, proc.pid, until=lambda ts: any(t.state == "FAILED" for t in ts))
    killed = [t for t in attempts if t.state == "FAILED"]
    assert len(killed) == 1 and killed[0].error_type == "WORKER_DIED" and killed[0].worker_pid in (victim, None), \
        [(t.name, t.worker_pid, t.error_type) for t in killed]
    for dead in killed:  # Ray ran the same task again elsewhere, and that attempt finished
        retried = [t for t in attempts if t.task_id == dead.task_id and t.attempt_number > dead.attempt_number]
        assert any(t.state == "FINISHED" for t in retried), f"task {dead.task_id} was not retried to completion"

    # Prefect saw every task run of the flow end Completed, the retried one included (same task run id).
    dag = merge_dag(setup.output, relpaths(shards))  # the listings, one task a shard (the default layout), the check
    task_runs = flow_task_runs(setup.pipeline, expected=len(dag))
    assert sorted(t.name for t in task_runs) == sorted(dag)
    assert all(t.state.is_completed() for t in task_runs), [(t.name, t.state) for t in task_runs]

    assert watcher.reads > 0 and watcher.problems == [], watcher.problems
    assert_complete_and_verified(setup, shards)


def driver_job(address: str, driver_pid: int, timeout: float = 60) -> str:
    """The Ray job id of the driver process `driver_pid` (it registers as the run starts)."""
    from ray.util.state import list_jobs

    deadline = time.monotonic() + timeout
    while True:
        jobs = [j for j in list_jobs(address=address) if j.driver_info and int(j.driver_info.pid) == driver_pid]
        if jobs:
            return jobs[0].job_id
        assert time.monotonic() < deadline, f"no Ray job of driver {driver_pid}"
        time.sleep(0.2)


def job_running(address: str, job_id: str) -> bool:
    from ray.util.state import list_jobs

    return any(j.job_id == job_id and j.status == "RUNNING" for j in list_jobs(address=address))


def flow_task_runs(pipeline: Path, expected: int, wait: float = 30) -> list:
    """The task runs of the (one) merge flow run of `pipeline`, from the session's Prefect API, once all
    `expected` of them are terminal there (the API records client events a little after they happen)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    deadline = time.monotonic() + wait
    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[f"merge {pipeline}"])))
        while True:
            runs = client.read_task_runs(task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run.id])), limit=expected + 10)
            if (len(runs) >= expected and all(r.state and r.state.is_final() for r in runs)) \
                    or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)


# ----------------------------------------------------------------- item 9: interrupted runs resume

@pytest.fixture
def resumable(tmp_path):
    """Enough shards that a run can be stopped part-way, and each a little slow."""
    shards = 60
    return build(tmp_path, str(tmp_path / "data") + "/", shards=shards, rows=3000), shards


def test_ctrl_c_then_skip_existing_processes_only_missing_shards(resumable, cluster, prefect_api, tmp_path):
    setup, shards = resumable
    out = Path(setup.output)
    watcher = WholeShards(out, 3000)
    tag = new_tag()
    env = driver_env(tag, tmp_path / "prefect-home", prefect_api)
    proc, stdout_path, stderr_path = start_run([setup.pipeline, "--output-prefix", setup.output, "--use-ray",
                                                "--max-inflight", "2"], env, tmp_path / "run1")
    watcher.start()
    try:
        wait_for_shards(out, proc, 3)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        code, _, stderr = finish(proc, stdout_path, stderr_path, timeout=120)
        deadline = time.monotonic() + 20  # the run's own Ray must go away with it
        while tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.5)
        leftovers = [p.title[:100] for p in tagged(tag)]
    finally:
        kill_tagged(tag)
    assert code == 130, stderr
    assert "interrupted by SIGINT: " in stderr and "rerun the same command to resume" in stderr, stderr
    assert "Traceback" not in stderr
    assert leftovers == [], "processes of the interrupted run were left running"
    before = shard_identities(out)
    assert 3 <= len(before) < shards and all(rel.endswith(".parquet") for rel in before), sorted(before)

    try:
        rerun_only_missing(setup, before, cluster, driver_env(tag, tmp_path / "prefect-home", prefect_api),
                           tmp_path / "run2", shards)
    finally:
        watcher.done.set()
        kill_tagged(tag)
    watcher.join()
    assert watcher.problems == [], watcher.problems


def test_killed_driver_then_skip_existing_processes_only_missing_shards(resumable, cluster, prefect_api,
                                                                         tmp_path):
    setup, shards = resumable
    out = Path(setup.output)
    watcher = WholeShards(out, 3000)
    tag = new_tag()
    env = driver_env(tag, tmp_path / "prefect-home", prefect_api)
    proc, _, _ = start_run([setup.pipeline, "--output-prefix", setup.output, "--use-ray",
                            "--ray-address", cluster.address, "--max-inflight", "2"], env, tmp_path / "run1")
    watcher.start()
    try:
        wait_for_shards(out, proc, 3)
        job = driver_job(cluster.address, proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # Ray marks the dead driver's job ended, then ends its workers; once both are seen, nothing of the
        # killed run can write any more (no owner: none of its tasks starts again).
        deadline = time.monotonic() + 60
        while job_running(cluster.address, job) or busy_workers(cluster, "merge-shard"):
            assert time.monotonic() < deadline, "the killed driver's job or workers never ended"
            time.sleep(0.1)
        before = shard_identities(out)
        assert 3 <= len(before) < shards, sorted(before)
        rerun_only_missing(setup, before, cluster, env, tmp_path / "run2", shards)
    finally:
        watcher.done.set()
        kill_tagged(tag)
    watcher.join()
    assert watcher.problems == [], watcher.problems
