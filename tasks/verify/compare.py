"""Value-for-value comparison of two columns: NaN equals NaN, one line naming the first differing row."""
from __future__ import annotations

import math

import pyarrow as pa
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


def compare(name: str, got: pa.ChunkedArray, want: pa.ChunkedArray, cast: bool = False) -> str | None:
    """None when equal value for value, else one line: how many rows differ and the first one."""
    if not got.type.equals(want.type):
        if not cast:
            return f"column {name!r} is {got.type}, expected {want.type}"
        try:
            want = want.cast(got.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return f"column {name!r} is {got.type}, expected {want.type}"
    if len(got) != len(want):
        return f"column {name!r} has {len(got)} rows, expected {len(want)}"
    if got.equals(want):
        return None
    bad, first = 0, None
    for offset in range(0, len(got), SLICE):
        g, w = got.slice(offset, SLICE), want.slice(offset, SLICE)
        if g.equals(w):
            continue
        for i, (x, y) in enumerate(zip(g.to_pylist(), w.to_pylist())):
            if not _same(x, y):
                bad += 1
                if first is None:
                    first = (offset + i, x, y)
    if not bad:
        return None  # only NaNs differed
    row, x, y = first
    return f"column {name!r}: {bad} of {len(got)} rows differ, first at row {row}: {_short(x)} vs {_short(y)}"


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
