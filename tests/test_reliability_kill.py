"""Killed runs: SIGKILL a real `sidecar-ops run` process at chosen points, on local disk and on S3.

Each run is held (tests/barrier/sitecustomize.py) at a point the test chose, then SIGKILLed there: in its
first shard's read, half-way through an output write (a local temp file written but not renamed; an S3
multipart upload with one part in), and between shards. After every kill: no partial shard under a final name
(every *.parquet reads fully with the base's row count), the half-written state is really there (the temp
file, the pending upload), and no complete shard was touched. Then a rerun with --skip-existing sweeps the
leftovers, rewrites only the missing shards and the output verifies.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import snapshot
from ray_fixtures import default_sigint
from reliability_fixtures import (REPO, allow_small_parts, assert_no_partial_shard, assert_output_verifies,
                                  cli_command, cli_env, make_demo, pending_uploads, run_cli)
from tasks import storage

pytestmark = pytest.mark.slow

SHARDS = 60
ROWS = 300
SUMMARY = re.compile(r"shards: (\d+) total, (\d+) merged, (\d+) skipped \(already complete\), (\d+) failed")
# Where each successive run is killed: (hold variable, which read or write of that run holds)
KILL_POINTS = [("SIDECAR_OPS_TEST_HOLD_AT", 1),        # the first shard's read: nothing written yet
               ("SIDECAR_OPS_TEST_HOLD_WRITE_AT", 2),  # half-way through the second output write
               ("SIDECAR_OPS_TEST_HOLD_AT", 4),        # between shards: some complete, one read in flight
               ("SIDECAR_OPS_TEST_HOLD_WRITE_AT", 3)]
HOOKS = str(REPO / "tests" / "barrier")


def shard_count(output: str) -> int:
    try:
        return len(storage.list_prefix(output).shards)
    except Exception:
        return 0


def wait_for(condition, timeout: float = 120, poll: float = 0.01) -> None:
    """Poll until `condition()` holds; fail the test when it does not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout}s"
        time.sleep(poll)


def kill_when_held(args: list[str], env: dict, hold: Path, point: tuple[str, int]) -> str:
    """Start the run held at `point`, SIGKILL its process group once it is there; returns what it held in."""
    hold.mkdir(parents=True)
    env = {**env, "SIDECAR_OPS_TEST_HOLD": str(hold), point[0]: str(point[1]),
           "PYTHONPATH": os.pathsep.join([HOOKS, env["PYTHONPATH"]])}
    proc = subprocess.Popen(cli_command(*args), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (hold / "held").exists() or proc.poll() is not None)
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before it reached {point}"
        os.killpg(proc.pid, signal.SIGKILL)
        return (hold / "held").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_sigkill_at_chosen_points_then_resume(where, tmp_path, prefect_api, request, monkeypatch):
    root = str(tmp_path / "data") + "/" if where == "local" else request.getfixturevalue("s3_root")
    demo = make_demo(tmp_path, root, shards=SHARDS, rows=ROWS)
    inputs = {name: snapshot(prefix) for name, prefix in demo.prefixes.items()}
    # On S3, outputs go up as multipart uploads of small parts, so a write can be held mid-upload.
    env = cli_env(PREFECT_API_URL=prefect_api, **(allow_small_parts(monkeypatch) if where == "s3" else {}))
    args = ["run", demo.pipeline, "--output-prefix", demo.output, "--skip-existing", "--max-inflight", "2"]
    log = []
    for n, point in enumerate(KILL_POINTS):
        before = snapshot(demo.output)
        complete_before = {rel: md5 for rel, md5 in before.items() if rel.endswith(".parquet")}
        held = kill_when_held(args, env, tmp_path / f"hold-{n}", point)
        present = assert_no_partial_shard(demo)
        after = snapshot(demo.output)
        temps = [rel for rel in after if not rel.endswith(".parquet")]
        uploads = pending_uploads(request.getfixturevalue("moto_endpoint"), root) if where == "s3" else []
        log.append(f"{point} in {held}: {len(present)} complete, {len(temps)} temp, {len(uploads)} uploads")
        for rel, md5 in complete_before.items():
            assert after.get(rel) == md5, f"complete shard {rel} was rewritten by a resumed run ({held})"
        assert all(os.path.basename(rel).startswith(storage.TEMP_MARK) for rel in temps), temps
        if point[0] == "SIDECAR_OPS_TEST_HOLD_WRITE_AT":  # the kill landed mid-write: its leftovers are there
            assert (uploads if where == "s3" else temps), f"no half-written state after a kill in {held}"
        assert len(present) < SHARDS, f"the run finished before it could be killed: {log}"

    complete = {rel: md5 for rel, md5 in snapshot(demo.output).items() if rel.endswith(".parquet")}
    assert complete, log
    res = run_cli(*args, env=env)
    assert res.returncode == 0, res.stderr
    total, merged, skipped, failed = map(int, SUMMARY.search(res.stdout).groups())
    assert (total, merged, skipped, failed) == (SHARDS, SHARDS - len(complete), len(complete), 0), res.stdout
    final = snapshot(demo.output)
    assert all(final[rel] == md5 for rel, md5 in complete.items()), "the rerun rewrote complete shards"
    # A killed writer can leave a local temp file (never *.parquet; its pid is dead, so it goes at once) or an
    # open multipart upload (invisible as an object; aborted once older than the threshold, here 0).
    storage.sweep_stale(demo.output, older_than_seconds=6 * 3600 if where == "local" else 0)
    assert storage.list_prefix(demo.output).others == ()
    if where == "s3":
        assert pending_uploads(request.getfixturevalue("moto_endpoint"), root) == []
    assert_output_verifies(demo)
    assert {name: snapshot(prefix) for name, prefix in demo.prefixes.items()} == inputs
    print(f"{where}: kill points {log}; {len(complete)} shards complete before the rerun")


@pytest.mark.timeout(600)
def test_ctrl_c_on_the_thread_runner_exits_130_then_resumes(tmp_path, prefect_api):
    """SIGINT to the run's process group (a terminal's Ctrl-C) once a few shards landed: exit 130 with the
    resume hint, no partial shard; the same command then writes exactly the missing shards."""
    demo = make_demo(tmp_path, str(tmp_path / "data") + "/", shards=SHARDS, rows=ROWS)
    env = cli_env(PREFECT_API_URL=prefect_api)
    args = ["run", demo.pipeline, "--output-prefix", demo.output, "--max-inflight", "2"]
    proc = subprocess.Popen(cli_command(*args), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=default_sigint)
    try:
        wait_for(lambda: shard_count(demo.output) >= 3 or proc.poll() is not None)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT: " in err and "rerun the same command to resume" in err, err
    assert "Traceback" not in err
    present = assert_no_partial_shard(demo)
    assert 3 <= len(present) < SHARDS
    complete = {rel: md5 for rel, md5 in snapshot(demo.output).items() if rel.endswith(".parquet")}

    res = run_cli(*args, env=env)
    assert res.returncode == 0, res.stderr
    counts = tuple(map(int, SUMMARY.search(res.stdout).groups()))
    assert counts == (SHARDS, SHARDS - len(complete), len(complete), 0), res.stdout
    final = snapshot(demo.output)
    assert all(final[rel] == md5 for rel, md5 in complete.items()), "the rerun rewrote complete shards"
    assert_output_verifies(demo)
