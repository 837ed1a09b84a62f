"""A run that starts its own Prefect server leaves no growing history behind: one database per run, copied
from a migrated template and removed at the end; `--keep-run-history` keeps Prefect's own database instead;
a killed run's database is removed by the next run (when it can be); a user's server (PREFECT_API_URL) is left
alone; a damaged or foreign template is rebuilt before the server starts; an unwritable PREFECT_HOME is one line
with the fix, exit 2."""
from __future__ import annotations

import gzip
import hashlib
import os
import socket
import sqlite3
import subprocess
import sys
from contextlib import closing
from importlib.metadata import version
from pathlib import Path

import pytest

from core_fixtures import build, merge_dag

from flows import compat
from tasks.demo import relpaths

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_debug_says_where_the_server_log_and_database_are(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    err = run(setup, home, "--debug").stderr
    line = next(x for x in err.splitlines() if x.startswith("Prefect server for this run:"))
    assert f"log {home / 'sidecar-ops-server.log'}" in line and f"database {home / 'sidecar-ops'}/run-" in line


@pytest.mark.slow
def test_keep_run_history_keeps_the_run_in_prefects_database(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=2, rows=20)
    home = tmp_path / "home"
    run(setup, home, "--keep-run-history")
    with sqlite3.connect(home / "prefect.db") as con:
        assert con.execute("select count(*) from flow_run").fetchone()[0] == 1
        names = sorted(name for (name,) in con.execute("select name from task_run"))
    assert names == sorted(merge_dag(setup.output, relpaths(2)))  # listings, a task a shard, the run's check
    assert not list(home.glob("sidecar-ops/run-*"))


@pytest.mark.slow
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


@pytest.mark.slow
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
            "revision": con.execute(compat.REVISION_QUERY).fetchall(),
            "block types": con.execute("select slug from block_type order by slug").fetchall(),
            "block schemas": con.execute("select checksum from block_schema order by checksum").fetchall()}


@pytest.mark.slow
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


@pytest.mark.slow
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


# --- local state that heals or says why (issue 18, seen cases 4 and 5) ---

def attempt(setup, home: Path, *extra: str, wrap: tuple[str, ...] = (), api: str | None = None):
    """`sidecar-ops run` as `run` does it, without asserting success; `wrap` prefixes the command."""
    env = {**os.environ, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    if api:
        env["PREFECT_API_URL"] = api
    argv = [sys.executable, "-m", "flows.cli", "run", str(setup.pipeline), "--output-prefix", setup.output,
            "--overwrite", *extra]
    return subprocess.run([*wrap, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def shipped_database() -> sqlite3.Connection:
    from flows.rundb import shipped_dump

    con = sqlite3.connect(":memory:")
    con.executescript(gzip.decompress(shipped_dump().read_bytes()).decode())
    return con


def assert_valid_template(template: Path) -> None:
    """The template is a sound database of the installed Prefect's schema: what the shipped dump holds."""
    with closing(sqlite3.connect(f"file:{template}?mode=ro", uri=True)) as con:
        assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert schema_of(con) == schema_of(shipped_database())


def a_template(home: Path) -> Path:
    """A home whose template was unpacked by a previous run (no server needed)."""
    from flows.rundb import RunDatabase

    RunDatabase(home).remove()
    (template,) = home.glob("sidecar-ops/template-prefect-*.db")
    assert_valid_template(template)
    return template


def junk(template: Path) -> None:
    template.write_bytes(os.urandom(4096))


def truncated(template: Path) -> None:
    data = template.read_bytes()
    template.write_bytes(data[: len(data) // 3])


def wrong_revision(template: Path) -> None:
    with closing(sqlite3.connect(template)) as con, con:
        con.execute("update alembic_version set version_num = '0123456789ab'")


def missing_table(template: Path) -> None:
    with closing(sqlite3.connect(template)) as con, con:
        con.execute("drop table task_run")


def changed_column(template: Path) -> None:
    """The right tables and revision, one column renamed: every run's server would fail its first request."""
    with closing(sqlite3.connect(template)) as con, con:
        con.execute("alter table flow_run rename column name to name_was")


@pytest.mark.parametrize("damage", [junk, truncated, wrong_revision, missing_table, changed_column])
def test_a_damaged_or_foreign_template_is_rebuilt_before_the_server_starts(tmp_path, damage):
    from flows.rundb import RunDatabase

    template = a_template(tmp_path)
    damage(template)
    db = RunDatabase(tmp_path)
    try:
        assert db.from_template
        assert_valid_template(template)
        assert_valid_template(db.path)  # the run's copy too
    finally:
        db.remove()


def test_without_a_shipped_dump_a_damaged_template_is_dropped_and_the_server_migrates(tmp_path, monkeypatch):
    """Another Prefect than the shipped dump's: the bad template goes, the run's server migrates a new database
    (and the run saves it as the template, as on a first run)."""
    from flows import rundb

    template = a_template(tmp_path)
    wrong_revision(template)
    monkeypatch.setattr(rundb, "shipped_dump", lambda: tmp_path / "no-such-dump.sql.gz")
    db = rundb.RunDatabase(tmp_path)
    try:
        assert not db.from_template and not template.exists()
    finally:
        db.remove()


def test_the_schema_check_sees_a_changed_column(tmp_path):
    from flows.rundb import Expected, shipped_dump, template_problem

    template = a_template(tmp_path)
    expected = Expected.of(gzip.decompress(shipped_dump().read_bytes()).decode())
    assert template_problem(template, expected) is None
    changed_column(template)
    assert template_problem(template, expected) == (f"schema differs from Prefect {version('prefect')}'s "
                                                    "(a table, column, index or trigger changed)")


def test_a_directory_in_place_of_the_template_is_one_line_and_leaves_nothing(tmp_path):
    from flows.rundb import RunDatabase
    from tasks.errors import ConfigError

    template = a_template(tmp_path)
    template.unlink()
    template.mkdir()
    (template / "kept.txt").write_text("a user's file")
    before = files(tmp_path)
    for _ in range(2):
        with pytest.raises(ConfigError) as refused:
            RunDatabase(tmp_path)
        assert str(refused.value) == (
            f"PREFECT_HOME holds something else where sidecar-ops keeps its Prefect database template: {template} "
            "is not a file; remove it (the next run rebuilds the template), or set PREFECT_API_URL to a running "
            "Prefect server")
    assert files(tmp_path) == before, "no run database, no temp template left behind"


@pytest.mark.slow
def test_a_directory_in_place_of_the_template_fails_a_run_with_that_line_exit_2(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    template = a_template(home)
    template.unlink()
    template.mkdir()
    before = files(home)
    out = attempt(setup, home)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: PREFECT_HOME holds something else where sidecar-ops keeps its Prefect database template: "
        f"{template} is not a file; remove it (the next run rebuilds the template), or set PREFECT_API_URL to a "
        "running Prefect server"), out.stderr
    assert files(home) - {"sidecar-ops-server.log"} == before
    assert not Path(setup.output).exists()


def test_a_sound_template_is_used_as_it_is(tmp_path):
    from flows.rundb import RunDatabase

    template = a_template(tmp_path)
    before = (digest(template), template.stat().st_mtime_ns)
    RunDatabase(tmp_path).remove()
    assert (digest(template), template.stat().st_mtime_ns) == before


@pytest.mark.slow
def test_a_run_after_its_template_was_overwritten_with_junk_succeeds_and_heals_it(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    run(setup, home)
    template = next(home.glob("sidecar-ops/template-prefect-*.db"))
    junk(template)
    run(setup, home)
    assert_valid_template(template)


def read_only(home: Path) -> tuple[str, ...]:
    """A command prefix under which `home` really cannot be written, as root too (where chmod stops nothing):
    root gets a read-only bind mount of it in a mount namespace of its own; a user, chmod."""
    if os.geteuid() != 0:
        for path in [home, *home.rglob("*")]:
            if path.is_dir():
                path.chmod(0o555)
        return ()
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, str(home), "sh", "-c", f"! touch {home}/x"],
                           capture_output=True)
    if probe.returncode:
        pytest.skip(f"no read-only bind mount here: {probe.stderr.decode().strip()}")
    return ("unshare", "-m", "sh", "-c", script, str(home))


def assert_says_prefect_home_is_unwritable(out: subprocess.CompletedProcess, home: Path, setup) -> None:
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert str(home) in last and "PREFECT_HOME" in last and "PREFECT_API_URL" in last, out.stderr
    assert "unexpected" not in out.stderr and "Traceback" not in out.stderr
    assert not Path(setup.output).exists()  # nothing written


@pytest.mark.slow
def test_a_read_only_prefect_home_is_one_line_with_the_fix_exit_2(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    home.mkdir()
    assert_says_prefect_home_is_unwritable(attempt(setup, home, wrap=read_only(home)), home, setup)


@pytest.mark.slow
def test_a_read_only_prefect_home_with_a_killed_runs_database_is_the_same_one_line(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    a_template(home)
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = home / "sidecar-ops" / f"run-{socket.gethostname()}-{dead.pid}-0badc0de.db"
    leftover.write_bytes(b"x")
    assert_says_prefect_home_is_unwritable(attempt(setup, home, wrap=read_only(home)), home, setup)


@pytest.mark.slow
def test_a_prefect_home_under_a_file_is_one_line_with_the_fix_exit_2(tmp_path):
    """Unwritable for root as for anyone: a path under a regular file (ENOTDIR)."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "home"
    assert_says_prefect_home_is_unwritable(attempt(setup, home), home, setup)


@pytest.mark.slow
def test_a_read_only_prefect_home_is_fine_with_a_running_server(tmp_path, prefect_api):
    """The second fix the message offers works."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=20, watermark_gap=False)
    home = tmp_path / "home"
    home.mkdir()
    out = attempt(setup, home, wrap=read_only(home), api=prefect_api)
    assert out.returncode == 0, out.stderr


def test_leftovers_that_cannot_be_removed_do_not_fail_the_sweep_or_the_cleanup(tmp_path, monkeypatch):
    """A killed run's database the sweep cannot remove (here: unlink fails as on a read-only file system) is
    left for a later run; the run itself goes on, and so does its own cleanup."""
    import errno

    from flows.rundb import RunDatabase

    a_template(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = tmp_path / "sidecar-ops" / f"run-{socket.gethostname()}-{dead.pid}-0badc0de.db"
    leftover.write_bytes(b"x")
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name.startswith("run-"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    db = RunDatabase(tmp_path)
    db.remove()
    assert leftover.exists()


def test_an_unwritable_prefect_home_is_a_config_error_unless_a_profile_names_a_server(tmp_path, monkeypatch):
    from flows import server
    from tasks.errors import ConfigError

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "a-file" / "home"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(server, "configured_api", lambda: None)
    with pytest.raises(ConfigError, match="PREFECT_HOME .*a-file/home is not writable"):
        with server.prefect_api():
            pass
    monkeypatch.setattr(server, "configured_api", lambda: "http://example.invalid/api")
    with server.prefect_api() as url:
        assert url == "http://example.invalid/api"
