"""W9 memory against rows per shard (issue 19, deliverable 4): peak RSS of one shard at several sizes (full: 0.5M,
1M, 1.5M, 2M rows), three contenders, each a fresh process:

(a) the whole-table script (contenders.floor_keys: read the base without its image column and each source's key
    and score columns whole, check the keys, append, write zstd parquet)
(b) a one-shard `sidecar-ops run` (its default layout; thread runner, warm PREFECT_HOME): the shard in one task,
    streamed a row group at a time; the peak RSS of the process that runs the shard task, which is what a Ray
    task's `--task-memory-gb` must cover plus the driver's own baseline
(c) the same with `--task-per-operation` (a chain of tasks), which hands the whole table from step to step

Peaks are VmHWM of the process image (bench/workloads/common.py:maxrss_mb). Ratios: (b)/(a) and (c)/(a) at each
size (goal for (b) <= 0.5, at 1.5M rows in the issue) and each contender's growth from the second size to the
largest, 2x the rows (goal for
(b) <= 1.2x). Outputs are checked for their row counts. Memory does not depend on timing: one round.
"""
from __future__ import annotations

from pathlib import Path

from bench.workloads.common import Row, probe
from bench.workloads.data import check_rows, make_case
from bench.workloads.w0_fixed import cli_home

SCRIPT, RUN, CHAIN = ("(a) whole-table script", "(b) one-shard sidecar-ops run",
                      "(c) one-shard sidecar-ops run --task-per-operation")


def peak_script(case, out: str) -> float:
    rep = probe("contender", "floor_keys", str(case.root), out)
    assert rep["returncode"] == 0, rep["stderr_tail"]
    return rep["maxrss_mb"]


def peak_run(case, out: str, home: Path, *flags: str) -> float:
    home.mkdir(parents=True, exist_ok=True)
    rep = probe("cli", "--", "run", case.pipeline, "--output-prefix", out, *flags, env={"PREFECT_HOME": str(home)})
    assert rep["exit_code"] == 0, f"sidecar-ops run: exit {rep['exit_code']}\n{rep['stderr_tail']}"
    return rep["maxrss_mb"]


def run(data: Path, size: dict) -> list[Row]:
    home = cli_home(data)
    rows: list[Row] = []
    peaks: dict[tuple[str, int], float] = {}
    for n in size["w9_rows"]:
        case = make_case(data / f"w9-{n}", 1, n)
        note = f"1 shard x {n:,} rows, {case.bytes_on_disk() / 2**20:.0f} MiB base"
        for name, measure in ((SCRIPT, lambda out: peak_script(case, out)),
                              (RUN, lambda out: peak_run(case, out, home)),
                              (CHAIN, lambda out: peak_run(case, out, home, "--task-per-operation"))):
            out = case.output({SCRIPT: "script", RUN: "fused", CHAIN: "chain"}[name])
            peaks[name, n] = measure(out)
            check_rows(case, out, name)
        rows.append(Row("W9", f"{SCRIPT} @ {n:,} rows: peak RSS", peaks[SCRIPT, n], unit="MiB", note=note))
        for name, goal in ((RUN, "<= 0.5"), (CHAIN, None)):
            rows.append(Row("W9", f"{name} @ {n:,} rows: peak RSS", peaks[name, n], unit="MiB",
                            ref=f"{SCRIPT} @ {n:,} rows: peak RSS", goal=goal))
    middle, largest = size["w9_rows"][1], size["w9_rows"][-1]  # 1x and 2x the rows
    for name, goal in ((SCRIPT, None), (RUN, "<= 1.2"), (CHAIN, None)):
        rows.append(Row("W9", f"{name}: peak RSS growth, {middle:,} -> {largest:,} rows", peaks[name, largest],
                        unit="MiB", ref=f"{name} @ {middle:,} rows: peak RSS", goal=goal,
                        note=f"{largest / middle:.1f}x the rows"))
    return rows
