"""End to end, the way an operator deploys: a Prefect server on loopback, a process work pool,
`prefect deploy --prefect-file deploy/prefect.yaml --all`, a worker, and `prefect deployment run ... --watch`
on the demo dataset, once on the thread runner and once with use_ray. Everything is asserted through the
Prefect API and the output itself; every process is started in its own session and stopped by process group.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from core_fixtures import merge_dag
from tasks.demo import make_dataset, relpaths

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POOL = "sidecar-ops-local"          # the process work pool named in deploy/prefect.yaml
SHARDS, ROWS = 4, 200
PIPELINE = "pipelines/demo_merge_filters_dqm_ernie_image_aes.yaml"
DATASET = "datasets/demo_filters_dqm_ernie_image_aes.yaml"
STARTUP_TIMEOUT = 180
RUN_TIMEOUT = 240


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the process group this test started (and nothing else)."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    # a process left in the group after its leader exited (e.g. a flow-run subprocess) goes too
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Stack:
    api_url: str
    env: dict
    work: Path
    logs: Path

    def prefect(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], cwd=ROOT, env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"prefect {' '.join(args)} -> {out.returncode}\n{out.stdout[-3000:]}\n" \
                                    f"{out.stderr[-3000:]}\n{self.tail_logs()}"
        return out

    def tail_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs.glob("*.log"))

    def client(self):
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api_url}):
            return get_client(sync_client=True)


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


def demo_project(work: Path) -> Path:
    """The demo data plus copies of the demo YAMLs whose prefixes are absolute paths under `work`."""
    data = work / "demo-data"
    make_dataset(str(data), shards=SHARDS, rows=ROWS)
    for rel in (DATASET, PIPELINE):
        text = (ROOT / rel).read_text()
        assert "demo-data/" in text
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text.replace("demo-data/", f"{data}/"))
    return work / PIPELINE


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("deploy-e2e")
    logs = work / "logs"
    logs.mkdir()
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ,
           "PREFECT_HOME": str(work / "prefect-home"),
           "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
           "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
           "PREFECT_CLI_PROMPT": "false",
           "PREFECT_LOGGING_LEVEL": "INFO",
           "PREFECT_WORKER_QUERY_SECONDS": "2",
           "DO_NOT_TRACK": "1",
           "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    procs: list[subprocess.Popen] = []
    try:
        server = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                        "--no-ui"], server_env, logs / "server.log")
        procs.append(server)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not healthy(api_url):
            assert server.poll() is None, f"prefect server exited {server.returncode}\n" + \
                (logs / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "prefect server did not answer /api/health"
            time.sleep(0.5)
        s = Stack(api_url, env, work, logs)
        s.prefect("work-pool", "create", POOL, "--type", "process")
        s.prefect("deploy", "--prefect-file", "deploy/prefect.yaml", "--all", timeout=180)
        procs.insert(0, start([str(BIN / "prefect"), "worker", "start", "--pool", POOL], env,
                              logs / "worker.log"))
        s.pipeline = demo_project(work)
        yield s
    finally:
        for proc in procs:  # the worker (and its flow-run subprocesses) first, the server last
            stop(proc)


def run_deployment(stack: Stack, deployment: str, run_name: str, **params) -> "FlowRun":  # noqa: F821
    args = ["deployment", "run", deployment, "--flow-run-name", run_name, "--watch", "--watch-interval", "2",
            "--watch-timeout", str(RUN_TIMEOUT)]
    for key, value in params.items():
        args += ["-p", f"{key}={value}"]
    out = stack.prefect(*args, timeout=RUN_TIMEOUT + 60).stdout
    ids = set(re.findall(r"UUID: ([0-9a-f-]{36})", out))  # the flow's own flow_run_name replaces run_name
    assert len(ids) == 1, out
    with stack.client() as client:
        return client.read_flow_run(ids.pop())


def task_runs_of(stack: Stack, flow_run_id, expected: int, timeout: float = 60.0) -> list:
    """Task runs reach the API through the server's event pipeline: wait until all are recorded as final."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    while True:
        with stack.client() as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        if (len(runs) >= expected and all(r.state and r.state.is_final() for r in runs)) \
                or time.monotonic() > deadline:
            return runs
        time.sleep(1)


def artifacts_of(stack: Stack, flow_run_id) -> dict:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with stack.client() as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: a for a in found if a.key}


def assert_merged(stack: Stack, run, output: Path) -> None:
    assert run.state.is_completed(), f"{run.state}\n{stack.tail_logs()}"
    expected = merge_dag(f"{output}/", relpaths(SHARDS))  # listings, one task a shard (the default), the check
    runs = task_runs_of(stack, run.id, len(expected))
    names = sorted(r.name for r in runs)
    assert sorted(expected) == names, f"task runs: {names}"
    assert all(r.state.is_completed() for r in runs), [(r.name, r.state.type) for r in runs]
    summary = artifacts_of(stack, run.id).get("merge-summary")
    assert summary is not None and summary.type == "markdown"
    assert f"{SHARDS} total, {SHARDS} merged" in summary.data
    assert sorted(str(p.relative_to(output)) for p in output.rglob("*.parquet")) == sorted(relpaths(SHARDS))


def verify_cli(stack: Stack, output: Path) -> str:
    out = subprocess.run([str(BIN / "sidecar-ops"), "verify", str(stack.pipeline), "--output-prefix", str(output),
                          "--samples", str(SHARDS)], cwd=stack.work, env=stack.env, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verify: PASS" in out.stdout
    return out.stdout


def test_thread_runner_deployment_merges_and_verify_deployment_publishes_artifacts(stack):
    output = stack.work / "out-thread"
    run = run_deployment(stack, "sidecar-merge/local", "e2e-merge-thread", pipeline=stack.pipeline,
                         output_prefix=f"{output}/")
    assert run.parameters["use_ray"] is False and run.parameters["max_inflight"] == 128
    assert_merged(stack, run, output)

    check = run_deployment(stack, "sidecar-verify/local", "e2e-verify-thread", pipeline=stack.pipeline,
                           output_prefix=f"{output}/", samples=SHARDS)
    assert check.state.is_completed(), f"{check.state}\n{stack.tail_logs()}"
    artifacts = artifacts_of(stack, check.id)
    assert artifacts["verify-checks"].type == "table"
    rows = artifacts["verify-checks"].data
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert {"output shard set", "row counts", "provenance"} <= {row["check"] for row in rows}, rows
    assert [row["check"] for row in rows if row["result"] != "PASS"] == [], rows
    assert artifacts["verify-statistics"].type == "markdown"
    assert "dqm_d1_v6_1" in artifacts["verify-statistics"].data
    verify_cli(stack, output)


@pytest.mark.ray
def test_ray_deployment_merges_every_shard_on_ray(stack):
    output = stack.work / "out-ray"
    run = run_deployment(stack, "sidecar-merge/local", "e2e-merge-ray", pipeline=stack.pipeline,
                         output_prefix=f"{output}/", use_ray="true")
    assert run.parameters["use_ray"] is True
    assert_merged(stack, run, output)
    verify_cli(stack, output)
