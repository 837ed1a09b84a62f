"""The post-write check compares the written key column with the base's, nulls included (issue 26, case 1).

pc.all(pc.equal(a, b)) is true where either side is null: a null written where the base has a value (or the
other way round) passed the check. A written key equals the base's only when both are the same value or both
are null (a faithful copy of the base's keys). The check is driven with real parquet bytes of a merged shard
(`payload`) whose key column was altered, against the base's keys as the shard task read them.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from core_fixtures import build, read_table

from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ShardError
from tasks.kernel import Job, ShardStats, merge_shard, same_keys, check_written

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REL = sorted(relpaths(1))[0]
ROW = 3


@pytest.fixture
def merged(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    stats = merge_shard(job, REL)
    return job, stats, read_table(setup.output + REL)


def with_null(column: pa.ChunkedArray, row: int) -> pa.ChunkedArray:
    values = column.to_pylist()
    values[row] = None
    return pa.chunked_array([pa.array(values, column.type)])


def payload(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=7)  # several batches: the null is not in the first
    return sink.getvalue()


def check(job: Job, stats: ShardStats, written: pa.Table, base_keys: pa.ChunkedArray) -> None:
    check_written(job, REL, stats, payload(written), base_keys.chunks)


def test_a_null_written_where_the_base_has_a_key_fails_the_check(merged):
    job, stats, table = merged
    key = job.pipeline.dataset.key_column
    written = table.set_column(table.schema.get_field_index(key), key, with_null(table[key], ROW))
    with pytest.raises(ShardError, match=f"shard {REL}: verifying .*: key column '{key}' of the output differs "
                                         "from the base"):
        check(job, stats, written, table[key])


def test_a_value_written_where_the_base_has_a_null_fails_the_check(merged):
    job, stats, table = merged
    key = job.pipeline.dataset.key_column
    with pytest.raises(ShardError, match=f"key column '{key}' of the output differs from the base"):
        check(job, stats, table, with_null(table[key], ROW))


def test_a_null_written_where_the_base_has_a_null_passes(merged):
    job, stats, table = merged
    key = job.pipeline.dataset.key_column
    keys = with_null(table[key], ROW)
    written = table.set_column(table.schema.get_field_index(key), key, keys)
    assert check(job, stats, written, keys) is None
    assert not same_keys(keys.chunks, iter([keys.slice(0, ROW).combine_chunks(), keys.slice(ROW + 1).combine_chunks()]))


@pytest.mark.parametrize("base, written, same", [
    (["a", "b", "c"], ["a", "b", "c"], True),
    (["a", "b", "c"], ["a", None, "c"], False),
    (["a", None, "c"], ["a", "b", "c"], False),
    (["a", None, "c"], ["a", None, "c"], True),
    ([None, None], [None, None], True),
    (["a", "b"], ["a", "c"], False),
    (["a", "b"], ["a"], False),
    (["a"], ["a", "b"], False),
], ids=["equal", "null-written", "null-base", "both-null", "all-null", "value", "fewer", "more"])
def test_same_keys_needs_each_written_key_equal_nulls_included(base, written, same):
    batches = [pa.array(written[:1], pa.string()), pa.array(written[1:], pa.string())]
    assert same_keys([pa.array(base, pa.string())], iter(batches)) is same


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", None]), max_size=12), st.data())
def test_same_keys_whatever_the_batches_on_either_side(keys, data):
    """Both sides read a batch at a time, in batches of any sizes (empty ones too): equal keys are the same,
    any one key changed, dropped or added is not."""
    def cut(values):
        bounds = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=4)))
        edges = [0, *bounds, len(values)]
        return [pa.array(values[a:b], pa.string()) for a, b in zip(edges, edges[1:])]

    assert same_keys(cut(keys), iter(cut(keys)))
    if keys:
        row = data.draw(st.integers(0, len(keys) - 1))
        changed = [*keys[:row], "z" if keys[row] is not None else "a", *keys[row + 1:]]
        assert not same_keys(cut(keys), iter(cut(changed)))
        assert not same_keys(cut(keys), iter(cut(keys[:-1])))
    assert not same_keys(cut(keys), iter(cut([*keys, "a"])))


@pytest.mark.parametrize("got, want", [(["a", None, "c"], ["a", "b", "c"]), (["a", "b", "c"], ["a", None, "c"])],
                         ids=["null-written", "null-expected"])
def test_verify_and_alignment_count_a_null_key_as_a_difference(got, want):
    """The other key comparisons in tasks/ (checked for the same trap): verify's value compare and the merge's
    alignment both count a null against a value as a mismatch."""
    from tasks.ops.alignment import check_aligned
    from tasks.verification.compare import compare

    g, w = pa.chunked_array([pa.array(got)]), pa.chunked_array([pa.array(want)])
    assert compare("k", g, w) == f"column 'k': 1 of 3 rows differ, first at row 1: {got[1]!r} vs {want[1]!r}"
    with pytest.raises(ShardError, match="key mismatch in 1 of 3 rows; first at row 1"):
        check_aligned(pa.table({"k": g}), "k", pa.table({"k": w}), "k")
