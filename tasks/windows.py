"""A parquet file's rows as consecutive windows of any size, whatever its row groups.

The streaming merge reads the base and every sibling in lockstep, `take(n)` rows at a time; their row groups
need not line up, so each reader decodes batches as it goes and keeps only the rows not yet taken: memory
holds about one window (plus a row group's worth of column chunks pyarrow reads at once), never the file.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


class RowWindows:
    def __init__(self, pf: pq.ParquetFile, columns: list[str], batch_rows: int):
        self.schema = pa.schema([pf.schema_arrow.field(c) for c in columns], metadata=pf.schema_arrow.metadata)
        self.rows = pf.metadata.num_rows
        self._batches = pf.iter_batches(batch_size=max(batch_rows, 1), columns=columns, use_threads=True)
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
