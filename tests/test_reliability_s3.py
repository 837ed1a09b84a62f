"""Flaky S3: moto behind tests/faultproxy.py answering a share of requests with 503 SlowDown, 500,
connection resets (before and after moto acted) and slow responses, multipart uploads included.

10% faults: the merge completes through retries, every shard verifies, no partial object, no orphaned
multipart upload. 100% faults: a clean failure with one line per problem, a documented exit code, nothing
left.
"""
from __future__ import annotations

import pytest

from conftest import snapshot
from faultproxy import FAULTS, MULTIPART, FaultProxy
from reliability_fixtures import (SMALL_PARTS, allow_small_parts, assert_no_partial_shard,
                                  assert_output_verifies, cli_env, make_demo, pending_uploads, run_cli)
from tasks import storage

pytestmark = pytest.mark.slow


@pytest.fixture
def small_parts(monkeypatch):
    return allow_small_parts(monkeypatch)


def run_through(proxy: FaultProxy, prefect_api: str, *args: str, **env: str):
    """`sidecar-ops ARGS` in a child process whose S3 endpoint is the proxy; outputs above 16 KB in parts."""
    return run_cli(*args, env=cli_env(AWS_ENDPOINT_URL=proxy.url, PREFECT_API_URL=prefect_api,
                                      **{**SMALL_PARTS, **env}))


def test_ten_percent_faults_merge_completes_and_verifies(tmp_path, s3_root, moto_endpoint, prefect_api,
                                                         small_parts):
    demo = make_demo(tmp_path, s3_root, shards=6, rows=400)
    inputs = {name: snapshot(prefix) for name, prefix in demo.prefixes.items()}
    with FaultProxy(moto_endpoint, rate=0.1, seed=7, faults=FAULTS, slow_seconds=0.2) as proxy:
        # ~30 KB outputs in 2 KB parts: ~100 multipart requests, so P(no fault among them) is ~1e-5.
        res = run_through(proxy, prefect_api, "run", demo.pipeline, "--output-prefix", demo.output,
                          "--retries", "2", SIDECAR_OPS_PART_SIZE=str(2 * 1024))
    code, out, err = res.returncode, res.stdout, res.stderr
    assert code == 0, err
    assert "6 merged" in out and "0 failed" in out
    # The faults really happened, writes and multipart parts among them.
    assert proxy.faults_injected() >= 10, proxy.stats
    assert sum(proxy.faults_injected(op) for op in MULTIPART) >= 1, proxy.stats
    assert proxy.stats[("ok", "UploadPart")] >= 6 * 10, "outputs were not written in parts"
    kinds = {kind: sum(n for (k, _), n in proxy.stats.items() if k == kind) for kind in ("ok", *FAULTS)}
    print(f"10% faults: {kinds}; on multipart requests: {sum(map(proxy.faults_injected, MULTIPART))}")
    assert_output_verifies(demo)
    assert len(assert_no_partial_shard(demo)) == 6
    assert storage.list_prefix(demo.output).others == ()
    # Every upload the run started is completed or aborted; only one whose CreateMultipartUpload reply was lost
    # (the run never heard its id) is left, to the age-based sweep and the bucket's lifecycle rule.
    left = {u["UploadId"] for u in pending_uploads(moto_endpoint, s3_root)}
    assert left <= proxy.unheard, (left, proxy.unheard)
    assert {name: snapshot(prefix) for name, prefix in demo.prefixes.items()} == inputs


def test_all_writes_failing_fails_each_shard_cleanly(tmp_path, s3_root, moto_endpoint, prefect_api,
                                                     small_parts):
    """Reads work, every write fails (multipart parts included): exit 1, one line per shard, nothing left."""
    demo = make_demo(tmp_path, s3_root, shards=3, rows=400)
    inputs = {name: snapshot(prefix) for name, prefix in demo.prefixes.items()}
    # CreateMultipartUpload succeeds, so an upload is open when its parts fail: it must be aborted.
    applies = lambda op: op in {"UploadPart", "CompleteMultipartUpload", "PutObject"}  # noqa: E731
    with FaultProxy(moto_endpoint, rate=1.0, seed=1, faults=("slowdown", "internal", "reset"),
                    applies=applies) as proxy:
        res = run_through(proxy, prefect_api, "run", demo.pipeline, "--output-prefix", demo.output,
                          "--retries", "0", AWS_MAX_ATTEMPTS="2")
    code, out, err = res.returncode, res.stdout, res.stderr
    assert code == 1, (out, err)
    assert proxy.stats[("ok", "CreateMultipartUpload")] >= 3
    assert proxy.stats[("ok", "AbortMultipartUpload")] >= 3
    failed = [line for line in err.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 3, err
    for line in failed:
        assert "writing s3://" in line and ".parquet" in line, line
    assert "Traceback" not in err + out
    assert "3 failed" in err
    assert storage.list_prefix(demo.output).shards == {}
    assert snapshot(demo.output) == {}
    assert pending_uploads(moto_endpoint, s3_root) == []
    assert {name: snapshot(prefix) for name, prefix in demo.prefixes.items()} == inputs


def test_storage_down_fails_before_writing(tmp_path, s3_root, moto_endpoint, prefect_api):
    """Every request fails: the run stops at the first listing with one line and exit 2, nothing written."""
    demo = make_demo(tmp_path, s3_root, shards=2, rows=50)
    with FaultProxy(moto_endpoint, rate=1.0, seed=2, faults=("slowdown", "internal", "reset")) as proxy:
        res = run_through(proxy, prefect_api, "run", demo.pipeline, "--output-prefix", demo.output,
                          AWS_MAX_ATTEMPTS="2")
    code, out, err = res.returncode, res.stdout, res.stderr
    assert code == 2, (out, err)
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: cannot list main_prefix s3://"), err
    assert err.rstrip().endswith(errors[0]) and "Traceback" not in err + out
    assert proxy.faults_injected() > 0 and proxy.stats[("ok", "ListObjects")] == 0
    assert snapshot(demo.output) == {}
    assert pending_uploads(moto_endpoint, s3_root) == []
