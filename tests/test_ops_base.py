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
from tasks.ops.base import NO_INPUT, SIBLINGS, FieldProblem, Input, Operation, OperationSpec, schema_extra
from tasks.ops.lineage import History, Status, Step, appended


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
    """An operation as an author may write one, relying on the protocol's defaults: it appends `stamp`, the
    dataset's name and the shard's relpath, and records them; it reads a sibling only if the dataset names one."""

    type: ClassVar[str] = "stamp"

    def to_dict(self) -> dict:
        return {"type": self.type}

    def input(self, dataset) -> Input | None:
        return Input(dataset.sibling, "id", "id") if dataset.sibling else None

    def plan(self, schema, dataset, relpath, history):
        raise NotImplementedError

    def apply(self, table, dataset, relpath, history):
        seen = f"{dataset.name}:{relpath}"
        stamps = pa.array([seen] * table.num_rows, pa.string())
        return table.append_column("stamp", stamps), Step(Status.APPLIED, (appended("stamp"),), NO_INPUT,
                                                          {"seen": seen})


def test_the_default_stream_applies_the_step_to_each_window_with_the_shards_dataset_and_relpath():
    dataset = SimpleNamespace(name="demo", sibling=None)
    schema = pa.schema([("id", pa.int64())])
    stream = Stamp().stream(schema, dataset, "a/b.parquet", History(), rows=3, window_rows=2)
    assert stream.step.notes == {"seen": "demo:a/b.parquet"}  # recorded before the first window
    assert stream.schema == schema.append(pa.field("stamp", pa.string()))
    window = pa.table({"id": [7, 8]}, schema=schema)
    assert stream.apply(window, 0).to_pydict() == {"id": [7, 8], "stamp": ["demo:a/b.parquet"] * 2}
    assert stream.apply(window.slice(1), 2).to_pydict() == {"id": [8], "stamp": ["demo:a/b.parquet"]}


def test_the_default_stream_refuses_an_operation_that_reads_a_sibling_of_this_dataset():
    reads = SimpleNamespace(name="demo", sibling="s3://bucket/scores/")
    with pytest.raises(TypeError) as raised:
        Stamp().stream(pa.schema([("id", pa.int64())]), reads, "a/b.parquet", History(), rows=3, window_rows=2)
    assert str(raised.value) == ("stamp reads a sibling, so it must define stream(): the default streams "
                                 "windows through apply(), which sees no sibling")


def test_an_operation_contributes_the_siblings_check_exactly_when_it_reads_a_sibling():
    assert Stamp().verify_checks(SimpleNamespace(sibling="s3://bucket/scores/")) == (SIBLINGS,)
    assert Stamp().verify_checks(SimpleNamespace(sibling=None)) == ()
