"""cast_columns, the small operation to copy: its own cases. What every operation must do (config round trip,
schema, dry run, merge + resume + verify on local disk and S3, verify catching an undone change, the flow) runs
on `example` in tests/test_operations.py."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from core_fixtures import aes_op, build, dqm_op, read_table, watermark_op

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ConfigError, ShardError
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.ops import OPERATIONS, History, Status
from tasks.ops.cast_columns import CastColumns, arrow_type, first_failing

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 3
REL = sorted(relpaths(SHARDS))


def cast(columns: dict, **fields) -> dict:
    return {"type": "cast_columns", "columns": columns, **fields}


def example(p: dict) -> list[dict]:
    """dqm, then retype two base columns (listed out of alphabetical order), then aes and the optional watermark."""
    return [dqm_op(p), cast({"width": "int64", "height": "float64"}), aes_op(p), watermark_op(p, required=False)]


def pipeline(tmp_path, ops=example, data=None):
    setup = build(tmp_path, str(data or tmp_path / "data"), shards=SHARDS, ops=ops)
    return setup, load_pipeline(setup.pipeline)


# ---------------------------------------------------------------- config

def test_yaml_builds_the_operation_and_its_meaning_ignores_order_and_spelling(tmp_path):
    setup, pipe = pipeline(tmp_path)
    op = pipe.operations[1]
    assert OPERATIONS["cast_columns"] is CastColumns  # registered by being defined in tasks/ops/
    assert op == CastColumns((("width", "int64"), ("height", "float64")), safe=True)
    assert op.to_dict() == {"type": "cast_columns", "columns": {"width": "int64", "height": "float64"}, "safe": True}
    assert op.input(pipe.dataset) is None and op.key_columns(pipe.dataset) == set()
    _, other = pipeline(tmp_path / "b", data=tmp_path / "data", ops=lambda p: [
        dqm_op(p), cast({"height": "double", "width": "int64"}), aes_op(p), watermark_op(p, required=False)])
    assert other.fingerprint == pipe.fingerprint  # double is float64; each column is cast alone
    _, unsafe = pipeline(tmp_path / "c", data=tmp_path / "data", ops=lambda p: [
        dqm_op(p), cast({"width": "int64", "height": "float64"}, safe=False), aes_op(p), watermark_op(p, required=False)])
    assert unsafe.fingerprint != pipe.fingerprint


@pytest.mark.parametrize("columns, message", [
    ({"image_key": "int64"}, "'image_key' is the dataset's key_column: rows are aligned by it$"),
    ({"image": "binary"}, "'image' is the dataset's image_column: it is never in the output$"),
    ({"s3_image_path": "large_string"}, r"'s3_image_path' is the key column of operations\[2\] \(merge_from_sidecar "
                                        r"from \S+\): rows are aligned by it, so it cannot be cast$"),
    ({"width": "int33"}, r"'width': 'int33' is not an Arrow type name \(e\.g\. float32, int64, string, "
                         r"timestamp\[ms\]\)$"),
    ({"width": "date64"}, r"'width': Parquet stores date64 as date32\[day\]: name date32\[day\] instead$"),
    ({"width": "timestamp[s]"}, r"'width': Parquet stores timestamp\[s\] as timestamp\[ms\]: name timestamp\[ms\] "
                                r"instead$"),
    ({}, r"must cast at least one column \(column: type\)$"),
    ({"width": 3}, "the type for 'width' must be an Arrow type name$"),
])
def test_refused_casts_name_file_line_and_field(tmp_path, columns, message):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1,
                  ops=lambda p: [dqm_op(p), cast(columns), aes_op(p)])
    with pytest.raises(ConfigError) as caught:
        load_pipeline(setup.pipeline)
    line = next(i for i, text in enumerate(setup.pipeline.read_text().splitlines(), 1) if "cast_columns" in text)
    assert re.match(rf"\S+merge\.yaml:{line + 1}: operations\[1\]\.columns: {message}", str(caught.value)), \
        str(caught.value)


def test_a_type_parquet_stores_as_another_is_refused_and_one_it_keeps_is_not():
    assert arrow_type("float32") == pa.float32() and arrow_type("timestamp[ms]") == pa.timestamp("ms")
    with pytest.raises(ValueError, match=r"Parquet stores time32\[s\] as time32\[ms\]"):
        arrow_type("time32[s]")


# ---------------------------------------------------------------- kernel

def test_casts_in_place_and_records_a_transform(tmp_path):
    setup, pipe = pipeline(tmp_path)
    job = Job(pipe, setup.output)
    for rel in REL:
        merge_shard(job, rel)
        out, base = read_table(setup.output + rel), read_table(setup.prefixes["base"] + rel)
        assert out.column_names[:4] == ["image_key", "s3_image_path", "width", "height"]  # in place
        assert out.schema.field("width").type == pa.int64() and out.schema.field("height").type == pa.float64()
        assert out["width"].to_pylist() == base["width"].to_pylist()
        assert out["height"].to_pylist() == [float(v) for v in base["height"].to_pylist()]
        record = read_provenance(storage.read_footer(setup.output + rel))["operations"][1]
        assert record["status"] == Status.APPLIED.value and record["input"] == "none"
        assert record["lineage"] == [{"column": "width", "change": "transform"},
                                     {"column": "height", "change": "transform"}]


def test_a_value_the_type_cannot_hold_fails_the_shard_naming_column_row_and_value(tmp_path):
    """A safe cast refuses an overflow: the row is the shard's, whatever window it falls in."""
    op = CastColumns((("height", "int8"),))
    schema = pa.schema([("height", pa.int32())])
    stream = op.stream(schema, None, "a.parquet", History(), rows=6, window_rows=3)
    assert stream.apply(pa.table({"height": [1, 2, 3]}, schema=schema), 0)["height"].type == pa.int8()
    with pytest.raises(ShardError, match=r"^column 'height': row 4: 300 does not fit int8 \(.*\); set `safe: false` "
                                         r"to convert anyway$"):
        stream.apply(pa.table({"height": [4, 300, 5]}, schema=schema), 3)
    wrapped = CastColumns((("height", "int8"),), safe=False).apply(pa.table({"height": [300]}, schema=schema), None,
                                                                   "a.parquet", History())[0]
    assert wrapped["height"].to_pylist() == [300 - 256]


def test_a_merge_failing_a_cast_names_the_shard_and_the_operation(tmp_path):
    setup, pipe = pipeline(tmp_path, ops=lambda p: [cast({"width": "int8"})])
    with pytest.raises(ShardError, match=r"shard \S+: operations\[0\] \(cast_columns width -> int8\): column "
                                         r"'width': row \d+: \d+ does not fit int8"):
        merge_shard(Job(pipe, setup.output), REL[0])
    assert not storage.list_prefix(setup.output).shards  # nothing published


def test_a_cast_arrow_cannot_do_is_a_shard_error_before_any_row(tmp_path):
    setup, pipe = pipeline(tmp_path, ops=lambda p: [cast({"filter_luma": "float32"})])
    with pytest.raises(ShardError, match=r"operations\[0\] \(cast_columns filter_luma -> float32\): column "
                                         r"'filter_luma': Arrow cannot cast struct<.*> to float$"):
        merge_shard(Job(pipe, setup.output), REL[0])


# ---------------------------------------------------------------- what the step says and checks

def test_describe_dry_run_and_meaning_name_each_cast():
    op = CastColumns((("width", "int64"), ("height", "float64")))
    assert op.dry_run_lines(None) == ("cast_columns width -> int64, height -> float64 (safe; reads no sibling)", [])
    assert CastColumns((("width", "int8"),), safe=False).dry_run_lines(None) == (
        "cast_columns width -> int8 (unsafe; reads no sibling)", [])
    assert op.meaning(None) == {"type": "cast_columns", "columns": {"height": "double", "width": "int64"},
                                "safe": True}


def test_columns_to_cast_missing_at_this_step_fail_the_shard_naming_them_and_what_the_table_has():
    schema = pa.schema([("id", pa.int64()), ("width", pa.int32())])
    op = CastColumns((("height", "int8"), ("width", "int8"), ("depth", "int8")))
    with pytest.raises(ShardError) as raised:
        op.stream(schema, None, "a.parquet", History(), rows=1, window_rows=1)
    assert str(raised.value) == ("column(s) height, depth to cast not in the table at this step (it has: id, width); "
                                 "check `columns` against the base and earlier operations")


class Sliced:
    """An array counting the slices first_failing casts; a binary search needs at most `bound` of them."""

    def __init__(self, values: pa.Array, bound: int):
        self.values, self.bound, self.slices = values, bound, 0

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, offset: int, length: int) -> pa.Array:
        self.slices += 1
        assert self.slices <= self.bound, "first_failing is not a binary search (or does not end)"
        return self.values.slice(offset, length)


@pytest.mark.parametrize("texts, first", [
    (["x"], 0), (["1", "x"], 1), (["x", "2", "3"], 0), (["1", "2", "3", "4", "5", "x", "7", "8"], 5),
    (["1", "2", "3", "x", "5", "6", "x", "8"], 3), (["1", "2", "3", "4", "5", "6", "7", "x"], 7),
])
def test_first_failing_finds_the_first_row_a_safe_cast_refuses_by_bisection(texts, first):
    values = Sliced(pa.array(texts), bound=max(1, (len(texts) - 1).bit_length()))
    assert first_failing(values, pa.int64()) == first


def test_compare_values_casts_each_column_before_the_step_as_it_did_and_skips_what_it_cannot_see():
    """A column missing from the output (the schema check's) or made by an earlier transform (before() is None)
    is skipped; the others are compared with the values before the step cast unsafely, as the step did."""
    op = CastColumns((("gone", "int8"), ("made", "int8"), ("height", "int8"), ("width", "int8")), safe=False)
    before = {"gone": pa.chunked_array([[1, 2]], pa.int32()), "made": None,
              "height": pa.chunked_array([[300, 2]], pa.int32()), "width": pa.chunked_array([[5, 6]], pa.int32())}
    compared = []

    def compare(name, got, want, cast=False):
        compared.append(name)
        return None if got.equals(want) else f"{name}: {got.to_pylist()} != {want.to_pylist()}"
    shard = SimpleNamespace(before=lambda index, column: before[column], compare=compare, out=pa.table({
        "made": pa.array([1, 2], pa.int8()), "height": pa.array([44, 2], pa.int8()),
        "width": pa.array([5, 7], pa.int8())}))
    found = op.compare_values(shard, 2, None)
    assert (found.keys, found.columns, compared) == ([], ["operations[2]: width: [5, 7] != [5, 6]"],
                                                     ["height", "width"])


@pytest.mark.slow
def test_the_planned_schema_of_a_cast_in_a_process_of_its_own():
    """In a child interpreter: a step handing pyarrow a field of no type crashes the process (SIGSEGV), which a
    test in the same process cannot report."""
    code = ("import pyarrow as pa; from tasks.ops.cast_columns import CastColumns; from tasks.ops.lineage import "
            "History; print(CastColumns((('w', 'int8'),)).plan(pa.schema([('w', pa.int32()), ('k', pa.string())]), "
            "None, 'a.parquet', History())[0])")
    child = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                           text=True, check=False)
    assert (child.returncode, child.stdout) == (0, "w: int8\nk: string\n"), child.stderr
