"""sidecar-ops benchmarks: generate data locally, run every workload, print medians and ratios.

    python bench/run.py [--size smoke|small|full] [--only W1,W3] [--w6-counts 1000,10000]
                        [--w10-counts 1000,10000,100000]

Data goes under bench/data/<size>/ (gitignored, reused when its parameters match); results go to
bench/out/results.json (`python bench/current.py RESULTS.json...` turns them into RESULTS.md's current table).
W0 fixed cost, W1 merge kernel vs floor and peers, W2 orchestration (thread runner vs Ray), W3 resume, W4
scale and memory, W5 S3 request counts, W6 scaling in shard count (chain, fused, fused on Ray vs plain Ray and
a sequential floor; Prefect server CPU and database growth), W7 end to end, each contender a fresh process
(sidecar-ops run vs a plain pyarrow script; one-shard fixed cost), W8 S3 with a first-byte latency per request
(default 15 ms; --w8-latency-ms): requests by kind, bytes, wall, against a minimal pyarrow script sequential
and 8 shards at once, a resume and a one-shard run, and `sidecar-ops verify` against a script doing the
guide's validation with 8 threads; W9 peak RSS of one shard against its rows at the row-group layouts users
have (pyarrow's default, one row group, Spark's 128 MiB): a whole-table script, a one-shard run, `sidecar-ops
verify --all` and a whole-table verify script; W10 `sidecar-ops verify` (the default sample, and --all) over
many tiny shards on S3 with W8's 15 ms a request: ms and requests a shard, driver peak RSS. Ratios are against
a floor measured in the same run; values are medians of `repeats` runs. Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

SIZES = {
    "smoke": dict(repeats=1, w0_rows=100, w1_shards=2, w1_rows=2_000, w2_shards=6, w2_repeats=1, w3_shards=6,
                  w4_dry_shards=[200], w4_mem_rows=2_000, w4_driver_shards=[5, 20], w5_shards=2, w5_rows=1_000,
                  ray_overhead_tasks=0, w6_counts=[20, 60],
                  w6_max={"ray": 20, "plain_ray": 20},  # each Ray mode once: a local Ray takes 10-30 s to start here
                  w7_shards=3, w7_rows=2_000, w8_shards=2, w8_rows=1_000,
                  w9_rows=[5_000, 10_000], w9_goal_rows=10_000, w9_growth=(5_000, 10_000),
                  w10_counts=[60, 120], w11_shards=6, w11_rounds=1, w12_counts=[100, 400]),
    "small": dict(repeats=3, w0_rows=1_000, w1_shards=4, w1_rows=50_000, w2_shards=100, w2_repeats=3,
                  w3_shards=100, w4_dry_shards=[10_000], w4_mem_rows=25_000, w4_driver_shards=[100, 1_000],
                  w5_shards=2, w5_rows=25_000, ray_overhead_tasks=50, w6_counts=[100, 1_000, 3_000],
                  w7_shards=12, w7_rows=20_000, w8_shards=12, w8_rows=20_000,
                  w9_rows=[100_000, 200_000, 400_000], w9_goal_rows=200_000, w9_growth=(100_000, 400_000),
                  w10_counts=[1_000, 3_000], w11_shards=150, w12_counts=[1_000, 5_000]),
    "full": dict(repeats=3, w0_rows=1_000, w1_shards=16, w1_rows=250_000, w2_shards=1_000, w2_repeats=3,
                 w3_shards=1_000, w4_dry_shards=[10_000, 100_000], w4_mem_rows=250_000,
                 w4_driver_shards=[1_000, 10_000], w5_shards=4, w5_rows=50_000, ray_overhead_tasks=50,
                 # the per-operation chain at 100,000 shards would take over an hour on 2 cores: 30,000 at most; the
                 # sequential loop (no orchestration to scale) stops at 10,000 to keep W6 within a session
                 w6_counts=[1_000, 10_000, 100_000], w6_max={"chain": 30_000, "sequential": 10_000}, w7_shards=12, w7_rows=200_000,
                 w7_repeats=7,  # the kept-server ratio moves by ~0.05 from round to round on this shared machine
                 w8_shards=24, w8_rows=20_000, w9_rows=[500_000, 1_000_000, 1_500_000, 2_000_000, 4_000_000],
                 w9_goal_rows=1_500_000, w9_growth=(1_000_000, 4_000_000),
                 # 10^5 shards: extrapolated from these by a linear fit; measured with --w10-counts 1000,10000,100000
                 # (at 10^5: ~45 min of set-up, 26 min for the sample verify, ~47 for --all, on 2 cores)
                 w10_counts=[1_000, 10_000], w11_shards=150, w12_counts=[2_000, 20_000]),
}
WORKLOADS = ("W0", "W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11", "W12")
NEEDS_SERVER = {"W1", "W2", "W3", "W4", "W5"}  # W6 starts its own (measured) server; W7 runs as a user does


def machine() -> dict:
    mem = next((int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal")), 0)
    versions = {}
    for mod in ("pyarrow", "prefect", "prefect_ray", "ray", "s3fs", "duckdb", "pandas"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing extra is reported, not fatal
            versions[mod] = None
    return {"cpus": os.cpu_count(), "mem_gib": round(mem / 2**20, 1), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_start": os.getloadavg(), "versions": versions}


def fmt_value(row: dict) -> str:
    v = row["value"]
    if v != v:  # nan
        return "-"
    if row["unit"] in ("reads", "req") and float(v).is_integer():
        return f"{int(v):,} {row['unit']}"
    return f"{v:,.3f} {row['unit']}" if abs(v) < 100 else f"{v:,.1f} {row['unit']}"


def table(rows: list[dict]) -> str:
    head = ["workload", "measure", "median", "ratio", "goal", "met", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x {r['ref'].split(':')[0]}" if r.get("ratio") is not None else ""
        met = {True: "yes", False: "NO", None: ""}[r.get("met")]
        lines.append("| " + " | ".join([r["workload"], r["name"], fmt_value(r), ratio, r.get("goal") or "", met,
                                         r.get("note", "")]) + " |")
    return "\n".join(lines)


def save(args, size, info, seconds, started, errors, rows) -> dict:
    info["loadavg_end"] = os.getloadavg()
    result = {"size": args.size, "params": size, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": info, "workload_seconds": seconds, "total_seconds": round(time.time() - started, 1),
              "errors": errors, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    out.with_suffix(".md").write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    m = result["machine"]
    load = f"{m['loadavg_start'][0]:.1f} at start, {m['loadavg_end'][0]:.1f} at end"
    lines = [f"size `{result['size']}`, {result['date']}, {m['cpus']} CPUs, {m['mem_gib']} GiB, Python {m['python']}, "
             f"load average {load}; {result['total_seconds']:.0f} s in all", "",
             "versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()), "",
             table(result["rows"])]
    lines += [f"\n{w} FAILED: {err}" for w, err in result["errors"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=SIZES, default="small")
    p.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads (default: all)")
    p.add_argument("--out", default=str(BENCH / "out" / "results.json"))
    p.add_argument("--data", default=None, help="where data and Prefect homes go (default bench/data/SIZE)")
    p.add_argument("--w6-counts", default=None, help="comma-separated shard counts for W6 (default: the size's)")
    p.add_argument("--w6-modes", default=None, help="comma-separated W6 modes (default: all): chain, fused, ray, "
                   "plain_ray, sequential")
    p.add_argument("--w8-latency-ms", type=float, default=None, help="W8's first-byte latency per request (15)")
    p.add_argument("--w10-counts", default=None, help="comma-separated shard counts for W10 (default: the size's)")
    p.add_argument("--w9-layouts", default=None, help="comma-separated W9 layouts (default: pyarrow,one,spark)")
    args = p.parse_args(argv)
    size = dict(SIZES[args.size])
    if args.w9_layouts:
        size["w9_layouts"] = [m.strip() for m in args.w9_layouts.split(",") if m.strip()]
    if args.w6_counts:
        size["w6_counts"] = [int(n) for n in args.w6_counts.split(",")]
    if args.w10_counts:
        size["w10_counts"] = [int(n) for n in args.w10_counts.split(",")]
    if args.w6_modes:
        size["w6_modes"] = [m.strip() for m in args.w6_modes.split(",") if m.strip()]
    if args.w8_latency_ms is not None:
        size["w8_latency_ms"] = args.w8_latency_ms
    chosen = [w.strip().upper() for w in args.only.split(",") if w.strip()]
    data = Path(args.data) if args.data else BENCH / "data" / args.size
    data.mkdir(parents=True, exist_ok=True)
    # Our own Prefect home (never the user's), quiet and offline, set before Prefect is imported.
    os.environ["PREFECT_HOME"] = str(data / "prefect-home")
    for key, value in {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
                       "RAY_USAGE_STATS_ENABLED": "0", "PREFECT_LOGGING_LEVEL": "WARNING",
                       "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL", "PREFECT_UI_ENABLED": "false"}.items():
        os.environ.setdefault(key, value)
    os.environ.pop("PREFECT_API_URL", None)

    import importlib

    from bench.workloads.common import ratio_rows
    from bench.workloads.flowrun import prefect_session

    started = time.time()
    info = machine()
    rows, errors, seconds = [], {}, {}
    modules = {"W0": "w0_fixed", "W1": "w1_kernel", "W2": "w2_orch", "W3": "w3_resume", "W4": "w4_scale",
               "W5": "w5_s3", "W6": "w6_shards", "W7": "w7_end_to_end", "W8": "w8_latency",
               "W9": "w9_memory", "W10": "w10_verify_scale", "W11": "w11_ray_fixed",
               "W12": "w12_verify_memory"}
    with prefect_session() if NEEDS_SERVER & set(chosen) else _nothing():
        for w in chosen:
            print(f"[bench] {w} ({args.size}) ...", file=sys.stderr, flush=True)
            t0 = time.time()
            try:
                mod = importlib.import_module(f"bench.workloads.{modules[w]}")
                got = mod.run(data, size)
                ratio_rows(got)
                rows += [r.to_dict() for r in got]
            except Exception as exc:  # noqa: BLE001 - one workload failing must not hide the others
                errors[w] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            seconds[w] = round(time.time() - t0, 1)
            print(f"[bench] {w} done in {seconds[w]} s", file=sys.stderr, flush=True)
            save(args, size, info, seconds, started, errors, rows)  # partial results survive a later crash
    result = save(args, size, info, seconds, started, errors, rows)
    out = Path(args.out)
    print(table(rows))
    for w, err in errors.items():
        print(f"{w} FAILED: {err}")
    print(f"\nresults: {out}  ({result['total_seconds']} s; load {info['loadavg_start']} -> {info['loadavg_end']})")
    return 1 if errors else 0


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
