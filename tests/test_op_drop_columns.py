"""drop_columns, the second operation type: its own cases. What every operation must do (config round trip,
schema, dry run, merge + resume + verify on local disk and S3, the flow) runs on `example` in
tests/test_operations.py."""
from __future__ import annotations

import io
import re

import pyarrow as pa
import pytest
from core_fixtures import (
    FILTER_EXTENSIONS,
    aes_op,
    build,
    dqm_op,
    expected_output,
    read_table,
    watermark_op,
    write_table,
)

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.dryrun import dry_run
from tasks.errors import ConfigError, ShardError
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.ops import NO_INPUT, DropColumns, Status
from tasks.plan import make_plan
from tasks.verification import MERGED, SCHEMA, verify

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 3
REL = sorted(relpaths(SHARDS))


def drop(*columns: str) -> dict:
    return {"type": "drop_columns", "columns": list(columns)}


def example(p: dict) -> list[dict]:
    """dqm, then drop a base column, then aes and the optional watermark (tests/test_operations.py runs it)."""
    return [dqm_op(p), drop("width"), aes_op(p), watermark_op(p, required=False)]


chain = example


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
    assert op.meaning(pipe.dataset) == op.to_dict()  # what the fingerprint hashes
    assert [what for what, _ in pipe.prefixes()] == ["main_prefix", "operations[0].source_prefix",
                                                     "operations[2].source_prefix", "operations[3].source_prefix"]
    other = build(tmp_path / "b", str(tmp_path / "data"), shards=1,
                  ops=lambda p: [dqm_op(p), drop("height"), aes_op(p), watermark_op(p, required=False)])
    assert load_pipeline(other.pipeline).fingerprint != pipe.fingerprint


@pytest.mark.parametrize("columns, message", [
    (["image_key"], "'image_key' is the dataset's key_column"),
    (["s3_image_path"], (r"'s3_image_path' is the key column of operations\[2\] \(merge_from_sidecar from \S+\): "
                         r"rows are aligned by it, so it cannot be dropped$")),
    (["image"], (r"'image' is the dataset's image_column: it is never in the output \(a sidecar carries no image "
                 r"bytes\), there is nothing to drop$")),
    (["filter_luma"], ("'filter_luma' is declared in the dataset's schema_extensions: remove it there to drop it "
                      "from the output$")),
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
        assert record["status"] == Status.DROPPED.value and record["removed"] == ["width"]  # as it always was
        assert record["lineage"] == [{"column": "width", "change": "remove"}]
        assert prov["inputs"]["operations"][1] == NO_INPUT
    plan = make_plan(job)
    assert plan.complete == REL and plan.todo == []  # resume: the recorded inputs match the listings
    assert plan.inputs(REL[0])["operations"][1] == NO_INPUT


def test_a_column_absent_at_that_step_is_a_shard_error(tmp_path, root):
    setup = build(tmp_path, root, shards=1,
                  ops=lambda p: [drop("width", "height"), dqm_op(p), drop("width", "height")])
    job = Job(load_pipeline(setup.pipeline), setup.output)
    has = ", ".join(["image_key", "s3_image_path", *(e["name"] for e in FILTER_EXTENSIONS), "dqm_d1_v6_1"])
    with pytest.raises(ShardError, match=r"shard \S+: operations\[2\] \(drop_columns width, height\): column\(s\) "
                                         rf"width, height to drop not in the table at this step \(it has: {has}\); "
                                         r"check `columns` against the base and earlier operations$"):
        merge_shard(job, REL[0])


# ---------------------------------------------------------------- dry run

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
