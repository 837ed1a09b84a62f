"""Progress for long runs: one live line on a terminal, a plain log line every so often otherwise."""
from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    def __init__(self, what: str, total: int, stream=None, every: float = 30.0):
        self.what, self.total = what, total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.every = 0.5 if self.live else every
        self.done = self.failed = self.skipped = self.rows = 0
        self.start = self.last = time.monotonic()

    def update(self, done: int = 0, failed: int = 0, rows: int = 0, skipped: int = 0) -> None:
        self.done += done
        self.failed += failed
        self.rows += rows
        self.skipped += skipped
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._emit(now)

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        finished = self.done + self.failed
        rate = self.rows / elapsed
        left = self.total - finished - self.skipped
        eta = _duration(left * elapsed / finished) if finished and left > 0 else "-"
        return (f"{self.what}: {finished + self.skipped}/{self.total} shards ({self.done} done, "
                f"{self.skipped} skipped, {self.failed} failed), {rate:,.0f} rows/s, "
                f"elapsed {_duration(elapsed)}, ETA {eta}")

    def _emit(self, now: float) -> None:
        if self.live:
            self.stream.write("\r\033[K" + self.line(now))
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
