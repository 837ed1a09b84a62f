"""The verify check registry: report order, units and the JSON schema's check names all come from it."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tasks import report as render
from tasks.verification import registry
from tasks.verification.checks import (
    BASE,
    INPUTS,
    KEYS,
    MERGED,
    PROVENANCE,
    ROWS,
    SCHEMA,
    SHARD_SET,
    STRAYS,
    siblings_check,
)
from tasks.verification.registry import Check, register, report_order
from tasks.verification.schema_doc import BEGIN, END, GUIDE_PATH, SCHEMA_PATH, render_guide
from tasks.verification.schema_doc import render as render_schema

REPO = Path(__file__).resolve().parents[1]


class Op:
    """Stands in for an operation: contributes the given per-operation checks."""

    def __init__(self, *checks: str):
        self.checks = checks

    def verify_checks(self, dataset) -> tuple[str, ...]:
        return self.checks


def test_committed_schema_is_generated_from_the_registry():
    text = SCHEMA_PATH.read_text()
    assert SCHEMA_PATH == REPO / "docs" / "verify-report.schema.json"
    assert render_schema(json.loads(text)) == text, "run: python -m tasks.verification.schema_doc"


def test_the_operator_guides_list_of_checks_is_generated_from_the_registry():
    text = GUIDE_PATH.read_text()
    assert GUIDE_PATH == REPO / "docs" / "operating-guide.md"
    assert render_guide(text) == text, "run: python -m tasks.verification.schema_doc"
    listed = text.partition(BEGIN)[2].partition(END)[0]
    for check in registry.REGISTRY:
        assert f"| `{check.name.replace('{index}', 'i')}` | {check.stage} | {check.unit} | {check.about} |" in listed


def test_a_guide_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="markers"):
        render_guide("# Operating guide\n")


def test_report_order_expands_per_operation_checks_only_for_contributing_operations():
    names = [name for name, _, _ in report_order([Op("siblings"), Op(), Op("siblings")], None)]
    expected = []
    for check in registry.REGISTRY:  # registration order, each per-operation check once per contributing op
        expected += ([check.name.format(index=i) for i in (0, 2)] if check.key == "siblings" else
                     [] if check.per_operation else [check.name])
    assert names == expected
    assert siblings_check(0) in names and siblings_check(1) not in names


def test_the_registry_holds_the_named_checks_once_each_in_stage_order():
    names = [c.name for c in registry.REGISTRY]
    assert len(set(names)) == len(names)
    assert {SHARD_SET, STRAYS, ROWS, SCHEMA, PROVENANCE, INPUTS, BASE, KEYS, MERGED} <= set(names)
    stages = [c.stage for c in registry.REGISTRY]
    assert stages == sorted(stages, key=list(registry.STAGES).index)  # report order: listing, footer, data


def check_doc(name: str, stage: str = "listing") -> dict:
    return Check(name, stage, 1).to_dict()


def test_schema_accepts_registered_names_and_refuses_others():
    schema = json.loads(SCHEMA_PATH.read_text())
    check_schema = {**schema["$defs"]["check"], "$defs": schema["$defs"]}
    for name in (SHARD_SET, siblings_check(0), siblings_check(17), MERGED):
        jsonschema.validate(check_doc(name), check_schema, cls=jsonschema.Draft202012Validator)
    for name in ("merged column", "operations[x] siblings", "operations[1] siblings extra"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(check_doc(name), check_schema, cls=jsonschema.Draft202012Validator)


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", list(registry.REGISTRY))
    return registry.REGISTRY


def test_a_newly_registered_check_reaches_order_schema_and_renderer(scratch_registry):
    register("widget count", "footer", "widgets", "every shard has its widgets")(lambda job, footers: [])
    assert [n for n, _, _ in report_order([], None)][-1] == "widget count"
    doc = json.loads(render_schema(json.loads(SCHEMA_PATH.read_text())))
    options = doc["$defs"]["check"]["properties"]["name"]["anyOf"]
    assert {"const": "widget count", "description": "every shard has its widgets"} in options
    assert "| `widget count` | footer | widgets | every shard has its widgets |" in render_guide(GUIDE_PATH.read_text())
    assert render._scope({"name": "widget count", "stage": "footer", "checked": 3}) == "3 widgets"


def test_units_come_from_the_registry():
    assert render._scope({"name": STRAYS, "stage": "listing", "checked": 7}) == "7 objects"
    assert render._scope({"name": siblings_check(3), "stage": "listing", "checked": 2}) == "2 shards"
    assert render._scope({"name": KEYS, "stage": "data", "checked": 5}) == "5 sampled"


def test_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="unknown stage 'disk'"):
        register("x", "disk", "shards", "x")
