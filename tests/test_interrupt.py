"""One way to be interrupted (issue 18, deliverables 1 and 3; seen cases 1, 2 and 7), in-process on the session's
Prefect API: a signal sent by a shard task itself, at a chosen shard, so nothing depends on timing.

SIGINT and SIGTERM alike: no new shard starts, the shard in flight finishes, the summary says what was and was
not done, the flow run ends Cancelled, exit 130; rerunning what the summary says finishes the job, and an
interrupted --overwrite continues with --continue-overwrite ID instead of starting over.
The same from outside the process (a real `kill`, the run's own server, a grace period that runs out):
tests/test_interrupt_process.py.
"""
from __future__ import annotations

import os
import re
import signal

import pytest

from core_fixtures import build, expected_output, identities, objects, read_table
from tasks import kernel
from tasks.demo import relpaths
from test_flow_local import ALL_COLUMNS, summary_counts

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 6
REL = sorted(relpaths(SHARDS))
STOP_AT = 3  # the signal is sent while the third shard is being read


def assert_output_equals_inputs(setup) -> None:
    assert objects(setup.output) == REL
    for rel in REL:
        columns = ALL_COLUMNS if rel != relpaths(SHARDS)[-1] else ALL_COLUMNS[:2]  # the watermark gap
        assert read_table(setup.output + rel).replace_schema_metadata(None).equals(
            expected_output(setup, rel, columns)), rel


@pytest.fixture
def signal_at(monkeypatch, request):
    """`signal_at(SIG)`: the STOP_AT-th shard opened by the next run (the default layout: one task a shard)
    sends SIG to this process, then carries on. SIGINT starts at Python's default, as in a terminal: a test run
    in the background (`cmd &` in a script) inherits it ignored, and an ignored signal stays ignored (by design)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

    def arm(sig: int) -> None:
        real, reads = kernel.open_shard, []

        def open_shard(job, relpath, *args):
            reads.append(relpath)
            if len(reads) == STOP_AT:
                os.kill(os.getpid(), sig)
            return real(job, relpath, *args)

        monkeypatch.setattr(kernel, "open_shard", open_shard)
    return arm


def flow_run_state(pipeline) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"merge {pipeline}"])))
    return [r.state.type.value for r in sorted(runs, key=lambda r: r.created)][-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_new_shards_finishes_the_one_in_flight_and_says_so(tmp_path, run, signal_at, sig):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    signal_at(sig)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--max-inflight", "1")
    assert code == 130, err
    name = signal.Signals(sig).name
    assert summary_counts(err) == (SHARDS, STOP_AT, 0, 0), err
    assert f"{SHARDS - STOP_AT} not started" in err
    assert (f"interrupted by {name}: {SHARDS - STOP_AT} shards not started, 0 abandoned in flight (no output "
            "written for them); rerun the same command to resume") in err
    assert "Traceback" not in err
    assert objects(setup.output) == REL[:STOP_AT]
    assert flow_run_state(setup.pipeline) == "CANCELLED"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the run's handlers are gone after it"

    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--max-inflight", "1")
    assert code == 0, err
    assert summary_counts(out) == (SHARDS, SHARDS - STOP_AT, STOP_AT, 0)
    assert_output_equals_inputs(setup)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_overwrite_continues_with_what_its_summary_says(tmp_path, run, signal_at, sig):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    first = identities(setup.output)

    signal_at(sig)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite", "--max-inflight", "1")
    assert code == 130, err
    hint = re.search(r"rerun with --continue-overwrite (\S+) instead of --overwrite to continue", err)
    assert hint, err
    interrupted = identities(setup.output)
    rewritten = [rel for rel in REL if interrupted[rel] != first[rel]]
    assert rewritten == REL[:STOP_AT]

    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--continue-overwrite", hint.group(1),
                         "--dry-run")
    assert code == 0, err
    assert f"outputs complete:       {STOP_AT}\n" in out and f"shards to process:      {SHARDS - STOP_AT}\n" in out
    assert f"outputs to recompute (not written by overwrite {hint.group(1)}): {SHARDS - STOP_AT}: " in out
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--continue-overwrite", hint.group(1),
                         "--max-inflight", "1")
    assert code == 0, err
    assert summary_counts(out) == (SHARDS, SHARDS - STOP_AT, STOP_AT, 0)
    final = identities(setup.output)
    assert all(final[rel] == interrupted[rel] for rel in REL[:STOP_AT]), "what the overwrite wrote is kept"
    assert all(final[rel] != first[rel] for rel in REL), "every other shard is recomputed"
    assert_output_equals_inputs(setup)

    code, out, _ = run(setup.pipeline, "--output-prefix", setup.output, "--continue-overwrite", hint.group(1))
    assert code == 0 and summary_counts(out) == (SHARDS, 0, SHARDS, 0), "a finished overwrite stays finished"


def test_overwrite_before_takes_only_a_time(tmp_path, cli, prefect_api):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1)
    code, _, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--overwrite-before", "yesterday")
    assert code == 2
    assert err.strip().splitlines()[-1] == ("error: --overwrite-before: 'yesterday' is not an ISO 8601 time "
                                            "(e.g. 2026-12-04T05:01:02Z)")
    assert objects(setup.output) == []


def test_a_signal_during_verify_ends_it_incomplete_not_passed(tmp_path, run, cli, monkeypatch):
    from flows import verify as verify_module

    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    real, checked = verify_module.check_shard, []

    def check_shard(job, shard, specs):
        checked.append(shard.relpath)
        if len(checked) == STOP_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(job, shard, specs)

    monkeypatch.setattr(verify_module, "check_shard", check_shard)
    code, out, err = cli("verify", setup.pipeline, "--output-prefix", setup.output, "--max-inflight", "1")
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "interrupted by SIGTERM: verification incomplete; rerun the same command"
    assert "PASS" not in out


def test_a_signal_while_footers_are_read_ends_verify_incomplete_without_reading_the_rest(tmp_path, cli, prefect_api,
                                                                                          monkeypatch):
    """The footer phase (the longest at 10^5 shards) stops at a signal too: the first footer outside the sample sends
    SIGTERM and holds every other read until the run's stop is requested; then no further shard's footers are
    read, and verify ends incomplete (exit 130), not PASS after reading them all."""
    import threading

    from flows import interrupt
    from tasks.plan import FOOTER_THREADS
    from tasks.verification import driver
    from test_verify_driver import merged

    shards = FOOTER_THREADS + 16
    job = merged(tmp_path, shards)
    requested, read, lock = threading.Event(), [], threading.Lock()
    real_read, real_request = driver.read_footers, interrupt.Stop.request

    def request(self, reason, grace=None):
        real_request(self, reason, grace)
        requested.set()

    def read_footers(job, rel, specs, want_ranges, *args):
        if not want_ranges:  # outside the sample
            with lock:
                read.append(rel)
                first = len(read) == 1
            if first:
                os.kill(os.getpid(), signal.SIGTERM)
            requested.wait()
        return real_read(job, rel, specs, want_ranges, *args)

    monkeypatch.setattr(interrupt.Stop, "request", request)
    monkeypatch.setattr(driver, "read_footers", read_footers)
    code, out, err = cli("verify", str(job.pipeline.path), "--output-prefix", job.output_prefix, "--samples", "1")
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "interrupted by SIGTERM: verification incomplete; rerun the same command"
    assert "PASS" not in out
    assert len(read) <= FOOTER_THREADS < shards - 1  # the reads already started, never the rest
