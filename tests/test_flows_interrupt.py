"""flows/interrupt.py at its own level, without a run: the grace period's bounds and message, what an
interruption carries (also across a pickle: Prefect and Ray hand exceptions between processes), and the signals
noted once the work is done. The runs themselves: tests/test_signal_phases.py, tests/test_interrupt*.py."""
from __future__ import annotations

import os
import pickle
import signal

import pytest

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
