"""Value-for-value comparison of two columns (NaN equals NaN), and the rows a value check flags: one line each,
naming the first row."""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks import storage
from tasks.errors import ShardError

SLICE = 4096


def _same(a, b) -> bool:
    """Python values equal, NaN equal to NaN (recursively through structs and lists)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Tally:
    """One column's comparison over consecutive windows of a shard: rows that differ counted, the first named
    by its row within the shard (a window's rows start at `offset`). A type or row-count mismatch is the line."""

    def __init__(self, name: str, rows: int | None = None):
        self.name, self.rows = name, rows  # rows: the shard's, for the line (else the rows compared)
        self.compared = self.bad = 0
        self.first: tuple | None = None
        self.problem: str | None = None

    def add(self, got: pa.ChunkedArray, want: pa.ChunkedArray, offset: int = 0, cast: bool = False) -> None:
        if self.problem is not None:
            return
        if not got.type.equals(want.type):
            want = self._cast(got, want, cast)
            if want is None:
                return
        if len(got) != len(want):
            self.problem = f"column {self.name!r} has {len(got)} rows, expected {len(want)}"
            return
        self.compared += len(got)
        if not got.equals(want):
            self._count(got, want, offset)

    def _cast(self, got: pa.ChunkedArray, want: pa.ChunkedArray, cast: bool) -> pa.ChunkedArray | None:
        try:
            if cast:
                return want.cast(got.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        self.problem = f"column {self.name!r} is {got.type}, expected {want.type}"
        return None

    def _count(self, got: pa.ChunkedArray, want: pa.ChunkedArray, offset: int) -> None:
        for start in range(0, len(got), SLICE):
            g, w = got.slice(start, SLICE), want.slice(start, SLICE)
            if g.equals(w):
                continue
            for i, (x, y) in enumerate(zip(g.to_pylist(), w.to_pylist())):
                if not _same(x, y):
                    self.bad += 1
                    if self.first is None:
                        self.first = (offset + start + i, x, y)

    def line(self) -> str | None:
        """None while equal value for value (NaN equal to NaN), else one line: how many rows differ, the first."""
        if self.problem is not None or not self.bad:
            return self.problem  # None: equal, or only NaNs differed
        row, x, y = self.first
        rows = self.compared if self.rows is None else self.rows
        return (f"column {self.name!r}: {self.bad} of {rows} rows differ, first at row {row}: "
                f"{_short(x)} vs {_short(y)}")


class Flagged:
    """The rows of one column a value check flags, over consecutive windows of a shard: counted, the first named
    by its row within the shard and its value (a window's rows start at `offset`)."""

    def __init__(self, name: str, what: str, rows: int):
        self.name, self.what, self.rows = name, what, rows
        self.bad = 0
        self.first: tuple | None = None

    def add(self, bad: pa.ChunkedArray, values: pa.ChunkedArray, offset: int = 0) -> None:
        """`bad`: a boolean per row of `values` (null: not flagged)."""
        count = pc.sum(bad).as_py() or 0
        if count and self.first is None:
            row = pc.index(pc.fill_null(bad, False), True).as_py()
            self.first = (offset + row, values[row].as_py())
        self.bad += count

    def line(self) -> str | None:
        if not self.bad:
            return None
        row, value = self.first
        return f"column {self.name!r}: {self.bad} of {self.rows} rows {self.what}, first at row {row}: {_short(value)}"


def compare(name: str, got: pa.ChunkedArray, want: pa.ChunkedArray, cast: bool = False) -> str | None:
    """None when equal value for value, else one line: how many rows differ and the first one."""
    tally = Tally(name)
    tally.add(got, want, cast=cast)
    return tally.line()


def read(uri: str, columns: list[str] | None = None, drop: str | None = None) -> pa.Table:
    """A shard's columns (all but `drop` when columns is None)."""
    with storage.open_parquet(uri) as f:
        pf = pq.ParquetFile(f)
        if columns is None and drop is not None:
            columns = [n for n in pf.schema_arrow.names if n != drop]
        return pf.read(columns=columns, use_threads=True)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(exc, ShardError) else f"{type(exc).__name__}: {first}"
