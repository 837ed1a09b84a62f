"""merge_from_sidecar's case for the shared operation tests (tests/test_operations.py); its own behaviour
(modes, keys, alignment errors, missing siblings) is tested in tests/test_merge_kernel.py, tests/test_bad_inputs.py
and tests/test_property_merge.py; its dry-run lines here."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import three_ops

from tasks import storage
from tasks.errors import ShardError
from tasks.ops import Input, MergeFromSidecar
from tasks.ops.lineage import History, Status, StepRecord, appended, replaced
from tasks.ops.merge_from_sidecar import ColumnPlan
from tasks.verification.values import ShardValues

KEYS_ONLY = SimpleNamespace(key_column="image_key", image_column="image")  # not DATASET: test_operations reads that name


def example(p: dict) -> list[dict]:
    """dqm by image_key, aes by s3_image_path, the optional watermark (missing for the last shard)."""
    return three_ops(p)


def test_dry_run_lines_name_mode_columns_and_the_columns_never_taken():
    """The dry run's line for the step, and one note for each listed column the sidecar never supplies (the
    dataset's key and image columns); with no columns listed, every column: '(all)', no note."""
    dataset = KEYS_ONLY
    listed = MergeFromSidecar("s3://b/dqm/", ("image_key", "dqm", "image"), "prefer_sidecar")
    assert listed.dry_run_lines(dataset) == (
        "merge_from_sidecar from s3://b/dqm/ mode=prefer_sidecar columns=['image_key', 'dqm', 'image']",
        ["image_key is the dataset's key column: kept from main, never taken from the sidecar",
         ("image is the dataset's image column: never taken from the sidecar (and dropped: a sidecar carries "
          "no image bytes)")])
    every = MergeFromSidecar("s3://b/aes/")
    assert every.dry_run_lines(dataset) == ("merge_from_sidecar from s3://b/aes/ mode=fill_missing columns=['(all)']",
                                            [])


def strings(names: list[str]) -> pa.Schema:
    return pa.schema([(name, pa.string()) for name in names])


@pytest.mark.parametrize("current, source, message", [
    (["image_key", "width"], ["path", "aes"],
     ("key column 'path' is not in the table being merged (it has: image_key, width); inspect the upstream "
      "base sidecar - there is no fallback to filename or basename matching")),
    (["image_key", "path"], ["image_key", "aes"],
     "source key column 'path' is not in the source shard (it has: image_key, aes); inspect the score sidecar"),
    (["image_key", "path"], ["path", "score"],
     "column(s) aes not in the source shard (it has: path, score); check `columns` against the score sidecar"),
])
def test_a_column_plan_the_footers_refuse_is_one_line(current, source, message):
    """Keys by `path` on both sides, taking `aes`: each thing the footers lack, named with what they have."""
    op = MergeFromSidecar("s3://b/aes/", ("aes",), target_key_column="path", source_key_column="path")
    with pytest.raises(ShardError) as info:
        op.column_plan(strings(current), strings(source), KEYS_ONLY)
    assert str(info.value) == message


def test_a_missing_sibling_fails_a_required_step_with_its_line_and_skips_an_optional_one(tmp_path):
    source = f"{tmp_path}/dqm/"
    schema = strings(["image_key"])
    with pytest.raises(ShardError) as info:
        MergeFromSidecar(source, ("dqm",)).stream(schema, KEYS_ONLY, "a/part-0.parquet", History(), 4, 4)
    assert str(info.value) == (
        f"sibling shard missing: {source}a/part-0.parquet; inspect the score sidecar (shard paths must match the "
        "base), or set `required: false` to skip shards it does not cover")
    optional = MergeFromSidecar(source, ("dqm",), required=False)
    skipped = optional.stream(schema, KEYS_ONLY, "a/part-0.parquet", History(), 4, 4)
    assert skipped.record.status is Status.SKIPPED and skipped.schema == schema


def test_verify_names_a_differing_key_and_column_of_the_step_by_their_names(tmp_path):
    """One window of an output whose key and merged column each differ from the sibling's in one row."""
    pq.write_table(pa.table({"sk": [1, 2, 3], "s": [0.5, 0.25, 0.125]}), tmp_path / "a.parquet")
    op = MergeFromSidecar(f"{tmp_path}/", ("s",), target_key_column="k", source_key_column="sk")
    record = StepRecord(Status.MERGED, (appended("s"),), "id")
    job = SimpleNamespace(pipeline=SimpleNamespace(dataset=KEYS_ONLY, operations=[op]))
    out = pa.table({"k": [1, 9, 3], "s": [0.5, 0.25, 0.0]})
    found = op.compare_values(ShardValues(job, "a.parquet", out, pa.table({"k": [1, 2, 3]}), (record,)), 0, record)
    assert found.keys == ["operations[0] k vs source sk: column 'k': 1 of 3 rows differ, first at row 1: 9 vs 2"]
    assert found.columns == ["operations[0]: column 's': 1 of 3 rows differ, first at row 2: 0.0 vs 0.125"]


def test_to_dict_input_and_meaning_say_what_the_step_reads_by_which_keys():
    listed = MergeFromSidecar("s3://b/aes/", ("aes", "x"), "prefer_sidecar", "k", "sk", required=False)
    assert listed.to_dict() == {"type": "merge_from_sidecar", "source_prefix": "s3://b/aes/", "columns": ["aes", "x"],
                                "mode": "prefer_sidecar", "target_key_column": "k", "source_key_column": "sk",
                                "required": False}
    assert listed.input(KEYS_ONLY) == Input("s3://b/aes/", "k", "sk", False, columns=("sk", "aes", "x"))
    every = MergeFromSidecar("s3://b/dqm/")  # every column, by the dataset's key
    assert every.to_dict() == {"type": "merge_from_sidecar", "source_prefix": "s3://b/dqm/", "columns": None,
                               "mode": "fill_missing", "target_key_column": None, "source_key_column": None,
                               "required": True}
    assert every.input(KEYS_ONLY) == Input("s3://b/dqm/", "image_key", "image_key", True, columns=None)
    assert every.meaning(KEYS_ONLY) == {**every.to_dict(), "target_key_column": "image_key",
                                        "source_key_column": "image_key"}


@pytest.mark.parametrize("mode", ["prefer_sidecar", "fill_missing"])
def test_a_planned_step_records_what_it_appends_replaces_keeps_and_protects(tmp_path, mode):
    """The sibling has the image (the dataset's: never taken), a and b (in the table: replaced or kept) and c."""
    pq.write_table(pa.table({"image_key": [1], "image": [b"x"], "a": [1], "b": [2], "c": [3]}), tmp_path / "s.parquet")
    current = pa.schema([("image_key", pa.int64()), ("a", pa.int64()), ("b", pa.int64())])
    op = MergeFromSidecar(f"{tmp_path}/", ("image", "a", "b", "c"), mode)
    schema, record = op.plan(current, KEYS_ONLY, "s.parquet", History())
    assert schema.names == ["image_key", "a", "b", "c"]
    taken = ["a", "b"] if mode == "prefer_sidecar" else []
    assert record == StepRecord(Status.PLANNED, (*(replaced(c) for c in taken), appended("c")), None, {
        "appended": ["c"], "replaced": taken, "kept_from_main": ["a", "b"] if not taken else [], "protected": ["image"]})
    with storage.open_parquet(f"{tmp_path}/s.parquet") as f:
        identity = storage.file_identity(f"{tmp_path}/s.parquet", f)
    stream = op.stream(current, KEYS_ONLY, "s.parquet", History(), rows=1, window_rows=1)
    stream.close()
    assert stream.record == dataclasses.replace(record, status=Status.MERGED, input=identity) and identity


SOURCE = pa.schema([("sk", pa.int64()), ("image_key", pa.int64()), ("image", pa.binary()), ("a", pa.int64()),
                    ("c", pa.int64())])
TABLE = pa.schema([("k", pa.int64()), ("image_key", pa.int64()), ("a", pa.int64())])


@pytest.mark.parametrize("columns, mode, plan", [
    (None, "prefer_sidecar", ColumnPlan(("c",), ("a",), (), ())),  # all but the keys and the image
    (("image", "a", "c"), "fill_missing", ColumnPlan(("c",), (), ("a",), ("image",))),
    (("image_key", "c"), "error", ColumnPlan(("c",), (), (), ("image_key",))),
])
def test_the_column_plan_from_footers(columns, mode, plan):
    op = MergeFromSidecar("s3://b/s/", columns, mode, "k", "sk")
    assert op.column_plan(TABLE, SOURCE, KEYS_ONLY) == plan


@pytest.mark.parametrize("op, table, message", [
    (MergeFromSidecar("p/", ("x", "a", "y"), "fill_missing", "k", "sk"), TABLE,
     ("column(s) x, y not in the source shard (it has: sk, image_key, image, a, c); check `columns` against the "
      "score sidecar")),
    (MergeFromSidecar("p/", None, "error", "k", "sk"), TABLE.append(pa.field("c", pa.int64())),
     ("column(s) a, c already exist in the table and mode is 'error'; use fill_missing (keep main) or "
      "prefer_sidecar (take the sidecar's)")),
])
def test_columns_absent_or_in_conflict_are_all_named_in_one_line(op, table, message):
    with pytest.raises(ShardError) as raised:
        op.column_plan(table, SOURCE, KEYS_ONLY)
    assert str(raised.value) == message


def test_a_sibling_whose_rows_cannot_be_decoded_is_named_when_its_window_is_read(tmp_path):
    """Its footer reads; the snappy-compressed values of its score column are overwritten."""
    uri = f"{tmp_path}/c.parquet"
    pq.write_table(pa.table({"image_key": list(range(100)), "s": [i * 1.37 for i in range(100)]}), uri,
                   compression="snappy", use_dictionary=False)
    chunk, data = pq.read_metadata(uri).row_group(0).column(1), bytearray((tmp_path / "c.parquet").read_bytes())
    end = chunk.data_page_offset + chunk.total_compressed_size
    data[end - 300:end - 10] = bytes(b ^ 0xFF for b in data[end - 300:end - 10])
    (tmp_path / "c.parquet").write_bytes(bytes(data))
    schema = pa.schema([("image_key", pa.int64())])
    stream = MergeFromSidecar(f"{tmp_path}/", ("s",)).stream(schema, KEYS_ONLY, "c.parquet", History(), 100, 100)
    with pytest.raises(ShardError) as raised:
        stream.apply(pa.table({"image_key": list(range(100))}, schema=schema), 0)
    stream.close()
    assert str(raised.value) == (f"source shard {uri} is not a readable parquet file (Corrupt snappy compressed "
                                 "data.); inspect the score sidecar")
