"""What the kernel writes around an output's rows, decided directly (tasks/kernel.py): its metadata, its row
group size, the declared extension columns it must carry, the steps it counts as skipped, and the one line a
failure to read a base shard gives (with whether a retry could help)."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import build, put_bytes, remove
from test_windows import write_groups

from tasks.config import load_pipeline
from tasks.errors import ShardError
from tasks.kernel import (PROVENANCE_KEY, Job, apply_operation, check_extensions, output_metadata, read_base,
                         row_group_rows, skipped_steps)
from tasks.ops import Status


def test_output_metadata_keeps_the_bases_but_pandas_and_adds_provenance_with_sorted_keys():
    schema = pa.schema([("k", pa.int64())], metadata={b"pandas": b"{}", b"origin": b"the base"})
    assert output_metadata(schema, {"rows": 3, "fingerprint": "f1"}) == {
        b"origin": b"the base", PROVENANCE_KEY: json.dumps({"fingerprint": "f1", "rows": 3}).encode()}
    plain = pa.schema([("k", pa.int64())])
    assert output_metadata(plain, {"b": 1, "a": 2}) == {PROVENANCE_KEY: b'{"a": 2, "b": 1}'}


def test_row_group_rows_is_the_largest_row_group_or_0(tmp_path):
    path = str(tmp_path / "f.parquet")
    write_groups(path, groups=(3, 0, 5, 1))
    assert row_group_rows(pq.ParquetFile(path)) == 5
    empty = str(tmp_path / "empty.parquet")
    pq.ParquetWriter(empty, pa.schema([("k", pa.int64())])).close()
    assert pq.ParquetFile(empty).metadata.num_row_groups == 0
    assert row_group_rows(pq.ParquetFile(empty)) == 0


def test_skipped_steps_counts_the_records_of_skipped_steps():
    records = [{"status": Status.SKIPPED.value}, {"status": Status.MERGED.value}, {}, {"status": "skipped"},
               {"status": Status.SKIPPED.value}]
    assert skipped_steps(records) == 2
    assert skipped_steps([]) == 0


@pytest.fixture
def job(tmp_path) -> Job:
    setup = build(tmp_path, str(tmp_path / "data"), shards=1)
    return Job(load_pipeline(setup.pipeline), setup.output)


def test_a_missing_or_mistyped_extension_column_is_named(job):
    first, second = job.pipeline.dataset.schema_extensions[:2]
    problem = second.type.problem(pa.string())
    assert problem, "a string column is not of the second declared type"
    without_first = pa.schema([(ext.name, pa.string()) for ext in job.pipeline.dataset.schema_extensions[1:]])
    with pytest.raises(ShardError) as info:
        check_extensions(job, without_first)
    assert str(info.value) == (f"declared extension column {first.name!r} ({first.type.name}) is missing "
                               "from the output")
    # allowed to miss (a skipped step), the columns after it are still checked
    with pytest.raises(ShardError) as info:
        check_extensions(job, without_first, allow_missing=True)
    assert str(info.value) == f"column {second.name!r}: {problem}"
    check_extensions(job, pa.schema([]), allow_missing=True)


REL = "2023/part-00000.parquet"


@pytest.mark.parametrize("damage, why", [
    (remove, "FileNotFoundError: "),
    (lambda uri: put_bytes(uri, b"PAR1" + b"\x00" * 100 + b"PAR1"), "not a readable parquet file ("),
])
def test_an_unreadable_base_shard_fails_its_shard_for_good(tmp_path, damage, why):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1)
    job = Job(load_pipeline(setup.pipeline), setup.output, fetch_ahead=False)
    damage(setup.prefixes["base"] + REL)
    with pytest.raises(ShardError) as info:
        read_base(job, REL)
    assert str(info.value).startswith(f"shard {REL}: reading base shard {setup.prefixes['base']}{REL}: {why}")
    assert info.value.transient is False


def test_an_operations_failure_names_the_shard_and_the_operation(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1)
    job = Job(load_pipeline(setup.pipeline), setup.output, fetch_ahead=False)
    dqm = setup.prefixes["dqm"]
    remove(dqm + REL)
    with pytest.raises(ShardError) as info:
        apply_operation(job, REL, 0, read_base(job, REL))
    assert str(info.value).startswith(f"shard {REL}: operations[0] (merge_from_sidecar from {dqm}): sibling "
                                      f"shard missing: {dqm}{REL}")
    assert info.value.transient is False
