"""The database of a run-scoped Prefect server: one SQLite file per run, removed when the run ends.

A run that starts its own Prefect server records its flow run, task runs, logs and artifacts there while it
lasts, then deletes them: nothing grows in PREFECT_HOME from run to run (Prefect's own `prefect.db` would gain
about 11 KB per task run, forever). The file starts as a copy of a template: an empty database already
migrated by this Prefect version, with its block types registered, so no run pays migrations (seconds). The
template comes from the dump this package ships for its pinned Prefect (`flows/templates/`, rebuilt by
`python -m flows.rundb`), or, for another Prefect version, from the first run's server, saved right after it
migrated a new database. Files of runs that were killed are removed by the next run on the same host.
"""
from __future__ import annotations

import asyncio
import gzip
import os
import shutil
import socket
import sqlite3
import uuid
from contextlib import closing
from importlib.metadata import version
from pathlib import Path

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
        self.sweep()
        if not self.template.exists():
            self.unpack_shipped()
        self.from_template = self.template.exists()
        if self.from_template:
            shutil.copyfile(self.template, self.path)

    @property
    def url(self) -> str:
        return f"sqlite+aiosqlite:///{self.path}"

    def save_template(self) -> None:
        """Once the server has migrated a new database (it answers /health): keep a copy for later runs.
        SQLite's backup API copies a consistent snapshot even while the server writes."""
        if self.from_template or self.template.exists():
            return
        temp = self.folder / f".template-{uuid.uuid4().hex}.db"
        with closing(sqlite3.connect(self.path)) as source, closing(sqlite3.connect(temp)) as target:
            source.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file (the server turns WAL on again)
        os.replace(temp, self.template)

    def unpack_shipped(self) -> None:
        """The template from the dump shipped for this Prefect version, if there is one."""
        dump = shipped_dump()
        if not dump.exists():
            return
        temp = self.folder / f".template-{uuid.uuid4().hex}.db"
        with closing(sqlite3.connect(temp)) as con:
            con.executescript(gzip.decompress(dump.read_bytes()).decode())
        os.replace(temp, self.template)

    def remove(self) -> None:
        for suffix in SUFFIXES:
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def sweep(self) -> None:
        """Remove the databases of this host's runs whose process is gone (killed before they cleaned up)."""
        host = socket.gethostname()
        for path in self.folder.glob(f"run-{host}-*.db*"):
            pid = path.name[len(f"run-{host}-"):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                path.unlink(missing_ok=True)


def shipped_dump() -> Path:
    return SHIPPED / f"prefect-{version('prefect')}.sql.gz"


def migrated_database(path: Path) -> None:
    """A new SQLite database at `path`, migrated and with block types registered as a Prefect server's start
    would leave it (in this process: set nothing else of Prefect's up first)."""
    os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{path}"
    from prefect.server.database import provide_database_interface
    from prefect.server.models.block_registration import run_block_auto_registration

    async def build() -> None:
        db = provide_database_interface()
        await db.create_db()
        async with await db.session() as session:
            await run_block_auto_registration(session=session)
            await session.commit()
        await (await db.engine()).dispose()

    asyncio.run(build())


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
