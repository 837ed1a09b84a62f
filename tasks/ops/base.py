"""The operation protocol: everything config, plan, dry run, merge and verify may ask of an operation.

An operation is a small frozen dataclass subclassing `Operation`, registered by its `type` in tasks/ops/__init__.py.
Callers never reach into its fields: they ask for its `input`, its key columns, the columns it touches, and let it
plan, apply, describe and verify itself. The record returned by `plan`/`apply` (stored per shard in provenance)
carries `status`, `input` (the sibling's identity, ABSENT or NO_INPUT) and the column lists `appended`,
`replaced`, `removed` (each optional, default empty); verify replays them to know which columns to expect.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa

ABSENT = "absent"    # input identity of an optional operation whose sibling shard does not exist
NO_INPUT = "none"    # input identity of an operation that reads no sibling shard
SKIPPED = "skipped_missing_sibling"  # record status: an optional sibling was missing, the step did nothing
FAILED = "failed"    # record status (verify only): what the step would do could not be derived
SIBLINGS = "siblings"  # the per-operation verify check every operation with an input contributes


@dataclass(frozen=True)
class Input:
    """A read-only prefix an operation reads shard by shard: the sibling of relpath is `prefix + relpath`."""

    prefix: str
    target_key: str       # key column in the table being built
    source_key: str       # key column in the sibling shard
    required: bool = True
    field: str = "source_prefix"  # the YAML field that names the prefix (for messages)

    def uri(self, relpath: str) -> str:
        return self.prefix + relpath


@dataclass
class Findings:
    """What an operation's value check found on one sampled shard: key lines and column lines."""

    keys: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)


class Operation(ABC):
    type: ClassVar[str]

    # ---------------------------------------------------------------- configuration
    @classmethod
    @abstractmethod
    def from_yaml(cls, fields, dataset, prefix_field) -> Operation:
        """Validate one YAML entry (a tasks.yamlsrc.Fields) and build the operation; errors via fields.fail."""

    @classmethod
    @abstractmethod
    def json_schema(cls) -> dict:
        """The JSON Schema (draft 2020-12) of one YAML entry, what `from_yaml` accepts: an object whose `type`
        property is `{"const": cls.type}`, with a title and description per field (editors show them).
        tasks/schemagen.py puts it into docs/schemas/pipeline.schema.json."""

    def conflicts(self, dataset, operations: tuple[Operation, ...]) -> list[tuple[str, str]]:
        """(field, message) for what this operation cannot do in this pipeline, seen whole; none by default."""
        return []

    @abstractmethod
    def to_dict(self) -> dict:
        """The operation as configured, recorded in provenance (each output's per-operation record)."""

    def meaning(self, dataset) -> dict:
        """What decides this step's output, with defaults filled in from the dataset: the pipeline fingerprint
        hashes it, so two spellings of the same step must give the same dict and any change of what the step
        does a different one (every output then becomes another pipeline's). `to_dict()` by default."""
        return self.to_dict()

    def describe(self) -> str:
        return self.type

    # ---------------------------------------------------------------- what it reads and touches
    def input(self, dataset) -> Input | None:
        """The sibling prefix this operation reads, or None when it reads nothing but the table."""
        return None

    def key_columns(self, dataset) -> set[str]:
        """Columns of the table this operation matches rows by (unique per row, kept out of dictionaries)."""
        source = self.input(dataset)
        return {source.target_key} if source else set()

    def supplies(self, column: str) -> bool:
        """Whether this operation may add or replace `column` (so a skipped step explains its absence)."""
        return False

    # ---------------------------------------------------------------- the step
    @abstractmethod
    def plan(self, schema: pa.Schema, dataset, relpath: str) -> tuple[pa.Schema, dict]:
        """The schema after this step and its record, from footers only (dry run, verify without provenance).
        Raises FileNotFoundError for a missing sibling and ShardError for what cannot work."""

    @abstractmethod
    def apply(self, table: pa.Table, dataset, relpath: str) -> tuple[pa.Table, dict]:
        """The step on one shard: the new table and the record kept in provenance."""

    # ---------------------------------------------------------------- dry run and verify
    def dry_run_lines(self, dataset) -> tuple[str, list[str]]:
        """The dry run's line for this step (after `operations[i]: `) and notes printed under its siblings."""
        return self.describe(), []

    def verify_checks(self, dataset) -> tuple[str, ...]:
        """Names of the per-operation checks (tasks.verify.checks) this operation contributes."""
        return (SIBLINGS,) if self.input(dataset) else ()

    def compare_values(self, shard, index: int, record) -> Findings:
        """Value checks on one sampled shard. `shard` (tasks.verify.values.ShardValues) offers the output and
        base tables, `read(uri, columns)` and `compare(name, got, want, cast)`; `record` is this step's
        OpRecord. Nothing to compare by default."""
        return Findings()


def column_names(fields, key: str, empty: str, required: bool = True) -> tuple[str, ...] | None:
    """A YAML list of distinct, non-empty column names (None when optional and absent); errors via fields.fail,
    `empty` saying what an empty list should have been."""
    columns = fields.get(key, list, required=required)
    if columns is None:
        return None
    if not columns:
        raise fields.fail(key, empty)
    for i, col in enumerate(columns):
        if not isinstance(col, str) or not col.strip():
            raise fields.fail(key, f"{key}[{i}] must be a non-empty column name")
    if len(set(columns)) != len(columns):
        raise fields.fail(key, "lists a column twice")
    return tuple(columns)
