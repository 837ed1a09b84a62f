"""W0 fixed cost: `sidecar-ops run` on a 1-shard dataset, to the first shard task and to exit.

Fresh PREFECT_HOME (an empty folder: the server migrates a new SQLite database) vs warm (the same
folder again), `--dry-run` (which must not start a server), and a kept server: PREFECT_API_URL naming a
`prefect server start` on loopback that outlives the runs (issue 35: start -> exit <= Prefect's import time + 0.7 s,
`python -c 'import prefect'` timed in the same rounds, alternating). Each run is a new interpreter.
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.workloads.common import Row, bench_env, median, probe
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
    return kept_server_rows(case, data, repeats) + [
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


def _cli(case, home: Path, *extra: str, api_url: str | None = None) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    out = case.output("w0")
    env = {"PREFECT_HOME": str(home), **({"PREFECT_API_URL": api_url} if api_url else {})}
    return probe("cli", "--", "run", case.pipeline, "--output-prefix", out, *extra, env=env)


KEPT_GOAL = 0.7  # seconds above Prefect's import time (issue 35)


def kept_server_rows(case, data: Path, repeats: int) -> list[Row]:
    """One-shard runs against a kept server, alternating with `python -c 'import prefect'` (its floor)."""
    runs, imports, above = [], [], []
    with kept_server(data) as url:
        _cli(case, data / "prefect-home-kept", api_url=url)  # untimed: the server's first flow run, warm caches
        for _ in range(max(repeats, 5)):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import prefect"], env=bench_env(), check=True)
            imports.append(time.perf_counter() - t)
            rep = _cli(case, data / "prefect-home-kept", api_url=url)
            assert rep["exit_code"] == 0, rep["stderr_tail"]
            runs.append(rep["t_end"] - rep["t_start"])
            above.append(runs[-1] - imports[-1])
    ref = "kept server: python -c 'import prefect'"
    run, floor, extra = median(runs), median(imports), median(above)
    return [
        Row("W0", ref, floor, samples=imports, note="the floor, timed in the same rounds"),
        Row("W0", "kept server: one-shard run, start -> exit", run, samples=runs, ref=ref,
            note="PREFECT_API_URL = a `prefect server start` on loopback, kept running"),
        Row("W0", "kept server: run minus import prefect, per round", extra, samples=above,
            goal=f"<= {KEPT_GOAL} s", met=extra <= KEPT_GOAL, note="median of the rounds' differences"),
    ]


@contextlib.contextmanager
def kept_server(data: Path):
    """`prefect server start` on a free loopback port with a PREFECT_HOME of its own, as a user keeps one."""
    from flows.server import free_port, healthy

    home = data / "prefect-home-kept-server"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = open(home / "server.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port)], env=bench_env({"PREFECT_HOME": str(home)}), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the kept Prefect server did not start; see {home / 'server.log'}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
