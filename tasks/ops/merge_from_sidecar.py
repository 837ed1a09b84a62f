"""merge_from_sidecar: copy columns from a row-aligned sibling shard after proving the rows line up.

No joins, no global index, no filename matching: the sibling shard is `source_prefix + relpath`, and its
key column must equal the current table's key column element by element (a null key is a mismatch).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ConfigDict, Field, field_validator

from tasks import storage
from tasks.errors import ShardError
from tasks.models import ColumnName, Prefix
from tasks.ops.alignment import Alignment, check_row_counts, comparable
from tasks.ops.base import (ABSENT, ColumnList, FieldProblem, Findings, Input, Operation, OperationSpec,
                            Sibling, StepStream, TableStream, schema_extra)
from tasks.ops.lineage import History, Status, StepRecord, appended, legacy_lists, replaced
from tasks.parquet_errors import unreadable_parquet
from tasks.validation import Says
from tasks.windows import RowWindows, parquet_file

MODES = ("fill_missing", "prefer_sidecar", "error")
KEY = ("Set it and {other} together, only when the score sidecar is aligned by a key other than the dataset's "
       "key_column (e.g. s3_image_path); omit both to use key_column on both sides.")


class MergeFromSidecarSpec(OperationSpec):
    """Copy columns from a row-aligned score sidecar: for every base shard, the shard at the same relative path under
    source_prefix, after checking row count and key equality row by row."""

    model_config = ConfigDict(title="merge_from_sidecar", json_schema_extra={"dependentRequired": {
        "target_key_column": ["source_key_column"], "source_key_column": ["target_key_column"]}})

    type: Literal["merge_from_sidecar"] = Field(description="The operation: merge_from_sidecar.")
    source_prefix: Prefix = Field(
        description="The score sidecar (s3://bucket/path/ or a local path), with the same relative shard paths and "
                    "row order as the base. Read-only.")
    columns: Annotated[ColumnList, Says(too_short="must list at least one column (omit it to take every column)")] = (
        Field(None, min_length=1, json_schema_extra=schema_extra(unique=True, no_default=True),
              description="The columns to copy, e.g. [dqm_d1_v6_1]; each once. Omit to take every column of the "
                          "source except its key and the dataset's key and image columns."))
    mode: str = Field("fill_missing", json_schema_extra=schema_extra(enum=list(MODES)),
                      description="When a column already exists: fill_missing (default) keeps the table's, "
                                  "prefer_sidecar takes the sidecar's, error fails the shard. The dataset's key and "
                                  "image columns always stay from the base.")
    target_key_column: ColumnName = Field(None, json_schema_extra=schema_extra(no_default=True),
                                          description="The key column of the table being merged. "
                                                      + KEY.format(other="source_key_column"))
    source_key_column: ColumnName = Field(None, json_schema_extra=schema_extra(no_default=True),
                                          description="The key column of the score sidecar. "
                                                      + KEY.format(other="target_key_column"))
    required: bool = Field(True, description="true (default): a missing sibling shard fails that shard. false: the "
                                             "operation does nothing on shards the sidecar does not cover.")

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
        return mode


@dataclass(frozen=True)
class ColumnPlan:
    append: tuple[str, ...]
    replace: tuple[str, ...]
    kept_from_main: tuple[str, ...]  # fill_missing: already present, main wins
    protected: tuple[str, ...]       # key / image column: never taken from a sidecar

    def read_columns(self, key: str) -> list[str]:
        return list(dict.fromkeys([key, *self.append, *self.replace]))


@dataclass(frozen=True)
class MergeFromSidecar(Operation):
    type = "merge_from_sidecar"

    source_prefix: str
    columns: tuple[str, ...] | None = None
    mode: str = "fill_missing"
    target_key_column: str | None = None
    source_key_column: str | None = None
    required: bool = True

    spec = MergeFromSidecarSpec

    @classmethod
    def from_spec(cls, spec: MergeFromSidecarSpec, dataset) -> MergeFromSidecar:
        target_key, source_key = spec.target_key_column, spec.source_key_column
        if (target_key is None) != (source_key is None):
            given, other = ("target_key_column", "source_key_column") if target_key else (
                "source_key_column", "target_key_column")
            raise FieldProblem(given, f"set together with {other}, or omit both to use the dataset's "
                                      f"key_column ({dataset.key_column})")
        return super().from_spec(spec, dataset)

    def to_dict(self) -> dict:
        return {"type": self.type, "source_prefix": self.source_prefix,
                "columns": list(self.columns) if self.columns is not None else None, "mode": self.mode,
                "target_key_column": self.target_key_column, "source_key_column": self.source_key_column,
                "required": self.required}

    def meaning(self, dataset) -> dict:
        keys = self.input(dataset)  # key columns omitted are the dataset's
        return {**self.to_dict(), "target_key_column": keys.target_key, "source_key_column": keys.source_key}

    def describe(self) -> str:
        return f"{self.type} from {self.source_prefix}"

    def input(self, dataset) -> Input:
        source_key = self.source_key_column or dataset.key_column
        return Input(self.source_prefix, self.target_key_column or dataset.key_column, source_key, self.required,
                     columns=(source_key, *self.columns) if self.columns else None)

    def supplies(self, column: str) -> bool:
        return self.columns is None or column in self.columns

    def column_plan(self, current: pa.Schema, source: pa.Schema, dataset) -> ColumnPlan:
        """Decide what to copy from footers alone; raises ShardError for what cannot work."""
        keys = self.input(dataset)
        target_key, source_key = keys.target_key, keys.source_key
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

    def plan(self, current: pa.Schema, dataset, relpath: str, history: History) -> tuple[pa.Schema, StepRecord]:
        """Output schema after this step from the sibling's footer, for dry runs (no data read)."""
        uri = self.source_prefix + relpath
        with storage.open_parquet(uri) as f:
            source = pq.ParquetFile(f).schema_arrow
        cols = self.column_plan(current, source, dataset)
        return _apply_schema(current, source, cols), self._record(Status.PLANNED, cols)

    def stream(self, schema: pa.Schema, dataset, relpath: str, history: History, rows: int,
               window_rows: int) -> StepStream:
        """Opens the sibling: columns planned, row counts and key types compared, from its footer; each window
        then takes as many of its rows, checks their keys and gains its columns."""
        uri = self.source_prefix + relpath
        keys = self.input(dataset)
        try:
            f = storage.open_parquet(uri)
            try:
                with _readable(uri):
                    identity = storage.file_identity(uri, f)
                    pf = parquet_file(f)
            except BaseException:
                f.close()
                raise
        except FileNotFoundError:
            if not self.required:
                return TableStream(StepRecord(Status.SKIPPED, input=ABSENT), schema)
            raise ShardError(f"sibling shard missing: {uri}; inspect the score sidecar (shard paths must match the "
                             "base), or set `required: false` to skip shards it does not cover") from None
        try:
            cols = self.column_plan(schema, pf.schema_arrow, dataset)
            check_row_counts(rows, pf.metadata.num_rows)
            comparable(pa.chunked_array([], schema.field(keys.target_key).type),
                       pa.chunked_array([], pf.schema_arrow.field(keys.source_key).type), keys.target_key,
                       keys.source_key)
            reader = RowWindows(pf, cols.read_columns(keys.source_key), window_rows)
        except BaseException:
            f.close()
            raise
        return SiblingStream(uri, f, reader, cols, Alignment(keys.target_key, keys.source_key, rows),
                             self._record(Status.MERGED, cols, identity), _apply_schema(schema, pf.schema_arrow, cols))

    def dry_run_lines(self, dataset) -> tuple[str, list[str]]:
        notes = [f"{col} is the dataset's " + (
            "key column: kept from main, never taken from the sidecar" if col == dataset.key_column else
            "image column: never taken from the sidecar (and dropped: a sidecar carries no image bytes)")
            for col in (self.columns or ()) if col in (dataset.key_column, dataset.image_column)]
        return f"{self.describe()} mode={self.mode} columns={list(self.columns or ['(all)'])}", notes

    def compare_values(self, shard, index: int, record) -> Findings:
        """The output's key equals the sibling's, and every column this step supplied equals the sibling's
        (`shard` is one window of rows: `read` gives the sibling's same rows, `compare` counts over all windows)."""
        found = Findings()
        keys = self.input(shard.dataset)
        cols = shard.layout.from_step(index)  # (output column, sibling column), followed through later renames
        try:
            source = shard.read(keys.uri(shard.relpath),
                                list(dict.fromkeys([keys.source_key, *(sibling for _, sibling in cols)])))
        except ShardError as exc:  # its row count is not the output's: no row lines up
            found.keys.append(f"operations[{index}] {keys.target_key} vs source {keys.source_key}: {exc}")
            found.columns.append(f"operations[{index}]: {exc}")
            return found
        except Exception as exc:
            found.columns.append(f"operations[{index}]: source shard unreadable: {shard.one_line(exc)}")
            return found
        out = shard.out
        if keys.target_key not in out.column_names:
            found.keys.append(f"operations[{index}]: key column {keys.target_key!r} missing from the output")
        elif line := shard.compare(keys.target_key, out[keys.target_key], source[keys.source_key], cast=True):
            found.keys.append(f"operations[{index}] {keys.target_key} vs source {keys.source_key}: {line}")
        for name, sibling in cols:
            if name not in out.column_names:
                found.columns.append(f"operations[{index}]: column {name!r} missing from the output")
            elif line := shard.compare(name, out[name], source[sibling]):
                found.columns.append(f"operations[{index}]: {line}")
        return found

    def _record(self, status: Status, cols: ColumnPlan, identity: str | None = None) -> StepRecord:
        lineage = (*(replaced(c) for c in cols.replace), *(appended(c) for c in cols.append))
        notes = {**legacy_lists(lineage, "appended", "replaced"),  # what its records have always carried
                 "kept_from_main": list(cols.kept_from_main), "protected": list(cols.protected)}
        return StepRecord(status, lineage, identity, notes)


@contextmanager
def _readable(uri: str):
    """A sibling that is not readable parquet is named as such."""
    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        if not unreadable_parquet(exc):
            raise
        raise ShardError(f"source shard {uri} is not a readable parquet file ({exc}); "
                         "inspect the score sidecar") from None


class SiblingStream(StepStream):
    def __init__(self, uri: str, file, reader: RowWindows, cols: ColumnPlan, alignment: Alignment,
                 record: StepRecord, schema: pa.Schema):
        self.uri, self.file, self.reader, self.cols, self.alignment = uri, file, reader, cols, alignment
        self.record, self.schema = record, schema
        self.sibling = Sibling(uri, file, reader.file, alignment, {c: c for c in (*cols.replace, *cols.append)})

    @property
    def failed(self) -> bool:
        return self.alignment.failed

    def apply(self, window: pa.Table, offset: int) -> pa.Table:
        with _readable(self.uri):
            source = self.reader.take(window.num_rows)
        self.alignment.check(window, source, offset)
        for col in self.cols.replace:
            window = window.set_column(window.schema.get_field_index(col), source.schema.field(col), source[col])
        for col in self.cols.append:
            window = window.append_column(source.schema.field(col), source[col])
        return window

    def finish(self) -> None:
        self.alignment.finish()

    def close(self) -> None:
        self.file.close()


def _apply_schema(current: pa.Schema, source: pa.Schema, cols: ColumnPlan) -> pa.Schema:
    for col in cols.replace:
        current = current.set(current.get_field_index(col), source.field(col))
    for col in cols.append:
        current = current.append(source.field(col))
    return current
