"""Prefect's server on SQLite vs on PostgreSQL: the same N-shard `sidecar-ops run` through each, alternated.

    .venv/bin/python bench/postgres.py [--shards 1000] [--rows 20] [--repeats 2] [--use-ray]

Starts a PostgreSQL server (tests/postgres_fixtures.py, PostgreSQL's default durability: fsync on), one Prefect
server on it and one on SQLite in a fresh PREFECT_HOME (both with the project's recorder tuning), builds N tiny
shards once, then alternates the two servers `repeats` times (after one uncounted warm-up round), each run writing
a fresh output prefix. Per run it measures:
  end to end      `sidecar-ops run` start -> exit
  recorded        start -> every task run of the flow run is recorded final in the server's database
  task runs/s     task runs recorded / recorded time, and / the flow's own wall time (from the summary)
  server CPU      user+system seconds of the Prefect server's process tree (and of PostgreSQL's), from /proc,
                  between the run's start and "recorded"; per task run
Prints a markdown table and writes bench/out/postgres.json. Needs Debian's `postgresql` package (or PG on PATH).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from core_fixtures import build, merge_dag  # noqa: E402
from postgres_fixtures import BIN, postgres, prefect_server, tree_cpu  # noqa: E402
from ray_fixtures import TAG, kill_tagged, new_tag  # noqa: E402

from tasks.demo import relpaths  # noqa: E402

RECORD_TIMEOUT = 600


def post(api: str, path: str, body: dict):
    req = urllib.request.Request(f"{api}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def latest_flow_run(api: str) -> str:
    return post(api, "/flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 1})[0]["id"]


def wait_recorded(api: str, flow_run: str, expected: int) -> int:
    """Block until `expected` task runs of `flow_run` are recorded in a final state; returns the count."""
    body = {"flow_runs": {"id": {"any_": [flow_run]}},
            "task_runs": {"state": {"type": {"any_": ["COMPLETED", "FAILED", "CRASHED", "CANCELLED"]}}}}
    deadline = time.monotonic() + RECORD_TIMEOUT
    while (n := post(api, "/task_runs/count", body)) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {n} of {expected} task runs recorded after {RECORD_TIMEOUT}s")
        time.sleep(0.2)
    return n


def one_run(api: str, pids: list[int], data, output: str, home: Path, flags: list[str], expected: int) -> dict:
    tag = new_tag()
    env = {**os.environ, TAG: tag, "PREFECT_HOME": str(home), "PREFECT_API_URL": api}
    cpu0 = [tree_cpu(p) for p in pids]
    t0 = time.perf_counter()
    try:
        out = subprocess.run([str(BIN / "sidecar-ops"), "run", str(data.pipeline), "--output-prefix", output,
                              *flags], cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"run failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        task_runs = wait_recorded(api, latest_flow_run(api), expected)
        recorded = time.perf_counter() - t0
    finally:
        kill_tagged(tag)
    cpu = [tree_cpu(p) - c for p, c in zip(pids, cpu0)]
    flow = float(re.search(r"wall time: ([\d.]+)s", out.stdout + out.stderr).group(1))
    return {"wall": wall, "flow": flow, "recorded": recorded, "task_runs": task_runs,
            "server_cpu": cpu[0], "db_cpu": cpu[1] if len(cpu) > 1 else 0.0, "load": os.getloadavg()[0]}


def db_size(pg, home: Path) -> dict[str, int]:
    return {"sqlite": sum(p.stat().st_size for p in home.glob("prefect.db*")),
            "postgresql": int(pg.psql("select pg_database_size('prefect')"))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--use-ray", action="store_true", help="run the merges with --use-ray (local Ray)")
    args = ap.parse_args()
    os.environ.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", RAY_USAGE_STATS_ENABLED="0")
    flags = ["--use-ray"] if args.use_ray else []
    work = Path(tempfile.mkdtemp(prefix="bench-postgres-"))
    try:
        measure(args, work, flags)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args, work: Path, flags: list[str]) -> None:
    data = build(work, str(work / "data"), shards=args.shards, rows=args.rows)
    results: dict[str, list] = {"sqlite": [], "postgresql": []}
    load = [os.getloadavg()[0]]
    with postgres(durable=True) as pg, \
            prefect_server(work / "home-sqlite", work / "sqlite.log") as (sqlite_api, sqlite_proc), \
            prefect_server(work / "home-pg", work / "pg.log", pg.url) as (pg_api, pg_proc):
        servers = {"sqlite": (sqlite_api, [sqlite_proc.pid]),
                   "postgresql": (pg_api, [pg_proc.pid, pg.postmaster_pid()])}
        empty = db_size(pg, work / "home-sqlite")
        for repeat in range(args.repeats + 1):  # round 0 warms caches and is not counted
            for name, (api, pids) in servers.items():
                output = f"{data.root}out-{name}-{repeat}/"
                dag = merge_dag(output, relpaths(args.shards))  # the listings, a task a shard, the run's check
                r = one_run(api, pids, data, output, work / f"driver-{name}", flags, len(dag))
                load.append(r["load"])
                print(f"round {repeat} {name}: {r['wall']:.1f} s end to end, flow {r['flow']:.1f} s, recorded "
                      f"{r['recorded']:.1f} s, server cpu {r['server_cpu']:.1f} s, db cpu {r['db_cpu']:.1f} s, "
                      f"load {r['load']:.1f}", flush=True)
                if repeat:
                    results[name].append(r)
        sizes = {k: v - empty[k] for k, v in db_size(pg, work / "home-sqlite").items()}  # growth
    med = {n: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for n, runs in results.items()}
    lines = ["| database | end to end | flow wall | all recorded | task runs/s (recorded) | task runs/s (flow) "
             "| Prefect server CPU / task run | PostgreSQL CPU / task run | server + DB CPU / task run "
             "| DB growth / task run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    total_runs = {n: sum(r["task_runs"] for r in runs) * (args.repeats + 1) / args.repeats
                  for n, runs in results.items()}  # every round, the warm-up included, is in the database
    for name, m in med.items():
        n = m["task_runs"]
        db = f"{m['db_cpu'] / n * 1000:.2f} ms" if name == "postgresql" else "(in the server)"
        lines.append(f"| {name} | {m['wall']:.1f} s | {m['flow']:.1f} s | {m['recorded']:.1f} s | "
                     f"{n / m['recorded']:.0f} | {n / m['flow']:.0f} | {m['server_cpu'] / n * 1000:.2f} ms | {db} "
                     f"| {(m['server_cpu'] + m['db_cpu']) / n * 1000:.2f} ms "
                     f"| {sizes[name] / total_runs[name] / 1024:.1f} KiB |")
    report = {"shards": args.shards, "rows_per_shard": args.rows, "repeats": args.repeats, "use_ray": args.use_ray,
              "results": results, "medians": med, "db_growth_bytes": sizes,
              "loadavg": {"min": min(load), "max": max(load)},
              "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (BENCH / "out").mkdir(exist_ok=True)
    (BENCH / "out" / "postgres.json").write_text(json.dumps(report, indent=2))
    print("\n".join(lines))
    print(f"load average {min(load):.1f}-{max(load):.1f}; {args.shards} shards x {args.rows} rows, "
          f"{'--use-ray' if args.use_ray else 'thread runner'}, medians of {args.repeats}")


if __name__ == "__main__":
    main()
