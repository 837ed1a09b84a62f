"""A signal once every shard has been submitted, in-process on the session's Prefect API, with a grace of 0 s:
every shard is in flight (held at a barrier in its read, so nothing depends on timing), the last one to
arrive sends SIGTERM, and the shards are held until the run has published its summary. The run must not
report Completed or exit 0; the summary says every shard was abandoned and none merged; and no abandoned
shard writes its output (or leaves a temp file) after the summary said none were written.
"""
from __future__ import annotations

import itertools
import os
import signal
import threading

import pytest

import flows.merge
from core_fixtures import build, objects
from tasks import kernel, storage
from tasks.demo import relpaths
from test_flow_local import summary_counts
from test_interrupt import flow_run_state

SHARDS = 3
REL = sorted(relpaths(SHARDS))
WAIT = 60  # seconds: only a hang ever waits this long


@pytest.fixture
def all_submitted_then_signal(monkeypatch):
    """Every shard task waits in its read until all SHARDS are there; the last sends SIGTERM; all then wait for
    the run's summary to be published (`hold.set()` first: they carry on at once), and carry on (towards their
    write). `finished` counts the shard tasks that have ended, written or not."""
    arrived = threading.Barrier(SHARDS, timeout=WAIT)
    summary_out, finished = threading.Event(), threading.Semaphore(0)
    real_open, real_stream, real_publish = kernel.open_shard, kernel.stream_output, flows.merge.publish_summary

    calls = itertools.count()

    def open_shard(job, relpath, *args):
        if next(calls) < SHARDS:  # the first attempts only: a later call never meets the barrier again
            if arrived.wait() == 0:
                os.kill(os.getpid(), signal.SIGTERM)
            assert summary_out.wait(WAIT), "the run never published its summary"
        return real_open(job, relpath, *args)

    def stream_output(*args, **kwargs):
        try:
            return real_stream(*args, **kwargs)
        finally:
            finished.release()

    def publish_summary(*args, **kwargs):
        try:
            return real_publish(*args, **kwargs)
        finally:
            summary_out.set()

    monkeypatch.setattr(kernel, "open_shard", open_shard)
    monkeypatch.setattr(kernel, "stream_output", stream_output)
    monkeypatch.setattr(flows.merge, "publish_summary", publish_summary)
    return finished, summary_out


def test_a_signal_once_every_shard_is_submitted_abandons_them_all_and_none_writes_after(
        tmp_path, run, all_submitted_then_signal):
    finished, _ = all_submitted_then_signal
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--max-inflight", str(SHARDS),
                         "--grace-seconds", "0", "--retries", "0")
    for _ in range(SHARDS):  # the abandoned shards' threads go on: wait until each has tried to write
        assert finished.acquire(timeout=WAIT), "a shard task never ended"
    assert code == 130, out + err
    assert summary_counts(err) == (SHARDS, 0, 0, 0), err
    assert f"0 not started, {SHARDS} abandoned in flight" in err
    assert flow_run_state(setup.pipeline) == "CANCELLED"
    leftovers = [name for _, _, files in os.walk(setup.output) for name in files]
    assert objects(setup.output) == [] and not any(storage.TEMP_MARK in n for n in leftovers), leftovers


def test_a_signal_once_every_shard_is_submitted_with_a_grace_they_finish_in_leaves_the_run_complete(
        tmp_path, run, all_submitted_then_signal):
    """The other side: the shards in flight finish within the grace period, so the stop left nothing undone:
    every shard merged and checked, exit 0, the flow run Completed."""
    finished, go_on = all_submitted_then_signal
    go_on.set()  # the shards do not wait for the summary: they finish within the grace period
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--max-inflight", str(SHARDS),
                         "--grace-seconds", "600", "--retries", "0")
    assert code == 0, out + err
    assert "SIGTERM: stopping: no new shard starts, shards in flight get 600 s to finish" in err
    assert summary_counts(out) == (SHARDS, SHARDS, 0, 0), out
    assert "run check passed" in out and "abandoned" not in out + err
    assert flow_run_state(setup.pipeline) == "COMPLETED"
    assert objects(setup.output) == REL
