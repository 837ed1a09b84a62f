"""rename_columns, the third operation type: its own cases. What every operation must do (config round trip,
schema, dry run, merge + resume + verify on local disk and S3, the flow) runs on `example` in
tests/test_operations.py."""
from __future__ import annotations

import io
import re

import pyarrow as pa
import pytest
from core_fixtures import FILTER_EXTENSIONS, aes_op, build, dqm_op, read_table, watermark_op, write_table

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ConfigError, ShardError
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.ops import RenameColumns, Status
from tasks.verification import BASE, MERGED, SCHEMA, verify

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 3
REL = sorted(relpaths(SHARDS))
AES = {"name": "ernie_image_aes", "type": "ernie_image_aes_score_v1"}
WATERMARK = {"name": "watermark", "type": "watermark_score_v1"}
# dqm_d1_v6_1 is not declared here, so the example may rename it
DATASET = {"extensions": FILTER_EXTENSIONS + [AES, WATERMARK]}


def rename(**columns: str) -> dict:
    return {"type": "rename_columns", "columns": columns}


def example(p: dict) -> list[dict]:
    """dqm, then rename its column and a base column, then aes and the optional watermark."""
    return [dqm_op(p), rename(dqm_d1_v6_1="dqm", width="image_width"), aes_op(p), watermark_op(p, required=False)]


def merged(tmp_path, ops=example, **dataset):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS, ops=ops, **{**DATASET, **dataset})
    job = Job(load_pipeline(setup.pipeline), setup.output)
    for rel in REL:
        merge_shard(job, rel)
    return setup, job


def failing(report) -> dict:
    return {c.name: [(f.path, f.detail) for f in c.failures] for c in report.checks if not c.passed}


# ---------------------------------------------------------------- config

def test_yaml_builds_the_operation(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, ops=example, **DATASET)
    pipe = load_pipeline(setup.pipeline)
    op = pipe.operations[1]
    assert op == RenameColumns((("dqm_d1_v6_1", "dqm"), ("width", "image_width")))
    assert op.input(pipe.dataset) is None and op.key_columns(pipe.dataset) == set()
    assert op.to_dict() == {"type": "rename_columns", "columns": {"dqm_d1_v6_1": "dqm", "width": "image_width"}}
    assert op.meaning(pipe.dataset) == op.to_dict()  # what the fingerprint hashes
    swapped = build(tmp_path / "b", str(tmp_path / "data"), shards=1, **DATASET, ops=lambda p: [
        dqm_op(p), rename(width="image_width", dqm_d1_v6_1="dqm"), aes_op(p), watermark_op(p, required=False)])
    assert load_pipeline(swapped.pipeline).fingerprint == pipe.fingerprint  # one step renames at once


@pytest.mark.parametrize("before, columns, message", [
    (False, {"image_key": "k"}, "'image_key' is the dataset's key_column"),
    (False, {"s3_image_path": "p"}, r"'s3_image_path' is the key column of operations\[2\] \(merge_from_sidecar from "
                                    r"\S+\): rows are aligned by it, so it cannot be renamed$"),
    (False, {"image": "picture"}, r"'image' is the dataset's image_column: it is never in the output \(a sidecar "
                                  r"carries no image bytes\), there is nothing to rename$"),
    (False, {"filter_luma": "luma"}, "'filter_luma' is declared in the dataset's schema_extensions: the output "
                                     "must carry it under that name$"),
    (False, {"width": "image_key"}, "new name 'image_key' is the dataset's key_column"),
    (False, {"width": "image"}, "new name 'image' is the dataset's image_column"),
    (True, {"width": "s3_image_path"}, r"new name 's3_image_path' is the key column of operations\[1\] "),
    (False, {"width": "w", "height": "w"}, "renames both 'width' and 'height' to 'w'"),
    (False, {"width": "height", "height": "width"}, "'height' is both renamed and a new name; rename in two steps"),
    (False, {"width": "width"}, "renames 'width' to itself"),
    (False, {}, r"must rename at least one column \(old_name: new_name\)"),
    (False, {"width": ""}, "new name for 'width' must be a non-empty column name"),
    (False, {"width": 3}, "new name for 'width' must be a non-empty column name"),
    (False, ["width"], "must be a mapping, got list"),
])
def test_refused_renames_name_file_line_and_field(tmp_path, before, columns, message):
    """Config-time refusals: key, image and declared columns, new names certain to clash, malformed mappings."""
    step = {"type": "rename_columns", "columns": columns}
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, **DATASET,
                  ops=lambda p: [dqm_op(p), aes_op(p), step] if before else [dqm_op(p), step, aes_op(p)])
    index = 2 if before else 1
    with pytest.raises(ConfigError) as caught:
        load_pipeline(setup.pipeline)
    line = next(i for i, text in enumerate(setup.pipeline.read_text().splitlines(), 1) if "rename_columns" in text)
    assert re.match(rf"\S+merge\.yaml:{line + 1}: operations\[{index}\]\.columns: {message}", str(caught.value)), \
        str(caught.value)


# ---------------------------------------------------------------- kernel

def test_renames_in_place_and_records_lineage(tmp_path):
    setup, job = merged(tmp_path)
    for rel in REL:
        out = read_table(setup.output + rel)
        base = read_table(setup.prefixes["base"] + rel)
        dqm = read_table(setup.prefixes["dqm"] + rel)
        names = out.column_names
        assert names[:4] == ["image_key", "s3_image_path", "image_width", "height"]  # width's place
        assert "width" not in names and "dqm_d1_v6_1" not in names
        assert names.index("dqm") == len([n for n in base.column_names if n != "image"])  # appended by dqm
        assert out["image_width"].equals(base["width"]) and out["dqm"].equals(dqm["dqm_d1_v6_1"])
        record = read_provenance(storage.read_footer(setup.output + rel))["operations"][1]
        assert record["status"] == Status.APPLIED.value and record["input"] == "none"
        assert record["lineage"] == [{"column": "dqm", "change": "rename", "was": "dqm_d1_v6_1"},
                                     {"column": "image_width", "change": "rename", "was": "width"}]


FILTERS_HAD = ", ".join(e["name"] for e in FILTER_EXTENSIONS)


@pytest.mark.parametrize("ops, message", [
    (lambda p: [rename(width="w", height="h"), rename(width="x", height="y")],
     r"operations\[1\] \(rename_columns width -> x, height -> y\): column\(s\) width, height to rename not in the "
     rf"table at this step \(it has: image_key, s3_image_path, w, h, {FILTERS_HAD}\); check `columns` against the "
     r"base and earlier operations$"),
    (lambda p: [rename(width="height")],
     r"operations\[0\] \(rename_columns width -> height\): new name\(s\) height already in the table at this step"),
    (lambda p: [rename(width="filter_luma", height="filter_clarity")],
     r"operations\[0\] \(rename_columns width -> filter_luma, height -> filter_clarity\): new name\(s\) filter_luma, "
     r"filter_clarity already in the table at this step; choose other names, or drop those columns first "
     r"\(drop_columns\)$"),
    # a column an earlier step dropped is missing, not explained by a skipped step
    (lambda p: [{"type": "drop_columns", "columns": ["width"]}, rename(width="w")],
     r"operations\[1\] \(rename_columns width -> w\): column\(s\) width to rename not in the table at this step"),
])
def test_what_only_the_shard_shows_is_a_shard_error(tmp_path, ops, message):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, ops=ops, **DATASET)
    with pytest.raises(ShardError, match=rf"shard \S+: {message}"):
        merge_shard(Job(load_pipeline(setup.pipeline), setup.output), relpaths(1)[0])


def test_a_column_a_skipped_optional_step_did_not_supply_stays_absent(tmp_path):
    """On the shard the optional watermark sidecar does not cover, the rename passes the absence on (recorded as
    `absent`) instead of failing; a declared extension under the new name is then legitimately missing there."""
    declared = FILTER_EXTENSIONS + [AES, {"name": "wm", "type": "watermark_score_v1"}]
    setup, job = merged(tmp_path, ops=lambda p: [*example(p)[:3], watermark_op(p, required=False),
                                                 rename(watermark="wm")], extensions=declared)
    gap = REL[-1]
    assert "wm" not in read_table(setup.output + gap).column_names
    assert "wm" in read_table(setup.output + REL[0]).column_names
    record = read_provenance(storage.read_footer(setup.output + gap))["operations"][4]
    assert record["lineage"] == [{"column": "wm", "change": "absent", "was": "watermark"}]
    report = verify(job, samples=SHARDS, stream=io.StringIO())
    assert report.ok, failing(report)


# ---------------------------------------------------------------- verify follows the rename

def change(setup, rel: str, fn) -> None:
    table = read_table(setup.output + rel)
    write_table(fn(table).replace_schema_metadata(table.schema.metadata), setup.output + rel)


def test_verify_compares_a_renamed_base_column_with_its_origin(tmp_path):
    setup, job = merged(tmp_path)
    rel = REL[1]
    col = "image_width"
    change(setup, rel, lambda t: t.set_column(t.column_names.index(col), t.schema.field(col),
                                              pa.chunked_array([pa.array(range(t.num_rows), t[col].type)])))
    found = failing(verify(job, samples=SHARDS, stream=io.StringIO()))
    assert set(found) == {BASE}, found
    assert found[BASE][0][0] == rel and f"column {col!r}" in found[BASE][0][1]


def test_verify_fails_when_an_old_name_comes_back(tmp_path):
    setup, job = merged(tmp_path)
    rel = REL[0]
    width = read_table(setup.prefixes["base"] + rel)["width"]
    change(setup, rel, lambda t: t.append_column("width", width))
    found = failing(verify(job, samples=SHARDS, stream=io.StringIO()))
    assert set(found) == {SCHEMA, MERGED}, found
    assert found[MERGED] == [(rel, "operations[1]: renamed column 'width' is still in the output")]
    assert "provenance says" in found[SCHEMA][0][1]
