"""Concurrent runs: two `sidecar-ops run` processes of the same pipeline on the same output prefix at once.

There is no lock: both plan, both may write the same shard, and every write is atomic (rename / single
PUT / completed multipart upload), so each shard is wholly one writer's. Both runs must finish (or one
refuse with one clear line), the output must verify, and every shard must equal what the kernel computes.
"""
from __future__ import annotations

import contextlib
import subprocess

import pyarrow.parquet as pq
import pytest

from conftest import snapshot
from faultproxy import FaultProxy
from reliability_fixtures import REPO, assert_output_verifies, cli_command, cli_env, make_demo
from tasks import merge, storage

SHARDS = 12


def expected_table(job: merge.Job, relpath: str):
    state = merge.read_base(job, relpath)
    for index in range(len(job.pipeline.operations)):
        state = merge.apply_step(job, relpath, index, state)
    return state.table


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_runs_on_one_output_prefix(where, tmp_path, prefect_api, request):
    root = str(tmp_path / "data") + "/" if where == "local" else request.getfixturevalue("s3_root")
    demo = make_demo(tmp_path, root, shards=SHARDS, rows=300)
    inputs = {name: snapshot(prefix) for name, prefix in demo.prefixes.items()}
    args = cli_command("run", demo.pipeline, "--output-prefix", demo.output, "--max-inflight", "2")
    with contextlib.ExitStack() as stack:
        env = cli_env(PREFECT_API_URL=prefect_api)
        if where == "s3":  # slow every S3 reply a little, so the two runs overlap rather than take turns
            proxy = stack.enter_context(FaultProxy(request.getfixturevalue("moto_endpoint"), rate=1.0,
                                                   faults=("slow",), slow_seconds=0.05))
            env["AWS_ENDPOINT_URL"] = proxy.url
        procs = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for code, out, err in results:
        if code != 0:  # allowed: a clear refusal, one line, exit 2, nothing half-done
            lines = [line for line in err.splitlines() if line.startswith("error")]
            assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
        else:
            assert f"shards: {SHARDS} total" in out and "0 failed" in out, out
    assert any(code == 0 for code, _, _ in results)
    print(where, [line for _, out, _ in results for line in out.splitlines() if line.startswith("shards:")])

    assert_output_verifies(demo)
    job = demo.job()
    for rel in storage.list_prefix(demo.prefixes["base"]).shards:
        with storage.open_parquet(job.output_uri(rel)) as f:
            pf = pq.ParquetFile(f)
            written = pf.read()
            prov = merge.read_provenance(pf.metadata)
        assert prov and prov["fingerprint"] == job.fingerprint, rel
        assert written.equals(expected_table(job, rel)), f"{rel} is not exactly one writer's merge"
    assert storage.list_prefix(demo.output).others == ()
    assert {name: snapshot(prefix) for name, prefix in demo.prefixes.items()} == inputs
