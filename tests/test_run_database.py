"""A run that starts its own Prefect server leaves no growing history behind: one database per run, copied
from a migrated template and removed at the end; `--keep-run-history` keeps Prefect's own database instead;
a killed run's database is removed by the next run; a user's server (PREFECT_API_URL) is left alone."""
from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

from core_fixtures import build

REPO = Path(__file__).resolve().parents[1]


def run(setup, home: Path, *extra: str, api: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    if api:
        env["PREFECT_API_URL"] = api
    out = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(setup.pipeline), "--output-prefix",
                          setup.output, "--overwrite", *extra], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def files(home: Path) -> set[str]:
    return {str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_runs_leave_only_the_template_and_the_log(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=2, rows=20)
    home = tmp_path / "home"
    run(setup, home)
    template = next(home.glob("sidecar-ops/template-prefect-*.db"))
    after_first = files(home)
    # Prefect may keep a small memo of its block registrations; nothing else but the template and the log
    assert after_first - {"memo_store.toml"} == {"sidecar-ops-server.log", str(template.relative_to(home))}
    before = digest(template)
    with sqlite3.connect(f"file:{template}?mode=ro", uri=True) as con:  # the template holds no run
        assert con.execute("select count(*) from flow_run").fetchone()[0] == 0
        assert con.execute("select count(*) from task_run").fetchone()[0] == 0
    for _ in range(2):
        run(setup, home)
    assert files(home) == after_first
    assert digest(template) == before  # runs copy it, never write it


def test_debug_says_where_the_server_log_and_database_are(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    err = run(setup, home, "--debug").stderr
    line = next(x for x in err.splitlines() if x.startswith("Prefect server for this run:"))
    assert f"log {home / 'sidecar-ops-server.log'}" in line and f"database {home / 'sidecar-ops'}/run-" in line


def test_keep_run_history_keeps_the_run_in_prefects_database(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=2, rows=20)
    home = tmp_path / "home"
    run(setup, home, "--keep-run-history")
    with sqlite3.connect(home / "prefect.db") as con:
        assert con.execute("select count(*) from flow_run").fetchone()[0] == 1
        assert con.execute("select count(*) from task_run").fetchone()[0] == 2 * 4  # 3 operations + verify
    assert not list(home.glob("sidecar-ops/run-*"))


def test_a_killed_runs_database_is_removed_by_the_next_run(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    run(setup, home)
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    leftovers = [home / "sidecar-ops" / f"run-{host}-{dead.pid}-0badc0de.db{suffix}" for suffix in ("", "-wal")]
    alive = home / "sidecar-ops" / f"run-{host}-{os.getpid()}-0000cafe.db"  # a run still going: kept
    for path in [*leftovers, alive]:
        path.write_bytes(b"x")
    run(setup, home)
    assert not any(p.exists() for p in leftovers)
    assert alive.exists()


def test_a_users_server_is_left_alone(tmp_path, prefect_api):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    run(setup, home, api=prefect_api)
    assert not (home / "sidecar-ops").exists() and not (home / "prefect.db").exists()
