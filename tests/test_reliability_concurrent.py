"""Concurrent runs: two `sidecar-ops run` processes of the same pipeline on the same output prefix at once.

There is no lock: both plan, both may write the same shard, and every write is atomic (rename / single
PUT / completed multipart upload), so each shard is wholly one writer's. Both runs must finish, the output
must verify, every shard must equal what the kernel computes, and the two runs must really have overlapped:
the Prefect API shows a shard task of each run in flight at the same moment.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from conftest import snapshot
from faultproxy import FaultProxy
from reliability_fixtures import REPO, assert_output_verifies, cli_command, cli_env, make_demo
from tasks import kernel, storage

pytestmark = pytest.mark.slow

SHARDS = 12


def shard_task_intervals(pipeline: str, timeout: float = 60) -> dict[str, list[tuple]]:
    """flow run id -> [(start, end)] of its shard tasks, once the API has recorded both runs' tasks as final."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterName, TaskRunFilter,
                                                TaskRunFilterFlowRunId)

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            flows = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(
                any_=[f"merge {pipeline}"])))
            out = {}
            for fr in flows:
                runs = client.read_task_runs(task_run_filter=TaskRunFilter(
                    flow_run_id=TaskRunFilterFlowRunId(any_=[fr.id])), limit=SHARDS * 4 + 10)
                if runs and all(r.state and r.state.is_final() and r.start_time and r.end_time for r in runs):
                    out[str(fr.id)] = [(r.start_time, r.end_time) for r in runs]
            if len(out) == 2 or time.monotonic() > deadline:
                return out
            time.sleep(0.5)


def overlapped(a: list[tuple], b: list[tuple]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


def expected_table(job: kernel.Job, relpath: str):
    state = kernel.read_base(job, relpath)
    for index in range(len(job.pipeline.operations)):
        state = kernel.apply_operation(job, relpath, index, state)
    return state.table


@pytest.mark.timeout(900)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_runs_on_one_output_prefix(where, tmp_path, prefect_api, request):
    root = str(tmp_path / "data") + "/" if where == "local" else request.getfixturevalue("s3_root")
    demo = make_demo(tmp_path, root, shards=SHARDS, rows=300)
    inputs = {name: snapshot(prefix) for name, prefix in demo.prefixes.items()}
    args = cli_command("run", demo.pipeline, "--output-prefix", demo.output, "--max-inflight", "2")
    with contextlib.ExitStack() as stack:
        # Both runs' shard work starts together (tests/barrier/sitecustomize.py): each plans before the other
        # wrote anything, so they write the same shards at the same time rather than taking turns.
        (tmp_path / "barrier").mkdir()
        env = cli_env(PREFECT_API_URL=prefect_api, SIDECAR_OPS_TEST_BARRIER=str(tmp_path / "barrier"),
                      SIDECAR_OPS_TEST_PARTIES="2")
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "barrier"), env["PYTHONPATH"]])
        if where == "s3":  # slow every S3 reply a little, so the two runs overlap rather than take turns
            proxy = stack.enter_context(FaultProxy(request.getfixturevalue("moto_endpoint"), rate=1.0,
                                                   faults=("slow",), slow_seconds=0.05))
            env["AWS_ENDPOINT_URL"] = proxy.url
        procs = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for code, out, err in results:
        assert code == 0, err
        assert f"shards: {SHARDS} total, {SHARDS} merged" in out and "0 failed" in out, out
    print(where, [line for _, out, _ in results for line in out.splitlines() if line.startswith("shards:")])
    intervals = list(shard_task_intervals(demo.pipeline).values())
    assert len(intervals) == 2, "both runs' task runs reached the API"
    assert overlapped(*intervals), "the two runs never had shard tasks in flight at the same time"

    assert_output_verifies(demo)
    job = demo.job()
    for rel in storage.list_prefix(demo.prefixes["base"]).shards:
        with storage.open_parquet(job.output_uri(rel)) as f:
            pf = pq.ParquetFile(f)
            written = pf.read()
            prov = kernel.read_provenance(pf.metadata)
        assert prov and prov["fingerprint"] == job.fingerprint, rel
        assert written.equals(expected_table(job, rel)), f"{rel} is not exactly one writer's merge"
    assert storage.list_prefix(demo.output).others == ()
    assert {name: snapshot(prefix) for name, prefix in demo.prefixes.items()} == inputs
