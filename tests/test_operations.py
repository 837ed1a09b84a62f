"""What every registered operation must do, whatever it is: one parametrized suite over tasks.ops.OPERATIONS.

Each operation's own test module, tests/test_op_<type>.py, provides `example(prefixes) -> [operation entries]`:
a pipeline over the demo sidecars (tests/core_fixtures.build) that uses it, and optionally `DATASET`, the
dataset fields it needs (build's keyword arguments, e.g. `extensions`). From that alone this suite checks
the config round trip, the JSON schema, the dry run's predicted schema, merge + lineage + resume, verify passing
and catching a planted defect, and verify without provenance. A new operation adds only its own cases there.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import json
import re
from pathlib import Path

import jsonschema
import pyarrow as pa
import pytest
import yaml
from core_fixtures import build, read_table, release_console_handlers, write_table

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.dryrun import dry_run
from tasks.errors import ConfigError
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.ops import OPERATIONS
from tasks.ops.lineage import Change, StepRecord, replay
from tasks.plan import inspect_schemas, make_plan
from tasks.verification import PROVENANCE, verify
from tasks.verification.registry import REGISTRY, report_order

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REPO = Path(__file__).resolve().parents[1]
SHARDS = 3
REL = sorted(relpaths(SHARDS))
NAMES = sorted(OPERATIONS)
DATA_CHECKS = {c.name for c in REGISTRY if c.stage == "data"}


def example(name: str):
    """The operation's example: `example(prefixes)` of tests/test_op_<name>.py, and the dataset fields it needs
    (its optional `DATASET`, keyword arguments of core_fixtures.build such as `extensions`)."""
    module = importlib.import_module(f"test_op_{name}")
    assert callable(getattr(module, "example", None)), f"tests/test_op_{name}.py must define example(prefixes)"
    return module.example, getattr(module, "DATASET", {})


def setup_for(name: str, tmp_path, root: str | None = None, shards: int = SHARDS):
    ops, dataset = example(name)
    setup = build(tmp_path, root or str(tmp_path / "data"), shards=shards, ops=ops, **dataset)
    pipe = load_pipeline(setup.pipeline)
    indices = [i for i, op in enumerate(pipe.operations) if op.type == name]
    assert indices, f"example({name}) does not use {name}"
    return setup, pipe, indices


def merged(name: str, tmp_path, root: str | None = None):
    setup, pipe, indices = setup_for(name, tmp_path, root)
    job = Job(pipe, setup.output)
    for rel in REL:
        merge_shard(job, rel)
    return setup, job, indices


def failing(report) -> dict[str, list[tuple[str, str]]]:
    return {c.name: [(f.path, f.detail) for f in c.failures] for c in report.checks if not c.passed}


def base_names(setup, rel: str) -> list[str]:
    return [n for n in storage.read_footer(setup.prefixes["base"] + rel).schema.to_arrow_schema().names
            if n != "image"]


# ---------------------------------------------------------------- config and schema

@pytest.mark.parametrize("name", NAMES)
def test_config_round_trips_through_to_dict(name, tmp_path):
    """to_dict() (what provenance records; None: omitted) written back as YAML builds the same operation and the
    same fingerprint."""
    setup, pipe, _ = setup_for(name, tmp_path, shards=1)
    doc = yaml.safe_load(setup.pipeline.read_text())
    entries = [{k: v for k, v in op.to_dict().items() if v is not None} for op in pipe.operations]
    setup.pipeline.write_text(yaml.safe_dump({**doc, "operations": entries}, sort_keys=False))  # the YAML order
    again = load_pipeline(setup.pipeline)
    assert again.operations == pipe.operations
    assert (again.fingerprint, again.legacy_fingerprint) == (pipe.fingerprint, pipe.legacy_fingerprint)
    for op in pipe.operations:
        json.dumps(op.meaning(pipe.dataset))  # the fingerprint hashes it


@pytest.mark.parametrize("name", NAMES)
def test_schema_is_generated_from_the_fields_model_and_published(name, tmp_path):
    cls = OPERATIONS[name]
    schema = cls.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == cls.spec.model_json_schema()
    assert schema["properties"]["type"]["const"] == name and "type" in schema["required"]
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(cls)} | {"type"}
    assert all(p.get("description") for p in schema["properties"].values()) and schema.get("description")
    assert schema["additionalProperties"] is False
    published = json.loads((REPO / "docs" / "schemas" / "pipeline.schema.json").read_text())
    assert published["$defs"][name] == schema
    assert {"$ref": f"#/$defs/{name}"} in published["properties"]["operations"]["items"]["oneOf"]

    setup, pipe, indices = setup_for(name, tmp_path, shards=1)
    doc = yaml.safe_load(setup.pipeline.read_text())
    check = jsonschema.Draft202012Validator(published)
    assert not list(check.iter_errors(doc))
    doc["operations"][indices[0]]["colour"] = "red"
    assert list(check.iter_errors(doc)), "the schema accepts an unknown field"
    setup.pipeline.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match=re.escape(
            f"operations[{indices[0]}].colour: unknown field (allowed: {', '.join(sorted(schema['properties']))})")):
        load_pipeline(setup.pipeline)


# ---------------------------------------------------------------- dry run

@pytest.mark.parametrize("name", NAMES)
def test_dry_run_names_each_step_and_predicts_the_output_schema(name, tmp_path):
    setup, job, _ = merged(name, tmp_path)
    out = io.StringIO()
    assert dry_run(job.pipeline, setup.output + "dry/", out=out) == 0, out.getvalue()
    for i, op in enumerate(job.pipeline.operations):
        assert f"operations[{i}]: {op.dry_run_lines(job.pipeline.dataset)[0]}" in out.getvalue()
    predicted, problems = inspect_schemas(make_plan(job), SHARDS)
    assert problems == []
    written = storage.read_footer(setup.output + REL[0]).schema.to_arrow_schema()
    assert predicted.remove_metadata().equals(written.remove_metadata()), (predicted, written)


# ---------------------------------------------------------------- merge, lineage, resume, verify

@pytest.mark.parametrize("name", NAMES)
def test_merge_records_lineage_resumes_and_verifies(name, tmp_path, root):
    setup, job, indices = merged(name, tmp_path, root)
    for rel in REL:
        prov = read_provenance(storage.read_footer(setup.output + rel))
        records = [StepRecord.from_dict(r) for r in prov["operations"]]
        assert all(isinstance(r.get("lineage"), list) for r in prov["operations"])
        written = storage.read_footer(setup.output + rel).schema.to_arrow_schema().names
        assert replay(base_names(setup, rel), records).names == written, rel  # lineage says what is there
    plan = make_plan(job)
    assert plan.complete == REL and plan.todo == []
    report = verify(job, samples=SHARDS, stream=io.StringIO())
    assert report.ok, failing(report)
    ds = job.pipeline.dataset
    assert [c.name for c in report.checks] == [n for n, _, _ in report_order(job.pipeline.operations, ds)]
    schema = json.loads((REPO / "docs" / "verify-report.schema.json").read_text())
    jsonschema.validate(report.to_dict(), schema, cls=jsonschema.Draft202012Validator)


def planted_defect(setup, job, name: str, indices: list[int], rel: str) -> str:
    """Undo the first column change a step of this type recorded on `rel`: a removed column comes back, a
    supplied or renamed one gets its rows reversed. Returns the column."""
    prov = read_provenance(storage.read_footer(setup.output + rel))
    table = read_table(setup.output + rel)
    for i in indices:
        for change in StepRecord.from_dict(prov["operations"][i]).lineage:
            column = change.column
            if change.change is Change.REMOVE and column not in table.column_names:
                filler = table[job.pipeline.dataset.key_column]
                table = table.append_column(pa.field(column, filler.type), filler)
            elif change.change is not Change.REMOVE and column in table.column_names:
                index = table.column_names.index(column)
                table = table.set_column(index, table.schema.field(index), table[column].take(
                    pa.array(range(table.num_rows - 1, -1, -1))))
            else:
                continue
            write_table(table.replace_schema_metadata(table.schema.metadata), setup.output + rel)
            return column
    pytest.fail(f"{name}: no recorded column change to undo on {rel}")


@pytest.mark.parametrize("name", NAMES)
def test_verify_catches_an_undone_column_change(name, tmp_path):
    setup, job, indices = merged(name, tmp_path)
    column = planted_defect(setup, job, name, indices, REL[0])
    found = failing(verify(job, samples=SHARDS, stream=io.StringIO()))
    assert found, f"verify passed with {column!r} changed back"
    assert all(path == REL[0] for lines in found.values() for path, _ in lines), found
    assert any(column in detail for lines in found.values() for _, detail in lines), found


@pytest.mark.parametrize("name", NAMES)
def test_verify_without_provenance_derives_each_step(name, tmp_path):
    """Lacking provenance, verify re-derives each step from the footers (Operation.plan) and the data checks
    still pass: nothing is reported missing or different because a step changed the columns."""
    setup, job, _ = merged(name, tmp_path)
    rel = REL[1]
    write_table(read_table(setup.output + rel).replace_schema_metadata(None), setup.output + rel)
    found = failing(verify(job, samples=SHARDS, stream=io.StringIO()))
    assert PROVENANCE in found and not DATA_CHECKS & set(found), found


@pytest.mark.parametrize("name", NAMES)
def test_flow_merges_resumes_and_verifies(name, tmp_path, cli, run, prefect_api):
    """The same pipeline through `sidecar-ops run` (twice: the second finds every shard complete) and verify."""
    setup, pipe, _ = setup_for(name, tmp_path)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0 and re.search(rf"shards: {SHARDS} total, 0 merged, {SHARDS} skipped", out), out + err
    checks = report_order(pipe.operations, pipe.dataset)
    try:
        code, out, err = cli("verify", setup.pipeline, "--output-prefix", setup.output)
    finally:
        release_console_handlers()
    assert code == 0 and f"verify: PASS (all {len(checks)} checks)" in out, out + err
