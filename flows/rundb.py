"""The database of a run-scoped Prefect server: one SQLite file per run, removed when the run ends.

A run that starts its own Prefect server records its flow run, task runs, logs and artifacts there while it
lasts, then deletes them: nothing grows in PREFECT_HOME from run to run (Prefect's own `prefect.db` would gain
about 11 KB per task run, forever). The file starts as a copy of a template that the first run on this
PREFECT_HOME and Prefect version saves right after its server migrated a new database, so later runs pay no
migrations. Files of runs that were killed are removed by the next run on the same host.
"""
from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import uuid
from contextlib import closing
from importlib.metadata import version
from pathlib import Path

FOLDER = "sidecar-ops"
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
