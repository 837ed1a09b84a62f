"""The check that ends every merge run (tasks/runcheck.py; the verify-run task): the output prefix holds one
output per base shard and nothing else, each as the run checked it; a failure fails the run (exit 1).

The kernel-level tests build the run's facts the way the flow does (the plan's listings, the shard tasks'
stats) and change the output prefix between the merge and the check; the flow-level ones run `sidecar-ops
run` on the session's Prefect API and read what the UI shows: the task runs and the `merge-run-check` artifact.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from core_fixtures import build, flow_run_named, merge_dag, put_bytes, read_table, remove, task_runs, write_table
from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, merge_shard, overwrite_fields
from tasks.plan import make_plan
from tasks.runcheck import check_run

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 3
REL = sorted(relpaths(SHARDS))


def merged_run(tmp_path, root):
    """A first run's facts, as the flow holds them at its end: the plan, and every shard's stats."""
    setup = build(tmp_path, root, shards=SHARDS)
    job = Job(load_pipeline(setup.pipeline), setup.output, run_id="run-a")
    plan = make_plan(job)
    return setup, plan, {rel: merge_shard(job, rel) for rel in REL}


def check(plan, merged):
    return check_run(plan, merged, storage.list_prefix(plan.job.output_prefix))


def test_a_complete_run_passes_with_its_rows_counted(tmp_path, root):
    setup, plan, merged = merged_run(tmp_path, root)
    result = check(plan, merged)
    assert result.ok, result.problems
    assert result.rows == sum(read_table(setup.output + rel).num_rows for rel in REL)
    assert {row["result"] for row in result.table if row["result"] != "info"} == {"ok"}
    assert result.line().startswith("run check passed: one output per base shard")


@pytest.mark.parametrize("stray", ["zz-extra.parquet", "notes.txt", "sub/part-0.parquet"])
def test_anything_else_under_the_output_prefix_fails_the_check(tmp_path, root, stray):
    setup, plan, merged = merged_run(tmp_path, root)
    put_bytes(setup.output + stray, b"not an output")
    result = check(plan, merged)
    assert result.problems == [f"1 object(s) under the output prefix are not outputs of base shards, e.g. {stray}"]
    assert result.line() == "run check FAILED: " + result.problems[0]


def test_a_base_shard_without_output_fails_the_check(tmp_path, root):
    setup, plan, merged = merged_run(tmp_path, root)
    remove(setup.output + REL[1])
    assert check(plan, merged).problems == [f"1 base shard(s) have no output, e.g. {REL[1]}"]


def resumed_run(tmp_path, root, kept: int):
    """A resumed run's facts: the first `kept` shards were merged by an earlier run and kept by this one's plan,
    the rest merged by this run."""
    setup = build(tmp_path, root, shards=SHARDS)
    earlier = Job(load_pipeline(setup.pipeline), setup.output, run_id="run-a")
    for rel in REL[:kept]:
        merge_shard(earlier, rel)
    job = Job(earlier.pipeline, setup.output, run_id="run-b")
    plan = make_plan(job)
    assert sorted(plan.complete) == REL[:kept]
    return setup, plan, {rel: merge_shard(job, rel) for rel in REL[kept:]}


@pytest.mark.parametrize("kept", [1, SHARDS - 1, SHARDS], ids=["first-kept", "all-but-one-kept", "all-kept"])
@pytest.mark.parametrize("which", ["first", "last"])
def test_a_kept_output_deleted_before_the_check_fails_it(tmp_path, root, kept, which):
    """One output per base shard holds for the outputs the run kept as for those it wrote: a kept output
    deleted after the plan kept it (another process, an operator's clean-up) fails the check."""
    setup, plan, merged = resumed_run(tmp_path, root, kept)
    assert check(plan, merged).ok
    gone = REL[0] if which == "first" else REL[kept - 1]
    remove(setup.output + gone)
    assert check(plan, merged).problems == [f"1 base shard(s) have no output, e.g. {gone}"]


@pytest.mark.parametrize("kept", [0, 1, SHARDS], ids=["none-kept", "some-kept", "all-kept"])
def test_every_output_deleted_before_the_check_fails_it_naming_each(tmp_path, root, kept):
    setup, plan, merged = resumed_run(tmp_path, root, kept)
    for rel in REL:
        remove(setup.output + rel)
    assert check(plan, merged).problems == [f"{SHARDS} base shard(s) have no output, e.g. {', '.join(REL)}"]


def test_an_output_rewritten_after_its_check_fails_the_check(tmp_path, root):
    setup, plan, merged = merged_run(tmp_path, root)
    write_table(read_table(setup.output + REL[0]).slice(1), setup.output + REL[0])  # another writer's
    assert check(plan, merged).problems == [
        f"1 output(s) changed after this run checked them and not current (another writer?), e.g. {REL[0]}"]


def test_an_overwrite_fails_on_an_output_another_run_wrote(tmp_path, root):
    """In an --overwrite run only what that overwrite wrote counts as current (as a continued overwrite judges)."""
    setup = build(tmp_path, root, shards=SHARDS)
    job = Job(load_pipeline(setup.pipeline), setup.output, run_id="run-a", **overwrite_fields(True, "run-a"))
    plan, merged = make_plan(job, overwrite=True), {rel: merge_shard(job, rel) for rel in REL}
    merge_shard(Job(job.pipeline, setup.output, run_id="run-b, whose id is longer: another size"), REL[1])
    assert check(plan, merged).problems == [
        f"1 output(s) changed after this run checked them and not current (another writer?), e.g. {REL[1]}"]


def test_another_runs_current_output_and_its_temp_file_pass_and_are_counted(tmp_path, root):
    """Two runs on one prefix (a supported case): the other one rewrote a shard after this one checked it,
    from the same inputs, and is writing another (its temp file is there)."""
    setup, plan, merged = merged_run(tmp_path, root)
    other = Job(plan.job.pipeline, setup.output, run_id="run-b, whose id is longer: another size")
    merge_shard(other, REL[1])
    put_bytes(setup.output + "2025/.sidecar-ops-tmp-hostb-123-abc", b"half an upload")
    result = check(plan, merged)
    assert result.ok, result.problems
    found = {row["check"]: row["found"] for row in result.table}
    assert found["outputs another run rewrote since, current (judged from their footers)"] == "1"
    assert found["temp files of writes in flight in another run (or killed: the next run's sweep takes them)"] == "1"


def test_kept_outputs_are_judged_by_the_identity_the_plan_listed(tmp_path, root):
    setup, _, _ = merged_run(tmp_path, root)
    resumed = make_plan(Job(load_pipeline(setup.pipeline), setup.output))  # every output complete: kept
    assert sorted(resumed.complete) == REL and not resumed.todo
    result = check(resumed, {})
    assert result.ok and result.rows == sum(resumed.rows.values()) > 0
    table = read_table(setup.output + REL[2])
    write_table(table, setup.output + REL[2])  # the same rows written again: another object
    assert check(resumed, {}).problems == []  # the same rows: current, only another object
    write_table(table.slice(1), setup.output + REL[2])  # cut short, its provenance kept: not current
    assert check(resumed, {}).problems == [
        f"1 output(s) changed after this run checked them and not current (another writer?), e.g. {REL[2]}"]


def test_an_output_neither_written_nor_kept_fails_the_check(tmp_path, root):
    _, plan, merged = merged_run(tmp_path, root)
    del merged[REL[0]]
    assert check(plan, merged).problems == [f"1 output(s) neither written nor kept by this run, e.g. {REL[0]}"]


def test_inputs_replaced_during_the_run_are_counted_not_failed(tmp_path, root):
    setup, plan, merged = merged_run(tmp_path, root)
    sibling = setup.prefixes["dqm"] + REL[0]
    table = read_table(sibling)
    write_table(table.set_column(1, table.schema.field(1), pa.concat_arrays([table.column(1).chunk(0)[1:],
                                                                              table.column(1).chunk(0)[:1]])),
                sibling)
    job = plan.job
    redone = merge_shard(job, REL[0])  # what a retry reading the new version records
    result = check(plan, {**merged, REL[0]: redone})
    assert result.ok
    [row] = [r for r in result.table if r["check"].startswith("outputs made from inputs replaced")]
    assert (row["found"], row["result"]) == ("1", "info")


# ----------------------------------------------------------------- through a run, on the session's API

def test_the_run_shows_its_listings_merges_and_check_and_publishes_the_check(tmp_path, root, run):
    from test_verify import read_artifacts

    setup = build(tmp_path, root, shards=SHARDS)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    assert "run check passed: one output per base shard" in err + out
    flow_run = flow_run_named(f"merge {setup.pipeline}")
    wanted = merge_dag(setup.output, REL)
    assert "list operations[2].source_prefix" in wanted and f"verify run {setup.output}" in wanted
    runs = task_runs(flow_run.id, wanted)
    assert sorted(r.name for r in runs) == sorted(wanted)  # one task a listing, a shard, the check: no more
    assert {r.state.type.value for r in runs} == {"COMPLETED"}
    artifact = read_artifacts(flow_run.id)["merge-run-check"]
    table = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert [(row["check"], row["found"], row["result"]) for row in table[:2]] == [
        ("one output per base shard", str(SHARDS), "ok"), (f"nothing else under {setup.output}", "0", "ok")]


def test_an_extra_shard_fails_the_run_and_its_check_task(tmp_path, root, run):
    setup = build(tmp_path, root, shards=SHARDS)
    put_bytes(setup.output + "zz-extra.parquet", b"left by someone")
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 1, out + err
    assert ("run check FAILED: 1 object(s) under the output prefix are not outputs of base shards, "
            "e.g. zz-extra.parquet") in err
    flow_run = flow_run_named(f"merge {setup.pipeline}")
    assert flow_run.state.is_failed()
    states = {r.name: r.state.type.value for r in task_runs(flow_run.id, {f"verify run {setup.output}"})}
    assert states[f"verify run {setup.output}"] == "FAILED"


def delete_before_the_check(monkeypatch, uri: str, merged: list[str] | None = None) -> None:
    """The run's check (tasks.prefect_tasks.check_run) lists the output prefix after `uri` was deleted by
    another process, once the run is done with it; `merged`: the shards the run must have merged."""
    import tasks.prefect_tasks

    real = tasks.prefect_tasks.check_run

    def delete_then_check(plan, done, fresh):
        if merged is not None:
            assert sorted(done) == merged
        remove(uri)
        return real(plan, done, storage.list_prefix(plan.job.output_prefix))

    monkeypatch.setattr(tasks.prefect_tasks, "check_run", delete_then_check)


def test_an_output_gone_before_the_check_fails_the_run(tmp_path, root, run, monkeypatch):
    """Another process deletes an output after its shard task wrote and checked it, before the run's check."""
    setup = build(tmp_path, root, shards=SHARDS)
    delete_before_the_check(monkeypatch, setup.output + REL[2])
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 1, out + err
    assert f"run check FAILED: 1 base shard(s) have no output, e.g. {REL[2]}" in err
    assert "shards: 3 total, 3 merged, 0 skipped (already complete), 0 failed" in err


def test_a_kept_output_gone_before_the_check_fails_the_resumed_run(tmp_path, root, run, monkeypatch):
    """A resumed run keeps the outputs of the first run but one; another process deletes a kept one after the
    plan kept it, before the run's check: the run fails (exit 1), naming it."""
    setup = build(tmp_path, root, shards=SHARDS)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    remove(setup.output + REL[1])  # this one is merged again; REL[0] and REL[2] are kept
    delete_before_the_check(monkeypatch, setup.output + REL[2], merged=[REL[1]])
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 1, out + err
    assert f"run check FAILED: 1 base shard(s) have no output, e.g. {REL[2]}" in err
    assert "shards: 3 total, 1 merged, 2 skipped (already complete), 0 failed" in err
