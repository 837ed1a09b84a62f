"""Killed runs: SIGKILL a real `sidecar-ops run` process at random points, on local disk and on S3.

After every kill: no partial shard under a final name (every *.parquet reads fully with the base's row
count) and no complete shard was touched. Then a rerun with --skip-existing rewrites only the missing
shards and the output verifies.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time

import pytest

from conftest import snapshot
from ray_fixtures import default_sigint
from reliability_fixtures import (REPO, allow_small_parts, assert_no_partial_shard, assert_output_verifies,
                                  cli_command, cli_env, make_demo, pending_uploads, run_cli)
from tasks import storage

pytestmark = pytest.mark.slow

KILLS = 5
SHARDS = 60
ROWS = 300
SUMMARY = re.compile(r"shards: (\d+) total, (\d+) merged, (\d+) skipped \(already complete\), (\d+) failed")


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


def kill_at_random_point(args: list[str], env: dict, output: str, rng: random.Random) -> str:
    """Start the run, SIGKILL its process group at a random point; returns where it was killed."""
    start_count = shard_count(output)
    proc = subprocess.Popen(cli_command(*args), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_shards = rng.choice([0, 1, 1, 2, 3])
        if wait_shards == 0:  # somewhere in start-up, planning or the first shard
            deadline = time.monotonic() + rng.uniform(1.0, 4.0)
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)
            where = "during start-up / first shards"
        else:  # after a few shards landed, plus a random bit more: mid-write of later shards
            wait_for(lambda: shard_count(output) >= start_count + wait_shards or proc.poll() is not None)
            time.sleep(rng.uniform(0.0, 0.3))
            where = f"after {wait_shards} new shard(s)"
        if proc.poll() is not None:
            return f"finished on its own (exit {proc.returncode})"
        os.killpg(proc.pid, signal.SIGKILL)
        return where
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_sigkill_at_random_points_then_resume(where, tmp_path, prefect_api, request, monkeypatch):
    root = str(tmp_path / "data") + "/" if where == "local" else request.getfixturevalue("s3_root")
    demo = make_demo(tmp_path, root, shards=SHARDS, rows=ROWS)
    inputs = {name: snapshot(prefix) for name, prefix in demo.prefixes.items()}
    # On S3, outputs go up as multipart uploads of small parts, so some kills land mid-upload.
    env = cli_env(PREFECT_API_URL=prefect_api, **(allow_small_parts(monkeypatch) if where == "s3" else {}))
    args = ["run", demo.pipeline, "--output-prefix", demo.output, "--skip-existing", "--max-inflight", "2"]
    rng = random.Random(f"kill-{where}")
    kills, log = 0, []
    for _ in range(KILLS + 3):
        if kills == KILLS:
            break
        before = snapshot(demo.output)
        complete_before = {rel: md5 for rel, md5 in before.items() if rel.endswith(".parquet")}
        point = kill_at_random_point(args, env, demo.output, rng)
        kills += not point.startswith("finished")
        present = assert_no_partial_shard(demo)
        after = snapshot(demo.output)
        uploads = pending_uploads(request.getfixturevalue("moto_endpoint"), root) if where == "s3" else []
        log.append(f"{point}: {len(present)} complete, {len(after) - len(present)} temp, "
                   f"{len(uploads)} uploads")
        for rel, md5 in complete_before.items():
            assert after.get(rel) == md5, f"complete shard {rel} was rewritten by a resumed run ({point})"
        strays = [rel for rel in after if not rel.endswith(".parquet")]
        assert all(os.path.basename(rel).startswith(storage.TEMP_MARK) for rel in strays), strays
        assert len(present) < SHARDS, f"the run finished before it could be killed: {log}"
    assert kills >= KILLS, log

    complete = {rel: md5 for rel, md5 in snapshot(demo.output).items() if rel.endswith(".parquet")}
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
    assert "interrupted; rerun the same command to resume" in err and "Traceback" not in err
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
