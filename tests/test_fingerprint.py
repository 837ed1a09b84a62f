"""The pipeline fingerprint hashes meaning, not spelling (issue 18, seen case 10 and deliverable 6).

Reordering schema_extensions, spelling out key columns equal to the dataset's key, comments and formatting
leave it unchanged, and a finished output stays complete for the plan, the post-write check and verify. Any
change of meaning changes it. Outputs written under the fingerprint of the code before (the "legacy" one, of
the same YAML) are still current: no forced recompute for existing users.
"""
from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest
import yaml
from core_fixtures import (FILTER_EXTENSIONS, SCORE_EXTENSIONS, aes_op, build, dqm_op, read_meta,
                           watermark_op, write_configs, write_table)

from tasks import kernel, prefect_tasks
from tasks.config import Pipeline, load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, ShardStats, read_provenance
from tasks.plan import make_plan
from tasks.verification.driver import verify

SHARDS = 2
REL = sorted(relpaths(SHARDS))
EXTENSIONS = FILTER_EXTENSIONS + SCORE_EXTENSIONS + [{"name": "watermark", "type": "watermark_score_v1"}]


def fingerprint_before_issue_18(pipeline: Pipeline) -> str:
    """The fingerprint as the code before this change computed it (a copy of that code): spelling included."""
    ds = pipeline.dataset
    doc = {"dataset": {"name": ds.name, "main_prefix": ds.main_prefix, "key_column": ds.key_column,
                       "image_column": ds.image_column, "source_inference": ds.source_inference,
                       "schema_extensions": [[e.name, e.type.name, e.type.to_dict()] for e in ds.schema_extensions]},
           "operations": [op.to_dict() for op in pipeline.operations]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def write_outputs(job: Job) -> None:
    """Merge every shard with the kernel (no Prefect): what a finished run leaves."""
    for rel in REL:
        state = kernel.read_base(job, rel)
        for i in range(len(job.pipeline.operations)):
            state = kernel.apply_operation(job, rel, i, state)
        kernel.write_output(job, rel, state)


def assert_current(job: Job, monkeypatch) -> None:
    """The plan, a shard task's retry, the post-write check and verify all call the finished output current."""
    plan = make_plan(job)
    assert (plan.complete, plan.todo, plan.foreign) == (REL, [], []), plan.foreign
    monkeypatch.setattr(prefect_tasks, "task_run", SimpleNamespace(run_count=2))  # a retry looks for an output
    for rel in REL:
        state = kernel.read_base(job, rel)
        for i in range(len(job.pipeline.operations)):
            state = kernel.apply_operation(job, rel, i, state)
        assert prefect_tasks.cached_output(job, rel, state.inputs(), state.table.num_rows) is not None, rel
    for rel in REL:
        kernel.check_written(job, rel, ShardStats(rel, rows=read_meta(job.output_uri(rel)).num_rows, bytes=0,
                                                 skipped_ops=int(rel == REL[-1])))
    report = verify(job, samples=0)
    assert report.ok, [(c.name, c.failures) for c in report.checks if not c.passed]


@pytest.fixture
def finished(tmp_path):
    """Demo sidecars, the three-operation pipeline, and its output written."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    write_outputs(job)
    return setup, job


def rewrite(setup, **kw) -> Pipeline:
    write_configs(setup.pipeline.parents[2], setup.prefixes, **kw)
    return load_pipeline(setup.pipeline)


COSMETIC = {
    "schema_extensions reordered": lambda p: dict(extensions=EXTENSIONS[::-1]),
    "default key columns spelled out": lambda p: dict(ops=[
        dqm_op(p, target_key_column="image_key", source_key_column="image_key"), aes_op(p),
        watermark_op(p, required=False, target_key_column="image_key", source_key_column="image_key")]),
    "default mode spelled out": lambda p: dict(ops=[dqm_op(p), aes_op(p),
                                                    watermark_op(p, required=False, mode="fill_missing")]),
}


@pytest.mark.parametrize("edit", sorted(COSMETIC))
def test_cosmetic_edit_keeps_fingerprint_and_finished_output(finished, edit, monkeypatch):
    setup, job = finished
    edited = rewrite(setup, **COSMETIC[edit](setup.prefixes))
    assert edited.fingerprint == job.fingerprint
    assert_current(Job(edited, setup.output), monkeypatch)


def test_comments_and_formatting_do_not_matter(finished):
    setup, job = finished
    doc = yaml.safe_load(setup.pipeline.read_text())
    ops = [dict(reversed(list(op.items()))) for op in doc["operations"]]  # keys in another order
    setup.pipeline.write_text("# a comment\n\noperations:  # and another\n"
                              + "".join(f"  - {json.dumps(op)}\n" for op in ops)  # flow style, quoted
                              + f"\ndataset: '{doc['dataset']}'\n# trailing\n")
    assert load_pipeline(setup.pipeline).fingerprint == job.fingerprint


def p_ops(p: dict, **changes) -> list[dict]:
    ops = [dqm_op(p), aes_op(p), watermark_op(p, required=False)]
    for i, change in changes.items():
        ops[int(i[1:])].update(change)
    return ops


MEANING = {
    "another column": lambda p: dict(ops=p_ops(p, o0={"columns": ["dqm_d1_v6_1", "extra"]})),
    "all columns": lambda p: dict(ops=p_ops(p, o0={"columns": None})),
    "another mode": lambda p: dict(ops=p_ops(p, o0={"mode": "error"})),
    "another source prefix": lambda p: dict(ops=p_ops(p, o0={"source_prefix": p["dqm"] + "v2/"})),
    "another key column": lambda p: dict(ops=p_ops(p, o0={"target_key_column": "s3_image_path",
                                                          "source_key_column": "s3_image_path"})),
    "required": lambda p: dict(ops=p_ops(p, o2={"required": True})),
    "operation order": lambda p: dict(ops=p_ops(p)[1::-1] + p_ops(p)[2:]),
    "another extension type": lambda p: dict(extensions=[
        {**e, "type": "dqm_score_v1"} if e["name"] == "ernie_image_aes" else e for e in EXTENSIONS]),
    "a type's definition": lambda p: dict(schema_types={"watermark_score_v1": {
        "kind": "struct", "fields": {"score": "floating"}}}),
    "an extension fewer": lambda p: dict(extensions=EXTENSIONS[:-1]),
    "dataset key column": lambda p: dict(key_column="s3_image_path"),
    "image column": lambda p: dict(image_column="picture"),
}


def test_every_change_of_meaning_changes_it(finished):
    setup, job = finished
    prints = {name: rewrite(setup, **change(setup.prefixes)).fingerprint for name, change in MEANING.items()}
    assert job.fingerprint not in prints.values(), prints
    assert len(set(prints.values())) == len(prints), prints


def test_output_of_the_fingerprint_before_is_current(finished, monkeypatch):
    """An output written by the code before this change (its fingerprint, the input key made with it) is
    complete for the plan, passes the post-write check and verify: no forced recompute, no refusal."""
    setup, job = finished
    legacy = fingerprint_before_issue_18(job.pipeline)
    assert legacy != job.fingerprint  # the shipped spelling (extensions not sorted) differs from the canonical
    monkeypatch.setattr(Job, "fingerprint", property(lambda self: legacy))
    write_outputs(job)
    monkeypatch.undo()
    assert {read_provenance(read_meta(setup.output + rel))["fingerprint"] for rel in REL} == {legacy}
    assert_current(Job(load_pipeline(setup.pipeline), setup.output), monkeypatch)


def test_output_of_the_fingerprint_before_with_other_inputs_is_stale(finished, monkeypatch):
    """Accepting the older fingerprint does not accept older inputs: the input key is recomputed with it."""
    setup, job = finished
    monkeypatch.setattr(Job, "fingerprint", property(lambda self: fingerprint_before_issue_18(self.pipeline)))
    write_outputs(job)
    monkeypatch.undo()
    table = kernel.read_base(job, REL[0]).table
    write_table(table.replace_schema_metadata({"rewritten": "yes"}), setup.prefixes["base"] + REL[0])
    plan = make_plan(Job(load_pipeline(setup.pipeline), setup.output))
    assert plan.complete == REL[1:] and [rel for rel, _ in plan.stale] == REL[:1]


def test_another_pipelines_fingerprint_is_still_foreign(finished):
    setup, job = finished
    other = rewrite(setup, ops=p_ops(setup.prefixes, o0={"mode": "error"}))
    plan = make_plan(Job(other, setup.output))
    assert [rel for rel, _ in plan.foreign] == REL and plan.complete == []
