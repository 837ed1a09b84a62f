"""A parquet file's rows in windows (tasks/windows.py) driven directly: the columns asked for with the file's
metadata, batches of the size asked for, a window that is exactly a row group as one chunk, and memory that
holds a window, never the file (bytes read counted, buffers of a window measured).
test_streaming.py checks the rows of windows of every size against the file."""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.windows import BATCH_ROWS, RowWindows, batches, window_rows

GROUPS = (3, 0, 5, 1, 11)  # rows of each row group: one empty


def write_groups(path: str, groups=GROUPS, metadata=None) -> pa.Table:
    rows = sum(groups)
    table = pa.table({"k": [f"key-{i:05d}" for i in range(rows)], "v": list(range(rows)),
                      "image": [b"jpeg"] * rows}).replace_schema_metadata(metadata)
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for size in groups:
            writer.write_table(table.slice(start, size))
            start += size
    return table


def test_batches_hold_the_columns_asked_for_in_batches_of_the_size_asked_for(tmp_path):
    path = str(tmp_path / "f.parquet")
    table = write_groups(path)
    got = list(batches(pq.ParquetFile(path), ["v"], batch_rows=4))
    assert [b.num_rows for b in got] == [3, 4, 1, 1, 4, 4, 3]  # never across a row group
    assert all(b.schema.names == ["v"] for b in got)
    assert pa.Table.from_batches(got).column("v").equals(table.column("v"))
    assert [b.num_rows for b in batches(pq.ParquetFile(path), ["k"], batch_rows=1)] == [1] * sum(GROUPS)
    assert [b.num_rows for b in batches(pq.ParquetFile(path), ["k"], batch_rows=0)] == [1] * sum(GROUPS)


def test_windows_hold_the_columns_asked_for_with_the_files_metadata(tmp_path):
    path = str(tmp_path / "f.parquet")
    table = write_groups(path, metadata={b"origin": b"the base"})
    reader = RowWindows(pq.ParquetFile(path), ["v", "k"], window_rows=4)
    expected = pa.schema([("v", pa.int64()), ("k", pa.string())], metadata={b"origin": b"the base"})
    assert reader.rows == sum(GROUPS)
    assert reader.schema.equals(expected, check_metadata=True)
    windows = [reader.take(n) for n in (4, 4, 4, 4, 4)]
    assert all(w.schema.equals(expected, check_metadata=True) for w in windows)
    rows = table.select(["v", "k"]).replace_schema_metadata(expected.metadata)
    assert pa.concat_tables(windows).equals(rows, check_metadata=True)
    end = reader.take(4)
    assert end.num_rows == 0 and end.schema.equals(expected, check_metadata=True)


def test_a_window_that_is_a_row_group_larger_than_a_batch_comes_as_one_chunk(tmp_path):
    """Read whole (one call), not decoded in batches of BATCH_ROWS."""
    path = str(tmp_path / "f.parquet")
    rows = BATCH_ROWS + 100
    write_groups(path, groups=(rows, 7))
    reader = RowWindows(pq.ParquetFile(path), ["k", "v"], window_rows=rows)
    window = reader.take(rows)
    assert window.num_rows == rows
    assert window.column("k").num_chunks == 1 and window.column("v").num_chunks == 1
    assert reader.take(rows).num_rows == 7


class CountingFile(io.FileIO):
    """A local file that counts the bytes read from it."""

    read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        self.read_bytes += len(data)
        return data


def group_bytes(path: str, group: int) -> int:
    meta = pq.ParquetFile(path).metadata.row_group(group)
    return sum(meta.column(i).total_compressed_size for i in range(meta.num_columns))


def constant_groups(path: str, groups: list[int]) -> str:
    """One int64 column of a constant value (its column chunks compress to almost nothing), in these row
    groups."""
    table = pa.table({"v": pa.array([7] * sum(groups), pa.int64())})
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for rows in groups:
            writer.write_table(table.slice(start, rows))
            start += rows
    return path


def test_a_window_reads_only_the_row_groups_it_needs(tmp_path):
    """Row groups of 20,000 rows taken in windows of 20,000, or of 2,000 taken 10 at a time: a window reads
    its row groups and not the next one (nor the rest of the file)."""
    for rows, group, window in ((200_000, 20_000, 20_000), (200_000, 2_000, 20_000)):
        path = constant_groups(str(tmp_path / f"groups-of-{group}.parquet"), [group] * (rows // group))
        with CountingFile(path) as f:
            reader = RowWindows(pq.ParquetFile(f), ["v"], window_rows=window)
            opened = f.read_bytes
            assert reader.take(window).num_rows == window
            needed = sum(group_bytes(path, g) for g in range(window // group))
            assert needed <= f.read_bytes - opened < needed + group_bytes(path, window // group)


@pytest.mark.parametrize("groups, window, batches", [
    ([200_000], 10_000, 1),   # windows cut from one row group: a batch each
    ([20], 1, 1),             # 1-row windows: 1-row batches
    ([10_000] * 3, 10_000, 1),  # windows that are the row groups: read whole
    ([999] + [1_999] * 5, 1_000, 2),  # windows across row groups: parts of two batches of a window each
])
def test_a_window_holds_buffers_of_about_its_own_rows(tmp_path, groups, window, batches):
    """Rows are decoded in batches of the window's size (never pyarrow's default 65,536 rows, nor a row group
    larger than the rows still wanted): a window's buffers hold at most `batches` windows' worth of rows."""
    reader = RowWindows(pq.ParquetFile(constant_groups(str(tmp_path / "f.parquet"), groups)), ["v"], window)
    for _ in range(sum(groups) // window):
        taken = reader.take(window)
        assert taken.num_rows == window and taken.get_total_buffer_size() <= batches * taken.nbytes


def test_a_window_holds_the_whole_rows_its_budget_pays_for():
    """Rows of 1 byte: the budget's bytes in rows; and always the floor of the exact quotient (a float
    division can round 144987.99... up to 144988)."""
    assert window_rows(0, 1.0, 10_000) == 10_000
    assert window_rows(0, 462.8580572185285, 64 << 20) == 144987
