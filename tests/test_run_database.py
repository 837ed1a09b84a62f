"""A run that starts its own Prefect server leaves no growing history behind: one database per run, copied
from a migrated template and removed at the end; `--keep-run-history` keeps Prefect's own database instead;
a killed run's database is removed by the next run; a user's server (PREFECT_API_URL) is left alone."""
from __future__ import annotations

import gzip
import hashlib
import os
import socket
import sqlite3
import subprocess
import sys
from contextlib import closing
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


def schema_of(con: sqlite3.Connection) -> dict:
    """What a migration decides: every table, index and trigger (a statement's clauses in any order: batch
    migrations recreate tables with their constraints reordered), the revision, the registered block types."""
    statements = {name: sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())
                  for name, sql in con.execute("select name, sql from sqlite_master")}
    return {"statements": statements,
            "revision": con.execute("select version_num from alembic_version").fetchall(),
            "block types": con.execute("select slug from block_type order by slug").fetchall(),
            "block schemas": con.execute("select checksum from block_schema order by checksum").fetchall()}


def test_the_shipped_template_is_what_prefects_migrations_make(tmp_path):
    """flows/templates/ holds the migrated database of the pinned Prefect; after upgrading Prefect, rebuild it
    with `python -m flows.rundb` (until then a new home's first run migrates, and saves its own template)."""
    from flows.rundb import dump, shipped_dump

    assert shipped_dump().exists(), f"no {shipped_dump()}: run `python -m flows.rundb`"
    built = tmp_path / "migrated.db"
    code = f"from pathlib import Path; from flows.rundb import migrated_database; migrated_database(Path({str(built)!r}))"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=300)
    shipped = sqlite3.connect(":memory:")
    shipped.executescript(gzip.decompress(shipped_dump().read_bytes()).decode())
    with closing(sqlite3.connect(built)) as migrated:
        assert schema_of(shipped) == schema_of(migrated)
    assert gzip.decompress(dump(built)) != b""


def test_a_new_homes_first_run_starts_from_the_shipped_template(tmp_path):
    """No migrations on a first run: the home's template is the shipped one (the same random block ids), not a
    database the run's server migrated."""
    from flows.rundb import shipped_dump

    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    run(setup, home)
    shipped = sqlite3.connect(":memory:")
    shipped.executescript(gzip.decompress(shipped_dump().read_bytes()).decode())
    template = next(home.glob("sidecar-ops/template-prefect-*.db"))
    ids = "select id from block_type order by id"
    with closing(sqlite3.connect(template)) as con:
        assert con.execute(ids).fetchall() == shipped.execute(ids).fetchall() != []
