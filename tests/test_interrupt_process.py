"""SIGTERM from outside, to a real `sidecar-ops run` process with a Prefect server of its own (issue 18, seen
case 1): what `kill`, Kubernetes, systemd and `ray job stop` do. The run is held inside a chosen shard's read
(tests/barrier/sitecustomize.py) when the signal is sent, so which shards are done, in flight and not started
is known, not guessed.

Before: exit 143, no summary, the flow run Crashed and the run's database left behind. Now: exit 130, a summary
of what was and was not done, the flow run Cancelled, the server and its database gone; a grace period that
runs out abandons the shard in flight without waiting for it.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from core_fixtures import build, objects
from flows.rundb import FOLDER
from ray_fixtures import REPO, driver_env, finish, new_tag, start_run, tagged
from tasks.demo import relpaths
from test_flow_local import summary_counts

pytestmark = pytest.mark.slow

SHARDS = 6
REL = sorted(relpaths(SHARDS))
HOLD_AT = 3


def wait_for(path: Path, proc, timeout: float = 180) -> None:
    """Until the run reaches the hold (a file it writes), or fail with its stderr if it ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before the hold (exit {proc.returncode})"
        assert time.monotonic() < deadline, "the run never reached the hold"
        time.sleep(0.02)


def held_run(tmp_path: Path, *flags: str):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    hold = tmp_path / "hold"
    hold.mkdir()
    home = tmp_path / "prefect-home"
    tag = new_tag()
    env = driver_env(tag, home, None, SIDECAR_OPS_TEST_HOLD=str(hold), SIDECAR_OPS_TEST_HOLD_AT=str(HOLD_AT),
                     PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "barrier"), str(REPO)]))
    argv = [setup.pipeline, "--output-prefix", setup.output, "--max-inflight", "1", *flags]
    proc, out, err = start_run(argv, env, tmp_path / "logs")
    wait_for(hold / "held", proc)
    return setup, hold, home, tag, proc, out, err


def test_sigterm_finishes_the_shard_in_flight_summarizes_and_ends_the_flow_run_cancelled(tmp_path):
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--keep-run-history")
    os.kill(proc.pid, signal.SIGTERM)
    (hold / "release").touch()  # the held shard goes on: it is in flight, it gets the grace period
    code, stdout, stderr = finish(proc, out, err)
    assert code == 130, stderr
    assert summary_counts(stderr) == (SHARDS, HOLD_AT, 0, 0), stderr
    assert (f"interrupted by SIGTERM: {SHARDS - HOLD_AT} shards not started, 0 abandoned in flight (no output "
            "written for them); rerun the same command to resume") in stderr
    assert "Traceback" not in stderr
    assert objects(setup.output) == REL[:HOLD_AT]
    with sqlite3.connect(home / "prefect.db") as db:  # --keep-run-history: the run's records stay here
        states = db.execute("select state_type from flow_run").fetchall()
    assert states == [("CANCELLED",)]
    assert tagged(tag) == [], "the run's Prefect server is gone"


def test_a_grace_period_that_runs_out_abandons_the_shard_in_flight_and_removes_the_runs_database(tmp_path):
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--grace-seconds", "0.5")
    os.kill(proc.pid, signal.SIGTERM)  # the held shard never goes on
    code, stdout, stderr = finish(proc, out, err, timeout=60)
    assert code == 130, stderr
    assert summary_counts(stderr) == (SHARDS, HOLD_AT - 1, 0, 0), stderr
    assert f"interrupted by SIGTERM: {SHARDS - HOLD_AT} shards not started, 1 abandoned in flight" in stderr
    assert objects(setup.output) == REL[:HOLD_AT - 1], "an abandoned shard leaves no output"
    assert tagged(tag) == [], "the run's Prefect server is gone"
    assert list((home / FOLDER).glob("run-*")) == [], "the run's database is removed"
    assert (home / FOLDER).exists(), "(the folder the run's database lived in)"


def test_sigterm_to_the_run_and_every_process_it_started_still_summarizes(tmp_path):
    """`ray job stop` and systemd signal every process of the run, its own Prefect server included: the server
    outlives that SIGTERM while the run lives (the run stops it last), so the run still ends as above. Before:
    the server died at once and the run hung on its unreachable API, no summary, until SIGKILL."""
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--grace-seconds", "0.5")
    tree = [p for p in tagged(tag) if p.pid == proc.pid or p.ppid == proc.pid]
    assert any("flows.apiserver" in p.title for p in tree), [p.title for p in tree]
    for p in tree:
        os.kill(p.pid, signal.SIGTERM)
    code, stdout, stderr = finish(proc, out, err, timeout=60)
    assert code == 130, stderr
    assert f"interrupted by SIGTERM: {SHARDS - HOLD_AT} shards not started, 1 abandoned in flight" in stderr
    assert "Error logging to API" not in stderr and "Traceback" not in stderr, stderr
    assert objects(setup.output) == REL[:HOLD_AT - 1]
    assert tagged(tag) == [], "the run's Prefect server is gone"
