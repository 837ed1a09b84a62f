"""The operation protocol's own helpers (tasks/ops/base.py), as an operation author uses them: the JSON Schema of a
spec, `schema_extra` for a field's schema, FieldProblem, and the protocol's defaults. What every registered
operation must do runs in tests/test_operations.py; the committed schemas in tests/test_config_schema.py."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar, Literal

import pyarrow as pa
import pytest
from pydantic import Field

from tasks.ops import DropColumns, RenameColumns
from tasks.ops.base import (NO_INPUT, SIBLINGS, FieldProblem, Input, Operation, OperationSpec, TableStream,
                            schema_extra)
from tasks.ops.lineage import History, Status, StepRecord, appended


class Undocumented(OperationSpec):
    type: Literal["undocumented"] = Field(description="The operation.")
    limit: int = Field(0, alias="Limit", description="An aliased field.")


def test_a_spec_schema_passes_pydantics_arguments_and_needs_no_docstring():
    assert Undocumented.model_json_schema()["description"] == ""
    assert list(Undocumented.model_json_schema()["properties"]) == ["type", "Limit"]
    assert list(Undocumented.model_json_schema(False)["properties"]) == ["type", "limit"]  # by_alias, positional
    assert list(Undocumented.model_json_schema(by_alias=False)["properties"]) == ["type", "limit"]


@pytest.mark.parametrize("options, schema, edited", [
    ({}, {"type": "string", "default": "a"}, {"type": "string", "default": "a"}),
    ({"unique": True}, {"type": "array", "default": None}, {"type": "array", "default": None, "uniqueItems": True}),
    ({"no_default": True}, {"type": "string", "default": None}, {"type": "string"}),
    ({"no_default": True}, {"type": "string"}, {"type": "string"}),
    ({"enum": ["x", "y"]}, {"type": "string", "default": "x"}, {"default": "x", "enum": ["x", "y"]}),
    ({"enum": ["x", "y"]}, {"anyOf": [{"type": "string"}]}, {"anyOf": [{"type": "string"}], "enum": ["x", "y"]}),
])
def test_schema_extra_edits_a_fields_schema_as_asked(options, schema, edited):
    schema = dict(schema)  # a copy: edited in place, the parameter would be the edited one in a later run
    schema_extra(**options)(schema)
    assert schema == edited


def test_field_problem_carries_its_field_and_message():
    problem = FieldProblem("columns", "'image' is the dataset's image_column")
    assert (problem.field, problem.message, str(problem)) == ("columns", problem.message, problem.message)


def test_an_operation_reading_no_sibling_supplies_no_column():
    """Only a skipped step's `supplies` excuses an absent column; a step without a sibling is never skipped."""
    assert not RenameColumns((("a", "b"),)).supplies("b") and not RenameColumns((("a", "b"),)).supplies("a")
    assert not DropColumns(("a",)).supplies("a")


@dataclass(frozen=True)
class Stamp(Operation):
    """An operation as an author writes one: `stream` only. It appends `stamp` (the dataset's name, the shard's
    relpath and the row's number in the shard) and records them; it reads a sibling only if the dataset names
    one."""

    type: ClassVar[str] = "stamp"

    def to_dict(self) -> dict:
        return {"type": self.type}

    def input(self, dataset) -> Input | None:
        return Input(dataset.sibling, "id", "id") if dataset.sibling else None

    def stream(self, schema, dataset, relpath, history, rows, window_rows):
        seen = f"{dataset.name}:{relpath}"

        def change(window: pa.Table, offset: int) -> pa.Table:
            stamps = [f"{seen}#{offset + i}" for i in range(window.num_rows)]
            return window.append_column("stamp", pa.array(stamps, pa.string()))
        return TableStream(StepRecord(Status.APPLIED, (appended("stamp"),), NO_INPUT, {"seen": seen}),
                           schema.append(pa.field("stamp", pa.string())), change)


DATASET = SimpleNamespace(name="demo", sibling=None)
SCHEMA = pa.schema([("id", pa.int64())])


def test_a_stream_sees_each_window_with_its_first_row_in_the_shard():
    stream = Stamp().stream(SCHEMA, DATASET, "a/b.parquet", History(), rows=3, window_rows=2)
    assert stream.record.notes == {"seen": "demo:a/b.parquet"}  # recorded before the first window
    assert stream.schema == SCHEMA.append(pa.field("stamp", pa.string()))
    window = pa.table({"id": [7, 8]}, schema=SCHEMA)
    assert stream.apply(window, 0).to_pydict() == {"id": [7, 8], "stamp": ["demo:a/b.parquet#0", "demo:a/b.parquet#1"]}
    assert stream.apply(window.slice(1), 2).to_pydict() == {"id": [8], "stamp": ["demo:a/b.parquet#2"]}


def test_apply_is_the_stream_over_one_window():
    table = pa.table({"id": [7, 8, 9]}, schema=SCHEMA)
    out, step = Stamp().apply(table, DATASET, "a/b.parquet", History())
    assert out.column("stamp").to_pylist() == [f"demo:a/b.parquet#{i}" for i in range(3)]
    assert step == StepRecord(Status.APPLIED, (appended("stamp"),), NO_INPUT, {"seen": "demo:a/b.parquet"})


def test_plan_is_the_stream_opened_on_the_schema_alone_and_planned():
    schema, step = Stamp().plan(SCHEMA, DATASET, "a/b.parquet", History())
    assert schema == SCHEMA.append(pa.field("stamp", pa.string()))
    assert step == StepRecord(Status.PLANNED, (appended("stamp"),), NO_INPUT, {"seen": "demo:a/b.parquet"})


def test_the_default_plan_refuses_an_operation_that_reads_a_sibling_of_this_dataset():
    reads = SimpleNamespace(name="demo", sibling="s3://bucket/scores/")
    with pytest.raises(TypeError) as raised:
        Stamp().plan(SCHEMA, reads, "a/b.parquet", History())
    assert str(raised.value) == ("stamp reads a sibling, so it must define plan(): the default opens stream(), "
                                 "which would read the sibling's rows")


def test_an_operation_contributes_the_siblings_check_exactly_when_it_reads_a_sibling():
    assert Stamp().verify_checks(SimpleNamespace(sibling="s3://bucket/scores/")) == (SIBLINGS,)
    assert Stamp().verify_checks(SimpleNamespace(sibling=None)) == ()


@dataclass(frozen=True)
class Echo(Operation):
    """Records in its StepRecord's notes what `stream` was given; skipped when the dataset says so."""

    type: ClassVar[str] = "echo"

    def to_dict(self) -> dict:
        return {"type": self.type}

    def stream(self, schema, dataset, relpath, history, rows, window_rows):
        status = Status.SKIPPED if dataset.skip else Status.APPLIED
        return TableStream(StepRecord(status, notes={"history": history, "rows": rows, "window_rows": window_rows}),
                           schema)


def test_apply_streams_the_table_as_one_window_and_plan_streams_no_rows_both_with_the_history():
    history, table = History(), pa.table({"id": [7, 8, 9]}, schema=SCHEMA)
    out, record = Echo().apply(table, SimpleNamespace(skip=False), "a/b.parquet", history)
    assert out == table and record == StepRecord(Status.APPLIED, notes={"history": history, "rows": 3, "window_rows": 3})
    assert record.notes["history"] is history
    schema, record = Echo().plan(SCHEMA, SimpleNamespace(skip=False), "a/b.parquet", history)
    assert schema == SCHEMA
    assert record == StepRecord(Status.PLANNED, notes={"history": history, "rows": 0, "window_rows": 0})
    assert record.notes["history"] is history


def test_plan_keeps_a_skipped_step_skipped():
    history = History()
    _, record = Echo().plan(SCHEMA, SimpleNamespace(skip=True), "a/b.parquet", history)
    assert record == StepRecord(Status.SKIPPED, notes={"history": history, "rows": 0, "window_rows": 0})
