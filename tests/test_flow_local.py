"""The merge flow end to end through `sidecar-ops run` on a real Prefect API, local disk and S3 (moto server).

Issue 2's Done-when: a 3-operation merge equals base + sources value for value; deleting two output shards
and rerunning rewrites exactly those two; resume holds with Prefect's database wiped.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core_fixtures import (build, expected_output, get_bytes, identities, objects, put_bytes, read_table,
                           remove, swap_rows_fn, task_runs, flow_run_named, versioned)
from tasks.demo import relpaths

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REPO = Path(__file__).resolve().parents[1]
SHARDS = 4
REL = sorted(relpaths(SHARDS))
ALL_COLUMNS = [("dqm", "dqm_d1_v6_1"), ("aes", "ernie_image_aes"), ("watermark", "watermark")]


def assert_clean(out: str, err: str) -> None:
    assert "Traceback" not in out + err
    assert "ERROR" not in out + err, err


def assert_output_equals_inputs(setup, rels=REL) -> None:
    assert objects(setup.output) == sorted(rels)
    for rel in rels:
        cols = ALL_COLUMNS if rel != relpaths(SHARDS)[-1] else ALL_COLUMNS[:2]  # the watermark gap
        got = read_table(setup.output + rel).replace_schema_metadata(None)
        assert got.equals(expected_output(setup, rel, cols)), rel


def summary_counts(out: str) -> tuple[int, int, int, int]:
    m = re.search(r"shards: (\d+) total, (\d+) merged, (\d+) skipped \(already complete\), (\d+) failed", out)
    assert m, out
    return tuple(int(x) for x in m.groups())


# ----------------------------------------------------------------- done-when

def test_merge_then_resume_rewrites_exactly_the_deleted_shards(tmp_path, root, run):
    setup = build(tmp_path, versioned(root), shards=SHARDS)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, err
    assert_clean(out, err)
    assert summary_counts(out) == (4, 4, 0, 0)
    assert "operations skipped for missing siblings (required: false): 1" in out
    assert_output_equals_inputs(setup)

    before = identities(setup.output)
    gone = [REL[1], REL[3]]
    for rel in gone:
        remove(setup.output + rel)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, err
    assert_clean(out, err)
    assert summary_counts(out) == (4, 2, 2, 0)
    after = identities(setup.output)
    assert set(after) == set(REL)
    for rel in REL:
        if rel in gone:
            assert after[rel] != before[rel], f"{rel} should have been rewritten"
        else:
            assert after[rel] == before[rel], f"{rel} was rewritten although it was complete"
    assert_output_equals_inputs(setup)


def test_rerun_on_complete_output_writes_nothing(tmp_path, root, run):
    setup = build(tmp_path, versioned(root), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    before = identities(setup.output)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--skip-existing")
    assert code == 0 and summary_counts(out) == (4, 0, 4, 0)
    assert identities(setup.output) == before
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite")
    assert code == 0 and summary_counts(out) == (4, 4, 0, 0)
    after = identities(setup.output)
    assert all(after[rel] != before[rel] for rel in REL)


@pytest.mark.slow
def test_resume_holds_with_a_fresh_prefect_home(tmp_path, run):
    """Run, then rerun in a new process with an empty PREFECT_HOME and no PREFECT_API_URL (it starts its own
    server through flows/server.py): the output shards alone say the work is done."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    before = identities(setup.output)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "fresh-prefect-home")
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(setup.pipeline),
                           "--output-prefix", setup.output], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stdout, proc.stderr)
    assert summary_counts(proc.stdout) == (4, 0, 4, 0)
    assert identities(setup.output) == before
    assert (tmp_path / "fresh-prefect-home").exists(), "the run used the fresh PREFECT_HOME"


def test_truncated_and_corrupt_outputs_are_recomputed(tmp_path, root, run):
    setup = build(tmp_path, root, shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    whole = get_bytes(setup.output + REL[0])
    put_bytes(setup.output + REL[0], whole[: len(whole) // 2])
    put_bytes(setup.output + REL[2], b"PAR1" + b"\0" * 64 + b"PAR1")
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, err
    assert summary_counts(out) == (4, 2, 2, 0)
    assert_output_equals_inputs(setup)


# ----------------------------------------------------------------- failures

def test_a_failing_shard_does_not_stop_the_others(tmp_path, root, run):
    setup = build(tmp_path, root, shards=SHARDS)
    bad = REL[1]
    swap_rows_fn(setup.prefixes["dqm"] + bad, 2, 9)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 1
    assert summary_counts(out + err) == (4, 3, 0, 1)
    failed = [line for line in (out + err).splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1
    assert failed[0].startswith(f"FAILED {bad}: shard {bad}: operations[0] (merge_from_sidecar from "
                                f"{setup.prefixes['dqm']}): key mismatch in 2 of 40 rows; first at row 2")
    assert "Traceback" not in out + err
    assert objects(setup.output) == [r for r in REL if r != bad]


def test_fail_fast_stops_submitting(tmp_path, run):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    swap_rows_fn(setup.prefixes["dqm"] + REL[0], 0, 1)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--fail-fast", "--max-inflight", "1")
    assert code == 1
    total, merged, skipped, failed = summary_counts(out + err)
    assert (total, merged, failed) == (4, 0, 1)
    assert "shards: 4 total, 0 merged, 0 skipped (already complete), 1 failed, 3 not started" in err
    assert "stopped after the first failure (--fail-fast): 3 shards not started" in err
    assert objects(setup.output) == []
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--max-inflight", "1")
    assert code == 1 and summary_counts(out + err) == (4, 3, 0, 1)


# ----------------------------------------------------------------- defaults and names

def test_default_output_prefix_is_a_new_timestamped_sibling(tmp_path, root, run):
    setup = build(tmp_path, root, shards=2)
    code, out, err = run(setup.pipeline)
    assert code == 0, err
    sidecar = setup.prefixes["base"].rstrip("/") + "_all_in_one"
    m = re.search(r"NOTE: no --output-prefix given; writing to a NEW prefix (\S+)", err)
    assert m, err
    written = m.group(1)
    assert re.fullmatch(re.escape(sidecar) + r"_run_\d{8}_\d{6}/", written), written
    assert objects(written) == sorted(relpaths(2))
    assert objects(sidecar + "/") == [], "the YAML's sidecar_prefix is never written by a bare run"


def test_task_run_names_carry_shard_relpaths(tmp_path, run):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    wanted = {f"merge {rel}" for rel in REL}  # one task a shard (the default layout)
    names = {r.name for r in task_runs(flow_run_named(f"merge {setup.pipeline}").id, wanted)}
    assert wanted <= names, sorted(wanted - names)
