"""W3 resume: rerun the flow on a complete output; it must read footers only and take <= 10% of the run.

Shards are small but larger than pyarrow's 64 KiB footer read, so a data read would show.
The first run is timed once; the resume rerun `repeats` times with every storage read counted.
"""
from __future__ import annotations

from pathlib import Path

from bench.workloads.common import Row, median
from bench.workloads.counting import count_local_reads
from bench.workloads.data import make_case
from bench.workloads.flowrun import run_flow


def run(data: Path, size: dict) -> list[Row]:
    case = make_case(data / "w3", size["w3_shards"], 3000, linked=True)
    n = len(case.relpaths)
    out = case.output("resume")
    first, summary = run_flow(case.pipeline, out)
    assert summary["merged"] == n, summary
    resumes, logs = [], []
    for _ in range(size["repeats"]):
        with count_local_reads() as log:
            seconds, summary = run_flow(case.pipeline, out)
        assert summary["skipped"] == n and summary["merged"] == 0, summary
        resumes.append(seconds)
        logs.append(log)
    log = logs[-1]
    r = median(resumes)
    return [
        Row("W3", "first run (thread runner)", first, samples=[first], note=f"{n} shards x 3,000 rows; timed once"),
        Row("W3", "resume rerun on complete output", r, samples=resumes, ref="first run (thread runner)",
            goal="<= 0.10"),
        Row("W3", "resume: data reads (non-footer)", log.data_reads, unit="reads", goal="== 0",
            met=log.data_reads == 0, note=f"{log.data_bytes:,} bytes"),
        Row("W3", "resume: footer reads", log.footer_reads, unit="reads",
            note=f"{log.footer_bytes:,} bytes over {len(log.files)} files, {log.opens} opens "
                 f"({log.opens / n:.1f} per shard)"),
    ]
