"""The end-of-run summary: counts, rows, bytes, wall time and one line per failed shard."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import InitVar, asdict, dataclass, field

FAILED_LINES = 20


@dataclass
class Summary:
    output_prefix: str
    total: int = 0
    merged: int = 0
    skipped: int = 0
    stale: int = 0  # existing outputs made from other inputs, to recompute (counted in merged/failed too)
    stale_recomputed: int = 0  # of those, recomputed (the others failed or never ran: old outputs remain)
    stale_shards: InitVar[Iterable[str]] = ()  # the relpaths of the stale outputs (the plan's)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (relpath, one-line error)
    rows: int = 0
    bytes: int = 0
    ops_skipped: int = 0  # operations with `required: false` whose sibling was missing
    copied: int = 0       # merged shards whose column chunks were copied as bytes (tasks/chunkcopy.py)
    decoded: int = 0      # merged shards whose columns were all decoded and encoded again
    seconds: float = 0.0
    stop_reason: str | None = None  # why the run stopped early: "--fail-fast", "SIGTERM", "SIGINT"
    not_started: int = 0            # shards to do that were never submitted after the stop
    abandoned: int = 0              # shards in flight when the grace period ended (no output written)
    continue_with: str = ""         # an overwrite run: the option that continues it (--continue-overwrite ID)
    run_check: str = ""             # the run check's line (tasks/runcheck.py), once it ran
    run_check_failed: bool = False

    def __post_init__(self, stale_shards: Iterable[str]) -> None:
        self._stale = frozenset(stale_shards)
        self.stale = self.stale or len(self._stale)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.run_check_failed

    @property
    def stale_failed(self) -> int:
        """Stale outputs whose recompute failed: the old output is still there, and not current."""
        return sum(rel in self._stale for rel, _ in self.failed)

    @property
    def finished(self) -> int:
        """Shards done one way or another: kept as complete, merged, or failed."""
        return self.skipped + self.merged + len(self.failed)

    def add(self, stats) -> None:
        """Count one merged shard (its ShardStats)."""
        self.merged += 1
        self.stale_recomputed += stats.relpath in self._stale
        self.rows += stats.rows
        self.bytes += stats.bytes
        self.ops_skipped += stats.skipped_ops
        self.copied += stats.path == "copy"
        self.decoded += stats.path == "decode"

    def stopped(self, reason: str | None, not_started: int, abandoned: list) -> None:
        """Record an early stop (fail-fast or a signal): what was never started and what was abandoned."""
        self.stop_reason, self.not_started, self.abandoned = reason, not_started, len(abandoned)

    @property
    def unfinished(self) -> int:
        return self.not_started + self.abandoned

    def headline(self) -> str:
        line = (f"shards: {self.total} total, {self.merged} merged, {self.skipped} skipped (already complete), "
                f"{len(self.failed)} failed")
        if self.stop_reason:
            line += f", {self.not_started} not started"
            if self.abandoned:
                line += f", {self.abandoned} abandoned in flight"
        return line

    def resume_hint(self) -> str:
        """What to run to finish an interrupted run."""
        if self.continue_with:
            return (f"rerun with {self.continue_with} instead of --overwrite to continue (shards this overwrite "
                    "wrote are kept, every other one is recomputed)")
        return "rerun the same command to resume (complete shards are kept)"

    def lines(self) -> list[str]:
        rate = self.rows / self.seconds if self.seconds else 0.0
        out = [f"output: {self.output_prefix}", self.headline(),
               f"rows merged: {self.rows:,}  bytes written: {self.bytes:,}  wall time: {self.seconds:.1f}s  "
               f"({rate:,.0f} rows/s)"]
        if self.merged:
            out.append(f"merged by copying column chunks: {self.copied}, by decoding every column: {self.decoded}")
        if self.stale:
            out.append(f"stale outputs (inputs changed since they were written): {self.stale} "
                       f"({self.stale_outcome()})")
        if self.ops_skipped:
            out.append(f"operations skipped for missing siblings (required: false): {self.ops_skipped}")
        if self.stop_reason == "--fail-fast":
            out.append(f"stopped after the first failure (--fail-fast): {self.not_started} shards not started"
                       + (f"; {self.resume_hint()}" if self.continue_with else ""))
        elif self.stop_reason:
            out.append(f"interrupted by {self.stop_reason}: {self.not_started} shards not started, {self.abandoned} "
                       f"abandoned in flight (no output written for them); {self.resume_hint()}")
        elif self.continue_with and self.failed:
            out.append(f"the overwrite did not finish ({len(self.failed)} failed): {self.resume_hint()}")
        if self.run_check:
            out.append(self.run_check)
        for rel, message in self.failed[:FAILED_LINES]:
            kept = " (its stale old output remains, not current)" if rel in self._stale else ""
            out.append(f"FAILED {rel}{kept}: {message}")
        if len(self.failed) > FAILED_LINES:
            out.append(f"... and {len(self.failed) - FAILED_LINES} more failed shards")
        return out

    def stale_outcome(self) -> str:
        """What became of the stale outputs: recomputed, failed or unfinished (old outputs remain)."""
        failed = self.stale_failed
        untouched = self.stale - self.stale_recomputed - failed
        parts = [f"{self.stale_recomputed} recomputed"]
        parts += [f"{failed} failed"] if failed else []
        parts += [f"{untouched} unfinished"] if untouched else []  # not started, or abandoned in flight
        left = failed + untouched
        if not left:
            return parts[0]
        remain = "its old output remains and is" if left == 1 else "their old outputs remain and are"
        return f"{', '.join(parts)}: {remain} not current"

    def to_dict(self) -> dict:
        return asdict(self)


class RunFailed(RuntimeError):
    """Raised at the end of a run in which shards failed, carrying the summary."""

    def __init__(self, summary: Summary):
        super().__init__(f"{len(summary.failed)} of {summary.total} shards failed" if summary.failed
                         else summary.run_check or "the run failed")
        self.summary = summary

    def __reduce__(self):
        return (type(self), (self.summary,))
