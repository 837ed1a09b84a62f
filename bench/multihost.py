"""Two-host cluster vs one host: the same `sidecar-ops run --use-ray` on the same S3 data.

    sudo .venv/bin/python bench/multihost.py [--shards 32] [--rows 50000] [--repeats 2]

Builds the namespaced hosts of tests/netns_cluster.py (Ray head with 0 CPUs on the head host, two worker hosts
with 1 CPU each, moto S3 on the head's cluster address), then alternates, `repeats` times:
  thread    sidecar-ops run (thread runner, no Ray)
  one-host  sidecar-ops run --use-ray (a local Ray instance for the run: 2 CPUs on this host)
  two-host  sidecar-ops run --use-ray --ray-address HEAD:PORT (no PREFECT_API_URL: the run's server listens on the
            cluster address with a per-run credential)
Each run recomputes every shard (--overwrite). Both Ray runs have 2 CPUs for shard tasks on the same 2 cores,
so the ratio is the cost of distribution (network hops, a remote object store, the API over the bridge), not a
speed-up. Prints a markdown table and writes bench/out/multihost.json. Needs root (network namespaces).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from core_fixtures import build  # noqa: E402
from netns_cluster import BIN, can_build, free_port, network, ray_cluster  # noqa: E402
from ray_fixtures import TAG, kill_tagged, new_tag  # noqa: E402

from tasks import storage  # noqa: E402


def run(argv: list[str], env: dict) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    out = subprocess.run([str(BIN / "sidecar-ops"), *argv], cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    flow = float(re.search(r"wall time: ([\d.]+)s", out.stdout).group(1))
    return wall, flow, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if why := can_build():
        raise SystemExit(f"cannot build hosts: {why}")
    os.environ.update(AWS_ACCESS_KEY_ID="bench-key", AWS_SECRET_ACCESS_KEY="bench-secret",
                      AWS_DEFAULT_REGION="us-east-1", PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
                      RAY_USAGE_STATS_ENABLED="0")
    import boto3
    from moto.server import ThreadedMotoServer

    work = Path(tempfile.mkdtemp(prefix="bench-multihost-"))
    results: dict[str, list] = {"thread": [], "one-host": [], "two-host": []}
    load = [os.getloadavg()[0]]
    with network(2) as net, ray_cluster(net, net.hosts, work) as cluster:
        port = free_port(net.head.ip)
        moto = ThreadedMotoServer(ip_address=net.head.ip, port=port, verbose=False)
        moto.start()
        endpoint = f"http://{net.head.ip}:{port}"
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        storage._s3.cache_clear()
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench-data")
        data = build(work, "s3://bench-data/", shards=args.shards, rows=args.rows)
        base = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
        modes = {
            "thread": [],
            "one-host": ["--use-ray"],
            "two-host": ["--use-ray", "--ray-address", cluster.address],
        }
        try:
            for repeat in range(args.repeats + 1):  # the first round warms caches and is not counted
                for mode, extra in modes.items():
                    tag = new_tag()
                    env = {**base, TAG: tag, "PREFECT_HOME": str(work / f"home-{mode}"), **cluster.auth_env()}
                    try:
                        wall, flow, _ = run(["run", str(data.pipeline), "--output-prefix",
                                             f"s3://bench-data/{mode}/", "--overwrite", "--max-inflight", "8",
                                             *extra], env)
                    finally:
                        kill_tagged(tag)
                    load.append(os.getloadavg()[0])
                    print(f"round {repeat} {mode}: {wall:.1f} s end to end, flow {flow:.1f} s", flush=True)
                    if repeat:
                        results[mode].append({"wall": wall, "flow": flow})
        finally:
            moto.stop()
    med = {m: {k: statistics.median(r[k] for r in runs) for k in ("wall", "flow")} for m, runs in results.items()}
    rows = args.shards * args.rows
    lines = ["| mode | end to end (median) | flow wall (median) | flow ratio to one-host | rows/s (flow) |",
             "|---|---|---|---|---|"]
    for mode, m in med.items():
        lines.append(f"| {mode} | {m['wall']:.1f} s | {m['flow']:.1f} s | "
                     f"{m['flow'] / med['one-host']['flow']:.2f}x | {rows / m['flow']:,.0f} |")
    report = {"shards": args.shards, "rows_per_shard": args.rows, "repeats": args.repeats, "results": results,
              "medians": med, "loadavg": {"min": min(load), "max": max(load)},
              "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (BENCH / "out").mkdir(exist_ok=True)
    (BENCH / "out" / "multihost.json").write_text(json.dumps(report, indent=2))
    print("\n".join(lines))
    print(f"load average {min(load):.1f}-{max(load):.1f}; {args.shards} shards x {args.rows:,} rows")


if __name__ == "__main__":
    main()
