"""W9 memory against rows per shard, on the row-group layouts users have (issue 19, deliverable 4; issue 27,
deliverable 3): peak RSS of one shard at several sizes (full: 0.5M, 1M, 1.5M, 2M, 4M rows) and layouts
(bench/workloads/data.py: `pyarrow` default row groups of 1,048,576 rows, `one` row group a shard, `spark`
~128 MiB row groups), each contender a fresh process:

(a) the whole-table script (contenders.floor_keys: read the base and each source's key and score columns
    whole, check the keys, append, write zstd parquet)
(b) a one-shard `sidecar-ops run` (its default layout; thread runner, warm PREFECT_HOME): the shard in one
    task, by the copy path (column chunks copied through a fixed buffer); the peak RSS of the process that runs
    the shard task, which is what a Ray task's `--task-memory-gb` must cover plus the driver's own baseline
(b'') the same with `--recompress zstd`: the decode path (windows of rows), at the pyarrow layout only
(c) the same with `--task-per-operation` (a chain of tasks), which hands the whole table from step to step;
    at the pyarrow layout only (the whole-table path: it is not meant to meet the goal)
(d) `sidecar-ops verify --samples 1 --all` on (b)'s output
(e) the whole-table verify script (contenders.verify_whole, the guide's validation: read the output, the base
    and each source whole; compare keys, base columns and merged columns) on (b)'s output: verify's floor
On S3 (issue 34), the pyarrow layout at `w9_goal_rows`, the shard uploaded to moto (server mode, loopback, in
this process: its memory is not the contenders'):
(a') the W8 floor script (bench/workloads/s3_script.py, pyarrow's own S3 filesystem, one shard): the base read
     whole, each source's key and score columns, zstd parquet written
(b') the one-shard `sidecar-ops run` of (b) on S3: inputs fetched ahead, the output a multipart upload

Peaks are VmHWM of the process image (bench/workloads/common.py:maxrss_mb). Ratios: each contender / (a) at
each layout and size (goals for (b) and (d) <= 0.5 at `w9_goal_rows` (1.5M in the issue) for the pyarrow and
one layouts) and each contender's growth over `w9_growth` (1M -> 4M rows; goal for (b) <= 1.1x (issue 35) and
(d) <= 1.2x at every layout). Outputs are checked for their row counts; verify must pass. Memory does not depend on timing:
one round.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.workloads.common import Row, bench_env, probe
from bench.workloads.counting import bench_s3
from bench.workloads.data import SIDECARS, check_rows, make_case, write_yamls
from bench.workloads.w0_fixed import cli_home
from bench.workloads.w8_latency import SCRIPT as S3_SCRIPT_PY
from bench.workloads.w8_latency import SOURCES

SCRIPT, RUN, CHAIN = ("(a) whole-table script", "(b) one-shard sidecar-ops run",
                      "(c) one-shard sidecar-ops run --task-per-operation")
DECODE = "(b'') one-shard sidecar-ops run --recompress zstd"
VERIFY, VERIFY_SCRIPT = "(d) sidecar-ops verify --samples 1 --all", "(e) whole-table verify script"
CONTENDERS = (SCRIPT, RUN, DECODE, CHAIN, VERIFY, VERIFY_SCRIPT)
LAYOUTS = ("pyarrow", "one", "spark")
CHAIN_LAYOUTS = ("pyarrow",)
GOAL_LAYOUTS = ("pyarrow", "one")  # the memory goal at w9_goal_rows; growth is asked of every layout
BOUNDED = (RUN, VERIFY)  # the contenders the goals are for
GROWTH = {RUN: "<= 1.1", VERIFY: "<= 1.2"}
S3_SCRIPT, S3_RUN = "(a') whole-table script on S3", "(b') one-shard sidecar-ops run on S3"
BUCKET = "w9-s3"


def peak_script(case, name: str, out: str) -> float:
    rep = probe("contender", name, str(case.root), out)
    assert rep["returncode"] == 0, rep["stderr_tail"]
    return rep["maxrss_mb"]


def peak_cli(home: Path, command: str, case, out: str, *flags: str, pipeline: str | None = None) -> float:
    home.mkdir(parents=True, exist_ok=True)
    rep = probe("cli", "--", command, pipeline or case.pipeline, "--output-prefix", out, *flags,
                env={"PREFECT_HOME": str(home)})
    assert rep["exit_code"] == 0, f"sidecar-ops {command}: exit {rep['exit_code']}\n{rep['stderr_tail']}"
    return rep["maxrss_mb"]


def measure(case, home: Path, chain: bool) -> dict[str, float]:
    """Peak RSS of each contender on `case` (one shard); verify (d) and (e) check (b)'s output."""
    peaks = {}
    script_out, merged = case.output("script"), case.output("fused")
    peaks[SCRIPT] = peak_script(case, "floor_keys", script_out)
    check_rows(case, script_out, SCRIPT)
    peaks[RUN] = peak_cli(home, "run", case, merged)
    check_rows(case, merged, RUN)
    peaks[VERIFY] = peak_cli(home, "verify", case, merged, "--samples", "1", "--all")
    peaks[VERIFY_SCRIPT] = peak_script(case, "verify_whole", merged)
    if chain:
        chained = case.output("chain")
        peaks[CHAIN] = peak_cli(home, "run", case, chained, "--task-per-operation")
        check_rows(case, chained, CHAIN)
        decoded = case.output("decode")
        peaks[DECODE] = peak_cli(home, "run", case, decoded, "--recompress", "zstd")
        check_rows(case, decoded, DECODE)
    return peaks


def label(name: str, layout: str, n: int) -> str:
    return f"{name} @ {layout}, {n:,} rows: peak RSS"


def growth_label(name: str, layout: str, low: int, high: int) -> str:
    return f"{name} @ {layout}: peak RSS growth, {low:,} -> {high:,} rows"


def groups_note(case) -> str:
    def groups(sidecar: str) -> str:
        md = pq.ParquetFile(case.path(sidecar, case.relpaths[0])).metadata
        return "/".join(f"{md.row_group(i).num_rows:,}" for i in range(md.num_row_groups))

    mib = case.bytes_on_disk() / 2**20
    return f"base row groups {groups('base')}, dqm {groups('dqm')}, {mib:.0f} MiB base"


def layout_rows(layout: str, peaks: dict, notes: dict, size: dict) -> list[Row]:
    rows = []
    for n in size["w9_rows"]:
        ref = label(SCRIPT, layout, n)
        rows.append(Row("W9", ref, peaks[n][SCRIPT], unit="MiB", note=f"1 shard x {n:,} rows; {notes[n]}"))
        for name in CONTENDERS[1:]:
            if name not in peaks[n]:
                continue
            goal_row = name in BOUNDED and layout in GOAL_LAYOUTS and n == size["w9_goal_rows"]
            goal = "<= 0.5" if goal_row else None
            rows.append(Row("W9", label(name, layout, n), peaks[n][name], unit="MiB", ref=ref, goal=goal))
    low, high = size["w9_growth"]
    for name in CONTENDERS:
        if name in peaks[high]:
            rows.append(Row("W9", growth_label(name, layout, low, high), peaks[high][name], unit="MiB",
                            ref=label(name, layout, low), goal=GROWTH.get(name),
                            note=f"{high / low:.1f}x the rows"))
    return rows


def run(data: Path, size: dict) -> list[Row]:
    home = cli_home(data)
    rows: list[Row] = []
    for layout in size.get("w9_layouts", LAYOUTS):
        peaks, notes = {}, {}
        for n in size["w9_rows"]:
            case = make_case(data / f"w9-{layout}-{n}", 1, n, layout=layout)
            notes[n] = groups_note(case)
            peaks[n] = measure(case, home, chain=layout in CHAIN_LAYOUTS)
        rows += layout_rows(layout, peaks, notes, size)
    return rows + s3_rows(data, size, home)


def s3_rows(data: Path, size: dict, home: Path) -> list[Row]:
    """(a') and (b'): the goal size's pyarrow-layout shard on S3 (moto, no latency: memory does not depend on it)."""
    import boto3

    n = size["w9_goal_rows"]
    case = make_case(data / f"w9-pyarrow-{n}", 1, n, layout="pyarrow")
    rel = case.relpaths[0]
    work = data / "w9-s3"
    with bench_s3() as (url, log):
        s3 = boto3.client("s3", endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        for sidecar in SIDECARS:
            s3.upload_file(case.path(sidecar, rel), BUCKET, f"in/{sidecar}/{rel}")
        write_yamls(work, source_root=f"s3://{BUCKET}/in")
        spec = {"bucket": BUCKET, "base": "in/base/", "output": "script/", "threads": 1, "relpaths": [rel],
                "sources": [[f"in/{s}/", key, col] for s, key, col in SOURCES]}
        (work / "spec.json").write_text(json.dumps(spec))
        proc = subprocess.run([sys.executable, str(S3_SCRIPT_PY), str(work / "spec.json"), str(work / "report.json")],
                              env=bench_env(), capture_output=True, text=True, timeout=3600)
        assert proc.returncode == 0, f"s3_script.py failed:\n{proc.stderr[-3000:]}"
        script = json.loads((work / "report.json").read_text())
        assert script["rows"] == n, f"{S3_SCRIPT}: {script['rows']} rows, expected {n}"
        log.clear()
        run = peak_cli(home, "run", case, f"s3://{BUCKET}/run/", pipeline=str(work / "pipelines" / "bench.yaml"))
        requests = ", ".join(f"{kind} {count}" for kind, count in sorted(log.counts().items()))
        body = s3.get_object(Bucket=BUCKET, Key=f"run/{rel}")["Body"].read()
        got = pq.ParquetFile(pa.BufferReader(body)).metadata.num_rows
        assert got == n, f"{S3_RUN}: {rel} has {got} rows, expected {n}"
    ref = f"{S3_SCRIPT} @ pyarrow, {n:,} rows: peak RSS"
    return [Row("W9", ref, script["maxrss_mb"], unit="MiB", note=f"1 shard x {n:,} rows on moto; {groups_note(case)}"),
            Row("W9", f"{S3_RUN} @ pyarrow, {n:,} rows: peak RSS", run, unit="MiB", ref=ref, goal="<= 0.5",
                note=f"the run's requests: {requests}")]

