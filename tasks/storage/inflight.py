"""The writes this process has in flight, so that a process about to exit can take them back (`abandon_writes`).

Every write that leaves something behind while it runs (a local temp file, an S3 multipart upload) registers
itself for its duration. When a stop's grace period runs out, the process calls `abandon_writes()` from its main
thread, with writers still running in worker threads: each write's leftovers are removed and the write is marked
so that it fails (never publishes its object) whatever it does next. A write that has published its object
already is not taken back: a whole object is never a leftover.

A run's shard tasks write inside its `run_writes()` block (a context variable: Prefect's thread pool runs each
task in a copy of the submitting context). Once `abandon_writes()` has been called inside that block, every
write of it that starts later is abandoned as it starts: a shard abandoned while it still read its inputs
never publishes its output after the run's summary said it wrote none (its thread is not waited for).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


class Abandonable(Protocol):
    def abandon(self) -> None:
        """Remove what the write has left so far and make every later step of it fail; idempotent."""


class WriteAbandoned(OSError):
    """The process abandoned this write while it ran (it is stopping): nothing was published."""


# RLock: a signal handler running abandon_writes on the main thread may interrupt that thread inside `tracked`.
_LOCK = threading.RLock()
_IN_FLIGHT: set[Abandonable] = set()


class RunWrites:
    """The writes of one run's shards: `closed` once the run has abandoned its writes."""

    closed = False


_RUN: ContextVar[RunWrites | None] = ContextVar("sidecar_ops_run_writes", default=None)


@contextmanager
def run_writes() -> Iterator[RunWrites]:
    """The block's writes (and those of the tasks it submits) belong to one run: `abandon_writes()` within it
    also abandons every write of the run that starts after it."""
    run = RunWrites()
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


@contextmanager
def tracked(write: Abandonable) -> Iterator[None]:
    """`write` is in flight within the block; abandoned at once if its run has abandoned its writes."""
    run = _RUN.get()
    with _LOCK:
        late = run is not None and run.closed
        if not late:
            _IN_FLIGHT.add(write)
    if late:
        write.abandon()  # every later step of the write fails: WriteAbandoned, nothing published
    try:
        yield
    finally:
        with _LOCK:
            _IN_FLIGHT.discard(write)


def abandon_writes() -> int:
    """Abort every multipart upload and remove every temp file of the writes this process has in flight, and make
    those writes fail instead of completing; returns how many writes were abandoned (0 when called again).
    Safe from the main thread while writers run in other threads. An upload whose CreateMultipartUpload is
    still in flight is aborted by its own writer when the reply comes, if the process still runs then; otherwise
    it is left to `sweep_stale` and the bucket's AbortIncompleteMultipartUpload rule (docs/storage.md).
    Inside a `run_writes()` block, the run's writes that start later are abandoned as they start."""
    run = _RUN.get()
    with _LOCK:
        if run is not None:
            run.closed = True
        writes = list(_IN_FLIGHT)
        _IN_FLIGHT.clear()
    for write in writes:
        write.abandon()
    return len(writes)
