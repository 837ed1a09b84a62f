"""merge_from_sidecar: copy columns from a row-aligned sibling shard after proving the rows line up.

No joins, no global index, no filename matching: the sibling shard is `source_prefix + relpath`, and its
key column must equal the current table's key column element by element (a null key is a mismatch).
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks import storage
from tasks.errors import ShardError

MODES = ("fill_missing", "prefer_sidecar", "error")
ABSENT = "absent"  # the input identity recorded for an optional operation whose sibling does not exist


@dataclass(frozen=True)
class ColumnPlan:
    append: tuple[str, ...]
    replace: tuple[str, ...]
    kept_from_main: tuple[str, ...]  # fill_missing: already present, main wins
    protected: tuple[str, ...]       # key / image column: never taken from a sidecar

    def read_columns(self, key: str) -> list[str]:
        return list(dict.fromkeys([key, *self.append, *self.replace]))


@dataclass(frozen=True)
class MergeFromSidecar:
    type = "merge_from_sidecar"

    source_prefix: str
    columns: tuple[str, ...] | None = None
    mode: str = "fill_missing"
    target_key_column: str | None = None
    source_key_column: str | None = None
    required: bool = True

    @classmethod
    def from_yaml(cls, fields, dataset, prefix_field) -> MergeFromSidecar:
        source_prefix = prefix_field(fields, "source_prefix")
        columns = fields.get("columns", list, required=False)
        if columns is not None:
            if not columns:
                raise fields.fail("columns", "must list at least one column (omit it to take every column)")
            for i, col in enumerate(columns):
                if not isinstance(col, str) or not col.strip():
                    raise fields.fail("columns", f"columns[{i}] must be a non-empty column name")
            if len(set(columns)) != len(columns):
                raise fields.fail("columns", "lists a column twice")
            columns = tuple(columns)
        mode = fields.get("mode", str, required=False, default="fill_missing")
        if mode not in MODES:
            raise fields.fail("mode", f"unknown mode {mode!r} (known: {', '.join(MODES)})")
        target_key = fields.name("target_key_column", required=False)
        source_key = fields.name("source_key_column", required=False)
        if (target_key is None) != (source_key is None):
            given, other = ("target_key_column", "source_key_column") if target_key else (
                "source_key_column", "target_key_column")
            raise fields.fail(given, f"set together with {other}, or omit both to use the dataset's "
                                     f"key_column ({dataset.key_column})")
        required = fields.get("required", bool, required=False, default=True)
        return cls(source_prefix, columns, mode, target_key, source_key, required)

    def to_dict(self) -> dict:
        return {"type": self.type, "source_prefix": self.source_prefix,
                "columns": list(self.columns) if self.columns is not None else None, "mode": self.mode,
                "target_key_column": self.target_key_column, "source_key_column": self.source_key_column,
                "required": self.required}

    def describe(self) -> str:
        return f"{self.type} from {self.source_prefix}"

    def inputs(self) -> list[str]:
        return [self.source_prefix]

    def keys(self, dataset) -> tuple[str, str]:
        return (self.target_key_column or dataset.key_column, self.source_key_column or dataset.key_column)

    def column_plan(self, current: pa.Schema, source: pa.Schema, dataset) -> ColumnPlan:
        """Decide what to copy from footers alone; raises ShardError for what cannot work."""
        target_key, source_key = self.keys(dataset)
        if target_key not in current.names:
            raise ShardError(
                f"key column {target_key!r} is not in the table being merged (it has: {', '.join(current.names)}); "
                "inspect the upstream base sidecar - there is no fallback to filename or basename matching")
        if source_key not in source.names:
            raise ShardError(f"source key column {source_key!r} is not in the source shard "
                             f"(it has: {', '.join(source.names)}); inspect the score sidecar")
        skip = {source_key, target_key, dataset.key_column}
        requested = self.columns or tuple(c for c in source.names if c not in skip and c != dataset.image_column)
        absent = [c for c in requested if c not in source.names]
        if absent:
            raise ShardError(f"column(s) {', '.join(absent)} not in the source shard (it has: "
                             f"{', '.join(source.names)}); check `columns` against the score sidecar")
        protected_names = {dataset.key_column, dataset.image_column} - {None}
        append, replace, kept, protected, conflicts = [], [], [], [], []
        for col in requested:
            if col in protected_names:
                protected.append(col)
            elif col not in current.names:
                append.append(col)
            elif self.mode == "error":
                conflicts.append(col)
            elif self.mode == "fill_missing":
                kept.append(col)
            else:
                replace.append(col)
        if conflicts:
            raise ShardError(f"column(s) {', '.join(conflicts)} already exist in the table and mode is 'error'; "
                             "use fill_missing (keep main) or prefer_sidecar (take the sidecar's)")
        return ColumnPlan(tuple(append), tuple(replace), tuple(kept), tuple(protected))

    def plan(self, current: pa.Schema, dataset, relpath: str) -> tuple[pa.Schema, dict]:
        """Output schema after this step from the sibling's footer, for dry runs (no data read)."""
        uri = self.source_prefix + relpath
        with storage.open_parquet(uri) as f:
            source = pq.ParquetFile(f).schema_arrow
        cols = self.column_plan(current, source, dataset)
        return _apply_schema(current, source, cols), self._record("planned", cols)

    def apply(self, table: pa.Table, dataset, relpath: str) -> tuple[pa.Table, dict]:
        uri = self.source_prefix + relpath
        try:
            with storage.open_parquet(uri) as f:
                identity = storage.file_identity(uri, f)
                pf = pq.ParquetFile(f)
                cols = self.column_plan(table.schema, pf.schema_arrow, dataset)
                target_key, source_key = self.keys(dataset)
                source = pf.read(columns=cols.read_columns(source_key), use_threads=True)
        except FileNotFoundError:
            if not self.required:
                return table, {**self.to_dict(), "status": "skipped_missing_sibling", "input": ABSENT}
            raise ShardError(f"sibling shard missing: {uri}; inspect the score sidecar (shard paths must match the "
                             "base), or set `required: false` to skip shards it does not cover") from None
        except (OSError, pa.ArrowException) as exc:
            if not unreadable_parquet(exc):
                raise
            raise ShardError(f"source shard {uri} is not a readable parquet file ({exc}); "
                             "inspect the score sidecar") from None
        check_aligned(table, target_key, source, source_key)
        for col in cols.replace:
            table = table.set_column(table.schema.get_field_index(col), source.schema.field(col), source[col])
        for col in cols.append:
            table = table.append_column(source.schema.field(col), source[col])
        return table, {**self._record("merged", cols), "input": identity}

    def _record(self, status: str, cols: ColumnPlan) -> dict:
        return {**self.to_dict(), "status": status, "appended": list(cols.append), "replaced": list(cols.replace),
                "kept_from_main": list(cols.kept_from_main), "protected": list(cols.protected)}


def _apply_schema(current: pa.Schema, source: pa.Schema, cols: ColumnPlan) -> pa.Schema:
    for col in cols.replace:
        current = current.set(current.get_field_index(col), source.field(col))
    for col in cols.append:
        current = current.append(source.field(col))
    return current


def unreadable_parquet(exc: BaseException) -> bool:
    """pyarrow could not parse the bytes (corrupt, truncated, not parquet), as opposed to an I/O failure.

    pyarrow reports parse failures as ArrowException or as a bare OSError without errno; storage errors
    arrive as OSError subclasses (FileNotFoundError, PermissionError, ConnectionError...) or carry an errno."""
    if isinstance(exc, pa.ArrowException):
        return True
    return type(exc) is OSError and exc.errno is None


def _family(t: pa.DataType) -> str | None:
    """Key types that compare without converting values: one family each; None for any other type."""
    if pa.types.is_dictionary(t):
        return _family(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)):
        return "binary"
    if pa.types.is_integer(t):
        return "integer"
    return None


INT64_MAX = 2**63 - 1


def _widen(keys: pa.ChunkedArray, family: str, unsigned: bool) -> pa.ChunkedArray:
    """The same values in the family's widest type: a lossless re-encoding, never a parse or format.
    A mixed-sign integer pair compares as int64; uint64 values beyond int64 become nulls (a mismatch)."""
    if pa.types.is_dictionary(keys.type):
        keys = keys.cast(keys.type.value_type)
    if family == "string":
        return keys.cast(pa.large_string())
    if family == "binary":
        return keys.cast(pa.large_binary())
    if unsigned:
        return keys.cast(pa.uint64())
    if keys.type == pa.uint64():
        big = pc.greater(keys, pa.scalar(INT64_MAX, pa.uint64()))
        if pc.any(big).as_py():
            keys = pc.if_else(big, pa.scalar(None, pa.uint64()), keys)
    return keys.cast(pa.int64())


def comparable(left: pa.ChunkedArray, right: pa.ChunkedArray, target_key: str,
               source_key: str) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """Both key columns in one type, or a ShardError when their types belong to different families."""
    if left.type == right.type:
        return left, right
    family = _family(left.type)
    if family is None or family != _family(right.type):
        raise ShardError(f"key types differ: {target_key} is {left.type}, source {source_key} is {right.type}; "
                         "keys align only within one family (string, binary or integer types), never by "
                         "converting values; rewrite one sidecar's key column with the other's type")
    value = lambda t: t.value_type if pa.types.is_dictionary(t) else t  # noqa: E731
    unsigned = family == "integer" and all(pa.types.is_unsigned_integer(value(t)) for t in (left.type, right.type))
    return _widen(left, family, unsigned), _widen(right, family, unsigned)


def check_aligned(table: pa.Table, target_key: str, source: pa.Table, source_key: str) -> None:
    """Row counts equal and keys equal element by element; raises ShardError naming the first bad row."""
    if table.num_rows != source.num_rows:
        raise ShardError(f"row count mismatch: table has {table.num_rows} rows, source shard has "
                         f"{source.num_rows}")
    left, right = comparable(table[target_key], source[source_key], target_key, source_key)
    if left.null_count == 0 and right.null_count == 0 and left.equals(right):
        return  # the common case, ~40x cheaper than the element-wise compare below (no nulls: equals == aligned)
    bad = pc.invert(pc.fill_null(pc.equal(left, right), False))
    count = pc.sum(bad).as_py() or 0
    if count:
        row = pc.index(bad, True).as_py()
        raise ShardError(f"key mismatch in {count} of {table.num_rows} rows; first at row {row}: "
                         f"{target_key}={table[target_key][row].as_py()!r} vs source "
                         f"{source_key}={source[source_key][row].as_py()!r}")
