"""Verify's value-for-value comparison (tasks/verification/compare.py): NaN equals NaN at any depth, every other
difference is counted and the first one named in the one line a verify report shows."""
from __future__ import annotations

import pyarrow as pa
import pytest

from tasks import storage
from tasks.errors import ShardError
from tasks.verification.compare import SLICE, Tally, compare, one_line, read

NAN = float("nan")


def column(values, type=None) -> pa.ChunkedArray:
    return pa.chunked_array([pa.array(values, type=type)])


def test_nan_equals_nan_in_floats_structs_and_lists():
    """Arrow's own equality says NaN != NaN, so these reach the row-by-row comparison and must still pass."""
    floats = [1.0, NAN, 3.0]
    structs = [{"score": NAN, "error": "e"}, {"score": 0.5, "error": None}, None]
    lists = [[1.0, NAN], [], None]
    for values in (floats, structs, lists):
        assert not column(values).equals(column(values))
        assert compare("c", column(values), column(values)) is None


def test_a_nan_against_a_number_differs():
    assert compare("f", column([NAN, 1.0]), column([2.0, 1.0])) == \
        "column 'f': 1 of 2 rows differ, first at row 0: nan vs 2.0"


def test_struct_differences_are_counted_and_the_first_named():
    got = column([{"score": NAN, "error": "e"}, None, {"score": 0.25, "error": "x"}])
    want = column([{"score": NAN, "error": "e"}, {"score": 1.0, "error": "e"}, {"score": 0.5, "error": "x"}])
    assert compare("wm", got, want) == ("column 'wm': 2 of 3 rows differ, first at row 1: "
                                        "None vs {'score': 1.0, 'error': 'e'}")


def test_list_differences_are_counted_and_the_first_named():
    """A null list, a longer list and a list with another element each differ; a NaN in the same place does not."""
    got = column([[1.0, NAN], None, [1.0, 2.0], [3.0, NAN]])
    want = column([[1.0, NAN], [1.0], [1.0], [3.0, 4.0]])
    assert compare("l", got, want) == "column 'l': 3 of 4 rows differ, first at row 1: None vs [1.0]"


@pytest.mark.parametrize("length, shown", [
    (78, repr("a" * 78) + " vs " + repr("b" * 78)),             # repr of 80 characters: shown whole
    (79, repr("a" * 79)[:77] + "... vs " + repr("b" * 79)[:77] + "..."),  # 81: cut to 77 and "..."
])
def test_long_values_are_cut_to_80_characters(length, shown):
    got, want = column(["same", "a" * length]), column(["same", "b" * length])
    assert compare("s", got, want) == f"column 's': 1 of 2 rows differ, first at row 1: {shown}"


def test_a_difference_after_an_equal_slice_is_found():
    size = SLICE + 100
    got, want = column(list(range(size))), column([*range(SLICE + 50), -1, *range(SLICE + 51, size)])
    assert compare("n", got, want) == f"column 'n': 1 of {size} rows differ, first at row {SLICE + 50}: " \
                                      f"{SLICE + 50} vs -1"


def test_types_must_match_unless_a_cast_is_asked_for():
    """Key columns compare across widths (cast=True); every other column must have the expected type."""
    small, wide = column([1, 2], pa.int32()), column([1, 3], pa.int64())
    assert compare("k", wide, small) == "column 'k' is int64, expected int32"
    assert compare("k", wide, small, cast=True) == "column 'k': 1 of 2 rows differ, first at row 1: 3 vs 2"
    assert compare("k", wide, column(["1", "x"]), cast=True) == "column 'k' is int64, expected string"
    assert compare("k", wide, column([1]), cast=True) == "column 'k' has 2 rows, expected 1"


def test_read_takes_the_columns_asked_for_or_all_but_one(root):
    uri = root + "a/part-0.parquet"
    storage.write_atomic(pa.table({"k": [1, 2], "image": [b"x", b"y"], "score": [0.5, 0.25]}), uri)
    assert read(uri).column_names == ["k", "image", "score"]
    assert read(uri, ["score"]).column_names == ["score"]
    assert read(uri, drop="image").column_names == ["k", "score"]
    assert read(uri, ["score"], drop="k").column_names == ["score"]  # `drop` only when no columns are named
    assert read(uri, drop="image")["score"].to_pylist() == [0.5, 0.25]


@pytest.mark.parametrize("exc, line", [
    (ShardError("shard a/b.parquet: operations[0]: 2 keys differ\nfirst at row 3"),
     "shard a/b.parquet: operations[0]: 2 keys differ"),
    (ShardError("   "), ""),
    (OSError("cannot read s3://b/x.parquet\ndetails"), "OSError: cannot read s3://b/x.parquet"),
    (ValueError(""), "ValueError: "),
])
def test_one_line_is_the_first_line_named_by_type_unless_a_shard_error(exc, line):
    assert one_line(exc) == line


def test_a_tally_counts_over_its_windows_names_the_shards_rows_and_casts_only_when_asked():
    tally = Tally("c")  # rows not given: the rows compared, over every window
    tally.add(column([1, 2]), column([1, 3]), offset=0)
    tally.add(column([4, 5]), column([4, 5]), offset=2)
    assert tally.line() == "column 'c': 1 of 4 rows differ, first at row 1: 2 vs 3"
    shard = Tally("c", rows=10)
    shard.add(column([1, 2]), column([1, 3]), offset=4)
    assert shard.line() == "column 'c': 1 of 10 rows differ, first at row 5: 2 vs 3"
    typed = Tally("c")
    typed.add(column([1], pa.int32()), column([1], pa.int64()))
    assert typed.line() == "column 'c' is int32, expected int64"
