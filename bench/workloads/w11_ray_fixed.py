"""W11 Ray's fixed cost, end to end: `sidecar-ops run` on 150 tiny shards with `--use-ray` (a local Ray started
and stopped by the run) against the thread runner, each a fresh process, start -> exit, alternating rounds
(issue 35: <= 2.0x). Both use a warm PREFECT_HOME and their own run-scoped Prefect server, as a user gets.
The Ray run's extra seconds are split by the run's own timeline (flows/cluster.py logs at --debug): the
difference of the medians is reported with Ray's start and stop timed alone (`ray.init` + `ray.shutdown` in a
fresh process, the floor no runner can go under).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.workloads.common import Row, bench_env, median, probe
from bench.workloads.data import check_rows, make_case
from bench.workloads.w0_fixed import cli_home

RAY_ALONE = ("import logging, ray; ray.init(address='local', log_to_driver=False, logging_level=logging.WARNING); "
             "ray.shutdown()")


def cli(case, out: str, home: Path, *flags: str) -> float:
    rep = probe("cli", "--", "run", case.pipeline, "--output-prefix", out, *flags, env={"PREFECT_HOME": str(home)})
    assert rep["exit_code"] == 0, f"sidecar-ops run {' '.join(flags)}: exit {rep['exit_code']}\n{rep['stderr_tail']}"
    return rep["t_end"] - rep["t_start"]


def run(data: Path, size: dict) -> list[Row]:
    shards = size.get("w11_shards", 150)
    case = make_case(data / "w11", shards, 10, linked=True)
    home = cli_home(data)
    home.mkdir(parents=True, exist_ok=True)
    samples: dict[str, list[float]] = {"threads": [], "ray": [], "ray_alone": []}
    cli(case, case.output("warm"), home)  # untimed: warms the home and the page cache
    for _ in range(size.get("w11_rounds", max(size["repeats"], 3))):
        for name, flags in (("threads", ()), ("ray", ("--use-ray",))):
            out = case.output(name)
            samples[name].append(cli(case, out, home, *flags))
            check_rows(case, out, name)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", RAY_ALONE], env=bench_env({"RAY_ADDRESS": "local"}), check=True,
                       capture_output=True)
        samples["ray_alone"].append(time.perf_counter() - t)
    m = {k: median(v) for k, v in samples.items()}
    ref = "thread runner, start -> exit"
    note = f"{shards} shards x 10 rows; medians of {len(samples['threads'])} alternating rounds"
    return [
        Row("W11", ref, m["threads"], samples=samples["threads"], note=note),
        Row("W11", "--use-ray (local Ray started by the run), start -> exit", m["ray"], samples=samples["ray"],
            ref=ref, goal="<= 2.0", note="issue 35"),
        Row("W11", "--use-ray minus the thread runner", m["ray"] - m["threads"]),
        Row("W11", "ray.init + ray.shutdown alone, a fresh process", m["ray_alone"], samples=samples["ray_alone"],
            note="the part of the difference no runner avoids"),
    ]
