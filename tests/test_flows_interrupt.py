"""flows/interrupt.py at its own level, without a run: the grace period's bounds and message, what an
interruption carries (also across a pickle: Prefect and Ray hand exceptions between processes), and the signals
noted once the work is done. The runs themselves: tests/test_signal_phases.py, tests/test_interrupt*.py."""
from __future__ import annotations

import os
import pickle
import signal

import pytest

from flows import interrupt
from flows.interrupt import OVER, SIGNALS, Interrupted, grace_seconds, late_signals, owned
from tasks.errors import ConfigError


@pytest.mark.parametrize("value, seconds", [("0", 0.0), (0.5, 0.5), ("10", 10.0), (86400, 86400.0)])
def test_a_grace_period_from_0_to_a_day_is_taken(value, seconds):
    assert grace_seconds(value) == seconds


@pytest.mark.parametrize("value", ["inf", "nan", "-1", -0.5, "86400.5", "ten", None])
def test_any_other_grace_period_is_one_line(value):
    with pytest.raises(ConfigError) as refused:
        grace_seconds(value)
    assert str(refused.value) == f"--grace-seconds: {value!r} is not a number of seconds from 0 to 86400"


def test_an_interruption_carries_its_reason_and_what_it_left_also_pickled():
    bare = Interrupted("SIGTERM")
    assert (str(bare), bare.reason, bare.result, bare.unfinished) == (
        "interrupted by SIGTERM", "SIGTERM", None, "verification incomplete")
    full = pickle.loads(pickle.dumps(Interrupted("SIGINT", result={"merged": 3}, unfinished="2 shards")))
    assert type(full) is Interrupted
    assert (str(full), full.reason, full.result, full.unfinished) == (
        "interrupted by SIGINT", "SIGINT", {"merged": 3}, "2 shards")


def test_signals_once_the_work_is_done_are_noted_for_the_owner_only():
    saved = {sig: signal.signal(sig, signal.SIG_DFL) for sig in SIGNALS}
    try:
        assert late_signals() == []  # nobody owns the signals
        with owned() as owner:
            owner.phase = OVER
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGHUP)
            assert late_signals() == ["SIGTERM", "SIGHUP"]
        assert late_signals() == []
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_the_handler_in_each_phase(monkeypatch):
    """The handler object called as the signal module would: what each signal does and the lines it announces."""
    lines = []
    monkeypatch.setattr(interrupt, "announce", lines.append)
    signals = interrupt.Signals()
    assert (signals.phase, signals.stop, signals.grace, signals.pending, signals.late) == (
        interrupt.STARTING, None, 10.0, [], [])
    with pytest.raises(interrupt.Interruption, match="^SIGTERM$"):
        signals(signal.SIGTERM, None)  # starting up: at once
    signals.phase, signals.grace = interrupt.FLOW, 5.0
    signals(signal.SIGINT, None)       # a flow run whose body has not started: kept for it
    signals(signal.SIGHUP, None)
    assert signals.pending == ["SIGINT", "SIGHUP"]
    stop = interrupt.Stop()
    signals.take(stop, 5.0)
    assert (stop.reason, stop.remaining(), signals.pending) == ("SIGINT", 0.0, []), "two signals: abandon at once"
    assert lines == ["SIGINT: stopping: no new shard starts, shards in flight get 5 s to finish (a second signal "
                     "abandons them)", "SIGHUP again: abandoning the shards in flight"]

    signals.stop = None                # the next flow run, its body not started: one signal, the grace applies
    signals(signal.SIGTERM, None)
    one = interrupt.Stop()
    signals.take(one, 5.0)
    assert one.reason == "SIGTERM" and 0 < one.remaining() <= 5.0

    lines.clear()
    fresh = interrupt.Stop()
    signals.take(fresh, 7.5)
    signals(signal.SIGTERM, None)
    assert fresh.reason == "SIGTERM" and 0 < fresh.remaining() <= 7.5
    signals(signal.SIGINT, None)
    assert (fresh.reason, fresh.remaining()) == ("SIGTERM", 0.0)
    assert lines == ["SIGTERM: stopping: no new shard starts, shards in flight get 7.5 s to finish (a second "
                     "signal abandons them)", "SIGINT again: abandoning the shards in flight"]

    planning = interrupt.Stop()
    signals.take(planning, 0.0)
    with planning.nothing_written(), pytest.raises(interrupt.Interruption, match="^SIGHUP$"):
        signals(signal.SIGHUP, None)
    lines.clear()
    signals(signal.SIGTERM, None)
    assert lines == ["SIGTERM: stopping: no new shard starts, shards in flight are abandoned"]
    planning.done = True
    signals(signal.SIGINT, None)
    assert signals.late == ["SIGINT"] and len(lines) == 1, "once the work is done: noted, nothing announced"


def test_a_signal_outranks_fail_fast_and_the_earliest_deadline_stands():
    stop = interrupt.Stop()
    stop.request("--fail-fast")
    assert (stop.reason, stop.deadline, stop.remaining()) == ("--fail-fast", None, None)
    stop.request("SIGTERM", grace=30.0)
    assert stop.reason == "SIGTERM" and 29.0 < stop.remaining() <= 30.0
    stop.request("SIGINT", grace=60.0)
    assert stop.reason == "SIGTERM" and 29.0 < stop.remaining() <= 30.0


def test_announce_prints_one_line_on_stderr_from_a_daemon_thread(monkeypatch, capsys):
    """Never from the handler's own frame (printing there can re-enter stderr's lock), never holding up the exit."""
    started = []

    class Recorded(interrupt.threading.Thread):
        def start(self):
            started.append(self)
            super().start()

    monkeypatch.setattr(interrupt.threading, "Thread", Recorded)
    interrupt.announce("SIGTERM: stopping")
    for thread in started:
        thread.join(10)
    assert [thread.daemon for thread in started] == [True]
    assert capsys.readouterr() == ("", "SIGTERM: stopping\n")


def test_while_owned_a_librarys_install_of_our_signals_is_a_no_op_and_others_go_through(monkeypatch, request):
    def theirs(signum, frame):
        pass

    # An in-process console run earlier in the session keeps its handler for good (the process would exit), and
    # a runner may start pytest with SIGINT ignored (mutmut does; an ignored signal is never taken): start from
    # signals nobody owns, at their defaults.
    monkeypatch.setattr(interrupt, "_owner", None)
    monkeypatch.setattr(signal, "signal", interrupt._set_handler)
    for sig in SIGNALS:
        previous = signal.signal(sig, signal.SIG_DFL)
        request.addfinalizer(lambda sig=sig, previous=previous: interrupt._set_handler(sig, previous))

    usr1 = signal.getsignal(signal.SIGUSR1)
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    with owned() as owner:
        for sig in SIGNALS:
            assert signal.signal(sig, theirs) is owner, "the install answers with the handler that stays"
            assert signal.getsignal(sig) is owner
        assert signal.signal(signal.SIGUSR1, theirs) == usr1
        assert signal.getsignal(signal.SIGUSR1) is theirs
    signal.signal(signal.SIGUSR1, usr1)
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == before
    assert signal.signal(signal.SIGTERM, theirs) == before[signal.SIGTERM], "after the block installs work again"
    signal.signal(signal.SIGTERM, before[signal.SIGTERM])
