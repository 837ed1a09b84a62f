"""W1 merge kernel: realistic shards, floor vs our kernel vs our flow vs pandas vs DuckDB, in one run.

Contenders run interleaved (one pass of each per repeat) after one untimed warm-up pass, so noise on
the shared machine hits them alike. Every output is checked for its row count once.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from bench.workloads.common import Row, median, probe, timed
from bench.workloads.contenders import CONTENDERS
from bench.workloads.data import check_rows, make_case
from bench.workloads.flowrun import run_flow
from bench.workloads.w0_fixed import cli_home, is_warm


def run(data: Path, size: dict) -> list[Row]:
    case = make_case(data / "w1", size["w1_shards"], size["w1_rows"])
    repeats = size["repeats"]
    samples: dict[str, list[float]] = {name: [] for name in [*CONTENDERS, "flow", "cli"]}
    cpu: dict[str, list[float]] = {name: [] for name in samples}
    home = cli_home(data)

    def flow(case, out):
        seconds, summary = run_flow(case.pipeline, out)
        assert summary["merged"] == len(case.relpaths), summary

    def cli(case, out):
        rep = probe("cli", "--", "run", case.pipeline, "--output-prefix", out, env={"PREFECT_HOME": str(home)})
        assert rep["exit_code"] == 0, rep["stderr_tail"]
        return rep["t_end"] - rep["t_start"]

    everyone = {**CONTENDERS, "flow": flow, "cli": cli}
    if not is_warm(home):
        cli(case, case.output("cli"))
    for rep in range(repeats + 1):  # pass 0 warms caches and the page cache, and checks every output
        for name, fn in everyone.items():
            if rep == 0 and name == "cli":
                continue  # a new interpreter each time: nothing to warm (the Prefect home is warm)
            out = case.output(name)
            cpu0 = time.process_time()
            seconds, returned = timed(fn, case, out)
            cpu[name].append(time.process_time() - cpu0)
            if name == "cli":
                seconds = returned
            if rep == 0 or (rep == 1 and name == "cli"):
                check_rows(case, out, name)
            if rep == 0:
                continue
            samples[name].append(seconds)
    m = {k: median(v) for k, v in samples.items()}
    c = {k: median(v[1:] if k != "cli" else v) for k, v in cpu.items()}  # cpu[k][0] is the warm-up pass
    rows_total = sum(case.rows)
    desc = f"{len(case.relpaths)} shards x {case.rows[0]:,} rows, {case.bytes_on_disk() / 2**20:.0f} MiB base"
    ours, n = m["flow"], len(case.relpaths)
    rows = [
        Row("W1", "(a) floor: minimal pyarrow", m["floor"], samples=samples["floor"], note=desc),
        Row("W1", "(b) kernel without check_written", m["kernel_noverify"], samples=samples["kernel_noverify"],
            ref="(a) floor: minimal pyarrow", goal="<= 1.10", note="like for like with the floor"),
        Row("W1", "(b') kernel merge_shard (incl. check_written), copy path", m["kernel"], samples=samples["kernel"],
            ref="(a) floor: minimal pyarrow", goal="<= 1.10", note="also re-reads both key columns"),
        Row("W1", "(b'') kernel merge_shard, decode path (--recompress zstd)", m["kernel_decode"],
            samples=samples["kernel_decode"], ref="(a) floor: minimal pyarrow", goal="<= 1.10"),
        Row("W1", "(a) floor: CPU seconds a shard", c["floor"] / n, note="this process, all threads"),
        Row("W1", "(b') kernel, copy path: CPU seconds a shard", c["kernel"] / n, ref="(a) floor: CPU seconds a shard",
            goal="<= 0.35", note="issue 35"),
        Row("W1", "(b'') kernel, decode path: CPU seconds a shard", c["kernel_decode"] / n,
            ref="(a) floor: CPU seconds a shard"),
        Row("W1", "(b') output bytes, copy path / decode path", _bytes(case, "kernel") / _bytes(case, "kernel_decode"),
            unit="x", note="the base's codec kept (here zstd, as the bench writes its inputs) vs zstd"),
        Row("W1", "(c) full flow, thread runner, warm server", m["flow"], samples=samples["flow"],
            ref="(a) floor: minimal pyarrow", goal="<= 1.25", note="merge_flow in-process, server already up"),
        Row("W1", "(c') sidecar-ops run, end to end", m["cli"], samples=samples["cli"],
            ref="(a) floor: minimal pyarrow", note="new interpreter + Prefect server start (warm home)"),
        Row("W1", "(d) pandas merge on keys", m["pandas"], samples=samples["pandas"],
            ref="(a) floor: minimal pyarrow", met=ours < m["pandas"], goal="slower than (c)"),
        Row("W1", "(e) DuckDB POSITIONAL JOIN + COPY", m["duckdb"], samples=samples["duckdb"],
            ref="(a) floor: minimal pyarrow", met=ours < m["duckdb"], goal="slower than (c)"),
        Row("W1", "floor throughput", rows_total / m["floor"] / 1e6, unit="M rows/s"),
    ]
    for row in rows:
        key = next((k for k, label in LABELS.items() if row.name.startswith(label)), None)
        if key and key != "cli":
            row.note = f"{row.note}; cpu {c[key]:.2f} s (this process, all threads)".lstrip("; ")
    return rows


def _bytes(case, name: str) -> int:
    return sum(os.path.getsize(os.path.join(case.root, "out", name, rel)) for rel in case.relpaths)  # the last pass's


LABELS = {"floor": "(a) floor: minimal", "kernel_noverify": "(b) ", "kernel": "(b') kernel merge_shard",
          "kernel_decode": "(b'') kernel merge_shard", "flow": "(c) ", "cli": "(c')", "pandas": "(d)", "duckdb": "(e)"}
