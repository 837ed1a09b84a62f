"""Per-task overhead: plain Ray vs Prefect thread pool vs stock/fast Ray runners.

    python bench/ray_overhead.py --tasks 200 [--repeats 3] [--modes fast,stock]

Runs one real local Prefect server (``prefect_test_harness``: a uvicorn
subprocess on loopback with a temp SQLite DB; PREFECT_HOME is a temp dir) and
one local Ray (``num_cpus=2``) shared by all Ray modes. Each mode is warmed up
first. Time is measured inside the flow, from the first submit until every
result is back, and divided by the number of task runs (2 per chain).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Must be set before prefect is imported (the server subprocess inherits them).
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-bench-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE", "100")
os.environ.setdefault("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE", "100")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# Repo root importable here and in Ray workers (they inherit the environment).
_ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, _ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))

import ray  # noqa: E402
from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402
from prefect.testing.utilities import prefect_test_harness  # noqa: E402
from prefect_ray import RayTaskRunner  # noqa: E402

from flows.runners import FastRayTaskRunner  # noqa: E402


@task(persist_result=False, cache_policy=NO_CACHE)
def inc(x: int) -> int:
    return x + 1


@ray.remote
def ray_inc(x: int) -> int:
    return x + 1


def plain_ray(n: int, chain: bool) -> float:
    t0 = time.perf_counter()
    if chain:
        refs = [ray_inc.remote(ray_inc.remote(i)) for i in range(n)]
    else:
        refs = [ray_inc.remote(i) for i in range(n)]
    out = ray.get(refs)
    elapsed = time.perf_counter() - t0
    assert out == [i + (2 if chain else 1) for i in range(n)]
    return elapsed


def prefect_mode(runner_factory):
    def run(n: int, chain: bool) -> float:
        @flow(task_runner=runner_factory(), log_prints=False)
        def bench_flow(n: int, chain: bool) -> float:
            t0 = time.perf_counter()
            if chain:
                futures = [inc.submit(inc.submit(i)) for i in range(n)]
            else:
                futures = [inc.submit(i) for i in range(n)]
            out = [f.result() for f in futures]
            elapsed = time.perf_counter() - t0
            assert out == [i + (2 if chain else 1) for i in range(n)], out[:5]
            return elapsed

        return bench_flow(n, chain)

    return run


MODES = {
    "plain": ("plain ray.remote", plain_ray),
    "threads": ("Prefect ThreadPoolTaskRunner", prefect_mode(lambda: ThreadPoolTaskRunner())),
    "stock": ("prefect-ray RayTaskRunner", prefect_mode(lambda: RayTaskRunner())),
    "fast": ("FastRayTaskRunner", prefect_mode(lambda: FastRayTaskRunner())),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=200, help="tasks (or chains) per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="plain,threads,stock,fast")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    logging.getLogger("prefect").setLevel(logging.WARNING)

    results: dict[tuple[str, bool], float] = {}
    with prefect_test_harness():
        ray.init(num_cpus=2, log_to_driver=False, logging_level=logging.WARNING, include_dashboard=False)
        try:
            for mode in modes:
                label, fn = MODES[mode]
                fn(min(20, args.tasks), False)  # warm up workers and caches
                for chain in (False, True):
                    runs = n_runs = args.tasks * (2 if chain else 1)
                    samples = [fn(args.tasks, chain) * 1000 / n_runs for _ in range(args.repeats)]
                    results[(mode, chain)] = statistics.median(samples)
                    print(
                        f"{label:30s} {'chain2' if chain else 'indep ':6s} "
                        f"ms/task runs={[round(s, 1) for s in samples]} ({runs} task runs each)",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            ray.shutdown()

    base = {c: results.get(("fast", c)) for c in (False, True)}
    print(f"\n{args.tasks} tasks per run, median of {args.repeats}; ms per task run (chains: 2 runs each)\n")
    print("| runner | indep ms/task | chain2 ms/task | indep x fast | chain2 x fast |")
    print("|---|---:|---:|---:|---:|")
    for mode in modes:
        cells = []
        for chain in (False, True):
            cells.append(f"{results[(mode, chain)]:.1f}")
        for chain in (False, True):
            b = base[chain]
            cells.append(f"{results[(mode, chain)] / b:.2f}" if b else "-")
        print(f"| {MODES[mode][0]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
