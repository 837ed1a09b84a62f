"""A real PostgreSQL server in a temporary data directory, and a Prefect server whose database it is.

PostgreSQL refuses to run as root, so under root (as in CI) `initdb` and `pg_ctl` run as the `postgres` user
in a directory it owns. The server listens on 127.0.0.1 on a free port (its unix socket stays inside the
directory), trusts loopback connections and has one database, `prefect`. Used by tests/test_postgres.py and
bench/postgres.py.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from test_deploy_e2e import BIN, free_port, healthy, start, stop

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"   # Debian's `postgresql` package
SERVER_START_TIMEOUT = 180
# The server's task run recorder tuning the project uses for its own servers (flows/server.py).
PREFECT_SERVER_ENV = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "DO_NOT_TRACK": "1",
}


def pg_bindir() -> Path | None:
    """The newest PostgreSQL server binaries installed (Debian layout first, then PATH)."""
    found = sorted(Path("/").glob(PG_BIN_GLOB.lstrip("/")), key=lambda p: int(p.parent.name)
                   if p.parent.name.isdigit() else 0)
    for bindir in reversed(found):
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


@dataclass
class Postgres:
    bindir: Path
    port: int
    data: Path
    log: Path

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the `prefect` database, as PREFECT_API_DATABASE_CONNECTION_URL wants it."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/prefect"

    def psql(self, sql: str, db: str = "prefect") -> str:
        out = subprocess.run([str(self.bindir / "psql"), "-X", "-At", "-h", "127.0.0.1", "-p", str(self.port),
                              "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-c", sql],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"psql {sql!r}: {out.stderr}"
        return out.stdout.strip()

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])


def _as_postgres() -> list[str]:
    """The command prefix that runs a PostgreSQL binary as a non-root user."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


@contextlib.contextmanager
def postgres(durable: bool = False):
    """Start a PostgreSQL server in a fresh temporary directory; stop it and remove the directory afterwards.

    `durable=False` (tests) turns fsync off; the benchmark keeps PostgreSQL's defaults."""
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries not found (apt-get install -y postgresql)")
    # Not pytest's tmp_path: /tmp/pytest-of-root is root-only (0700), so the postgres user could not enter it.
    top = Path(tempfile.mkdtemp(prefix="sidecar-ops-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(top, user.pw_uid, user.pw_gid)
    data, log, port = top / "data", top / "postgres.log", free_port()
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {top} -c max_connections=100"
    if not durable:
        opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    pg = Postgres(bindir, port, data, log)
    try:
        run = _as_postgres()
        out = subprocess.run([*run, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                              "-E", "UTF8", "--no-sync"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"initdb: {out.stdout}{out.stderr}"
        out = subprocess.run([*run, str(bindir / "pg_ctl"), "start", "-D", str(data), "-l", str(log), "-w",
                              "-t", "120", "-o", opts], capture_output=True, text=True, timeout=150)
        assert out.returncode == 0, f"pg_ctl start: {out.stdout}{out.stderr}\n{log.read_text()[-2000:]}"
        pg.psql("create database prefect", db="postgres")
        yield pg
    finally:
        if (data / "postmaster.pid").exists():
            _stop(pg)
        shutil.rmtree(top, ignore_errors=True)


def _stop(pg: Postgres) -> None:
    with contextlib.suppress(OSError, ValueError):
        pid = pg.postmaster_pid()
        subprocess.run([*_as_postgres(), str(pg.bindir / "pg_ctl"), "stop", "-D", str(pg.data), "-m", "fast",
                        "-w", "-t", "30"], capture_output=True, timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 0)
            os.kill(pid, signal.SIGKILL)  # still there after a fast shutdown: its children follow it


@contextlib.contextmanager
def prefect_server(home: Path, log: Path, database_url: str | None = None, **extra_env: str):
    """`prefect server start` on loopback with PREFECT_HOME=`home`, on `database_url` (None: SQLite in the home).

    Yields (API URL, the server's Popen); the server runs in its own session and is stopped by process group."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **PREFECT_SERVER_ENV, "PREFECT_HOME": str(home), **extra_env}
    env.pop("PREFECT_API_URL", None)
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    else:
        env.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
    home.mkdir(parents=True, exist_ok=True)
    proc = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"],
                 env, log)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not healthy(api):
            assert proc.poll() is None, f"prefect server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"prefect server did not answer /api/health:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield api, proc
    finally:
        stop(proc)


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, its reaped children and its live descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            text = (entry / "stat").read_text()
            fields = text[text.rindex(")") + 2:].split()
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:  # fields[11:15] = utime, stime, cutime, cstime
            total += sum(int(v) for v in stats[p][11:15]) / tick
        todo.extend(children.get(p, []))
    return total
