"""A parquet file's rows as consecutive windows of any size, whatever its row groups.

The streaming merge reads the base and every sibling in lockstep, `take(n)` rows at a time; their row groups
need not line up, so each reader decodes batches as it goes and keeps only the rows not yet taken. It asks
pyarrow for one row group at a time: pyarrow pre-buffers (reads ahead, in as few requests as it can) every
row group it is asked for at once, which for the whole file would hold all its column chunks. Memory holds
about a window, a batch being decoded and one row group's column chunks, never the file.
"""
from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

BATCH_ROWS = 16_384  # rows pyarrow decodes at once (a window is made of such batches)


def batches(pf: pq.ParquetFile, columns: list[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The file's rows in batches, asking pyarrow for one row group at a time."""
    for group in range(pf.metadata.num_row_groups):
        yield from pf.iter_batches(batch_size=max(1, batch_rows), row_groups=[group], columns=columns,
                                   use_threads=True)


class RowWindows:
    def __init__(self, pf: pq.ParquetFile, columns: list[str], window_rows: int):
        self.schema = pa.schema([pf.schema_arrow.field(c) for c in columns], metadata=pf.schema_arrow.metadata)
        self.rows = pf.metadata.num_rows
        self._batches = batches(pf, columns, min(window_rows, BATCH_ROWS))
        self._held: list[pa.RecordBatch] = []
        self._held_rows = 0

    def take(self, n: int) -> pa.Table:
        """The next `n` rows (fewer only at the end of the file)."""
        while self._held_rows < n:
            batch = next(self._batches, None)
            if batch is None:
                break
            self._held.append(batch)
            self._held_rows += batch.num_rows
        table = pa.Table.from_batches(self._held, schema=self.schema)
        taken, rest = table.slice(0, n), table.slice(n)
        self._held, self._held_rows = rest.to_batches(), rest.num_rows
        return taken
