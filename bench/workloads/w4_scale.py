"""W4 scale and memory, each measured in a fresh interpreter (peak RSS from getrusage).

- dry-run planning of many tiny shards on a local listing: time and driver peak RSS
- merging one shard vs a shard 8x larger: RSS growth during merge_shard vs the decoded output table
- driver peak RSS of a full run (thread runner) at N vs 10N shards
"""
from __future__ import annotations

from pathlib import Path

from bench.workloads.common import Row, probe
from bench.workloads.data import make_case
from flows.server import configured_api


def run(data: Path, size: dict) -> list[Row]:
    home = {"PREFECT_HOME": str(data / "prefect-home-cli")}
    rows: list[Row] = []
    for n in size["w4_dry_shards"]:
        case = make_case(data / f"w4-dry-{n}", n, 1, linked=True)
        rep = probe("cli", "--", "run", case.pipeline, "--output-prefix", case.output("dry"), "--dry-run", env=home)
        assert rep["exit_code"] == 0, rep["stderr_tail"]
        rows.append(Row("W4", f"dry run, {n:,} shards: wall", rep["t_end"] - rep["t_start"], samples=[],
                        note="no server started" if rep["server_entered_at"] is None else "STARTED a server"))
        rows.append(Row("W4", f"dry run, {n:,} shards: driver peak RSS", rep["maxrss_mb"], unit="MiB"))

    r = size["w4_mem_rows"]
    case = make_case(data / "w4-mem", 3, [100, r, 8 * r])
    growth = {}
    for rel, rows_in in zip(case.relpaths[1:], case.rows[1:]):
        rep = probe("merge", case.pipeline, case.output(f"mem-{rows_in}"), case.relpaths[0], rel)
        growth[rows_in] = delta = rep["maxrss_mb"] - rep["rss_before_mb"]
        rows.append(Row("W4", f"merge one shard of {rows_in:,} rows: RSS growth", delta, unit="MiB",
                        goal="<= 3x output", met=delta <= 3 * rep["output_decoded_mb"],
                        note=f"{delta / rep['output_decoded_mb']:.2f}x the decoded output "
                             f"({rep['output_decoded_mb']:.0f} MiB); peak RSS {rep['maxrss_mb']:.0f} MiB"))
    rows.append(Row("W4", "RSS growth, 8x shard / 1x shard", growth[8 * r] / growth[r], unit="x",
                    note="8.0 = scales with the shard"))

    drv = {}
    # the session's server (in this process's Prefect settings, no longer in os.environ): driver RSS only
    api = {**home, "PREFECT_API_URL": configured_api()}
    for n in size["w4_driver_shards"]:
        case = make_case(data / f"w4-drv-{n}", n, 10, linked=True)
        rep = probe("cli", "--", "run", case.pipeline, "--output-prefix", case.output("run"), env=api)
        assert rep["exit_code"] == 0, rep["stderr_tail"]
        drv[n] = rep["maxrss_mb"]
        rows.append(Row("W4", f"full run, {n:,} shards: driver peak RSS", rep["maxrss_mb"], unit="MiB",
                        note=f"wall {rep['t_end'] - rep['t_start']:.1f} s"))
    lo, hi = size["w4_driver_shards"]
    rows.append(Row("W4", f"driver peak RSS {hi:,} / {lo:,} shards", drv[hi] / drv[lo], unit="x",
                    goal="<= 1.5", met=drv[hi] / drv[lo] <= 1.5))
    return rows
