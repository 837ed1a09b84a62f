"""W10 verify over many shards on S3 (issue 27, deliverable 2): `sidecar-ops verify` at several shard counts
behind W8's counting proxy, which adds a first-byte latency to every request (15 ms, `w10_latency_ms`).

A case of N tiny shards (10 rows, the bench schema and pipeline) per count, in its own bucket of one moto server
(loopback, in this process). Set-up, beside the proxy (moto's own port, no latency, not counted):
- the base, DQM and AES objects: one shard of each written once locally, its bytes put under every relpath with
  a thread pool (boto3 put_object). Every shard is the same table, so alignment holds;
- the merged outputs: a real `sidecar-ops run` over the N shards. One merged output copied under every relpath
  would not do: each output records the key of its inputs, and that key includes the relpath
  (tasks/kernel.py shard_key), so the copies would fail verify's `current inputs` check.
Measured, through the proxy, each a fresh process (bench/workloads/probe.py), once per count:
(a) `sidecar-ops verify --samples 50` (the default sample: every shard's footers, 50 shards' data)
(b) `sidecar-ops verify --samples 50 --all` (also every shard's score statistics, so every shard's data)
Per run: wall (start -> exit, so with a process's start-up), ms a shard, requests a shard by kind, the driver's
peak RSS, and CPU a shard: the verify process's (with any children it waited for) and this process's, which
serves moto and the proxy (what real S3 would do elsewhere: beside verify on these 2 cores, it slows it). Each report (--json) is checked: every check passed, N shards, and the statistics hold every row of
their scope. Where the largest count is below 10^5, rows give 10^5 by a linear fit over the counts measured,
labelled "extrapolated".
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.workloads.common import Row, probe
from bench.workloads.data import SIDECARS, make_case, write_yamls
from bench.workloads.w0_fixed import cli_home
from bench.workloads.w8_latency import kinds_note, per_shard

ROWS = 10
SAMPLES = 50
TARGET = 100_000
PUT_THREADS = 16
MODES = {"sample": (f"(a) verify --samples {SAMPLES}", []),
         "all": (f"(b) verify --samples {SAMPLES} --all", ["--all"])}
SCORE_COLUMNS = ("dqm_d1_v6_1", "ernie_image_aes")  # bench.yaml's score columns


@contextlib.contextmanager
def moto_and_proxy(latency_ms: float):
    """moto on loopback and W8's counting proxy in front of it; yields (moto's URL, the proxy's URL, RequestLog).
    The set-up writes to moto itself; what is measured goes through the proxy."""
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    from bench.workloads.counting import RequestLog, _Proxy, _Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    log = RequestLog()
    handler = type("Proxy", (_Proxy,), {"upstream": ("127.0.0.1", port), "log": log, "latency": latency_ms / 1000})
    proxy = _Server(("127.0.0.1", 0), handler)
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxy.server_address[1]}", log
    finally:
        proxy.shutdown()
        moto.stop()


def run(data: Path, size: dict) -> list[Row]:
    for key, value in {"AWS_ACCESS_KEY_ID": "bench-key-id", "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(key, value)
    template = make_case(data / "w10-template", 1, ROWS)
    bodies = {s: Path(template.path(s, template.relpaths[0])).read_bytes() for s in SIDECARS}
    latency = float(size.get("w10_latency_ms", 15))
    results = {}
    with moto_and_proxy(latency) as (moto, proxy, log):
        import boto3

        s3 = boto3.client("s3", endpoint_url=moto)
        for n in size["w10_counts"]:
            results[n] = ScaleCase(data, n, s3, moto, proxy, log).measure(bodies)
            log_progress(data, n, results[n])
    return rows(results, latency)


class ScaleCase:
    """N shards in bucket w10-N: inputs, current outputs, then the measured verify runs."""

    def __init__(self, data: Path, n: int, s3, moto: str, proxy: str, log):
        self.data, self.n, self.s3, self.moto, self.proxy, self.log = data, n, s3, moto, proxy, log
        self.bucket, self.root, self.home = f"w10-{n}", data / f"w10-{n}", cli_home(data)
        self.out = f"s3://{self.bucket}/out/"

    @property
    def pipeline(self) -> str:
        return str(self.root / "pipelines" / "bench.yaml")

    def measure(self, bodies: dict[str, bytes]) -> dict:
        from tasks.demo import relpaths

        t0 = time.perf_counter()
        self.s3.create_bucket(Bucket=self.bucket)
        jobs = [(f"{sidecar}/{rel}", body) for rel in relpaths(self.n) for sidecar, body in bodies.items()]
        with ThreadPoolExecutor(PUT_THREADS) as pool:
            list(pool.map(lambda job: self.s3.put_object(Bucket=self.bucket, Key=job[0], Body=job[1]), jobs))
        put_seconds = time.perf_counter() - t0
        write_yamls(self.root, source_root=f"s3://{self.bucket}")
        result = {"put": put_seconds, "objects": len(jobs), "run": self.merge()}
        for mode in MODES:
            result[mode] = self.verify(mode)
        return result

    def cli(self, endpoint: str, *args: str) -> dict:
        self.home.mkdir(parents=True, exist_ok=True)
        rep = probe("cli", "--", *args, env={"PREFECT_HOME": str(self.home), "AWS_ENDPOINT_URL": endpoint})
        assert rep["exit_code"] == 0, f"W10 @ {self.n:,}: sidecar-ops {args[0]}: exit {rep['exit_code']}\n" \
                                      f"{rep['stderr_tail']}"
        return rep

    def merge(self) -> float:
        """The outputs: a real `sidecar-ops run` on moto itself (no latency); its wall."""
        rep = self.cli(self.moto, "run", self.pipeline, "--output-prefix", self.out)
        return rep["t_end"] - rep["t_start"]

    def verify(self, mode: str) -> dict:
        report_path = self.root / f"verify-{mode}.json"
        self.log.clear()
        cpu0, child0 = time.process_time(), children_cpu()
        rep = self.cli(self.proxy, "verify", self.pipeline, "--output-prefix", self.out, "--samples", str(SAMPLES),
                       *MODES[mode][1], "--json", str(report_path))
        cpu, child = time.process_time() - cpu0, children_cpu() - child0
        entries = self.log.snapshot()
        scope = self.checked(json.loads(report_path.read_text()), mode)
        return {"wall": rep["t_end"] - rep["t_start"], "rss": rep["maxrss_mb"], "requests": per_shard(entries, self.n),
                "scope": scope, "cpu": child, "server_cpu": cpu}

    def checked(self, report: dict, mode: str) -> int:
        """Every check passed over the N shards and each score column's statistics hold every row of their scope
        (the sample, or every shard with --all); returns that scope's shard count."""
        label = f"W10 {MODES[mode][0]} @ {self.n:,}"
        failed = [c["name"] for c in report["checks"] if not c["passed"]]
        assert report["ok"] and not failed, f"{label}: checks failed: {failed}"
        assert report["shards"] == self.n, f"{label}: {report['shards']} shards in the report"
        scope = self.n if mode == "all" else min(SAMPLES, self.n)
        assert report["stats_shards"] == scope, f"{label}: statistics over {report['stats_shards']} shards"
        for column in SCORE_COLUMNS:
            stats = next(s for s in report["statistics"] if s["column"] == column)
            assert (stats["shards"], stats["rows"]) == (scope, scope * ROWS), f"{label}: {column} {stats}"
        return scope


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def log_progress(data: Path, n: int, result: dict) -> None:
    """One JSON line per count (w10-progress.jsonl): a long run keeps what it measured if stopped."""
    line = {"shards": n, "loadavg": os.getloadavg(), "time": time.time(), **result}
    with open(data / "w10-progress.jsonl", "a") as f:
        f.write(json.dumps(line, default=str) + "\n")
    print(f"[bench] W10 @ {n:,}: " + ", ".join(f"{m} {result[m]['wall']:.1f} s" for m in MODES), file=sys.stderr,
          flush=True)


def fit(points: dict[int, float], x: int) -> float:
    """The least-squares line through (count, value), at count x."""
    slope, intercept = statistics.linear_regression(list(points), list(points.values()))
    return intercept + slope * x


def rows(results: dict[int, dict], latency: float) -> list[Row]:
    counts = sorted(results)
    lo, hi = counts[0], counts[-1]
    out = []
    for n in counts:
        r = results[n]
        out.append(Row("W10", f"set-up @ {n:,}: put the inputs", r["put"],
                       note=f"{r['objects']:,} objects, {PUT_THREADS} threads, moto without the proxy"))
        out.append(Row("W10", f"set-up @ {n:,}: sidecar-ops run (the outputs)", r["run"],
                       note="moto without the proxy; start -> exit"))
    for mode, (label, _) in MODES.items():
        for n in counts:
            out += mode_rows(label, n, results[n][mode], lo if n == hi and hi != lo else None, latency)
        if hi < TARGET and len(counts) > 1:
            out += extrapolated(label, {n: results[n][mode] for n in counts})
    return out


def mode_rows(label: str, n: int, r: dict, lo: int | None, latency: float) -> list[Row]:
    name, req = f"{label} @ {n:,}", r["requests"]
    return [
        Row("W10", f"{name}: wall", r["wall"], samples=[r["wall"]],
            note=f"{n:,} shards verified, statistics over {r['scope']:,} shards ({r['scope'] * ROWS:,} rows); "
                 f"{latency:g} ms a request; start -> exit"),
        Row("W10", f"{name}: ms a shard", r["wall"] / n * 1000, unit="ms",
            ref=f"{label} @ {lo:,}: ms a shard" if lo else None, note=f"vs {lo:,} shards" if lo else ""),
        Row("W10", f"{name}: requests a shard", req["per_shard"], unit="req",
            note=f"{kinds_note(req)}; in all: " + ", ".join(f"{k} {v:,}" for k, v in req["kinds"].items())
                 + f" ({req['total']:,})"),
        Row("W10", f"{name}: driver peak RSS", r["rss"], unit="MiB",
            ref=f"{label} @ {lo:,}: driver peak RSS" if lo else None, note=f"vs {lo:,} shards" if lo else ""),
        Row("W10", f"{name}: verify CPU a shard", r["cpu"] / n * 1000, unit="ms",
            note=f"the verify process; moto + proxy (the bench process): {r['server_cpu'] / n * 1000:.1f} ms a shard"),
    ]


def extrapolated(label: str, by_count: dict[int, dict]) -> list[Row]:
    """10^5 by a linear fit over the counts measured (not a measurement)."""
    how = f"NOT measured: linear fit over {', '.join(f'{n:,}' for n in by_count)} shards"
    wall = fit({n: r["wall"] for n, r in by_count.items()}, TARGET)
    requests = fit({n: r["requests"]["total"] for n, r in by_count.items()}, TARGET)
    rss = fit({n: r["rss"] for n, r in by_count.items()}, TARGET)
    name = f"{label} @ {TARGET:,} (extrapolated)"
    return [Row("W10", f"{name}: wall", wall, note=how),
            Row("W10", f"{name}: ms a shard", wall / TARGET * 1000, unit="ms", note=how),
            Row("W10", f"{name}: requests a shard", requests / TARGET, unit="req", note=how),
            Row("W10", f"{name}: driver peak RSS", rss, unit="MiB", note=how)]
