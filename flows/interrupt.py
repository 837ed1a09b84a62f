"""One way to stop early: Ctrl-C (SIGINT) and SIGTERM (`ray job stop`, Kubernetes, systemd) end a run alike.

The first signal asks the run to stop: no new shard starts, shards in flight get a grace period to finish,
the rest are abandoned (a write is atomic, so an abandoned shard leaves no output). A second signal abandons
them at once. `--fail-fast` is the same stop without a signal and without a deadline.

Prefect installs its own SIGTERM handler for the length of a flow run, which re-raises the signal with the
default action: the process dies with status 143, no summary, a Crashed flow run and its server's database
left behind. So `handling()` installs ours inside the flow body, over Prefect's, and restores it afterwards;
the command line installs one too for the seconds before and after a flow run (`until_flow`).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Seconds in-flight shards get after the first signal (--grace-seconds). Kubernetes waits 30 s before its
# SIGKILL; `ray job stop` only RAY_JOB_STOP_WAIT_TIME_S (3 s unless the cluster sets more: docs/cluster.md).
DEFAULT_GRACE = 10.0


class Interrupted(Exception):
    """A run stopped by a signal, carrying what it did (a merge's Summary or verify's report)."""

    def __init__(self, reason: str, result=None):
        super().__init__(f"interrupted by {reason}")
        self.reason, self.result = reason, result

    def __reduce__(self):
        return (type(self), (self.reason, self.result))


@dataclass
class Stop:
    """Whether, why and until when a run stops early. Read by the shard scheduler before each submission."""

    reason: str | None = None        # "SIGTERM", "SIGINT", "--fail-fast"
    deadline: float | None = None    # monotonic time at which shards still in flight are abandoned
    wakers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def requested(self) -> bool:
        return self.reason is not None

    @property
    def by_signal(self) -> bool:
        return self.reason is not None and self.reason.startswith("SIG")

    def request(self, reason: str, grace: float | None = None) -> None:
        """Stop submitting; with `grace`, abandon what is in flight after that many seconds (0: at once)."""
        if self.reason is None or (self.by_signal is False and reason.startswith("SIG")):
            self.reason = reason
        if grace is not None:
            deadline = time.monotonic() + grace
            self.deadline = deadline if self.deadline is None else min(self.deadline, deadline)
        # Called from a signal handler: the scheduler may hold its queue's lock right now, so wake it from
        # another thread rather than here.
        for wake in list(self.wakers):
            threading.Thread(target=wake, daemon=True).start()

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@contextlib.contextmanager
def handling(stop: Stop, grace: float = DEFAULT_GRACE):
    """SIGINT and SIGTERM request `stop` (a second one: abandon in-flight work at once) while the block runs.
    Outside the main thread signals cannot be handled: the block then runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum, _frame):
        stop.request(signal.Signals(signum).name, grace=0.0 if stop.by_signal else grace)

    previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def raise_keyboard_interrupt(signum, _frame):
    """Outside a flow run's shard loop (starting up, planning, finishing) a signal ends the run at once, the
    way Ctrl-C always did: KeyboardInterrupt unwinds every `with` (the run's server, its database)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def until_flow():
    """The command line's own handler for SIGTERM, like Python's for SIGINT (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
