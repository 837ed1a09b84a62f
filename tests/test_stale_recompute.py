"""Issue 18, seen case 6: a stale output whose recompute fails.

Its old output stays where it is (made from the inputs it recorded, never trusted by a resume: the input key
differs), the summary says it failed and that its old output remains and is not current (instead of counting it
as recomputed), and `sidecar-ops verify` fails on that shard from the footers alone (no data sampled), through
the `current inputs` check.
"""
from __future__ import annotations

import json
import os

from core_fixtures import build, get_bytes, swap_rows_fn
from test_interrupt import signal_at  # noqa: F401 (a fixture)
from test_flow_local import REL, SHARDS, summary_counts

from tasks.verification import INPUTS


def test_failed_recompute_of_a_stale_output_is_reported_and_fails_verify(tmp_path, run, cli):
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    broken, touched = REL[0], REL[1]
    old_output = get_bytes(setup.output + broken)
    swap_rows_fn(setup.prefixes["dqm"] + broken, 2, 9)  # changed: stale, and its recompute fails (misaligned)
    sibling = setup.prefixes["dqm"] + touched
    os.utime(sibling, ns=(os.stat(sibling).st_mtime_ns + 10**9,) * 2)  # same bytes, a new identity: recomputed

    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    text = out + err
    assert code == 1, text
    assert summary_counts(text) == (4, 1, 2, 1)
    assert ("stale outputs (inputs changed since they were written): 2 (1 recomputed, 1 failed: its old output "
            "remains and is not current)") in text, text
    assert f"FAILED {broken} (its stale old output remains, not current): shard {broken}: operations[0]" in text
    assert "stale outputs recomputed" not in text
    assert get_bytes(setup.output + broken) == old_output, "the old output is left as it was"

    report_path = tmp_path / "report.json"
    code, out, err = cli("verify", setup.pipeline, "--output-prefix", setup.output, "--samples", "0",
                         "--json", report_path)
    assert code == 1, out + err
    report = json.loads(report_path.read_text())
    failed = {c["name"]: c["failures"] for c in report["checks"] if not c["passed"]}
    assert failed == {INPUTS: [{"path": broken, "detail": "stale: operations[0] sibling changed since it was "
                                "written (the same comparison a run's plan makes); rerun the merge to recompute "
                                "it"}]}, failed


def test_stale_outputs_a_stopped_run_never_reached_are_unfinished_not_recomputed(tmp_path, run, signal_at):
    """The third side: every output stale, the run stopped by SIGTERM at the third shard's read (one shard at a
    time): three recomputed, three never started, counted unfinished with their old outputs left, not current."""
    import signal

    from test_interrupt import REL as ALL, SHARDS as COUNT, STOP_AT

    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=COUNT)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    for rel in ALL:  # same bytes, a new identity: every output stale
        sibling = setup.prefixes["dqm"] + rel
        os.utime(sibling, ns=(os.stat(sibling).st_mtime_ns + 10**9,) * 2)
    old = {rel: get_bytes(setup.output + rel) for rel in ALL}
    signal_at(signal.SIGTERM)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--max-inflight", "1")
    assert code == 130, out + err
    left = COUNT - STOP_AT
    assert (f"stale outputs (inputs changed since they were written): {COUNT} ({STOP_AT} recomputed, {left} "
            "unfinished: their old outputs remain and are not current)") in err, err
    assert [rel for rel in ALL if get_bytes(setup.output + rel) == old[rel]] == ALL[STOP_AT:]
