"""rename_columns: give columns new names in place (position, type and values kept).

Reads no sibling. The config refuses renaming a key column (the dataset's or any operation's), the image column
or a declared schema_extensions column, and new names that are certain to clash (the dataset's key or image
column, an earlier operation's key column, another column of the same step). A column not in the table when the
step runs, or a new name already there, is a ShardError; a column absent because an optional step before it was
skipped is passed on as absent (its new name then is absent too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pyarrow as pa
from pydantic import AfterValidator, ConfigDict, Field

from tasks.errors import ShardError
from tasks.models import ColumnName
from tasks.ops.base import NO_INPUT, FieldProblem, Findings, Operation, OperationSpec, TableStream
from tasks.ops.lineage import ColumnChange, History, Status, StepRecord, absent, renamed
from tasks.validation import Items, Says


def _one_to_one(columns: dict[str, str]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for old, new in columns.items():
        if old == new:
            raise ValueError(f"renames {old!r} to itself")
        if new in columns:
            raise ValueError(f"{new!r} is both renamed and a new name; rename in two steps")
        if new in seen:
            raise ValueError(f"renames both {seen[new]!r} and {old!r} to {new!r}")
        seen[new] = old
    return columns


class RenameColumnsSpec(OperationSpec):
    """Rename columns in place: each keeps its position, type and values under a new name (e.g. a score column
    to the name the dataset declares). Reads no sibling shard."""

    model_config = ConfigDict(title="rename_columns")

    type: Literal["rename_columns"] = Field(description="The operation: rename_columns.")
    columns: Annotated[dict[ColumnName, ColumnName], Items("new name for {index!r} must be a non-empty column name"),
                       Says(too_short="must rename at least one column (old_name: new_name)",
                            dict_key="old names must be non-empty column names"),
                       AfterValidator(_one_to_one)] = Field(
        min_length=1, description="old_name: new_name for each column to rename, e.g. {dqm: dqm_d1_v6_1}. Never "
                                  "a key column (the dataset's or an operation's), the image_column or a column "
                                  "declared in schema_extensions; a new name must not be a column the table has at "
                                  "this step. A column not in the table at this step fails the shard, unless an "
                                  "optional operation that supplies it was skipped there.")


@dataclass(frozen=True)
class RenameColumns(Operation):
    type = "rename_columns"
    spec = RenameColumnsSpec

    columns: tuple[tuple[str, str], ...]  # (old, new) in the YAML's order

    @classmethod
    def from_spec(cls, spec: RenameColumnsSpec, dataset) -> RenameColumns:
        declared = {e.name for e in dataset.schema_extensions}
        for old, new in spec.columns.items():
            if old == dataset.key_column:
                raise FieldProblem("columns", f"{old!r} is the dataset's key_column: every output keeps it by name")
            if old == dataset.image_column:
                raise FieldProblem("columns", f"{old!r} is the dataset's image_column: it is never in the output "
                                              "(a sidecar carries no image bytes), there is nothing to rename")
            if old in declared:
                raise FieldProblem("columns", f"{old!r} is declared in the dataset's schema_extensions: the output "
                                              "must carry it under that name")
            if new in (dataset.key_column, dataset.image_column):
                what = "key_column" if new == dataset.key_column else "image_column"
                raise FieldProblem("columns", f"new name {new!r} is the dataset's {what}; choose another name")
        return cls(tuple(spec.columns.items()))

    def conflicts(self, dataset, operations) -> list[tuple[str, str]]:
        problems, mine = [], next(i for i, op in enumerate(operations) if op is self)
        for i, op in enumerate(operations):
            keys = op.key_columns(dataset)
            for old, new in self.columns:
                if old in keys:
                    problems.append(("columns", f"{old!r} is the key column of operations[{i}] ({op.describe()}): "
                                                "rows are aligned by it, so it cannot be renamed"))
                elif i < mine and new in keys:
                    problems.append(("columns", f"new name {new!r} is the key column of operations[{i}] "
                                                f"({op.describe()}), already in the table at this step"))
        return problems

    def to_dict(self) -> dict:
        return {"type": self.type, "columns": dict(self.columns)}

    def meaning(self, dataset) -> dict:
        return {**self.to_dict(), "columns": dict(sorted(self.columns))}  # renames at once: order decides nothing

    def describe(self) -> str:
        return f"{self.type} " + ", ".join(f"{old} -> {new}" for old, new in self.columns)

    def dry_run_lines(self, dataset) -> tuple[str, list[str]]:
        return f"{self.describe()} (reads no sibling)", []

    def _lineage(self, names: list[str], history: History) -> tuple[ColumnChange, ...]:
        """What the step does to a table with these columns; ShardError for what cannot be renamed there."""
        lineage, missing, clashes = [], [], []
        for old, new in self.columns:
            if old in names:
                lineage.append(renamed(old, new))
                if new in names:
                    clashes.append(new)
            elif history.skipped_supplier(old) is not None:
                lineage.append(absent(old, new))  # an optional step before it was skipped on this shard
            else:
                missing.append(old)
        if missing:
            raise ShardError(f"column(s) {', '.join(missing)} to rename not in the table at this step (it has: "
                             f"{', '.join(names)}); check `columns` against the base and earlier operations")
        if clashes:
            raise ShardError(f"new name(s) {', '.join(clashes)} already in the table at this step; choose other "
                             "names, or drop those columns first (drop_columns)")
        return tuple(lineage)

    @staticmethod
    def _new_names(names: list[str], lineage: tuple[ColumnChange, ...]) -> list[str]:
        new = {c.was: c.column for c in lineage if c.was in names}
        return [new.get(n, n) for n in names]

    def stream(self, schema: pa.Schema, dataset, relpath: str, history: History, rows: int,
               window_rows: int) -> TableStream:
        lineage = self._lineage(schema.names, history)
        names = self._new_names(schema.names, lineage)
        for i, name in enumerate(names):
            schema = schema.set(i, schema.field(i).with_name(name))
        return TableStream(StepRecord(Status.APPLIED, lineage, NO_INPUT), schema,
                           lambda window, offset: window.rename_columns(names))

    def compare_values(self, shard, index: int, record) -> Findings:
        """An old name is not in the output, unless a later operation supplied it again. (Renamed columns are
        compared with their origin, followed through the rename, by the base and merged column checks.)"""
        found = Findings()
        for change in record.lineage:
            if change.was in shard.out.column_names and change.was not in shard.layout.origin:
                found.columns.append(f"operations[{index}]: renamed column {change.was!r} is still in the output")
        return found
