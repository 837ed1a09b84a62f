"""drop_columns, the second operation type, through every caller: config, dry run, kernel, flow, resume, verify
and the JSON report; on local disk and S3 (moto server)."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import jsonschema
import pyarrow as pa
import pytest
from core_fixtures import (
    aes_op,
    build,
    dqm_op,
    expected_output,
    read_table,
    release_console_handlers,
    watermark_op,
    write_table,
)

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.dryrun import dry_run
from tasks.errors import ConfigError, ShardError
from tasks.merge import Job, merge_shard, read_provenance
from tasks.ops import NO_INPUT, DropColumns
from tasks.plan import make_plan
from tasks.verify import BASE, KEYS, MERGED, SCHEMA, siblings_check, verify

REPO = Path(__file__).resolve().parents[1]
SHARDS = 3
REL = sorted(relpaths(SHARDS))


def drop(*columns: str) -> dict:
    return {"type": "drop_columns", "columns": list(columns)}


def chain(p: dict) -> list[dict]:
    """dqm, then drop a base column, then aes and the optional watermark."""
    return [dqm_op(p), drop("width"), aes_op(p), watermark_op(p, required=False)]


def expected(setup, rel: str) -> pa.Table:
    cols = [("dqm", "dqm_d1_v6_1"), ("aes", "ernie_image_aes")]
    if rel != relpaths(SHARDS)[-1]:  # the watermark gap
        cols.append(("watermark", "watermark"))
    return expected_output(setup, rel, cols).drop_columns(["width"])


# ---------------------------------------------------------------- config

def test_yaml_builds_the_operation_and_its_fingerprint(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, ops=chain)
    pipe = load_pipeline(setup.pipeline)
    op = pipe.operations[1]
    assert op == DropColumns(("width",))
    assert op.input(pipe.dataset) is None and op.key_columns(pipe.dataset) == set()
    assert op.to_dict() == {"type": "drop_columns", "columns": ["width"]}
    assert [what for what, _ in pipe.prefixes()] == ["main_prefix", "operations[0].source_prefix",
                                                     "operations[2].source_prefix", "operations[3].source_prefix"]
    other = build(tmp_path / "b", str(tmp_path / "data"), shards=1,
                  ops=lambda p: [dqm_op(p), drop("height"), aes_op(p), watermark_op(p, required=False)])
    assert load_pipeline(other.pipeline).fingerprint != pipe.fingerprint


@pytest.mark.parametrize("columns, message", [
    (["image_key"], "'image_key' is the dataset's key_column"),
    (["s3_image_path"], r"'s3_image_path' is the key column of operations\[2\] \(merge_from_sidecar from "),
    (["image"], "'image' is the dataset's image_column"),
    (["filter_luma"], "'filter_luma' is declared in the dataset's schema_extensions"),
    ([], "must list at least one column to drop"),
    (["width", "width"], "lists a column twice"),
    (["width", ""], r"columns\[1\] must be a non-empty column name"),
])
def test_refused_columns_name_file_line_and_field(tmp_path, columns, message):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1,
                  ops=lambda p: [dqm_op(p), drop(*columns), aes_op(p)])
    with pytest.raises(ConfigError) as caught:
        load_pipeline(setup.pipeline)
    line = next(i for i, text in enumerate(setup.pipeline.read_text().splitlines(), 1) if "drop_columns" in text)
    assert re.match(rf"\S+merge\.yaml:{line + 1}: operations\[1\]\.columns: {message}", str(caught.value)), \
        str(caught.value)


def test_required_does_not_apply(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1,
                  ops=lambda p: [dqm_op(p), {**drop("width"), "required": False}])
    with pytest.raises(ConfigError, match=r"operations\[1\]\.required: unknown field \(allowed: columns, type\)"):
        load_pipeline(setup.pipeline)


# ---------------------------------------------------------------- kernel, resume identity

def test_kernel_drops_the_column_and_records_it(tmp_path, root):
    setup = build(tmp_path, root, shards=SHARDS, ops=chain)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    for rel in REL:
        merge_shard(job, rel)
        got = read_table(setup.output + rel)
        assert got.replace_schema_metadata(None).equals(expected(setup, rel)), rel
        prov = read_provenance(storage.read_footer(setup.output + rel))
        record = prov["operations"][1]
        assert record["status"] == "dropped" and record["removed"] == ["width"]
        assert prov["inputs"]["operations"][1] == NO_INPUT
    plan = make_plan(job)
    assert plan.complete == REL and plan.todo == []  # resume: the recorded inputs match the listings
    assert plan.inputs(REL[0])["operations"][1] == NO_INPUT


def test_a_column_absent_at_that_step_is_a_shard_error(tmp_path, root):
    setup = build(tmp_path, root, shards=1, ops=lambda p: [drop("width"), dqm_op(p), drop("width")])
    job = Job(load_pipeline(setup.pipeline), setup.output)
    with pytest.raises(ShardError, match=r"shard \S+: operations\[2\] \(drop_columns width\): column\(s\) width "
                                         r"to drop not in the table at this step"):
        merge_shard(job, REL[0])


# ---------------------------------------------------------------- dry run

def test_dry_run_predicts_the_schema_without_the_dropped_column(tmp_path, root):
    setup = build(tmp_path, root, shards=SHARDS, ops=chain)
    out = io.StringIO()
    assert dry_run(load_pipeline(setup.pipeline), setup.output, out=out) == 0, out.getvalue()
    text = out.getvalue()
    assert "operations[1]: drop_columns width (reads no sibling)\noperations[2]: merge_from_sidecar" in text
    assert len(re.findall(r"siblings: \d+ found", text)) == 3
    schema = text.split("output schema", 1)[1]
    assert "    height: int32" in schema and "    width:" not in schema


def test_dry_run_reports_a_column_absent_at_that_step(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS, ops=lambda p: [drop("width"), drop("width")])
    out = io.StringIO()
    assert dry_run(load_pipeline(setup.pipeline), setup.output, out=out) == 1
    assert re.search(r"shard \S+: operations\[1\] \(drop_columns width\): column\(s\) width to drop not in",
                     out.getvalue()), out.getvalue()


# ---------------------------------------------------------------- verify and the JSON report

def merged(tmp_path, root) -> tuple[Job, object]:
    setup = build(tmp_path, root, shards=SHARDS, ops=chain)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    for rel in REL:
        merge_shard(job, rel)
    return job, setup


def failing(report) -> dict:
    return {c.name: [(f.path, f.detail) for f in c.failures] for c in report.checks if not c.passed}


def test_verify_passes_and_lists_siblings_only_for_operations_with_inputs(tmp_path, root):
    job, _ = merged(tmp_path, root)
    report = verify(job, samples=SHARDS, stream=io.StringIO())
    assert report.ok, failing(report)
    names = [c.name for c in report.checks]
    assert [n for n in names if "siblings" in n] == [siblings_check(0), siblings_check(2), siblings_check(3)]
    schema = json.loads((REPO / "docs" / "verify-report.schema.json").read_text())
    jsonschema.validate(report.to_dict(), schema, cls=jsonschema.Draft202012Validator)


def test_verify_fails_when_a_dropped_column_comes_back(tmp_path):
    job, setup = merged(tmp_path, str(tmp_path / "data"))
    rel = REL[0]
    table = read_table(setup.output + rel)
    width = read_table(setup.prefixes["base"] + rel)["width"]
    write_table(table.append_column("width", width).replace_schema_metadata(table.schema.metadata),
                setup.output + rel)
    report = verify(job, samples=SHARDS, stream=io.StringIO())
    found = failing(report)
    assert set(found) == {SCHEMA, MERGED}, found
    assert found[MERGED] == [(rel, "operations[1]: dropped column 'width' is still in the output")]
    assert "provenance says" in found[SCHEMA][0][1]


def test_verify_without_provenance_derives_the_drop(tmp_path):
    """Deep checks re-derive what each step did from footers: the dropped base column is not 'missing'."""
    job, setup = merged(tmp_path, str(tmp_path / "data"))
    rel = REL[1]
    write_table(read_table(setup.output + rel).replace_schema_metadata(None), setup.output + rel)
    report = verify(job, samples=SHARDS, stream=io.StringIO())
    found = failing(report)
    assert BASE not in found and KEYS not in found and MERGED not in found, found


# ---------------------------------------------------------------- the flow (sidecar-ops run), resume, verify CLI

def test_flow_merges_resumes_and_verifies(tmp_path, root, cli, prefect_api):
    setup = build(tmp_path, root, shards=SHARDS, ops=chain)
    try:
        code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output)
        assert code == 0, out + err
        for rel in REL:
            assert read_table(setup.output + rel).replace_schema_metadata(None).equals(expected(setup, rel))
        code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output)
        assert code == 0, out + err
        assert re.search(rf"shards: {SHARDS} total, 0 merged, {SHARDS} skipped", out), out
        code, out, err = cli("verify", setup.pipeline, "--output-prefix", setup.output, "--json", tmp_path / "r.json")
        assert code == 0 and "verify: PASS (all 12 checks)" in out, out + err
        schema = json.loads((REPO / "docs" / "verify-report.schema.json").read_text())
        report = json.loads((tmp_path / "r.json").read_text())
        jsonschema.validate(report, schema, cls=jsonschema.Draft202012Validator)
        assert "operations[1] siblings" not in [c["name"] for c in report["checks"]]
    finally:
        release_console_handlers()
