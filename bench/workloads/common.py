"""Timing, memory and result helpers shared by the workloads."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
PROBE = BENCH / "workloads" / "probe.py"


@dataclass
class Row:
    """One line of the results table: a median (or a count) and, optionally, its ratio to a reference row."""

    workload: str
    name: str
    value: float
    unit: str = "s"
    samples: list[float] = field(default_factory=list)
    ref: str | None = None      # name of the row (same workload) this one is divided by
    ratio: float | None = None
    goal: str | None = None     # e.g. "<= 1.10"
    met: bool | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def ratio_rows(rows: list[Row]) -> None:
    """Fill ratio (and goal met) for rows that name a reference row of the same workload."""
    by_name = {(r.workload, r.name): r for r in rows}
    for r in rows:
        if r.ref is None:
            continue
        ref = by_name.get((r.workload, r.ref))
        if ref is None or not ref.value:
            continue
        r.ratio = r.value / ref.value
        parts = (r.goal or "").split()
        if len(parts) == 2 and parts[0] in ("<=", ">="):
            limit = float(parts[1])
            r.met = r.ratio <= limit if parts[0] == "<=" else r.ratio >= limit


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def rss_mb() -> float:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def maxrss_mb() -> float:
    """Peak RSS of this process image (VmHWM; getrusage's ru_maxrss would carry the parent's over fork+exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bench_env(extra: dict | None = None) -> dict:
    """Environment for child processes: repo importable, quiet, no telemetry."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep), "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("PREFECT_API_URL", None)
    env.pop("RAY_ADDRESS", None)  # ray.init() leaves the (now stopped) local cluster's address here
    env.update(extra or {})
    return env


def probe(mode: str, *args: str, env: dict | None = None, timeout: float = 3600) -> dict:
    """Run bench/workloads/probe.py MODE in a fresh interpreter; returns its JSON report plus `t_start`."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"sidecar-bench-probe-{os.getpid()}-{time.monotonic_ns()}.json"
    t_start = time.time()
    proc = subprocess.run([sys.executable, str(PROBE), mode, str(out), *args], env=bench_env(env),
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    t_end = time.time()
    try:
        report = json.loads(out.read_text())
        out.unlink()
    except (OSError, ValueError):
        raise RuntimeError(f"probe {mode} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report.update(t_start=t_start, t_end=t_end, returncode=proc.returncode, stderr_tail=proc.stderr[-2000:])
    return report
