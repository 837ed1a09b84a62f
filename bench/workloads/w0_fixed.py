"""W0 fixed cost: `sidecar-ops run` on a 1-shard dataset, to the first shard task and to exit.

Fresh PREFECT_HOME (an empty folder: the server migrates a new SQLite database) vs warm (the same
folder again), and `--dry-run` (which must not start a server). Each run is a new interpreter.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench.workloads.common import Row, median, probe
from bench.workloads.data import make_case


def run(data: Path, size: dict) -> list[Row]:
    case = make_case(data / "w0", 1, size["w0_rows"])
    repeats = size["repeats"]
    homes = Path(tempfile.mkdtemp(prefix="homes-", dir=data))
    warm_home = cli_home(data)
    samples: dict[str, list[float]] = {k: [] for k in ("fresh_first", "fresh_exit", "warm_first", "warm_exit",
                                                       "warm_server", "dry_exit")}
    dry_started_server = False
    try:
        fresh_runs = [] if is_warm(warm_home) else [_cli(case, warm_home)]  # a cold home is a fresh home
        while len(fresh_runs) < repeats:
            fresh_runs.append(_cli(case, homes / f"fresh-{len(fresh_runs)}"))
        for fresh in fresh_runs:
            assert fresh["exit_code"] == 0, fresh["stderr_tail"]
        for fresh in fresh_runs:
            warm = _cli(case, warm_home)
            dry = _cli(case, warm_home, "--dry-run")
            for rep in (fresh, warm, dry):
                assert rep["exit_code"] == 0, rep["stderr_tail"]
            samples["fresh_first"].append(fresh["first_task_at"] - fresh["t_start"])
            samples["fresh_exit"].append(fresh["t_end"] - fresh["t_start"])
            samples["warm_first"].append(warm["first_task_at"] - warm["t_start"])
            samples["warm_exit"].append(warm["t_end"] - warm["t_start"])
            samples["warm_server"].append(warm["server_ready_at"] - warm["server_entered_at"])
            samples["dry_exit"].append(dry["t_end"] - dry["t_start"])
            dry_started_server |= dry["server_entered_at"] is not None
    finally:
        shutil.rmtree(homes, ignore_errors=True)
    m = {k: median(v) for k, v in samples.items()}
    return [
        Row("W0", "fresh home: start -> first shard task", m["fresh_first"], samples=samples["fresh_first"]),
        Row("W0", "fresh home: start -> exit", m["fresh_exit"], samples=samples["fresh_exit"]),
        Row("W0", "warm home: start -> first shard task", m["warm_first"], samples=samples["warm_first"],
            goal="<= 5 s", met=m["warm_first"] <= 5.0, note="goal is for an idle machine"),
        Row("W0", "warm home: start -> exit", m["warm_exit"], samples=samples["warm_exit"]),
        Row("W0", "warm home: Prefect server start alone", m["warm_server"], samples=samples["warm_server"]),
        Row("W0", "--dry-run: start -> exit", m["dry_exit"], samples=samples["dry_exit"],
            met=not dry_started_server,
            note="started a Prefect server" if dry_started_server else "no Prefect server started"),
    ]


def cli_home(data: Path) -> Path:
    """The PREFECT_HOME that `sidecar-ops run` subprocesses share (warm after its first run)."""
    return data / "prefect-home-cli"


def is_warm(home: Path) -> bool:
    return (home / "prefect.db").exists()


def _cli(case, home: Path, *extra: str) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    out = case.output("w0")
    return probe("cli", "--", "run", case.pipeline, "--output-prefix", out, *extra,
                 env={"PREFECT_HOME": str(home)})
