"""The retry path (issue 11, seen case 4), made deterministic: a fault is injected into one chosen shard's chosen
attempt (the write patched for that relpath only: `stream_output` in the default layout, one task a shard;
`write_output` in the task-per-operation chain's last step), on the thread runner against the session's Prefect API.

- A writer that dies after its shard landed: the retry finds the output made from the same inputs, ends as
  Cached, and reports the real stats (rows, bytes, the skipped optional operation), so verification passes.
- An --overwrite run whose first attempt fails before writing: the retry must not keep the previous run's
  output (it was made from the same inputs, but this run is meant to replace it).
"""
from __future__ import annotations

import re
from collections import Counter

import pytest

from core_fixtures import build, flow_run_named, identities, read_meta, task_runs

from tasks import kernel, storage
from tasks.demo import relpaths

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 4
REL = sorted(relpaths(SHARDS))
GAP = relpaths(SHARDS)[-1]  # the shard without a watermark sibling: its optional operation is skipped


# layout: (flags, the kernel function that writes a shard's output, the name of the task run that calls it)
LAYOUTS = {"fused": ([], "stream_output", "merge {}"),
           "chain": (["--task-per-operation"], "write_output", "merge[2] {}")}
EACH_LAYOUT = pytest.mark.parametrize("layout", list(LAYOUTS))


def inject(monkeypatch, layout: str, relpath: str, attempt: int, after_write: bool) -> Counter:
    """The layout's write fails for `relpath` on its `attempt`-th call (after or before writing); others pass."""
    writer = LAYOUTS[layout][1]
    real_write, calls = getattr(kernel, writer), Counter()

    def write(job, rel, state):
        calls[rel] += 1
        if rel == relpath and calls[rel] == attempt and not after_write:
            raise OSError(f"injected: lost before writing {rel}")
        stats = real_write(job, rel, state)
        if rel == relpath and calls[rel] == attempt:
            raise OSError(f"injected: worker lost after the upload of {rel} completed")
        return stats

    monkeypatch.setattr(kernel, writer, write)
    return calls


def task_states(pipeline, name: str) -> list[str]:
    """States of the task runs called `name` in this test's (one) flow run of `pipeline`, once each is final
    (task runs reach the API through events, after the run returned)."""
    runs = task_runs(flow_run_named(f"merge {pipeline}").id, {name})
    return [run.state.name for run in runs if run.name == name]


def summary_numbers(out: str) -> dict[str, int]:
    m = re.search(r"rows merged: ([\d,]+)  bytes written: ([\d,]+)", out)
    assert m, out
    return {"rows": int(m.group(1).replace(",", "")), "bytes": int(m.group(2).replace(",", ""))}


@EACH_LAYOUT
def test_retry_after_write_is_cached_with_real_stats(tmp_path, monkeypatch, run, layout):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    calls = inject(monkeypatch, layout, GAP, attempt=1, after_write=True)
    flags, _, task_name = LAYOUTS[layout]
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--retries", "1", *flags)
    assert code == 0, out + err
    assert calls[GAP] == 1, "the retry found the output and did not write again"
    assert "4 total, 4 merged, 0 skipped (already complete), 0 failed" in out
    assert "operations skipped for missing siblings (required: false): 1" in out
    sizes = storage.list_prefix(setup.output).shards
    assert summary_numbers(out) == {"rows": SHARDS * 40, "bytes": sum(sizes.values())}
    assert task_states(setup.pipeline, task_name.format(GAP)) == ["Cached"]


@EACH_LAYOUT
def test_overwrite_retry_never_keeps_the_previous_output(tmp_path, monkeypatch, run, layout):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    flags = LAYOUTS[layout][0]
    assert run(setup.pipeline, "--output-prefix", setup.output, *flags)[0] == 0
    before = identities(setup.output)
    first_run = kernel.read_provenance(read_meta(setup.output + REL[0])).get("run_id")
    calls = inject(monkeypatch, layout, REL[0], attempt=1, after_write=False)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite", "--retries", "1", *flags)
    assert code == 0, out + err
    assert calls[REL[0]] == 2
    assert "4 total, 4 merged, 0 skipped (already complete), 0 failed" in out
    after = identities(setup.output)
    assert all(after[rel] != before[rel] for rel in REL), "every shard was rewritten by the --overwrite run"
    runs = {kernel.read_provenance(read_meta(setup.output + rel)).get("run_id") for rel in REL}
    assert len(runs) == 1 and first_run not in runs
