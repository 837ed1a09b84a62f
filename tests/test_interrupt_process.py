"""SIGTERM (and SIGHUP, SIGINT) from outside, to a real `sidecar-ops run` process with a Prefect server of its
own (issue 18, seen case 1; issue 26): what `kill`, Kubernetes, systemd, `ray job stop` and a closed terminal do.
The run is held inside a chosen shard's read (tests/barrier/sitecustomize.py) when the signal is sent, so which
shards are done, in flight and not started is known, not guessed.

Before: exit 143, no summary, the flow run Crashed and the run's database left behind. Now: exit 130, a summary
of what was and was not done, the flow run Cancelled, the server and its database gone; a grace period that
runs out abandons the shard in flight without waiting for it, and takes its write back (no temp file); a second
signal abandons it at once. SIGHUP does what SIGTERM does (before: exit 129, no summary, a RUNNING flow run in the
kept database). Held at other phases (tests/barrier: SIDECAR_OPS_TEST_HOLD_IN): a signal while starting up ends
the run at once (exit 130, no flow run); during the summary or after it is printed, the run's own exit code
stands (before: 130 Cancelled, and 143).
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


def wait_until(reached, proc, what: str, timeout: float, shown=lambda: "") -> None:
    """Poll until the run has done `what` (`reached()`), or fail as soon as it has ended without doing it."""
    deadline = time.monotonic() + timeout
    while not reached():
        assert proc.poll() is None, f"the run ended before {what} (exit {proc.returncode})"
        assert time.monotonic() < deadline, f"the run never got to {what}{shown()}"
        time.sleep(0.02)  # a poll interval: the outcome is the run's file or line, never this wait


def wait_for(path: Path, proc, timeout: float = 180) -> None:
    """Until the run reaches the hold (a file it writes), or fail if it ends first."""
    wait_until(path.exists, proc, "the hold", timeout)


def wait_for_line(path: Path, text: str, proc, timeout: float = 60) -> None:
    """Until the run has written `text` on stderr (its notice that a signal was handled), or fail."""
    wait_until(lambda: text in path.read_text(), proc, f"saying {text!r}", timeout,
               shown=lambda: f":\n{path.read_text()[-2000:]}")


def held_run(tmp_path: Path, *flags: str, **hold: str):
    """A run held where `hold` says (tests/barrier/sitecustomize.py; default: the HOLD_AT-th shard's read)."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    folder = tmp_path / "hold"
    folder.mkdir()
    home = tmp_path / "prefect-home"
    tag = new_tag()
    env = driver_env(tag, home, None, SIDECAR_OPS_TEST_HOLD=str(folder),
                     PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "barrier"), str(REPO)]),
                     **(hold or {"SIDECAR_OPS_TEST_HOLD_AT": str(HOLD_AT)}))
    hold = folder
    argv = [setup.pipeline, "--output-prefix", setup.output, "--max-inflight", "1", *flags]
    proc, out, err = start_run(argv, env, tmp_path / "logs")
    wait_for(hold / "held", proc)
    return setup, hold, home, tag, proc, out, err


def kept_flow_run_states(home: Path) -> list[tuple[str]]:
    with sqlite3.connect(home / "prefect.db") as db:  # --keep-run-history: the run's records stay here
        return db.execute("select state_type from flow_run").fetchall()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_finishes_the_shard_in_flight_summarizes_and_ends_the_flow_run_cancelled(tmp_path, sig):
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--keep-run-history")
    os.kill(proc.pid, sig)
    (hold / "release").touch()  # the held shard goes on: it is in flight, it gets the grace period
    code, stdout, stderr = finish(proc, out, err)
    assert code == 130, stderr
    assert summary_counts(stderr) == (SHARDS, HOLD_AT, 0, 0), stderr
    assert (f"interrupted by {sig.name}: {SHARDS - HOLD_AT} shards not started, 0 abandoned in flight (no output "
            "written for them); rerun the same command to resume") in stderr
    assert "Traceback" not in stderr
    assert objects(setup.output) == REL[:HOLD_AT]
    assert kept_flow_run_states(home) == [("CANCELLED",)]
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


def test_a_second_signal_abandons_the_shard_in_flight_at_once(tmp_path):
    """The grace is long (600 s) and the held shard never goes on: only the second signal can end the run in
    time. It is sent once the run has said it handled the first (two signals sent together may arrive as one)."""
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--grace-seconds", "600")
    os.kill(proc.pid, signal.SIGTERM)
    wait_for_line(err, "SIGTERM: stopping: no new shard starts, shards in flight get 600 s to finish", proc)
    os.kill(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc, out, err, timeout=60)
    assert code == 130, stderr
    assert "SIGINT again: abandoning the shards in flight" in stderr
    assert summary_counts(stderr) == (SHARDS, HOLD_AT - 1, 0, 0), stderr
    assert f"interrupted by SIGTERM: {SHARDS - HOLD_AT} shards not started, 1 abandoned in flight" in stderr
    assert objects(setup.output) == REL[:HOLD_AT - 1], "the abandoned shard leaves no output"
    assert tagged(tag) == [], "the run's Prefect server is gone"


def test_a_grace_period_that_runs_out_during_a_write_takes_the_write_back(tmp_path):
    """The third shard's write is held with its temp file written, before its rename: when the grace runs out
    the process removes that temp file before it exits (before: left behind for the next run's sweep)."""
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--grace-seconds", "0.5",
                                                      SIDECAR_OPS_TEST_HOLD_WRITE_AT=str(HOLD_AT))
    assert (hold / "held").read_text().startswith("local temp file of ")
    assert len(objects(setup.output)) == HOLD_AT, "two outputs and the held write's temp file"
    os.kill(proc.pid, signal.SIGTERM)
    code, stdout, stderr = finish(proc, out, err, timeout=60)
    assert code == 130, stderr
    assert f"interrupted by SIGTERM: {SHARDS - HOLD_AT} shards not started, 1 abandoned in flight" in stderr
    assert objects(setup.output) == REL[:HOLD_AT - 1], "no output and no temp file of the abandoned write"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_while_starting_up_ends_the_run_at_once(tmp_path, sig):
    """Held in the first configuration load: no flow run, no server yet (before: SIGHUP killed it, exit 129)."""
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--keep-run-history",
                                                      SIDECAR_OPS_TEST_HOLD_IN="startup")
    os.kill(proc.pid, sig)
    code, stdout, stderr = finish(proc, out, err, timeout=60)
    assert code == 130, stderr
    assert stderr.strip().splitlines()[-1] == (f"interrupted by {sig.name} before any shard started: nothing "
                                               "written; rerun the same command")
    assert "Traceback" not in stderr
    assert objects(setup.output) == []
    assert tagged(tag) == [], "no process of the run is left"


@pytest.mark.parametrize("phase", ["summary", "exit"])
def test_a_signal_once_the_work_is_done_leaves_the_exit_code_it_earned(tmp_path, phase):
    """During the summary (before: exit 130, the flow run Cancelled) or once it is printed (before: killed by
    the signal, exit 143): every shard is merged, so the run exits 0 and its flow run is Completed."""
    setup, hold, home, tag, proc, out, err = held_run(tmp_path, "--keep-run-history",
                                                      SIDECAR_OPS_TEST_HOLD_IN=phase)
    os.kill(proc.pid, signal.SIGTERM)
    (hold / "release").touch()  # the held main thread handles the signal before it can see this file
    code, stdout, stderr = finish(proc, out, err, timeout=60)
    assert code == 0, stderr
    assert summary_counts(stdout) == (SHARDS, SHARDS, 0, 0)
    assert "interrupted" not in stdout + stderr and "Traceback" not in stderr
    assert objects(setup.output) == REL
    assert kept_flow_run_states(home) == [("COMPLETED",)]
    assert tagged(tag) == [], "the run's Prefect server is gone"
