"""Score statistics for struct score columns (raw_score / score / error), mergeable shard by shard.

Each shard yields a small `ColumnPartial`; partials add up in the driver, which never holds a table.
Histograms have BINS equal bins over [min, max] of the whole scope: bin = min(floor((v - lo) / width), BINS - 1)
with width = (hi - lo) / BINS (all in float64; lo == hi widens the range by 0.5 each side, as numpy does).
The range comes from the output footers' column statistics, so one data pass is enough; where footers
lack statistics (or disagree with the data), the caller runs a second pass with the exact range.
Null and NaN scores are left out of min/mean/max/histogram; a null struct row counts as a null raw_score.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BINS = 10
SCORE_FIELDS = ("raw_score", "score")


@dataclass(frozen=True)
class StatSpec:
    """A declared struct extension column and which score fields its type declares."""

    column: str
    fields: tuple[str, ...]       # subset of SCORE_FIELDS
    has_error: bool


def stat_specs(dataset) -> tuple[StatSpec, ...]:
    specs = []
    for ext in dataset.schema_extensions:
        if ext.type.kind != "struct":
            continue
        fields = tuple(f for f in SCORE_FIELDS if f in ext.type.fields)
        if fields:
            specs.append(StatSpec(ext.name, fields, "error" in ext.type.fields))
    return tuple(specs)


def widen(lo: float, hi: float) -> tuple[float, float]:
    return (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)


def edges(lo: float, hi: float) -> list[float]:
    lo, hi = widen(lo, hi)
    width = (hi - lo) / BINS
    return [lo + i * width for i in range(BINS)] + [hi]


@dataclass
class FieldPartial:
    count: int = 0
    total: float = 0.0
    min: float | None = None
    max: float | None = None
    hist: list[int] | None = None
    hist_range: tuple[float, float] | None = None  # the (lo, hi) the histogram was binned with

    def add(self, other: FieldPartial) -> None:
        if other.count and not self.count:
            self.hist, self.hist_range = (list(other.hist) if other.hist else None), other.hist_range
        elif other.count:
            if self.hist is not None and other.hist is not None and self.hist_range == other.hist_range:
                self.hist = [a + b for a, b in zip(self.hist, other.hist)]
            else:  # binned differently (or not at all): the caller recomputes
                self.hist, self.hist_range = None, None
        self.count += other.count
        self.total += other.total
        if other.min is not None:
            self.min = other.min if self.min is None else min(self.min, other.min)
            self.max = other.max if self.max is None else max(self.max, other.max)

    def histogram_ok(self) -> bool:
        """True when the histogram covers exactly [min, max] of the data (or there is no data)."""
        if self.count == 0:
            return True
        return self.hist is not None and self.hist_range == (self.min, self.max)

    def to_dict(self) -> dict:
        hist = None
        if self.count and self.histogram_ok():
            hist = {"edges": edges(self.min, self.max), "counts": list(self.hist)}
        return {"count": self.count, "min": self.min, "max": self.max,
                "mean": self.total / self.count if self.count else None, "histogram": hist}


@dataclass
class ColumnPartial:
    column: str
    shards: int = 0
    rows: int = 0
    errors: int | None = None
    null_raw_score: int | None = None
    fields: dict[str, FieldPartial] = field(default_factory=dict)

    def add(self, other: ColumnPartial) -> None:
        self.shards += other.shards
        self.rows += other.rows
        if other.errors is not None:
            self.errors = (self.errors or 0) + other.errors
        if other.null_raw_score is not None:
            self.null_raw_score = (self.null_raw_score or 0) + other.null_raw_score
        for name, part in other.fields.items():
            self.fields.setdefault(name, FieldPartial()).add(part)

    def to_dict(self) -> dict:
        return {"column": self.column, "shards": self.shards, "rows": self.rows, "errors": self.errors,
                "null_raw_score": self.null_raw_score,
                "fields": {name: part.to_dict() for name, part in self.fields.items()}}


def _valid_floats(values: pa.ChunkedArray) -> pa.ChunkedArray:
    values = pc.drop_null(values.cast(pa.float64()))
    return pc.filter(values, pc.invert(pc.is_nan(values)))


def _null_or_nan(values: pa.ChunkedArray) -> int:
    values = values.cast(pa.float64())
    return int(pc.sum(pc.or_(pc.is_null(values), pc.fill_null(pc.is_nan(values), True))).as_py() or 0)


def histogram(values: pa.ChunkedArray, lo: float, hi: float) -> list[int]:
    lo, hi = widen(lo, hi)
    width = (hi - lo) / BINS
    index = pc.floor(pc.divide(pc.subtract(values, lo), width))
    index = pc.cast(pc.min_element_wise(pc.max_element_wise(index, 0.0), float(BINS - 1)), pa.int64())
    counts = [0] * BINS
    for item in pc.value_counts(index).to_pylist():
        counts[item["values"]] += item["counts"]
    return counts


def field_partial(values: pa.ChunkedArray, hist_range: tuple[float, float] | None) -> FieldPartial:
    valid = _valid_floats(values)
    part = FieldPartial(count=len(valid))
    if len(valid):
        bounds = pc.min_max(valid).as_py()
        part.min, part.max = bounds["min"], bounds["max"]
        part.total = float(pc.sum(valid).as_py())
    if hist_range is not None:
        part.hist = histogram(valid, *hist_range) if len(valid) else [0] * BINS
        part.hist_range = hist_range
    return part


def column_partial(table: pa.Table, spec: StatSpec,
                   ranges: dict[str, tuple[float, float] | None]) -> ColumnPartial | None:
    """Statistics of one shard's column; None when the shard does not have it (a skipped operation)."""
    if spec.column not in table.column_names:
        return None
    col = table[spec.column]
    if not pa.types.is_struct(col.type):
        return None  # the schema check reports the wrong type
    present = {col.type.field(i).name for i in range(col.type.num_fields)}
    part = ColumnPartial(spec.column, shards=1, rows=len(col))
    if spec.has_error and "error" in present:
        error = pc.struct_field(col, "error")
        part.errors = int(pc.sum(pc.fill_null(pc.not_equal(pc.cast(error, pa.string()), ""), False)).as_py() or 0)
    for name in spec.fields:
        if name not in present:
            continue
        values = pc.struct_field(col, name)  # null where the struct row itself is null
        if name == "raw_score":
            part.null_raw_score = _null_or_nan(values)
        part.fields[name] = field_partial(values, ranges.get(f"{spec.column}.{name}"))
    return part


def footer_ranges(metadata: pq.FileMetaData, specs: tuple[StatSpec, ...]) -> dict[str, tuple[float, float] | None]:
    """min/max of every score leaf ('col.field') from column chunk statistics; None where any are missing."""
    wanted = {f"{s.column}.{f}" for s in specs for f in s.fields}
    ranges: dict[str, tuple[float, float] | None] = {}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            path = chunk.path_in_schema
            if path not in wanted:
                continue
            stats = chunk.statistics
            if path in ranges and ranges[path] is None:
                continue
            if stats is None or not stats.has_min_max:
                if not (stats is not None and stats.null_count == chunk.num_values):
                    ranges[path] = None  # values present but no statistics
                continue
            lo, hi = float(stats.min), float(stats.max)
            old = ranges.get(path)
            ranges[path] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return ranges


def merge_ranges(into: dict, ranges: dict) -> None:
    """Combine per-shard footer ranges; a None (statistics missing) poisons that leaf."""
    for path, rng in ranges.items():
        if path in into and (into[path] is None or rng is None):
            into[path] = None
        elif path in into:
            into[path] = (min(into[path][0], rng[0]), max(into[path][1], rng[1]))
        else:
            into[path] = rng
