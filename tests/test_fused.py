"""`--fuse-operations` (the default): one task per shard does every operation, the write and its check, against
`--task-per-operation` (a chain of one task per operation).

Its outputs are the per-operation chain's outputs (same content, same resume key), a failure names the same
shard and operation, and the Prefect API records exactly one task run per shard.
"""
from __future__ import annotations

import inspect
import json
from collections import Counter

import pytest

from core_fixtures import build, flow_run_named, merge_dag, read_meta, read_table, swap_rows_fn, task_runs
from test_flow_local import REL, SHARDS, assert_clean, assert_output_equals_inputs, summary_counts

from flows import compat
from tasks import kernel
from tasks.errors import ShardError
from tasks.kernel import PROVENANCE_KEY

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path



def provenance(uri: str) -> dict:
    prov = json.loads(read_meta(uri).metadata[PROVENANCE_KEY])
    return {k: v for k, v in prov.items() if k not in kernel.PER_RUN_FIELDS}


def test_fused_run_equals_the_chain_and_records_one_task_per_shard(tmp_path, run):
    root = str(tmp_path / "data") + "/"  # the same kernel and writer as the chain: one backend is enough
    fused = build(tmp_path / "fused", root + "fused/", shards=SHARDS)
    code, out, err = run(fused.pipeline, "--output-prefix", fused.output)  # the default layout
    assert code == 0, err
    assert_clean(out, err)
    assert summary_counts(out) == (4, 4, 0, 0)
    assert "operations skipped for missing siblings (required: false): 1" in out
    assert_output_equals_inputs(fused)
    dag = merge_dag(fused.output, REL)  # a duplicate task run would count twice
    runs = task_runs(flow_run_named(f"merge {fused.pipeline}").id, dag)
    assert Counter(r.name for r in runs) == Counter(dag)

    chain = build(tmp_path / "chain", root + "chain/", shards=SHARDS)
    assert run(chain.pipeline, "--output-prefix", chain.output, "--task-per-operation")[0] == 0
    for rel in REL:
        assert read_table(fused.output + rel).equals(read_table(chain.output + rel)), rel
        want, got = provenance(chain.output + rel), provenance(fused.output + rel)
        for prov in (want, got):  # the data's own locations differ between the two builds
            prov.pop("main_prefix"), prov.pop("inputs"), prov.pop("input_key"), prov.pop("fingerprint")
            for op in prov["operations"]:
                op.pop("source_prefix"), op.pop("input", None)
        assert got == want, rel


@pytest.mark.parametrize("flags, fused", [([], True), (["--fuse-operations"], True),
                                          (["--task-per-operation"], False)])
def test_one_task_a_shard_is_the_default_and_the_chain_is_asked_for(flags, fused):
    """On the command line, in a deployment's flow run (the flow's parameter) and in a RunConfig alike."""
    from flows.cli import parser
    from flows.merge import merge_flow
    from flows.runconfig import RunConfig

    assert parser().parse_args(["run", "p.yaml", *flags]).fuse_operations is fused
    assert inspect.signature(merge_flow.fn).parameters["fuse_operations"].default is True
    assert RunConfig(None, "", "").fuse_operations is True


def test_the_two_layouts_cannot_both_be_asked_for(capsys):
    from flows.cli import parser

    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["run", "p.yaml", "--fuse-operations", "--task-per-operation"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_fused_and_chain_outputs_resume_each_other(tmp_path, run):
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output, "--fuse-operations")[0] == 0
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--task-per-operation")
    assert code == 0, err
    assert summary_counts(out) == (4, 0, 4, 0)


def test_fused_failure_names_the_shard_and_the_operation(tmp_path, run):
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=SHARDS)
    bad = REL[1]
    swap_rows_fn(setup.prefixes["dqm"] + bad, 2, 9)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--fuse-operations")
    assert code == 1
    assert summary_counts(out + err) == (4, 3, 0, 1)
    failed = [line for line in (out + err).splitlines() if line.startswith("FAILED ")]
    assert failed == [line for line in failed if line.startswith(
        f"FAILED {bad}: shard {bad}: operations[0] (merge_from_sidecar from {setup.prefixes['dqm']}): "
        "key mismatch in 2 of 40 rows; first at row 2")] and len(failed) == 1
    assert "Traceback" not in out + err


@pytest.mark.slow  # 10^3 shards: ~25 s
def test_the_driver_keeps_no_links_of_finished_shards(tmp_path, run, monkeypatch):
    """Prefect links every task result to its state in the flow run context for the whole flow run, and its
    thread pool keeps a cancel event per task run; the shard scheduler and runner drop those of finished
    shards, so the driver's memory does not grow with the shard count. Observed at each finished shard."""
    from prefect.context import FlowRunContext

    import flows.scheduler

    shards, window, sizes, events, before = 80, 4, [], [], []
    real = flows.scheduler.run_window

    def watched(items, submit, *args, **kwargs):
        before.append(len(compat.result_links(FlowRunContext.get())))  # the listings' (a few, fixed)
        for done in real(items, submit, *args, **kwargs):
            sizes.append(len(compat.result_links(FlowRunContext.get())))
            events.append(len(compat.cancel_events_of(submit.__self__.runner)))  # Prefect's: one a task run
            yield done

    monkeypatch.setattr(flows.scheduler, "FORGET_EVERY", 8)
    monkeypatch.setattr("flows.merge.run_window", watched)
    for flags, tasks in ((["--task-per-operation"], 4), ([], 1)):  # the chain: 3 operations + the check
        setup = build(tmp_path / f"{tasks}", str(tmp_path / f"data{tasks}") + "/", shards=shards, rows=5)
        sizes.clear(), events.clear(), before.clear()
        code, _, err = run(setup.pipeline, "--output-prefix", setup.output, "--max-inflight", str(window), *flags)
        assert code == 0, err
        assert len(sizes) == shards
        # a few links a task run, of the shards in flight or finished since the last sweep; kept, they would
        # number at least one a task run of every shard
        bound = 4 * (8 + tasks * (window + 1))
        assert before[0] <= 5 * 5, before  # 5 listings, each the Listing and its 4 trackable fields (depth 1)
        assert max(sizes) - before[0] <= bound < shards * tasks, (flags, sizes, before)
        assert sizes[-1] == before[0], (flags, sizes, before)
        assert max(events) <= tasks * (window + 1), (flags, events)


def fail_check_once(monkeypatch, relpath: str, then_broken: bool = False) -> Counter:
    """kernel.check_written fails with a transient error on `relpath`'s first call; with `then_broken`, its later
    calls fail as a check of a bad output would (permanent). Other shards' checks run unchanged. Call counts."""
    real, calls = kernel.check_written, Counter()

    def check(job, rel, stats, *more, **kw):
        calls[rel] += 1
        if rel == relpath and calls[rel] == 1:
            raise ShardError(f"injected: connection reset verifying {rel}", transient=True)
        if rel == relpath and then_broken:
            raise ShardError(f"injected: key column of {rel} differs from the base")
        return real(job, rel, stats, *more, **kw)

    monkeypatch.setattr(kernel, "check_written", check)
    return calls


LAYOUTS = pytest.mark.parametrize("layout", [["--task-per-operation"], []], ids=["chain", "fused"])


@LAYOUTS
def test_a_retry_runs_the_post_write_check_on_the_output_it_returns(tmp_path, monkeypatch, run, layout):
    """Issue 18, seen case 8: the retry finds the output written by the first attempt; it must check it again,
    not end as Cached on the strength of the footer alone (both task layouts: the write step checks)."""
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=SHARDS)
    calls = fail_check_once(monkeypatch, REL[0])
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, *layout, "--retries", "1")
    assert code == 0, out + err
    assert summary_counts(out) == (4, 4, 0, 0)
    assert calls == Counter({REL[0]: 2, **{rel: 1 for rel in REL[1:]}}), calls


@LAYOUTS
def test_a_retry_whose_check_fails_fails_the_shard(tmp_path, monkeypatch, run, layout):
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=SHARDS)
    calls = fail_check_once(monkeypatch, REL[0], then_broken=True)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, *layout, "--retries", "1")
    assert code == 1, out + err
    assert summary_counts(out + err) == (4, 3, 0, 1)
    assert f"FAILED {REL[0]}: injected: key column of {REL[0]} differs from the base" in out + err
    assert calls[REL[0]] == 2
