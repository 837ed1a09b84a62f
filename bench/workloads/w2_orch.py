"""W2 orchestration: N tiny shards (2 tasks each: merge DQM, merge AES + write and check) through the full
flow with the thread runner and with --use-ray, vs a plain-Ray floor running the same kernel steps.

Both Ray contenders start (and stop) a local Ray per run; Ray's start time is reported on its own.
Optionally bench/ray_overhead.py (owned by the Ray runner's author) prints stock vs our runner ms/task.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from bench.workloads.common import BENCH, Row, bench_env, median
from bench.workloads.data import make_case
from bench.workloads.flowrun import run_flow

TASKS_PER_SHARD = 2


def plain_ray(case, out: str) -> tuple[float, float]:
    """(seconds with Ray start and stop, seconds of the tasks alone)."""
    import logging

    import ray

    t0 = time.perf_counter()
    ray.init(address="local", log_to_driver=False, logging_level=logging.WARNING)
    try:
        from tasks import kernel
        from tasks.config import load_pipeline

        job = kernel.Job(load_pipeline(case.pipeline), out)

        # Defined here so cloudpickle ships them by value (workers need not import bench/).
        @ray.remote
        def first(job, rel):
            return kernel.apply_operation(job, rel, 0, kernel.read_base(job, rel))

        @ray.remote
        def last(job, rel, state):
            return kernel.write_output(job, rel, kernel.apply_operation(job, rel, 1, state))  # writes and checks

        t1 = time.perf_counter()
        job_ref = ray.put(job)
        refs = [last.remote(job_ref, rel, first.remote(job_ref, rel)) for rel in case.relpaths]
        stats = ray.get(refs)
        tasks = time.perf_counter() - t1
        assert len(stats) == len(case.relpaths)
    finally:
        ray.shutdown()
    return time.perf_counter() - t0, tasks


def run(data: Path, size: dict) -> list[Row]:
    case = make_case(data / "w2", size["w2_shards"], 10, linked=True)
    n = len(case.relpaths)
    samples: dict[str, list[float]] = {k: [] for k in ("threads", "ray", "plain", "plain_tasks")}
    for rep in range(size["w2_repeats"]):
        seconds, summary = run_flow(case.pipeline, case.output("threads"))
        assert summary["merged"] == n, summary
        samples["threads"].append(seconds)
        seconds, summary = run_flow(case.pipeline, case.output("ray"), use_ray=True)
        assert summary["merged"] == n, summary
        samples["ray"].append(seconds)
        total, tasks = plain_ray(case, case.output("plain"))
        samples["plain"].append(total)
        samples["plain_tasks"].append(tasks)
    m = {k: median(v) for k, v in samples.items()}
    per = 1000 / (n * TASKS_PER_SHARD)
    ref = "thread runner, full flow"
    rows = [
        Row("W2", ref, m["threads"], samples=samples["threads"], note=f"{n} shards x {TASKS_PER_SHARD} tasks"),
        Row("W2", "--use-ray (FastRayTaskRunner), full flow", m["ray"], samples=samples["ray"], ref=ref,
            goal="<= 1.5", note="includes starting local Ray"),
        Row("W2", "plain-Ray floor, same kernel steps", m["plain"], samples=samples["plain"], ref=ref,
            note="includes starting local Ray"),
        Row("W2", "plain-Ray floor, tasks only", m["plain_tasks"], samples=samples["plain_tasks"], ref=ref),
        Row("W2", "Ray start + stop (plain floor)", m["plain"] - m["plain_tasks"]),
        Row("W2", "thread runner ms/task", m["threads"] * per, unit="ms"),
        Row("W2", "--use-ray ms/task", m["ray"] * per, unit="ms"),
        Row("W2", "plain-Ray ms/task (tasks only)", m["plain_tasks"] * per, unit="ms"),
    ]
    if size.get("ray_overhead_tasks"):
        rows += stock_vs_ours(size["ray_overhead_tasks"], size["repeats"])
    return rows


def stock_vs_ours(tasks: int, repeats: int) -> list[Row]:
    """Trivial tasks through stock RayTaskRunner vs ours (bench/ray_overhead.py, run as is)."""
    proc = subprocess.run([sys.executable, str(BENCH / "ray_overhead.py"), "--tasks", str(tasks), "--repeats",
                           str(repeats), "--modes", "plain,threads,stock,fast"],
                          # its bare ray.init() would join any Ray cluster already running on this machine
                          env=bench_env({"RAY_ADDRESS": "local"}),
                          capture_output=True, text=True, timeout=3600)
    rows = []
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"[\d.]+", cells[1]):
            rows.append(Row("W2", f"trivial tasks ms/task (indep / chain2): {cells[0]}", float(cells[1]),
                            unit="ms", note=f"chain2 {cells[2]} ms; bench/ray_overhead.py --tasks {tasks}"))
    if not rows:
        rows.append(Row("W2", "trivial tasks: bench/ray_overhead.py", float("nan"),
                        note=f"failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"))
    return rows
