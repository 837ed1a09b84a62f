"""cast_columns: change the Arrow type of named columns in place (position, name and, where they fit, values kept).

Reads no sibling. Types are pyarrow's names (`float32`, `int64`, `string`, `timestamp[ms]`...); one that Parquet
stores as another (`date64` as `date32`, `timestamp[s]` as `timestamp[ms]`) is refused with the one to name, so
the dry run's schema is the written one. `safe: true` (the default): a value the new type cannot hold (an overflow,
a fraction to an integer, text that is not a number) fails the shard, naming the column and the row; `safe: false`
converts it anyway, as pyarrow's unsafe cast does (wrapping, truncating). Key columns cannot be cast (rows are
aligned by them, compared without conversion).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ConfigDict, Field

from tasks.errors import ShardError
from tasks.models import ColumnName
from tasks.ops.base import NO_INPUT, FieldProblem, Findings, Operation, OperationSpec, TableStream
from tasks.ops.lineage import History, Status, StepRecord, transformed
from tasks.validation import Items, Says


class CastColumnsSpec(OperationSpec):
    """Change the Arrow type of columns in place (e.g. a score column from float64 to float32, or text ids to
    int64). Reads no sibling shard."""

    model_config = ConfigDict(title="cast_columns")

    type: Literal["cast_columns"] = Field(description="The operation: cast_columns.")
    columns: Annotated[dict[ColumnName, str], Items("the type for {index!r} must be an Arrow type name"),
                       Says(too_short="must cast at least one column (column: type)",
                            dict_key="column names must be non-empty")] = Field(
        min_length=1, description="column: Arrow type for each column to cast, e.g. {dqm_score: float32}. Types "
                                  "by pyarrow's names: bool, int8..int64, uint8..uint64, float16, float32, float64, "
                                  "string, large_string, binary, date32, timestamp[ms|us|ns], duration[s|ms|us|ns]. "
                                  "Never a key column (the dataset's or an operation's) or the image_column. A "
                                  "column not in the table at this step fails the shard.")
    safe: bool = Field(True, description="true: a value the new type cannot hold (overflow, a fraction to an "
                                         "integer, text that is not a number) fails the shard, naming the column "
                                         "and row; false: converted anyway, as pyarrow's unsafe cast (wrapping, "
                                         "truncating).")


@cache
def arrow_type(name: str) -> pa.DataType:
    """The Arrow type a name stands for, as Parquet stores and reads it back; ValueError saying why not."""
    try:
        wanted = pa.type_for_alias(name)
    except ValueError:
        raise ValueError(f"{name!r} is not an Arrow type name (e.g. float32, int64, string, timestamp[ms])") from None
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"c": pa.array([], wanted)}), sink)
    stored = pq.read_schema(pa.BufferReader(sink.getvalue())).field("c").type
    if stored != wanted:
        raise ValueError(f"Parquet stores {name} as {stored}: name {stored} instead")
    return wanted


@dataclass(frozen=True)
class CastColumns(Operation):
    type = "cast_columns"
    spec = CastColumnsSpec

    columns: tuple[tuple[str, str], ...]  # (column, type name) in the YAML's order
    safe: bool = True

    @classmethod
    def from_spec(cls, spec: CastColumnsSpec, dataset) -> CastColumns:
        for column, name in spec.columns.items():
            if column in (dataset.key_column, dataset.image_column):
                what = "key_column: rows are aligned by it" if column == dataset.key_column else (
                    "image_column: it is never in the output")
                raise FieldProblem("columns", f"{column!r} is the dataset's {what}")
            try:
                arrow_type(name)
            except ValueError as exc:
                raise FieldProblem("columns", f"{column!r}: {exc}") from None
        return cls(tuple(spec.columns.items()), spec.safe)

    def conflicts(self, dataset, operations) -> list[tuple[str, str]]:
        return [("columns", f"{column!r} is the key column of operations[{i}] ({op.describe()}): rows are aligned "
                            "by it, so it cannot be cast")
                for i, op in enumerate(operations) for column, _ in self.columns if column in op.key_columns(dataset)]

    def to_dict(self) -> dict:
        return {"type": self.type, "columns": dict(self.columns), "safe": self.safe}

    def meaning(self, dataset) -> dict:  # each column cast alone: the order decides nothing; aliases are one type
        return {**self.to_dict(), "columns": {c: str(arrow_type(t)) for c, t in sorted(self.columns)}}

    def describe(self) -> str:
        return f"{self.type} " + ", ".join(f"{column} -> {name}" for column, name in self.columns)

    def dry_run_lines(self, dataset) -> tuple[str, list[str]]:
        return f"{self.describe()} ({'safe' if self.safe else 'unsafe'}; reads no sibling)", []

    def stream(self, schema: pa.Schema, dataset, relpath: str, history: History, rows: int,
               window_rows: int) -> TableStream:
        if absent := [column for column, _ in self.columns if column not in schema.names]:
            raise ShardError(f"column(s) {', '.join(absent)} to cast not in the table at this step (it has: "
                             f"{', '.join(schema.names)}); check `columns` against the base and earlier operations")
        targets = {column: arrow_type(name) for column, name in self.columns}
        for column, target in targets.items():
            current = schema.field(column)
            try:
                pc.cast(pa.array([], current.type), target)
            except pa.ArrowNotImplementedError:
                raise ShardError(f"column {column!r}: Arrow cannot cast {current.type} to {target}") from None
            schema = schema.set(schema.get_field_index(column), current.with_type(target))

        def change(window: pa.Table, offset: int) -> pa.Table:  # columnwise: each column cast by itself
            for column, target in targets.items():
                index = window.schema.get_field_index(column)
                if index < 0:  # a window of some columns only (the copy path's); stream() saw them all
                    continue
                window = window.set_column(index, schema.field(column), self.cast(column, window[column], target, offset))
            return window
        return TableStream(StepRecord(Status.APPLIED, tuple(transformed(c) for c in targets), NO_INPUT), schema, change,
                           columnwise=True)

    def cast(self, column: str, values: pa.ChunkedArray, target: pa.DataType, offset: int) -> pa.ChunkedArray:
        """`values` (rows from `offset` of the shard) as `target`; a value a safe cast refuses is one line."""
        try:
            return pc.cast(values, target, safe=self.safe)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            row = first_failing(values.combine_chunks(), target)
            raise ShardError(f"column {column!r}: row {offset + row}: {values[row].as_py()!r} does not fit "
                             f"{target} ({exc}); set `safe: false` to convert anyway") from None

    def compare_values(self, shard, index: int, record) -> Findings:
        """Each cast column equals its values before the step, cast the same way."""
        found = Findings()
        for column, name in self.columns:
            before = shard.before(index, column)
            if column not in shard.out.column_names or before is None:
                continue  # missing: the schema check says so; made by an earlier transform: not reproduced here
            if line := shard.compare(column, shard.out[column], pc.cast(before, arrow_type(name), safe=False)):
                found.columns.append(f"operations[{index}]: {line}")
        return found


def first_failing(values: pa.Array, target: pa.DataType) -> int:
    """The first row of `values` a safe cast to `target` refuses (a binary search over casts of slices)."""
    lo, hi = 0, len(values)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(values.slice(lo, mid - lo), target)
            lo = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
    return lo
