"""What a merge run shows in the Prefect UI besides its task runs: a progress bar and the summary."""
from __future__ import annotations

import time
from dataclasses import fields

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from tasks.summary import Summary

PROGRESS_EVERY = 1.0  # seconds between updates of the progress artifact, at most
FAILED_ROWS = 1000    # failed shards listed one per row in the summary table; the rest are counted


class ProgressArtifact:
    """The flow run's progress artifact (shards finished / total, in percent), throttled."""

    def __init__(self, key: str, total: int, description: str, every: float = PROGRESS_EVERY):
        self.total, self.description, self.every = max(total, 1), description, every
        self.shown = 0.0
        self.last = time.monotonic()
        self.id = create_progress_artifact(progress=0.0, key=key, description=description)

    def update(self, finished: int, final: bool = False) -> None:
        now = time.monotonic()
        percent = round(100.0 * finished / self.total, 2)
        if percent == self.shown or (not final and now - self.last < self.every):
            return
        self.shown, self.last = percent, now
        update_progress_artifact(self.id, progress=percent)


def summary_rows(summary: Summary) -> list[dict[str, str]]:
    """The summary as a two-column table: every count, then one row per failed shard."""
    rows = [{"item": "output prefix", "value": summary.output_prefix}]
    for f in fields(summary):
        value = getattr(summary, f.name)
        if f.name in ("output_prefix", "failed"):
            continue
        if isinstance(value, bool):
            rows.append({"item": f.name.replace("_", " "), "value": "yes" if value else "no"})
            continue
        if isinstance(value, (str, type(None))):
            if value:
                rows.append({"item": f.name.replace("_", " "), "value": value})
            continue
        rows.append({"item": f.name.replace("_", " "),
                     "value": f"{value:.1f}" if isinstance(value, float) else f"{value:,}"})
    rows.append({"item": "failed", "value": f"{len(summary.failed):,}"})
    rows += [{"item": f"FAILED {rel}", "value": message} for rel, message in summary.failed[:FAILED_ROWS]]
    if len(summary.failed) > FAILED_ROWS:
        rows.append({"item": "FAILED ...", "value": f"and {len(summary.failed) - FAILED_ROWS:,} more"})
    return rows


def publish_summary(summary: Summary, pipeline: str) -> None:
    create_markdown_artifact(key="merge-summary", markdown="```\n" + "\n".join(summary.lines()) + "\n```",
                             description=f"merge of {pipeline}")
    create_table_artifact(key="merge-summary-table", table=summary_rows(summary),
                          description=f"merge of {pipeline}: counts, rows, bytes, time and failed shards")
