"""drop_columns: take named columns out of the table at this point of the chain.

Reads no sibling. Key columns (the dataset's and every operation's) and declared schema_extensions columns
cannot be dropped: the config refuses them. A column not in the table when the step runs is a ShardError.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pyarrow as pa
from pydantic import ConfigDict, Field

from tasks.errors import ShardError
from tasks.ops.base import (NO_INPUT, ColumnList, FieldProblem, Findings, Operation, OperationSpec,
                            TableStream, schema_extra)
from tasks.ops.lineage import History, Status, StepRecord, legacy_lists, removed
from tasks.validation import Says


class DropColumnsSpec(OperationSpec):
    """Take columns out of the table at this point of the chain (e.g. a score column that is not wanted in the
    all-in-one sidecar). Reads no sibling shard."""

    model_config = ConfigDict(title="drop_columns")

    type: Literal["drop_columns"] = Field(description="The operation: drop_columns.")
    columns: Annotated[ColumnList, Says(too_short="must list at least one column to drop")] = Field(
        min_length=1, json_schema_extra=schema_extra(unique=True),
        description="The columns to drop, each once. Never the dataset's key_column, an operation's key column, the "
                    "image_column or a column declared in schema_extensions. A column not in the table at this step "
                    "fails the shard.")


@dataclass(frozen=True)
class DropColumns(Operation):
    type = "drop_columns"
    spec = DropColumnsSpec

    columns: tuple[str, ...]

    @classmethod
    def from_spec(cls, spec: DropColumnsSpec, dataset) -> DropColumns:
        declared = {e.name for e in dataset.schema_extensions}
        for col in spec.columns:
            if col == dataset.key_column:
                raise FieldProblem("columns", f"{col!r} is the dataset's key_column: every output keeps it")
            if col == dataset.image_column:
                raise FieldProblem("columns", f"{col!r} is the dataset's image_column: it is never in the output "
                                              "(a sidecar carries no image bytes), there is nothing to drop")
            if col in declared:
                raise FieldProblem("columns", f"{col!r} is declared in the dataset's schema_extensions: remove it "
                                              "there to drop it from the output")
        return super().from_spec(spec, dataset)

    def conflicts(self, dataset, operations) -> list[tuple[str, str]]:
        problems = []
        for i, op in enumerate(operations):
            for key in sorted(op.key_columns(dataset) & set(self.columns)):
                message = (f"{key!r} is the key column of operations[{i}] ({op.describe()}): rows are aligned "
                           "by it, so it cannot be dropped")
                problems.append(("columns", message))
        return problems

    def to_dict(self) -> dict:
        return {"type": self.type, "columns": list(self.columns)}

    def meaning(self, dataset) -> dict:
        return {**self.to_dict(), "columns": sorted(self.columns)}  # a set: the order decides nothing

    def describe(self) -> str:
        return f"{self.type} {', '.join(self.columns)}"

    def _absent(self, names: list[str]) -> None:
        if absent := [c for c in self.columns if c not in names]:
            raise ShardError(f"column(s) {', '.join(absent)} to drop not in the table at this step (it has: "
                             f"{', '.join(names)}); check `columns` against the base and earlier operations")

    def stream(self, schema: pa.Schema, dataset, relpath: str, history: History, rows: int,
               window_rows: int) -> TableStream:
        self._absent(schema.names)
        for col in self.columns:
            schema = schema.remove(schema.get_field_index(col))
        return TableStream(self._record(Status.DROPPED), schema,
                           lambda window, offset: window.drop_columns(list(self.columns)))

    def _record(self, status: Status) -> StepRecord:
        lineage = tuple(removed(c) for c in self.columns)
        return StepRecord(status, lineage, NO_INPUT, legacy_lists(lineage, "removed"))  # `removed`: as it always did

    def dry_run_lines(self, dataset) -> tuple[str, list[str]]:
        return f"{self.describe()} (reads no sibling)", []

    def compare_values(self, shard, index: int, record) -> Findings:
        """A dropped column is not in the output, unless a later operation supplied it again."""
        found = Findings()
        for col in self.columns:
            if col in shard.out.column_names and col not in shard.layout.origin:
                found.columns.append(f"operations[{index}]: dropped column {col!r} is still in the output")
        return found
