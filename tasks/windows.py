"""A parquet file's rows as consecutive windows of any size, whatever its row groups, and how big a window is.

The streaming merge reads the base and every sibling in lockstep, `take(n)` rows at a time; their row groups
need not line up, so each reader keeps only the rows not yet taken. A row group that fits in the rows still wanted
is read whole (one call, one chunk a column: the common case, windows following the base's row groups); a larger
one is decoded in batches as it goes. Either way pyarrow is asked for one row group at a time: it pre-buffers
(reads ahead, in as few requests as it can) every row group it is asked for at once, which for the whole file
would hold all its column chunks. A local file is read through small buffers (`parquet_file`), so not even one
row group's column chunks are held whole; a remote one a column chunk per request (a request costs a round trip).

A window's size comes from a budget, not from the writer's row groups (`window_rows`): the base's row groups when
the largest fits in it (windows, and so the output's row groups, then follow the base's), else as many rows as
fit, measured on the merged first rows. Memory holds about a window, a batch being decoded and the reads'
buffers, never a row group of any size, never the file.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cache

import pyarrow as pa
import pyarrow.parquet as pq

BATCH_ROWS = 16_384  # rows pyarrow decodes at once (a window is made of such batches)
WINDOW_BYTES = 32 << 20  # default budget: decoded (Arrow) bytes of a window of merged rows, an output row group
MAX_WINDOW_ROWS = 1 << 20  # pyarrow's own largest row group
PROBE_ROWS = 4096  # the first rows, merged to measure a row's bytes; they begin the first window
READ_BUFFER = 256 << 10  # a local column chunk is read through a buffer of this size, not whole


@cache
def use_returning_memory_pool() -> None:
    """What pyarrow's Python layer allocates comes from jemalloc in this process: it gives the windows' freed
    memory back to the system within a second, where pyarrow's default (mimalloc) kept ~100 MiB more of a
    1.5M-row shard's at the same CPU time. Arrow's C++ internals (the parquet reader's) follow only
    ARROW_DEFAULT_MEMORY_POOL, read once as pyarrow loads: the command line and Ray's workers set it to jemalloc
    (flows/cli.py, flows/runners.py); a pool chosen that way is kept. A pyarrow without jemalloc keeps its own."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:
        pass


def parquet_file(f) -> pq.ParquetFile:
    """A ParquetFile that reads a local file (a pyarrow NativeFile) through small buffers, a page at a time, and
    anything else (an S3 object, one fetched into memory) a row group's column chunks at once, in as few reads as
    pyarrow can (pre-buffered: a request costs a round trip)."""
    if isinstance(f, pa.NativeFile):
        return pq.ParquetFile(f, buffer_size=READ_BUFFER, pre_buffer=False)
    return pq.ParquetFile(f)


def window_rows(natural: int, row_bytes: float, budget: int = WINDOW_BYTES) -> int:
    """Rows a window holds: `natural` (the base's largest row group) when it fits in `budget` bytes at `row_bytes`
    a row, else as many rows as fit (at least PROBE_ROWS, at most MAX_WINDOW_ROWS)."""
    fit = max(PROBE_ROWS, min(int(budget // max(row_bytes, 1.0)), MAX_WINDOW_ROWS))
    return natural if 0 < natural <= fit else fit


def batches(pf: pq.ParquetFile, columns: list[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The file's rows in batches, asking pyarrow for one row group at a time."""
    for group in range(pf.metadata.num_row_groups):
        yield from pf.iter_batches(batch_size=max(1, batch_rows), row_groups=[group], columns=columns,
                                   use_threads=True)


class RowWindows:
    def __init__(self, pf: pq.ParquetFile, columns: list[str], window_rows: int, schema: pa.Schema | None = None):
        """`schema`: the batches' own where `columns` name nested fields ("a.b": a struct of b alone)."""
        self.schema = schema or pa.schema([pf.schema_arrow.field(c) for c in columns],
                                          metadata=pf.schema_arrow.metadata)
        self.rows = pf.metadata.num_rows
        self._pf, self._columns, self._batch_rows = pf, columns, max(1, min(window_rows, BATCH_ROWS))
        self._group = 0                                       # the next row group not yet started
        self._batches: Iterator[pa.RecordBatch] = iter(())    # the rest of a row group being decoded in batches
        self._held: list[pa.RecordBatch] = []
        self._held_rows = 0

    def _more(self, wanted: int) -> list[pa.RecordBatch]:
        """The next rows: the next batch of the row group being decoded, else the next row group, read whole
        when it fits in the `wanted` rows (one call, one chunk: the common case of windows that follow the row
        groups) or else decoded in batches. [] at the end of the file."""
        while True:
            batch = next(self._batches, None)
            if batch is not None:
                return [batch]
            if self._group >= self._pf.metadata.num_row_groups:
                return []
            group, self._group = self._group, self._group + 1
            rows = self._pf.metadata.row_group(group).num_rows
            if 0 < rows <= wanted:
                return self._pf.read_row_group(group, columns=self._columns).to_batches()
            self._batches = self._pf.iter_batches(batch_size=self._batch_rows, row_groups=[group],
                                                  columns=self._columns, use_threads=True)

    @property
    def file(self) -> pq.ParquetFile:
        return self._pf

    def reread(self, column: str) -> Iterator[pa.Array]:
        """`column` again from the file's first row, a batch at a time, from the same open file (the same bytes:
        a local file's descriptor, an S3 object's reads pinned to its ETag)."""
        return (batch.column(0) for batch in batches(self._pf, [column]))

    def take(self, n: int) -> pa.Table:
        """The next `n` rows (fewer only at the end of the file)."""
        while self._held_rows < n:
            more = self._more(n - self._held_rows)
            if not more:
                break
            self._held += more
            self._held_rows += sum(batch.num_rows for batch in more)
        table = pa.Table.from_batches(self._held, schema=self.schema)
        taken, rest = table.slice(0, n), table.slice(n)
        self._held, self._held_rows = rest.to_batches(), rest.num_rows
        return taken
