"""Resume keyed on the output shard and its inputs (issue 11, seen case 1 and deliverable 1).

Each output records the identities of its inputs (size + ETag on S3, size + mtime_ns locally) and the key
kernel.shard_key makes of them; the planner recomputes that key from its listings. A rerun after one source
shard changed rewrites exactly that shard; outputs of an older version or older merge semantics are stale;
a rerun on a complete S3 output reads footers of the output only (requests counted at a proxy).
"""
from __future__ import annotations

import re
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import build, identities, read_meta, read_table, versioned, write_table
from faultproxy import FaultProxy
from reliability_fixtures import cli_env, make_demo, run_cli

from tasks import kernel, storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, read_provenance
from tasks.plan import make_plan
from tasks.prefect_tasks import SHARD_INPUTS

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 4
REL = sorted(relpaths(SHARDS))
SUMMARY = re.compile(r"shards: (\d+) total, (\d+) merged, (\d+) skipped \(already complete\), (\d+) failed")


def counts(out: str) -> tuple[int, ...]:
    m = SUMMARY.search(out)
    assert m, out
    return tuple(int(x) for x in m.groups())


def new_dqm_scores(uri: str) -> pa.Table:
    """Recompute one DQM shard in place: same keys, new dqm_d1_v6_1 values, a new file."""
    table = read_table(uri).replace_schema_metadata(None)
    old = table["dqm_d1_v6_1"]
    new = pa.array([None if v is None else {**v, "raw_score": -1.0} for v in old.to_pylist()], old.type)
    table = table.set_column(table.schema.get_field_index("dqm_d1_v6_1"), "dqm_d1_v6_1", new)
    write_table(table, uri)
    return table


def test_changed_source_rewrites_exactly_that_shard(tmp_path, root, run, cli):
    setup = build(tmp_path, versioned(root), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    before = identities(setup.output)
    changed = new_dqm_scores(setup.prefixes["dqm"] + REL[1])

    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--dry-run")
    assert code == 0, out + err
    assert f"outputs stale (inputs changed since written; recomputed): 1: {REL[1]} (operations[0] sibling changed)" \
        in out
    assert "shards to process:      1" in out

    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    assert counts(out) == (SHARDS, 1, SHARDS - 1, 0)
    assert "stale outputs (inputs changed since they were written): 1 (1 recomputed)" in out
    after = identities(setup.output)
    assert [rel for rel in REL if after[rel] != before[rel]] == [REL[1]]
    assert read_table(setup.output + REL[1])["dqm_d1_v6_1"].equals(changed["dqm_d1_v6_1"])


def test_changed_base_shard_is_stale(tmp_path, run):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    before = identities(setup.output)
    base = read_table(setup.prefixes["base"] + REL[2]).replace_schema_metadata(None)
    write_table(base.replace_schema_metadata({"rewritten": "yes"}), setup.prefixes["base"] + REL[2])
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0 and counts(out) == (SHARDS, 1, SHARDS - 1, 0), out + err
    after = identities(setup.output)
    assert [rel for rel in REL if after[rel] != before[rel]] == [REL[2]]


def strip_identities(uri: str) -> None:
    """Make an output look written by a version that recorded no input identities."""
    with storage.open_parquet(uri) as f:
        pf = pq.ParquetFile(f)
        table = pf.read()
    prov = read_provenance(pf.metadata)
    for key in ("inputs", "input_key", "merge_semantics", "rows", "run_id"):
        prov.pop(key)
    meta = dict(table.schema.metadata)
    meta[kernel.PROVENANCE_KEY] = json.dumps(prov).encode()
    storage.write_atomic(table.replace_schema_metadata(meta), uri)


def test_outputs_without_input_identities_or_of_older_semantics_are_stale(tmp_path, run, monkeypatch):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    strip_identities(setup.output + REL[0])
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0 and counts(out) == (SHARDS, 1, SHARDS - 1, 0), out + err
    assert read_provenance(read_meta(setup.output + REL[0]))["input_key"]

    monkeypatch.setattr(kernel, "MERGE_SEMANTICS_VERSION", kernel.MERGE_SEMANTICS_VERSION + 1)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0 and counts(out) == (SHARDS, SHARDS, 0, 0), out + err
    assert f"stale outputs (inputs changed since they were written): {SHARDS} ({SHARDS} recomputed)" in out


def test_one_key_for_planner_task_and_provenance(tmp_path, root):
    """The planner's key (from listings), the policy's key (from what the task read) and the key recorded in
    the output are the same function of the same identities: otherwise every rerun would recompute."""
    setup = build(tmp_path, root, shards=2)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    for rel in sorted(relpaths(2)):
        state = kernel.read_base(job, rel)
        for i in range(len(job.pipeline.operations)):
            state = kernel.apply_operation(job, rel, i, state)
        kernel.write_output(job, rel, state)
        policy_key = SHARD_INPUTS.compute_key(None, {"job": job, "relpath": rel, "state": state}, {})
        recorded = read_provenance(read_meta(setup.output + rel))
        plan = make_plan(job)
        assert recorded["input_key"] == policy_key
        assert kernel.shard_key(job.fingerprint, rel, plan.inputs(rel)) == policy_key
        assert recorded["inputs"] == plan.inputs(rel)
    assert plan.complete == sorted(relpaths(2)) and plan.todo == []
    assert plan.inputs(sorted(relpaths(2))[-1])["operations"][2] == "absent"  # the watermark gap


# ----------------------------------------------------------------- S3: a rerun reads no shard data

def shard_reads(log: list, sizes: dict[str, int]) -> tuple[list, list]:
    """(footer reads, data reads) among the GETs of *.parquet objects in a proxy log. A read is a footer read
    when its byte range reaches the object's end (pyarrow reads footers from the tail); a GET without a range
    reads the whole object and counts as a data read."""
    footers, data = [], []
    for op, path, rng, _ in log:
        if op != "GetObject" or not path.endswith(".parquet"):
            continue
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng or "")
        (footers if m and int(m.group(2)) >= sizes[path] - 1 else data).append((path, rng))
    return footers, data


def object_sizes(*prefixes: str) -> dict[str, int]:
    out = {}
    for prefix in prefixes:
        for rel, size in storage.list_prefix(prefix).shards.items():
            out["/" + prefix[len("s3://"):] + rel] = size
    return out


def test_read_counter_counts_data_and_footer_reads(tmp_path, s3_root, moto_endpoint, monkeypatch):
    """The counter itself: reading a column through the proxy shows as data reads, a footer as a footer read."""
    demo = make_demo(tmp_path, s3_root, shards=1, rows=3000)
    uri = demo.prefixes["base"] + relpaths(1)[0]
    with FaultProxy(moto_endpoint, rate=0.0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        storage._s3.cache_clear()
        try:
            storage.read_footer(uri)
            footers, data = shard_reads(proxy.log, object_sizes(demo.prefixes["base"]))
            assert len(footers) >= 1 and data == []
            with storage.open_parquet(uri) as f:
                pq.ParquetFile(f).read(columns=["image_key"])
            footers, data = shard_reads(proxy.log, object_sizes(demo.prefixes["base"]))
            assert len(data) >= 1, proxy.log
        finally:
            storage._s3.cache_clear()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rerun_on_complete_s3_output_reads_only_output_footers(tmp_path, s3_root, moto_endpoint, prefect_api):
    demo = make_demo(tmp_path, s3_root, shards=6, rows=3000)  # shards above pyarrow's 64 KiB tail read
    args = ["run", demo.pipeline, "--output-prefix", demo.output]
    with FaultProxy(moto_endpoint, rate=0.0) as proxy:
        env = cli_env(PREFECT_API_URL=prefect_api, AWS_ENDPOINT_URL=proxy.url)
        first = run_cli(*args, env=env)
        assert first.returncode == 0, first.stderr
        sizes = object_sizes(demo.output, *demo.prefixes.values())
        outputs = object_sizes(demo.output)
        assert len(outputs) == 6 and min(outputs.values()) > 64 * 1024, "above pyarrow's speculative tail read"
        proxy.log.clear()
        rerun = run_cli(*args, env=env)
        assert rerun.returncode == 0, rerun.stderr
        assert counts(rerun.stdout) == (6, 0, 6, 0)
        log = list(proxy.log)
    footers, data = shard_reads(log, sizes)
    assert data == [], data
    assert {p for p, _ in footers} == set(outputs), "footers of the output shards only, no input touched"
    assert not [entry for entry in log if entry[0] in ("PutObject", "HeadObject")], "no write, no HEAD per shard"
    print({op: sum(1 for e in log if e[0] == op) for op in {e[0] for e in log}})
