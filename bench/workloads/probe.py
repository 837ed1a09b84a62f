"""Run one measured thing in a fresh interpreter and write a JSON report (used by the workloads).

    probe.py cli OUT.json -- ARGS...      `sidecar-ops ARGS...` (same entry point as the console script),
                                           recording when the first shard task starts, whether a Prefect
                                           server was started, and the driver's peak RSS; with
                                           SIDECAR_BENCH_S3_TRACE=PATH, which code made each S3 request
                                           (bench/workloads/s3trace.py)
    probe.py merge OUT.json PIPELINE OUTPUT WARMUP_RELPATH RELPATH
                                           tasks.kernel.merge_shard on a tiny warm-up shard (lazy imports,
                                           kernel registries, thread pools), then on RELPATH: RSS before,
                                           peak RSS, decoded size of the output table
    probe.py contender OUT.json NAME CASE_ROOT OUTPUT
                                           one contender of bench/workloads/contenders.py (ALONE) over
                                           every shard of the case built under CASE_ROOT, as a script would
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

T0 = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workloads.common import maxrss_mb, rss_mb  # noqa: E402 (needs the sys.path line)


def cli(args: list[str]) -> dict:
    report: dict = {"first_task_at": None, "server_entered_at": None, "server_ready_at": None}
    import contextlib
    import os

    trace = os.environ.get("SIDECAR_BENCH_S3_TRACE")  # W8: which code issues each S3 request
    if trace:
        from bench.workloads import s3trace

        s3trace.install(trace)

    from flows import collector

    collector.pause()  # what the console script does first (flows/console.py console)
    from flows.cli import main, quiet_environment

    quiet_environment(False)  # what main() sets before pyarrow loads (Arrow's memory pool), before tasks.kernel does
    import flows.server
    import tasks.kernel

    real_api = flows.server.prefect_api

    def first_task(read):  # a shard's first read of its base: open_shard (one task a shard) or read_base (chain)
        def first(*a, **k):
            if report["first_task_at"] is None:
                report["first_task_at"] = time.time()
            return read(*a, **k)
        return first

    @contextlib.contextmanager
    def prefect_api(*a, **k):
        report["server_entered_at"] = time.time()
        with real_api(*a, **k) as url:
            report["server_ready_at"] = time.time()
            yield url

    tasks.kernel.read_base = first_task(tasks.kernel.read_base)
    tasks.kernel.open_shard = first_task(tasks.kernel.open_shard)
    flows.server.prefect_api = prefect_api
    report["imported_at"] = time.time()
    try:
        report["exit_code"] = main(args)
    finally:
        if trace:
            s3trace.dump()
    collector.exiting()  # as the console script does before it exits
    report["prefect_imported"] = "prefect" in sys.modules
    return report


def merge(pipeline: str, output: str, warmup: str, relpath: str) -> dict:
    import pyarrow.parquet as pq

    from tasks.config import load_pipeline
    from tasks.kernel import Job, merge_shard

    job = Job(load_pipeline(pipeline), output)
    merge_shard(job, warmup)
    before = rss_mb()
    t = time.perf_counter()
    stats = merge_shard(job, relpath)
    report = {"seconds": time.perf_counter() - t, "rss_before_mb": before, "maxrss_mb": maxrss_mb(),
              "rows": stats.rows, "output_bytes": stats.bytes}
    report["output_decoded_mb"] = pq.read_table(job.output_uri(relpath)).nbytes / 2**20
    return report


def contender(name: str, root: str, output: str) -> dict:
    from bench.workloads.contenders import ALONE
    from bench.workloads.data import load_case

    case = load_case(Path(root))
    t = time.perf_counter()
    ALONE[name](case, output)
    return {"seconds": time.perf_counter() - t, "shards": len(case.relpaths)}


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    if mode == "cli":
        result = cli(rest[1:] if rest[:1] == ["--"] else rest)
    elif mode == "merge":
        result = merge(*rest)
    elif mode == "contender":
        result = contender(*rest)
    else:
        raise SystemExit(f"unknown probe mode {mode!r}")
    result.setdefault("maxrss_mb", maxrss_mb())
    result.update(t0=T0, t_exit=time.time())
    Path(out).write_text(json.dumps(result))
