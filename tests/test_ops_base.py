"""The operation protocol's own helpers (tasks/ops/base.py), as an operation author uses them: the JSON Schema of a
spec, `schema_extra` for a field's schema, FieldProblem, and the protocol's defaults. What every registered
operation must do runs in tests/test_operations.py; the committed schemas in tests/test_config_schema.py."""
from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from tasks.ops import DropColumns, RenameColumns
from tasks.ops.base import FieldProblem, OperationSpec, schema_extra


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
