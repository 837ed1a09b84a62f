"""W6 scaling in shard count: many tiny shards (10 rows, the bench pipeline: 2 operations + the check) at
several counts, every mode end to end in a fresh interpreter, against ONE Prefect server for the workload.

(a) `sidecar-ops run`, thread runner, one task per operation (the default)
(b) `sidecar-ops run --fuse-operations`, thread runner (one task per shard)
(c) `sidecar-ops run --use-ray --fuse-operations` (a local Ray started by the run)
(d) plain-Ray floor: ray.remote merge_shard per shard, a window of 32 refs, no Prefect (contenders.ray_kernel)
(e) sequential floor: merge_shard in a loop in one process (contenders.kernel)

Per run: wall (start -> exit), ms/shard, driver peak RSS; for (a)-(c) also the server's CPU seconds (its
process tree, /proc) and its SQLite database growth (prefect.db + wal), read once every task run of the flow
run is recorded. `w6_max` caps a mode's counts (e.g. the chain at 100,000 shards would take hours). Every
run's output shard count is asserted. One run per (mode, count): the curve, not a median.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from bench.workloads.common import Row, probe
from bench.workloads.data import Case, count_outputs, make_case
from bench.workloads.w0_fixed import cli_home
from bench.workloads.w2_orch import TASKS_PER_SHARD

ROWS = 10
# mode: (label, `sidecar-ops run` flags or the name of a contender, Prefect task runs per shard)
MODES = {
    "chain": ("(a) thread runner, per-operation chain", ["--task-per-operation"], TASKS_PER_SHARD),
    "fused": ("(b) thread runner, --fuse-operations", ["--fuse-operations"], 1),
    "ray": ("(c) --use-ray --fuse-operations", ["--use-ray", "--fuse-operations"], 1),
    "plain_ray": ("(d) plain-Ray floor (ray.remote merge_shard)", "ray_kernel", 0),
    "sequential": ("(e) sequential kernel loop, one process", "kernel", 0),
}
WALL_REFS = {"fused": ("chain", None), "ray": ("plain_ray", "<= 3")}  # mode: (divided by, goal), same count


@dataclass
class Server:
    api: str
    pid: int
    home: Path

    def cpu(self) -> float:
        from bench.postgres import tree_cpu

        return tree_cpu(self.pid)

    def db_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.home.glob("prefect.db*") if not p.name.endswith("-shm"))

    def wait_recorded(self, task_runs: int) -> float:
        """Until every task run of the latest flow run is recorded final; returns the seconds waited."""
        from bench import postgres

        # its 600 s limit, or longer for a long run: the tuned recorder keeps up with far more than 20 task runs/s
        postgres.RECORD_TIMEOUT = max(600, task_runs // 20)
        t0 = time.perf_counter()
        try:
            postgres.wait_recorded(self.api, postgres.latest_flow_run(self.api), task_runs)
        except SystemExit as exc:  # bench/postgres.py is a script; here a timeout fails W6 only
            raise RuntimeError(str(exc)) from None
        return time.perf_counter() - t0


@contextlib.contextmanager
def server(data: Path):
    """`prefect server start` on SQLite in a fresh home, with the tuning of the run-scoped server."""
    from bench.postgres import prefect_server  # tests/postgres_fixtures.py's, as bench/postgres.py uses it
    from flows.server import SERVER_TUNING

    home = data / "w6-server-home"
    shutil.rmtree(home, ignore_errors=True)
    with prefect_server(home, data / "w6-server.log", **SERVER_TUNING) as (api, proc):
        yield Server(api, proc.pid, home)


def mode_counts(size: dict, mode: str) -> list[int]:
    cap = size.get("w6_max", {}).get(mode)
    return sorted({min(n, cap) if cap else n for n in size["w6_counts"]})


def one_run(srv: Server, case: Case, mode: str, home: Path) -> dict:
    label, how, tasks = MODES[mode]
    n, out, got = len(case.relpaths), case.output(mode), {}
    if isinstance(how, str):
        rep = probe("contender", how, str(case.root), out)
    else:
        cpu0, db0 = srv.cpu(), srv.db_bytes()
        rep = probe("cli", "--", "run", case.pipeline, "--output-prefix", out, *how,
                    env={"PREFECT_HOME": str(home), "PREFECT_API_URL": srv.api})
        assert rep["exit_code"] == 0, f"{label} @ {n:,}: exit {rep['exit_code']}\n{rep['stderr_tail']}"
        lag = srv.wait_recorded(n * tasks)
        got = {"cpu": srv.cpu() - cpu0, "db": srv.db_bytes() - db0, "lag": lag}
    written = count_outputs(out)
    assert written == n, f"{label} @ {n:,}: {written} output shards, expected {n}"
    shutil.rmtree(out, ignore_errors=True)  # 100,000 shards of output per mode add up
    return {"wall": rep["t_end"] - rep["t_start"], "rss": rep["maxrss_mb"], **got}


def run(data: Path, size: dict) -> list[Row]:
    modes = size.get("w6_modes") or list(MODES)
    counts = {mode: mode_counts(size, mode) for mode in MODES if mode in modes}
    every = sorted({n for ns in counts.values() for n in ns})
    cases = {n: make_case(data / f"w6-{n}", n, ROWS, linked=True) for n in every}
    results: dict[tuple[str, int], dict] = {}
    with server(data) as srv:
        for n in every:  # modes interleaved at each count
            for mode in counts:
                if n in counts[mode]:
                    results[mode, n] = one_run(srv, cases[n], mode, cli_home(data))
                    log_progress(data, mode, n, results[mode, n])
    return [row for mode in counts for row in mode_rows(mode, counts, results, max(every))]


def log_progress(data: Path, mode: str, n: int, result: dict) -> None:
    """One JSON line per finished run (w6-progress.jsonl): a W6 of hours keeps what it measured if stopped."""
    line = {"mode": mode, "shards": n, "loadavg": os.getloadavg(), "time": time.time(), **result}
    with open(data / "w6-progress.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def mode_rows(mode: str, counts: dict, results: dict, largest: int) -> list[Row]:
    label, _, tasks = MODES[mode]
    ns, rows = counts[mode], []
    lo, hi = ns[0], ns[-1]
    tenth = max((n for n in ns if n <= hi // 10), default=lo)  # RSS reference: 1/10 of the largest, if run
    capped = f"capped at {hi:,} by w6_max (largest count {largest:,})" if hi < largest else ""
    versus, goal = WALL_REFS.get(mode, (None, None))
    for n in ns:
        r, name, last = results[mode, n], f"{label} @ {n:,}", n == hi and len(ns) > 1
        ref = f"{MODES[versus][0]} @ {n:,}: wall" if versus and n in counts.get(versus, ()) else None
        rows.append(Row("W6", f"{name}: wall", r["wall"], samples=[r["wall"]], ref=ref, goal=goal if ref else None,
                        note=f"{n:,} output shards checked; {ROWS} rows each"))
        rows.append(Row("W6", f"{name}: ms/shard", r["wall"] / n * 1000, unit="ms",
                        ref=f"{label} @ {lo:,}: ms/shard" if last else None, goal="<= 1.5" if last else None,
                        note="; ".join(filter(None, [last and f"vs {lo:,} shards", n == hi and capped]))))
        rss_ref = last and tasks and tenth != hi
        rows.append(Row("W6", f"{name}: driver peak RSS", r["rss"], unit="MiB",
                        ref=f"{label} @ {tenth:,}: driver peak RSS" if rss_ref else None,
                        goal="<= 1.5" if rss_ref else None, note=f"vs {tenth:,} shards" if rss_ref else ""))
        if tasks:
            rows.append(Row("W6", f"{name}: Prefect server CPU", r["cpu"],
                            note=f"{r['cpu'] / n * 1000:.2f} ms/shard, {n * tasks:,} task runs recorded "
                                 f"(the last {r['lag']:.1f} s after exit)"))
            rows.append(Row("W6", f"{name}: DB growth", r["db"] / 2**20, unit="MiB",
                            note=f"{r['db'] / n / 1024:.1f} KiB/shard; prefect.db + wal file sizes (0: reused pages)"))
    return rows
