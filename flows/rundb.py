"""The database of a run-scoped Prefect server: one SQLite file per run, removed when the run ends.

A run that starts its own Prefect server records its flow run, task runs, logs and artifacts there while it
lasts, then deletes them: nothing grows in PREFECT_HOME from run to run (Prefect's own `prefect.db` would gain
about 11 KB per task run, forever). The file starts as a copy of a template: an empty database already
migrated by this Prefect version, with its block types registered, so no run pays migrations (seconds). The
template comes from the dump this package ships for the Prefect of constraints.txt (`flows/templates/`, rebuilt by
`python -m flows.rundb`), or, for another Prefect version, from the first run's server, saved right after it
migrated a new database. Before each run the template is checked (a few ms: an SQLite file that passes
`PRAGMA quick_check`, with the tables, the migration revision and, with a shipped dump, the very schema (every
table, column, index and trigger) the installed Prefect expects); a damaged or foreign one is rebuilt, or dropped
for the server to migrate anew. Something else in the template's place (a directory) is refused with one line
(ConfigError). Files of runs that were killed are removed by the next run on the same host, when they can be; a
run that fails to start leaves none of its own.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import sys
import socket
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from flows import compat
from tasks.errors import ConfigError

FOLDER = "sidecar-ops"
SHIPPED = Path(__file__).resolve().parent / "templates"
SUFFIXES = ("", "-wal", "-shm", "-journal")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunDatabase:
    def __init__(self, home: Path):
        self.folder = home / FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)
        self.template = self.folder / f"template-prefect-{version('prefect')}.db"
        self.path = self.folder / f"run-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.db"
        self.path.touch()  # the first write: an unwritable folder fails here (OSError), before anything else
        try:
            self.sweep()
            self.from_template = self.ready_template()
            if self.from_template:
                shutil.copyfile(self.template, self.path)
        except BaseException:
            self.remove()
            raise

    @property
    def url(self) -> str:
        return f"sqlite+aiosqlite:///{self.path}"

    def save_template(self) -> None:
        """Once the server has migrated a new database (it answers /health): keep a copy for later runs.
        SQLite's backup API copies a consistent snapshot even while the server writes."""
        if self.from_template or self.template.exists():
            return
        with self.new_template() as temp:
            with closing(sqlite3.connect(self.path)) as source, closing(sqlite3.connect(temp)) as target:
                source.backup(target)
                target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file (the server: WAL again)

    @contextmanager
    def new_template(self) -> Iterator[Path]:
        """A temp file to build the template in, renamed into place at the end, removed if anything fails."""
        temp = self.folder / f".template-{uuid.uuid4().hex}.db"
        try:
            yield temp
            os.replace(temp, self.template)
        finally:
            for suffix in SUFFIXES:
                Path(f"{temp}{suffix}").unlink(missing_ok=True)

    def ready_template(self) -> bool:
        """Whether a sound template is there to copy: the one found, or one rebuilt from the shipped dump in
        place of a damaged or foreign one. Without a dump a bad template is dropped (the server migrates)."""
        dump = shipped_dump()
        script = gzip.decompress(dump.read_bytes()).decode() if dump.exists() else None
        if self.template.exists() and not self.template.is_file():
            raise ConfigError(f"PREFECT_HOME holds something else where sidecar-ops keeps its Prefect database "
                              f"template: {self.template} is not a file; remove it (the next run rebuilds the "
                              "template), or set PREFECT_API_URL to a running Prefect server")
        if self.template.exists():
            problem = template_problem(self.template, Expected.of(script))
            if problem is None:
                return True
            print(f"note: rebuilding {self.template}: {problem}", file=sys.stderr)
        if script is None:
            self.template.unlink(missing_ok=True)
            return False
        with self.new_template() as temp, closing(sqlite3.connect(temp)) as con:
            con.executescript(script)
        return True

    def remove(self) -> None:
        """Best effort: a file that cannot be removed now is the next run's sweep's."""
        for suffix in SUFFIXES:
            with suppress(OSError):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def sweep(self) -> None:
        """Remove the databases of this host's runs whose process is gone (killed before they cleaned up); one
        that cannot be removed (a read-only file system, another user's file) is left, and the run goes on."""
        host = socket.gethostname()
        for path in self.folder.glob(f"run-{host}-*.db*"):
            pid = path.name[len(f"run-{host}-"):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with suppress(OSError):
                    path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Expected:
    """What a template for the installed Prefect holds: its tables, migration revision and schema digest
    (schema_digest; None: unknown)."""
    tables: frozenset[str]
    revision: str | None
    schema: str | None = None

    @classmethod
    def of(cls, script: str | None) -> Expected:
        """From the shipped dump's SQL when there is one (loaded in memory: a few ms), else Prefect's own
        migration scripts (no schema then: the run's server migrates)."""
        if script is None:
            return cls(compat.PREFECT_CORE_TABLES, compat.migrations_head())
        tables = frozenset(re.findall(r'^CREATE TABLE "?(\w+)', script, re.MULTILINE))
        found = re.search(compat.REVISION_IN_DUMP, script, re.MULTILINE)
        with closing(sqlite3.connect(":memory:")) as con:
            con.executescript(script)
            schema = schema_digest(con)
        return cls(tables, found.group(1) if found else None, schema)


def schema_digest(con: sqlite3.Connection) -> str:
    """A digest of every table, index, view and trigger's SQL (its clauses in any order: batch migrations
    recreate a table with its constraints reordered): a changed column changes it."""
    objects = sorted((kind, name, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
                     for kind, name, sql in con.execute("select type, name, sql from sqlite_master"))
    return hashlib.sha256(json.dumps(objects).encode()).hexdigest()


def template_problem(path: Path, expected: Expected) -> str | None:
    """Why the template at `path` cannot serve this Prefect, or None. Read-only; a few ms for Prefect 3.9."""
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            check = con.execute("PRAGMA quick_check").fetchall()
            if check != [("ok",)]:
                return f"damaged database ({check[0][0]})"
            tables = {name for (name,) in con.execute("select name from sqlite_master where type = 'table'")}
            if expected.tables - tables:
                return f"tables missing: {', '.join(sorted(expected.tables - tables))}"
            revisions = [rev for (rev,) in con.execute(compat.REVISION_QUERY)]
            schema = schema_digest(con)
    except sqlite3.Error as exc:
        return str(exc)
    if expected.revision is not None and revisions != [expected.revision]:
        return (f"migration revision {', '.join(revisions) or 'none'}, Prefect {version('prefect')} expects "
                f"{expected.revision}")
    if expected.schema is not None and schema != expected.schema:
        return f"schema differs from Prefect {version('prefect')}'s (a table, column, index or trigger changed)"
    return None


def shipped_dump() -> Path:
    return SHIPPED / f"prefect-{version('prefect')}.sql.gz"


def migrated_database(path: Path) -> None:
    """A new SQLite database at `path`, migrated and with block types registered as a Prefect server's start
    would leave it (in this process: set nothing else of Prefect's up first)."""
    os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{path}"
    compat.migrate_database()


def dump(path: Path) -> bytes:
    with closing(sqlite3.connect(path)) as con:
        return gzip.compress("\n".join(con.iterdump()).encode(), mtime=0)


if __name__ == "__main__":  # rebuild the shipped template for the installed Prefect (after upgrading it)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        migrated_database(Path(tmp) / "prefect.db")
        SHIPPED.mkdir(exist_ok=True)
        shipped_dump().write_bytes(dump(Path(tmp) / "prefect.db"))
    print(f"wrote {shipped_dump()}")
