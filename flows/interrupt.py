"""One way to stop early: Ctrl-C (SIGINT), SIGTERM (`ray job stop`, Kubernetes, systemd) and SIGHUP (a
closed terminal) end a run alike, whenever they come (docs/operating-guide.md, section 7, has the table):

- starting up (arguments, configuration, the run's Prefect server; no flow run yet) and planning (inside the
  flow run, before any shard starts): nothing is written yet, so the signal ends the run at once
  (`Interruption`, exit 130; a flow run ends Cancelled);
- while shards may run: no new shard starts, shards in flight get a grace period (`--grace-seconds`) to
  finish, the rest are abandoned (their writes are atomic: no output; `abandon_writes` removes their temp
  files and uploads). A second signal abandons them at once. The flow run ends Cancelled, exit 130 (unless
  the stop left nothing undone);
- once the work is done (the summary, the server stopping, after the summary is printed): the signal is
  noted and the result stands (exit 0 or 1 as earned).
`--fail-fast` is the same stop without a signal and without a deadline.

One handler (`Signals`) owns the three signals from the command line's first line to the process's exit
(`owned`). Prefect's flow engine and Ray's `init` install SIGTERM handlers of their own (Prefect's re-raises
the signal with the default action: exit 143, a Crashed flow run, no summary); while we own the signals such
installs are refused, so no library's handler ever runs in between. A flow body run without the command line
(a deployment) owns them for its own length (`handling`).
"""
from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from tasks.errors import ConfigError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Seconds in-flight shards get after the first signal (--grace-seconds). Kubernetes waits 30 s before its
# SIGKILL; `ray job stop` only RAY_JOB_STOP_WAIT_TIME_S (3 s unless the cluster sets more: docs/cluster.md).
DEFAULT_GRACE = 10.0
# No shard needs a day to finish and no scheduler waits that long before its SIGKILL; beyond ~292 years
# Python's timeouts overflow.
MAX_GRACE = 86400.0

STARTING, FLOW, OVER = "starting", "flow", "over"  # where a command line run is (Signals.phase)


class Interrupted(Exception):
    """A run stopped by a signal, carrying what it did (a merge's Summary), else what it left (`unfinished`)."""

    def __init__(self, reason: str, result=None, unfinished: str = "verification incomplete"):
        super().__init__(f"interrupted by {reason}")
        self.reason, self.result, self.unfinished = reason, result, unfinished

    def __reduce__(self):
        return (type(self), (self.reason, self.result, self.unfinished))


class Interruption(KeyboardInterrupt):
    """A signal ending the run at once where nothing is written yet (start-up, planning); carries its name."""


def grace_seconds(value) -> float:
    """A valid grace period (--grace-seconds, the flow's grace_seconds), else a ConfigError (exit 2)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_GRACE):
        raise ConfigError(f"--grace-seconds: {value!r} is not a number of seconds from 0 to {MAX_GRACE:g}")
    return seconds


@dataclass
class Stop:
    """Whether, why and until when a run stops early. Read by the shard scheduler before each submission."""

    reason: str | None = None        # "SIGTERM", "SIGINT", "SIGHUP", "--fail-fast"
    deadline: float | None = None    # monotonic time at which shards still in flight are abandoned
    wakers: list[Callable[[], None]] = field(default_factory=list)
    at_once: bool = False            # planning: nothing written yet, a signal ends the run now (Interruption)
    done: bool = False               # the work is over: a signal no longer changes the result

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
    def nothing_written(self):
        """For the block (planning), a signal ends the run at once: `Interruption`."""
        self.at_once = True
        try:
            yield
        finally:
            self.at_once = False


class Signals:
    """The handler of SIGINT, SIGTERM and SIGHUP: what a signal does depends on where the run is."""

    def __init__(self):
        self.phase = STARTING
        self.stop: Stop | None = None   # the flow body's, once it has started
        self.grace = DEFAULT_GRACE
        self.pending: list[str] = []    # received in a flow run before its body started
        self.late: list[str] = []       # received once the work was done: noted, ignored

    def __call__(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        stop = self.stop
        if self.phase == OVER or (stop is not None and stop.done):
            self.late.append(name)  # no notice here: the interpreter may be finishing (no thread may print)
        elif self.phase == STARTING or (stop is not None and stop.at_once):
            raise Interruption(name)
        elif stop is None:
            self.pending.append(name)
            announce(stopping(name, self.grace, again=len(self.pending) > 1))
        else:
            again = stop.by_signal
            stop.request(name, grace=0.0 if again else self.grace)
            announce(stopping(name, self.grace, again))

    def take(self, stop: Stop, grace: float) -> None:
        """The flow body's stop from now on; signals received since the flow run started apply to it."""
        self.stop, self.grace = stop, grace
        for name in self.pending:
            stop.request(name, grace=0.0 if stop.by_signal else grace)
        self.pending.clear()


def stopping(name: str, grace: float, again: bool) -> str:
    if again:
        return f"{name} again: abandoning the shards in flight"
    later = f"get {grace:g} s to finish (a second signal abandons them)" if grace else "are abandoned"
    return f"{name}: stopping: no new shard starts, shards in flight {later}"


def announce(line: str) -> None:
    """One line on stderr, from another thread: printing in a signal handler can re-enter stderr's lock."""
    threading.Thread(target=lambda: print(line, file=sys.stderr, flush=True), daemon=True).start()


_set_handler = signal.signal
_owner: Signals | None = None


def _others_refused(signum, handler):
    """`signal.signal` while we own the signals: ours stay (a library's install is a no-op), others go."""
    if signum in SIGNALS:
        return signal.getsignal(signum)
    return _set_handler(signum, handler)


def _install() -> dict:
    """Our handler for each signal not ignored: one ignored when the process started stays ignored, as Python
    leaves SIGINT (`nohup` ignores SIGHUP, a shell's background job SIGINT)."""
    global _owner
    _owner = Signals()
    kept = [sig for sig in SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN]
    previous = {sig: _set_handler(sig, _owner) for sig in kept}
    signal.signal = _others_refused
    return previous


def _uninstall(previous: dict) -> None:
    global _owner
    signal.signal = _set_handler
    for sig, handler in previous.items():
        _set_handler(sig, handler)
    _owner = None


@contextlib.contextmanager
def owned(phase: str = STARTING, for_good: bool = False):
    """The three signals go to one `Signals` for the block (main thread only), starting in `phase`. Nested
    (the demo runs three commands; a flow body under the command line): the same handler, its phase restored
    after. `for_good` (the console's): once the block ends the run is over; the handler stays until the exit."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    if _owner is not None:
        owner, saved = _owner, _owner.phase
        owner.phase = phase
        try:
            yield owner
        finally:
            owner.phase = OVER if for_good else saved
        return
    previous = _install()
    owner = _owner
    owner.phase = phase
    try:
        yield owner
    finally:
        if for_good:
            owner.phase = OVER
        else:
            _uninstall(previous)


@contextlib.contextmanager
def flow_running(grace: float):
    """Around the command line's flow call: signals ask the flow to stop (its body applies them)."""
    owner = _owner
    if owner is None:
        yield
        return
    owner.phase, owner.grace, owner.stop = FLOW, grace, None
    owner.pending.clear()
    try:
        yield
    finally:
        owner.phase = OVER


def late_signals() -> list[str]:
    """Signals received once the work was done (ignored: the result stands)."""
    return list(_owner.late) if _owner is not None else []


@contextlib.contextmanager
def handling(stop: Stop, grace: float = DEFAULT_GRACE):
    """A flow body: signals request `stop` (a second one: abandon in-flight work at once) while the block
    runs; when it ends the work is done (`stop.done`). Outside the main thread signals cannot be handled: the
    block then runs unchanged."""
    with owned(FLOW) as owner:
        if owner is not None:
            owner.take(stop, grace)
        try:
            yield stop
        finally:
            stop.done = True
