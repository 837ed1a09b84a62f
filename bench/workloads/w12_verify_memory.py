"""W12 verify's driver memory per shard (issue 34): `sidecar-ops verify --samples 50` over N tiny local shards,
the driver's peak RSS at each count, and the growth per extra shard between the smallest and the largest count
(goal <= 1 KiB a shard from 2,000 to 20,000 at the full size).

Set-up (not measured): bench's linked case (10-row shards, hard links of a few templates, so N costs little disk),
its outputs written by the kernel itself (tasks/kernel.py merge_shard, in this process: what a run's shard task
does, without N Prefect task runs). Each verify is a fresh process (bench/workloads/probe.py) and must pass every
check over the N shards. What grows per shard in the driver: the four listings (base, two sources, output) and
whatever the fold of the footers keeps (tasks/verification/driver.py Found: only problems and the sample's facts).
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.workloads.common import Row, probe
from bench.workloads.data import make_case
from bench.workloads.w0_fixed import cli_home

ROWS = 10
SAMPLES = 50


def run(data: Path, size: dict) -> list[Row]:
    counts = size["w12_counts"]
    results = {n: measure(data, n) for n in counts}
    lo, hi = counts[0], counts[-1]
    rows = [Row("W12", f"verify --samples {SAMPLES} @ {n:,}: driver peak RSS", r["rss"], unit="MiB",
                note=f"{n:,} shards, every check passed; wall {r['wall']:.1f} s (start -> exit)")
            for n, r in results.items()]
    growth = (results[hi]["rss"] - results[lo]["rss"]) * 1024 / (hi - lo)
    rows.append(Row("W12", f"driver RSS a shard, {lo:,} -> {hi:,}", growth, unit="KiB",
                    goal="<= 1.0", met=growth <= 1.0,
                    note=f"({results[hi]['rss']:.1f} - {results[lo]['rss']:.1f} MiB) / {hi - lo:,} extra shards"))
    return rows


def measure(data: Path, n: int) -> dict:
    case = make_case(data / f"w12-{n}", n, ROWS, linked=True)
    out = outputs(case)
    report = Path(case.root) / "verify.json"
    home = cli_home(data)
    home.mkdir(parents=True, exist_ok=True)
    rep = probe("cli", "--", "verify", case.pipeline, "--output-prefix", out, "--samples", str(SAMPLES),
                "--json", str(report), env={"PREFECT_HOME": str(home)})
    assert rep["exit_code"] == 0, f"W12 @ {n:,}: verify exit {rep['exit_code']}\n{rep['stderr_tail']}"
    found = json.loads(report.read_text())
    failed = [c["name"] for c in found["checks"] if not c["passed"]]
    assert found["ok"] and not failed and found["shards"] == n, f"W12 @ {n:,}: {failed}, {found['shards']} shards"
    return {"rss": rep["maxrss_mb"], "wall": rep["t_end"] - rep["t_start"]}


def outputs(case) -> str:
    """Every shard merged by the kernel into the case's out/w12/ (reused when complete)."""
    from tasks.config import load_pipeline
    from tasks.kernel import Job, merge_shard

    out = Path(case.root) / "out" / "w12"
    marker = out.parent / "w12-ready"
    if marker.exists() and marker.read_text() == str(len(case.relpaths)):
        return str(out) + "/"
    out = case.output("w12")
    job = Job(load_pipeline(case.pipeline), out)
    for rel in case.relpaths:
        merge_shard(job, rel)
    marker.write_text(str(len(case.relpaths)))
    return out
