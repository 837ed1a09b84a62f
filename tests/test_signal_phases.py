"""A signal in every phase of a run ends it the documented way (issue 26; docs/operating-guide.md, section 7),
in-process on the session's Prefect API. The signal is sent by the run's own code at the chosen point (a patched
step sends it to this process), so which phase it lands in is known, not timed:

- as the flow run starts (before its body) and while planning: exit 130, "no shard started", nothing written,
  the flow run Cancelled (before: Prefect's own SIGTERM handler crashed the flow run; planning went on to the
  end);
- during the summary: the exit code the work earned (0, or 1 with a failed shard), the flow run Completed or
  Failed (before: 130 and Cancelled, hiding the failure);
- a library installing its own SIGTERM handler meanwhile (Prefect's flow engine, Ray's init) changes nothing.
`--grace-seconds` is a finite number of seconds from 0 to a day, else one line and exit 2.
Signals sent from outside a real process (start-up, after the summary, SIGHUP, two signals, a write held when
the grace runs out): tests/test_interrupt_process.py.
"""
from __future__ import annotations

import os
import signal
import threading

import pytest

from core_fixtures import build, objects
from tasks import kernel
from tasks.demo import relpaths
from tasks.errors import ShardError
from test_flow_local import summary_counts
from test_interrupt import flow_run_state

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 4
REL = sorted(relpaths(SHARDS))
NEVER = 30  # seconds a step waits on an event nobody sets: only an exception may end that wait early


def kill_self(sig: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), sig)


@pytest.mark.parametrize("value", ["inf", "1e10", "nan", "-1", "86401", "ten"])
def test_grace_seconds_is_a_finite_number_from_0_to_a_day(tmp_path, run, value):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    code, _, err = run(setup.pipeline, "--output-prefix", setup.output, "--grace-seconds", value)
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (f"error: --grace-seconds: {value!r} is not a number of seconds from 0 "
                                            "to 86400")
    assert objects(setup.output) == []


def test_a_signal_as_the_flow_run_starts_cancels_it_before_any_shard(tmp_path, run, monkeypatch):
    """The flow function's first step gets the signal: Prefect's engine has installed its
    SIGTERM handler by then (before: TerminationSignal, the flow run Crashed)."""
    from flows import merge as merge_flow_module

    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    real = merge_flow_module.RunnerChoice

    def runner_choice(*args, **kwargs):
        kill_self()
        return real(*args, **kwargs)

    monkeypatch.setattr(merge_flow_module, "RunnerChoice", runner_choice)
    code, _, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == ("interrupted by SIGTERM: no shard started, nothing written; rerun the "
                                            "same command")
    assert "Traceback" not in err
    assert objects(setup.output) == []
    assert flow_run_state(setup.pipeline) == "CANCELLED"


def test_a_signal_while_planning_ends_the_run_at_once(tmp_path, run, monkeypatch):
    """Planning (listing, footers) writes nothing and can take long: the signal ends it where it is. The patched
    planner waits on an event nobody sets, so only the signal's exception ends that wait in time."""
    from flows import merge as merge_flow_module

    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    real, waited_out = merge_flow_module.make_plan, []

    def make_plan(*args, **kwargs):
        kill_self()
        waited_out.append(not threading.Event().wait(NEVER))
        return real(*args, **kwargs)

    monkeypatch.setattr(merge_flow_module, "make_plan", make_plan)
    code, _, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert waited_out == [], "planning went on after the signal"
    assert code == 130, err
    assert err.strip().splitlines()[-1] == ("interrupted by SIGTERM: no shard started, nothing written; rerun the "
                                            "same command")
    assert objects(setup.output) == []
    assert flow_run_state(setup.pipeline) == "CANCELLED"


@pytest.mark.parametrize("failing", [False, True], ids=["all-merged", "one-failed"])
def test_a_signal_during_the_summary_leaves_the_exit_code_the_work_earned(tmp_path, run, monkeypatch, failing):
    from flows import merge as merge_flow_module

    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    real_publish, real_open = merge_flow_module.publish_summary, kernel.open_shard

    def publish_summary(*args, **kwargs):
        kill_self()
        return real_publish(*args, **kwargs)

    def open_shard(job, relpath, *args):
        if failing and relpath == REL[0]:
            raise ShardError(f"{relpath}: made to fail by the test")
        return real_open(job, relpath, *args)

    monkeypatch.setattr(merge_flow_module, "publish_summary", publish_summary)
    monkeypatch.setattr(kernel, "open_shard", open_shard)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--retries", "0")
    assert code == (1 if failing else 0), err
    assert summary_counts(out + err) == (SHARDS, SHARDS - failing, 0, int(failing))
    assert "interrupted" not in out + err
    assert err.strip().splitlines()[-1] == ("(SIGTERM received after the work was done: ignored, the result "
                                            "stands)")
    assert flow_run_state(setup.pipeline) == ("FAILED" if failing else "COMPLETED")


@pytest.mark.parametrize("kept", [False, True], ids=["merged", "all-kept"])
def test_a_signal_during_the_run_check_leaves_the_exit_code_the_work_earned(tmp_path, run, monkeypatch, kept):
    """Between the last shard and the summary, the run's check (the verify-run task): the work is done, so the
    signal is noted and the run ends as it earned, whether it merged its shards or kept them all (a resumed run
    with nothing to do, which never starts a shard)."""
    import tasks.prefect_tasks

    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    if kept:
        assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    real_check = tasks.prefect_tasks.check_run

    def check_run(*args, **kwargs):
        kill_self()
        return real_check(*args, **kwargs)

    monkeypatch.setattr(tasks.prefect_tasks, "check_run", check_run)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    assert summary_counts(out) == ((SHARDS, 0, SHARDS, 0) if kept else (SHARDS, SHARDS, 0, 0)), out
    assert "run check passed" in out and "interrupted" not in out + err and "stopping" not in err
    assert err.strip().splitlines()[-1] == ("(SIGTERM received after the work was done: ignored, the result "
                                            "stands)")
    assert flow_run_state(setup.pipeline) == "COMPLETED"


def test_libraries_cannot_replace_the_runs_signal_handler():
    """Prefect's flow engine (capture_sigterm) and Ray's init (set_sigterm_handler) install SIGTERM handlers of
    their own; while the command line owns the signals those installs are refused (the real functions, called
    here), and everything is as before once it lets go."""
    from prefect.utilities.engine import capture_sigterm
    from ray._private.utils import set_sigterm_handler

    from flows.interrupt import FLOW, SIGNALS, Stop, owned

    saved = {sig: signal.signal(sig, signal.SIG_DFL) for sig in SIGNALS}  # as in a process started normally
    try:
        stop = Stop()
        with owned() as owner:
            owner.phase = FLOW
            owner.take(stop, grace=5.0)
            with capture_sigterm():
                set_sigterm_handler(lambda *_: None)
                kill_self()
            assert stop.reason == "SIGTERM" and stop.deadline is not None
            kill_self(signal.SIGHUP)
            assert stop.remaining() == 0, "a second signal (SIGHUP alike) abandons what is in flight at once"
            assert all(signal.getsignal(sig) is owner for sig in SIGNALS)
        assert all(signal.getsignal(sig) is signal.SIG_DFL for sig in SIGNALS)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, "signal.signal works again"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_signal_ignored_when_the_process_started_stays_ignored():
    """`nohup` starts a run with SIGHUP ignored, a shell's background job with SIGINT ignored: they stay so."""
    from flows.interrupt import SIGNALS, owned

    saved = {sig: signal.signal(sig, signal.SIG_DFL) for sig in SIGNALS}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with owned() as owner:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is owner
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_deployment_refuses_an_endless_grace_period(tmp_path, prefect_api, monkeypatch):
    """A flow run started without the command line (a deployment's parameters) checks grace_seconds too: the
    flow run fails with the one line, before anything is planned or written (before: it ran, and the first
    signal raised OverflowError)."""
    from flows.merge import merge_flow

    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    state = merge_flow(pipeline=str(setup.pipeline), output_prefix=setup.output, grace_seconds=float("inf"),
                       return_state=True)
    assert state.is_failed()
    assert str(state.result(raise_on_failure=False)) == ("--grace-seconds: inf is not a number of seconds from 0 "
                                                         "to 86400")
    assert objects(setup.output) == []
