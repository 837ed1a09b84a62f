"""`sidecar-ops run --dry-run`: the plan from listings and sampled footers; writes nothing, needs no server."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pytest
from conftest import free_port, snapshot
from core_fixtures import build, dqm_op, read_table, write_table
from faultproxy import DENIED, UNSUPPORTED, proxied  # noqa: F401 (a fixture)

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, merge_shard

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REPO = Path(__file__).resolve().parents[1]
SHARDS = 5
REL = sorted(relpaths(SHARDS))


def field(out: str, label: str) -> str:
    m = re.search(rf"^{re.escape(label)}\s+(.*)$", out, re.M)
    assert m, f"no {label!r} line in:\n{out}"
    return m.group(1).strip()


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, root, cli):
    setup = build(tmp_path, root, shards=SHARDS)
    merge_shard(Job(load_pipeline(setup.pipeline), setup.output), REL[0])  # one output already complete
    inputs_before = {p: snapshot(p) for p in setup.inputs()}
    output_before = snapshot(setup.output)
    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--dry-run")
    assert code == 0, out + err
    assert field(out, "sidecar_prefix (yaml):") == setup.prefixes["base"].rstrip("/") + "_all_in_one/"
    assert field(out, "output prefix (effective):") == setup.output
    assert field(out, "shards:").startswith(f"{SHARDS} ")
    missing = re.findall(r"siblings: (\d+) found, (\d+) missing, (\d+) extra", out)
    assert missing == [("5", "0", "0"), ("5", "0", "0"), ("4", "1", "0")]
    assert f"skipped where missing (required: false): {relpaths(SHARDS)[-1]}" in out
    assert field(out, "outputs complete:") == "1"
    assert field(out, "shards to process:") == str(SHARDS - 1)
    schema = out.split("output schema", 1)[1]
    for name, dtype in [("image_key", "string"), ("dqm_d1_v6_1", "struct<raw_score: float, error: string, model: "
                                                                 "string>"),
                        ("ernie_image_aes", "struct<raw_score: float, score: float, error: string>"),
                        ("watermark", "struct<score: float, error: string>")]:
        assert f"    {name}: {dtype}" in schema
    assert out.rstrip().endswith("dry run OK: nothing written")
    assert snapshot(setup.output) == output_before
    assert {p: snapshot(p) for p in setup.inputs()} == inputs_before


def test_dry_run_with_default_output_prefix_creates_nothing(tmp_path, cli):
    setup = build(tmp_path, str(tmp_path / "data"), shards=2)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, out, err = cli("run", setup.pipeline, "--dry-run")
    assert code == 0, out + err
    effective = field(out, "output prefix (effective):")
    assert "_all_in_one_run_" in effective and "NOTE: no --output-prefix given" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_dry_run_reports_a_missing_source_column(tmp_path, root, cli):
    setup = build(tmp_path, root, shards=SHARDS,
                  ops=lambda p: [dqm_op(p, columns=["dqm_d1_v6_1", "dqm_v7"])])
    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--dry-run", "--samples", "2")
    assert code == 1
    assert "PROBLEMS" in out and "dry run: nothing written" in out
    assert re.search(r"shard \S+: operations\[0\] \(merge_from_sidecar from \S+\): column\(s\) dqm_v7 not in the "
                     r"source shard", out), out
    assert snapshot(setup.output) == {}


def test_dry_run_reports_a_declared_extension_with_the_wrong_type(tmp_path, root, cli):
    setup = build(tmp_path, root, shards=SHARDS, ops=lambda p: [dqm_op(p)])
    for rel in REL:  # every shard, so any sample sees it
        uri = setup.prefixes["dqm"] + rel
        t = read_table(uri).replace_schema_metadata(None)
        write_table(t.set_column(1, "dqm_d1_v6_1", pa.array([0.5] * t.num_rows, pa.float64())), uri)
    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--dry-run")
    assert code == 1
    assert "column 'dqm_d1_v6_1': expected struct<raw_score: floating, error: string, ...> (dqm_score_v1), " \
           "found double" in out
    assert snapshot(setup.output) == {}


def test_dry_run_reports_a_missing_required_sibling_and_extra_ones(tmp_path, cli):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS,
                  ops=lambda p: [dqm_op(p), {"type": "merge_from_sidecar", "source_prefix": p["watermark"],
                                            "columns": ["watermark"]}])
    extra = setup.prefixes["dqm"] + "2030/part-99999.parquet"
    write_table(read_table(setup.prefixes["dqm"] + REL[0]).replace_schema_metadata(None), extra)
    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--dry-run")
    assert code == 1
    assert "siblings: 6 found, 0 missing, 1 extra (extra ones are ignored)" in out
    assert f"operations[1] (merge_from_sidecar from {setup.prefixes['watermark']}): 1 sibling shard(s) missing: " \
           f"{relpaths(SHARDS)[-1]}" in out


def test_dry_run_starts_no_prefect_server(tmp_path):
    """PREFECT_API_URL points at a closed port: anything that talked to Prefect would fail or hang."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=2)
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api",
           "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "flows/merge.py", str(setup.pipeline), "--dry-run",
                           "--output-prefix", setup.output], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run OK: nothing written" in proc.stdout
    assert "Traceback" not in proc.stderr
    home = tmp_path / "prefect-home"  # importing prefect may create the folder, but no database or server log
    assert not home.exists() or not any(home.iterdir()), sorted(home.iterdir())
    assert not os.path.exists(setup.output)


# ----------------------------------------------------------------- leftovers and the bucket's lifecycle rule

def dead_pid() -> int:
    """A process id no process of this host has now (searched down from the kernel's largest)."""
    for pid in range(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1, 300, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free process id")


def test_dry_run_sweeps_no_leftovers(tmp_path, root, cli, request):
    """Under the output prefix: a dead writer's temp file, hours old (local), or an upload the store started
    7 h ago (S3; the proxy reports its real Initiated). A run's start-up sweep removes it (shown last, so the
    leftover is a real one); the dry run leaves it where it is."""
    setup = build(tmp_path, root, shards=2)
    if storage.is_s3(root):
        proxy = request.getfixturevalue("proxied")()
        bucket, _, key = (setup.output + REL[0])[len("s3://"):].partition("/")
        upload = storage._s3().call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
        proxy.age(upload, 7 * 3600)

        def leftovers() -> list[str]:
            return [upload_id for _, upload_id, _ in storage.pending_uploads(setup.output)]
    else:
        temp = Path(setup.output) / f"{storage.TEMP_MARK}{socket.gethostname()}-{dead_pid()}-0123abcd"
        temp.parent.mkdir(parents=True)
        temp.write_bytes(b"half a shard")
        hours_ago = time.time() - 7 * 3600
        os.utime(temp, (hours_ago, hours_ago))

        def leftovers() -> list[str]:
            return sorted(p.name for p in Path(setup.output).iterdir())
    before = leftovers()
    assert len(before) == 1
    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--dry-run")
    assert code == 0, out + err
    assert out.rstrip().endswith("dry run OK: nothing written")
    assert leftovers() == before
    assert storage.sweep_stale(setup.output) == 1
    assert leftovers() == []


ABORT_RULE = {"ID": "abort", "Status": "Enabled", "Filter": {"Prefix": ""},
              "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}
EXPIRY_RULE = {"ID": "expire", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 30}}
LIFECYCLE = {  # the bucket's rules -> the dry run's lifecycle line (None: no such line)
    "no-rules": ([], "has no AbortIncompleteMultipartUpload rule for {output}"),
    "abort-rule": ([ABORT_RULE], None),
    "abort-rule-elsewhere": ([{**ABORT_RULE, "Filter": {"Prefix": "logs/"}}],
                             "has no AbortIncompleteMultipartUpload rule for {output}"),
    "expiry-rule-only": ([EXPIRY_RULE], "has no AbortIncompleteMultipartUpload rule for {output}"),
    DENIED: ([ABORT_RULE], "cannot read the lifecycle rules of bucket {bucket} (PermissionError: "),
    UNSUPPORTED: ([], "cannot read the lifecycle rules of bucket {bucket} (OSError: "),
}


@pytest.mark.parametrize("case", LIFECYCLE)
def test_dry_run_says_when_the_output_bucket_has_no_abort_rule(tmp_path, s3_root, moto_endpoint, cli, case,
                                                               proxied):  # noqa: F811
    """One line when nothing but a run's sweep would abort the output's orphaned uploads: no
    AbortIncompleteMultipartUpload rule covering the output prefix, or rules the store will not show (denied,
    or no lifecycle support): never a failure of the dry run."""
    rules, line = LIFECYCLE[case]
    setup = build(tmp_path, s3_root, shards=2)
    bucket = s3_root[len("s3://"):].rstrip("/")
    if rules:
        boto3.client("s3", endpoint_url=moto_endpoint).put_bucket_lifecycle_configuration(
            Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    refused = case in (DENIED, UNSUPPORTED)
    proxy = proxied(rate=1.0 if refused else 0.0, faults=(case,) if refused else (DENIED,),
                    applies=lambda op: op == "GetBucketLifecycleConfiguration")
    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--dry-run")
    assert code == 0, out + err
    assert proxy.stats[("ok" if not refused else case, "GetBucketLifecycleConfiguration")] == 1
    said = [text for text in out.splitlines() if text.startswith("lifecycle: ")]
    if line is None:
        assert said == [], out
    else:
        assert len(said) == 1 and line.format(output=setup.output, bucket=repr(bucket)) in said[0], out
    assert "Traceback" not in out + err
