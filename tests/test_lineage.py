"""Column lineage (tasks/ops/lineage.py): the one replay verify uses, records of earlier versions read through the
converter, and outputs written before lineage was recorded still verifying and counting as complete."""
from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest
from core_fixtures import aes_op, build, dqm_op, watermark_op

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import PROVENANCE_KEY, Job, merge_shard, read_provenance
from tasks.ops import DropColumns, MergeFromSidecar
from tasks.ops.lineage import (Change, ColumnChange, History, Origin, Status, StepRecord, absent, appended, from_legacy,
                               removed, renamed, replaced, replay, transformed)
from tasks.plan import make_plan
from tasks.verification import verify

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 3
REL = sorted(relpaths(SHARDS))


def test_replay_follows_every_kind_of_change():
    records = [StepRecord(Status.DROPPED, (removed("b"),)),
               StepRecord(Status.MERGED, (appended("x"), appended("y", sibling="y_src"))),
               StepRecord(Status.SKIPPED),  # a skipped step changes nothing, whatever its lineage
               StepRecord(Status.APPLIED, (renamed("a", "A"), renamed("x", "X"), absent("w", "W"))),
               StepRecord(Status.MERGED, (replaced("c", sibling="c2"), removed("y")))]
    layout = replay(["a", "b", "c", "k"], records)
    assert layout.names == ["A", "c", "k", "X"] and layout.base_part == ["A", "c", "k"] and layout.added == ["X"]
    assert layout.origin == {"A": Origin("a"), "c": Origin("c2", 4), "k": Origin("k"), "X": Origin("x", 1)}
    assert layout.from_step(1) == [("X", "x")] and layout.from_step(4) == [("c", "c2")]
    assert layout.explained == {"W"}
    assert replay(["a"], None).names == ["a"]


def test_records_without_lineage_are_converted_from_their_column_lists():
    merged = {"type": "merge_from_sidecar", "status": "merged", "appended": ["x"], "replaced": ["c"],
              "kept_from_main": [], "protected": [], "input": "id"}
    assert from_legacy(merged) == (replaced("c"), appended("x"))
    assert StepRecord.from_dict(merged) == StepRecord(Status.MERGED, (replaced("c"), appended("x")), "id")
    assert StepRecord.from_dict({"status": "dropped", "removed": ["w"], "input": "none"}).lineage == (removed("w"),)
    assert StepRecord.from_dict({"status": "skipped_missing_sibling", "input": "absent"}).applied is False
    assert StepRecord.from_dict({"status": "from_a_later_version"}).status is Status.APPLIED


def test_a_step_survives_its_provenance_form():
    step = StepRecord(Status.APPLIED, (renamed("a", "b"), absent("c", "d")), "none", {"note": [1]})
    record = json.loads(json.dumps(step.to_dict()))
    assert record["lineage"] == [{"column": "b", "change": "rename", "was": "a"},
                                 {"column": "d", "change": "absent", "was": "c"}]
    assert StepRecord.from_dict(record) == StepRecord(step.status, step.lineage, step.input)
    assert [s.value for s in Status] == ["planned", "merged", "dropped", "applied", "skipped_missing_sibling",
                                         "failed"]  # the strings provenance has always held
    assert {c.value for c in Change} == {"append", "replace", "rename", "remove", "absent", "transform"}


def test_history_tells_a_skipped_supplier_from_a_misconfiguration():
    optional = MergeFromSidecar("s3://b/w/", ("watermark",), required=False)
    history = History.of([optional, DropColumns(("width",))],
                         [{"status": "skipped_missing_sibling", "input": "absent"}, StepRecord(Status.DROPPED)])
    assert history.skipped_supplier("watermark") == 0 and history.skipped_supplier("height") is None
    later = history.then(DropColumns(("x",)), StepRecord(Status.APPLIED, (absent("watermark", "wm"),)))
    assert later.skipped_supplier("wm") == 2 and len(later.records) == 3


# ---------------------------------------------------------------- outputs of earlier versions

def chain(p: dict) -> list[dict]:
    return [dqm_op(p), {"type": "drop_columns", "columns": ["width"]}, aes_op(p), watermark_op(p, required=False)]


def merged(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS, ops=chain)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    for rel in REL:
        merge_shard(job, rel)
    return setup, job


def test_records_keep_every_field_they_had_and_add_lineage(tmp_path):
    setup, job = merged(tmp_path)
    ops = read_provenance(storage.read_footer(setup.output + REL[-1]))["operations"]
    config = [set(op.to_dict()) for op in job.pipeline.operations]
    merge = {"status", "input", "appended", "replaced", "kept_from_main", "protected"}
    before = [merge, {"status", "input", "removed"}, merge, {"status", "input"}]
    assert [set(r) for r in ops] == [c | b | {"lineage"} for c, b in zip(config, before)]
    assert [r["status"] for r in ops] == ["merged", "dropped", "merged", "skipped_missing_sibling"]


def test_outputs_written_before_lineage_still_verify_and_count_as_complete(tmp_path):
    """An earlier version's output differs only in lacking `lineage` in each record: strip it, and resume finds every
    shard complete (same input key) and verify passes, its layout read from appended/replaced/removed."""
    setup, job = merged(tmp_path)
    for rel in REL:
        uri = setup.output + rel
        table = pq.read_table(uri)
        prov = json.loads(table.schema.metadata[PROVENANCE_KEY])
        for record in prov["operations"]:
            del record["lineage"]
        meta = {**table.schema.metadata, PROVENANCE_KEY: json.dumps(prov, sort_keys=True).encode()}
        storage.write_atomic(table.replace_schema_metadata(meta), uri)
        assert "lineage" not in json.dumps(read_provenance(storage.read_footer(uri)))
    plan = make_plan(job)
    assert plan.complete == REL and plan.todo == []
    report = verify(job, samples=SHARDS, stream=io.StringIO())
    assert report.ok, {c.name: c.failures for c in report.checks if not c.passed}


def test_a_changes_sibling_column_round_trips_through_provenance():
    """A sibling column under another name (and by default the column's own name) is written and read back."""
    changes = [appended("a"), appended("a", "s"), replaced("r"), replaced("r", "t"), renamed("w", "v"), removed("x"),
               absent("y", "z")]
    assert [c.to_dict() for c in changes[:4]] == [
        {"column": "a", "change": "append", "sibling": "a"}, {"column": "a", "change": "append", "sibling": "s"},
        {"column": "r", "change": "replace", "sibling": "r"}, {"column": "r", "change": "replace", "sibling": "t"}]
    assert [ColumnChange.from_dict(c.to_dict()) for c in changes] == changes
    layout = replay(["k"], [StepRecord(Status.MERGED, (appended("a", "s"),))])
    assert layout.origin == {"k": Origin("k"), "a": Origin("s", 0)}


def test_a_transformed_column_keeps_its_place_and_is_the_steps_own_not_a_siblings():
    records = [StepRecord(Status.APPLIED, (transformed("b"),)), StepRecord(Status.APPLIED, (renamed("b", "c"),))]
    layout = replay(["a", "b"], records)
    assert layout.names == ["a", "c"] and layout.kept == 2
    assert layout.origin["c"] == Origin("b", 0, transformed=True)
    assert (layout.origin["c"].step, layout.from_step(0)) == (0, [])  # no sibling column to compare it with
    assert replay(["a", "b"], [StepRecord(Status.SKIPPED, (transformed("b"),))]).origin["b"] == Origin("b")


def test_a_step_record_is_its_notes_status_lineage_and_input_and_a_history_takes_records_or_dicts():
    record = StepRecord(Status.MERGED, (appended("s", "raw"), renamed("a", "b")), "id-1", {"appended": ["s"]})
    recorded = {"appended": ["s"], "status": "merged", "input": "id-1",
                "lineage": [{"column": "s", "change": "append", "sibling": "raw"},
                            {"column": "b", "change": "rename", "was": "a"}]}
    assert record.to_dict() == recorded
    assert StepRecord(Status.PLANNED).to_dict() == {"status": "planned", "lineage": []}  # no input: none recorded
    history = History.of(["op0", "op1", "op2"], [record, recorded])
    assert history.steps == (("op0", record), ("op1", StepRecord(Status.MERGED, record.lineage, "id-1")))
