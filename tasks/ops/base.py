"""The operation protocol: everything config, plan, dry run, merge and verify may ask of an operation.

An operation is a small frozen dataclass subclassing `Operation`, registered by its `type` in tasks/ops/__init__.py.
Its YAML fields are a pydantic model (`spec`, a subclass of `OperationSpec`): config validates an entry with it
(errors `file:line: field: message`) and tasks/schemagen.py publishes its JSON Schema. Callers never reach into
an operation's fields: they ask for its `input`, its key columns, the columns it may supply, and let it plan,
stream, describe and verify itself. An operation writes one code path, `stream` (its step over a shard, window by
window); `apply` (a whole table: the `--task-per-operation` chain) is `stream` over one window, and `plan` (from
footers) is `stream` opened on the schema alone for a step that reads no sibling. Each returns a `StepRecord`
(tasks/ops/lineage.py): its status and its lineage, where every column it affected came from; verify replays
lineage, never an operation's fields.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Annotated, ClassVar

import pyarrow as pa
from pydantic import AfterValidator

from tasks import storage
from tasks.models import ColumnName
from tasks.ops.lineage import History, Status, StepRecord
from tasks.validation import Items, Spec

ABSENT = storage.ABSENT  # input identity of an optional operation whose sibling shard does not exist (as listed)
NO_INPUT = "none"    # input identity of an operation that reads no sibling shard
SKIPPED = Status.SKIPPED  # an optional sibling was missing, the step did nothing
FAILED = Status.FAILED    # (verify only) what the step would do could not be derived
SIBLINGS = "siblings"  # the per-operation verify check every operation with an input contributes


class FieldProblem(ValueError):
    """Raised by `Operation.from_spec` for what its fields cannot say alone: config names the field's line."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


class OperationSpec(Spec):
    """Base of an operation's YAML fields (strict types, unknown fields refused). A subclass declares
    `type: Literal["<name>"]` first, then its own fields, each with a description (editors show them); its
    docstring and `model_config` title become the JSON Schema's description and title."""

    @classmethod
    def model_json_schema(cls, *args, **kwargs) -> dict:
        schema = super().model_json_schema(*args, **kwargs)
        schema["description"] = " ".join(schema.get("description", "").split())  # the docstring on one line
        return schema


def _distinct(columns: list[str]) -> list[str]:
    if len(set(columns)) != len(columns):
        raise ValueError("lists a column twice")
    return columns


# A YAML list of distinct, non-empty column names; a bad item is reported on the list's line as `columns[i] ...`.
ColumnList = Annotated[list[ColumnName], Items("{name}[{index}] must be a non-empty column name"),
                       AfterValidator(_distinct)]


def schema_extra(unique: bool = False, no_default: bool = False, **replace) -> Callable[[dict], None]:
    """A field's `json_schema_extra`: uniqueItems, no suggested default, keys replaced (e.g. an enum for a type)."""
    def edit(schema: dict) -> None:
        if unique:
            schema["uniqueItems"] = True
        if no_default:
            schema.pop("default", None)
        if replace:
            schema.pop("type", None)
            schema.update(replace)
    return edit


@dataclass(frozen=True)
class Input:
    """A read-only prefix an operation reads shard by shard: the sibling of relpath is `prefix + relpath`."""

    prefix: str
    target_key: str       # key column in the table being built
    source_key: str       # key column in the sibling shard
    required: bool = True
    field: str = "source_prefix"  # the YAML field that names the prefix (for messages)
    columns: tuple[str, ...] | None = None  # the sibling's columns the operation may read (None: any)

    def uri(self, relpath: str) -> str:
        return self.prefix + relpath


@dataclass
class Findings:
    """What an operation's value check found on one sampled shard: key lines and column lines."""

    keys: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sibling:
    """The sibling shard a step reads, opened (its footer read, nothing decoded): the copy path
    (tasks/chunkcopy.py) reads its key column to check `alignment` and copies its columns' chunks."""

    uri: str
    file: object          # the open file (storage.open_parquet)
    pf: object            # its pyarrow ParquetFile
    alignment: object     # tasks.ops.alignment.Alignment of the step's target key and the sibling's key
    columns: dict = field(default_factory=dict)  # output column -> the sibling's column it takes


class StepStream(ABC):
    """One operation's step over a shard, window by window (Operation.stream). `record` is what it did and
    `schema` the table's after it; `apply`
    takes the next window of rows (starting at row `offset` of the shard) and returns it changed; `failed`
    says a window showed the shard cannot be merged (the caller stops writing, keeps feeding windows to count),
    `finish` raises that after the last window; `close` releases what it opened."""

    record: StepRecord
    schema: pa.Schema
    failed: bool = False
    sibling: Sibling | None = None  # the sibling shard the step reads, if any
    columnwise: bool = False  # apply() also works on a window of only the columns the step transforms

    @abstractmethod
    def apply(self, window: pa.Table, offset: int) -> pa.Table:
        """The next window of rows, changed by the step."""

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class TableStream(StepStream):
    """A step that changes each window by itself (or not at all: `change` None). `change(window, offset)`:
    `offset` is the window's first row in the shard, for messages naming a row (`offset + i`)."""

    def __init__(self, record: StepRecord, schema: pa.Schema,
                 change: Callable[[pa.Table, int], pa.Table] | None = None, columnwise: bool = False):
        self.record, self.schema, self.change, self.columnwise = record, schema, change, columnwise

    def apply(self, window: pa.Table, offset: int) -> pa.Table:
        return self.change(window, offset) if self.change else window


def whole(stream: StepStream, table: pa.Table) -> pa.Table:
    """A step's stream applied to a whole table at once (one window)."""
    try:
        out = stream.apply(table, 0)
        stream.finish()
        return out
    finally:
        stream.close()


class Operation(ABC):
    type: ClassVar[str]

    # ---------------------------------------------------------------- configuration
    spec: ClassVar[type[OperationSpec]]  # the YAML fields of one entry (its JSON Schema is generated from it)

    @classmethod
    def from_spec(cls, spec: OperationSpec, dataset) -> Operation:
        """The operation from its validated fields. Raise FieldProblem(field, message) for what needs the
        dataset to judge. By default every field but `type` becomes the dataclass field of the same name
        (lists as tuples)."""
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in spec if k != "type"}
        return cls(**values)

    @classmethod
    def json_schema(cls) -> dict:
        """The JSON Schema (draft 2020-12) of one YAML entry, generated from `spec`; tasks/schemagen.py puts it
        into docs/schemas/pipeline.schema.json."""
        return cls.spec.model_json_schema()

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
    def stream(self, schema: pa.Schema, dataset, relpath: str, history: History, rows: int,
               window_rows: int) -> StepStream:
        """The step over a shard of `rows` rows whose table has `schema`, seen in windows of `window_rows` rows
        (the last may be shorter). What it can tell from footers is checked and recorded now, as the stream's
        `record` (status, input, the lineage of every column it affects; kept in provenance beside `to_dict()`)
        and `schema` (the table's after it); each window then goes through `StepStream.apply(window, offset)`.
        `history`: what the earlier steps did on this shard, e.g. which skipped step explains a column's
        absence. A step that changes each window by itself returns a `TableStream`. Raises ShardError for what
        cannot work on this shard (FileNotFoundError for a missing required sibling)."""

    def apply(self, table: pa.Table, dataset, relpath: str, history: History) -> tuple[pa.Table, StepRecord]:
        """The step on a whole table (the `--task-per-operation` chain): `stream` over one window."""
        stream = self.stream(table.schema, dataset, relpath, history, table.num_rows, table.num_rows)
        return whole(stream, table), stream.record

    def plan(self, schema: pa.Schema, dataset, relpath: str, history: History) -> tuple[pa.Schema, StepRecord]:
        """The schema after this step and its record (status PLANNED unless skipped), from footers only (dry
        run, verify without provenance). By default `stream` opened on the schema alone and closed, which suits
        a step that reads no sibling; an operation that reads one overrides this to read only its footer."""
        if self.input(dataset) is not None:
            raise TypeError(f"{self.type} reads a sibling, so it must define plan(): the default opens stream(), "
                            "which would read the sibling's rows")
        stream = self.stream(schema, dataset, relpath, history, 0, 0)
        stream.close()
        record = stream.record
        return stream.schema, record if not record.applied else replace(record, status=Status.PLANNED)

    # ---------------------------------------------------------------- dry run and verify
    def dry_run_lines(self, dataset) -> tuple[str, list[str]]:
        """The dry run's line for this step (after `operations[i]: `) and notes printed under its siblings."""
        return self.describe(), []

    def verify_checks(self, dataset) -> tuple[str, ...]:
        """Names of the per-operation checks (tasks.verification.checks) this operation contributes."""
        return (SIBLINGS,) if self.input(dataset) else ()

    def compare_values(self, shard, index: int, record: StepRecord) -> Findings:
        """Value checks on one sampled shard, called once per window of its rows. `shard`
        (tasks.verification.values.ShardValues) offers the window's output and base rows, the replayed `layout`,
        `read(uri, columns)` (the same rows of that file) and `compare(name, got, want, cast)` (a line counting
        the differences of every window so far: the last window's findings are the shard's); `record` is this
        step's StepRecord. Nothing to compare by default."""
        return Findings()


def provenance_record(op: Operation, record: StepRecord) -> dict:
    """The per-operation entry an output's provenance keeps: the operation as configured, then its record."""
    return {**op.to_dict(), **record.to_dict()}
