"""Local files: absolute paths, memory-mapped reads, temp file + fsync + rename for atomic writes.

Identity is size + st_mtime_ns; of a file being read, taken from its open descriptor (never from a file that
replaced it since). Temp files are named TEMP_MARK + host + pid + random, never *.parquet, so `sweep_stale` can
tell a dead writer's leftovers from a live one's.
"""
from __future__ import annotations

import os
import posixpath
import socket
import threading
import time
import uuid
from contextlib import suppress

import fsspec
import pyarrow as pa

from tasks.storage.backend import TEMP_MARK, Backend, Written
from tasks.storage.inflight import WriteAbandoned, tracked


def local_identity(st: os.stat_result) -> str:
    """Identity of a local file: size plus st_mtime_ns (nanoseconds; an in-place rewrite changes it)."""
    return f"size={st.st_size};mtime_ns={st.st_mtime_ns}"


def walk(root: str):
    """(relpath, stat) of every file under a local folder. os.scandir's entries carry the stat that fsspec's
    listing makes anyway (one per file); fsspec keeps only a float mtime, so the walk is done here to keep
    st_mtime_ns without a second stat per file."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(root + rel_dir) as entries:
            for entry in entries:
                rel = rel_dir + entry.name
                if entry.is_dir():
                    stack.append(rel + "/")
                else:
                    yield rel, entry.stat()


def writer_dead(temp_name: str) -> bool:
    """True when the temp file names a writer process on this host that no longer runs."""
    parts = temp_name[len(TEMP_MARK):].rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class TempFile:
    """A write's temp file, beside its final name `final`. Created, and renamed to `final`, only while the write
    is not abandoned; `abandon` (another thread: tasks/storage/inflight.py) removes it, so no temp file
    outlives an abandoned write, and the write then fails."""

    def __init__(self, final: str):
        # host and pid in the name, so sweep_stale can tell a dead writer's leftovers from a live one's
        name = f"{TEMP_MARK}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"
        self.final, self.path = final, os.path.join(os.path.dirname(final), name)
        self.abandoned = False
        self.lock = threading.RLock()

    def open(self) -> pa.NativeFile:
        with self.lock:
            self.refuse_if_abandoned()
            return pa.OSFile(self.path, "wb")

    def publish(self) -> None:
        with self.lock:
            self.refuse_if_abandoned()
            os.replace(self.path, self.final)

    def remove(self) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.path)

    def abandon(self) -> None:
        with self.lock:
            self.abandoned = True
            self.remove()

    def refuse_if_abandoned(self) -> None:
        if self.abandoned:
            raise WriteAbandoned(f"write of {self.final} abandoned (the process is stopping): temp file removed")


class LocalBackend(Backend):
    """Local disk (and anything mounted there). URIs are absolute paths."""

    name = "local"
    atomic_writes = True

    @staticmethod
    def normalize(path: str) -> str:
        return os.path.abspath(os.path.expanduser(path)).rstrip("/") + "/"

    def filesystem(self, uri: str):
        return fsspec.filesystem("file"), uri

    def listing(self, prefix: str):
        if not os.path.isdir(prefix):
            return None
        return [(rel, st.st_size, local_identity(st)) for rel, st in walk(prefix)]

    def identity(self, uri: str, opened=None) -> str:
        """From the open handle's descriptor (fstat) when there is one: the file whose bytes are read, even if
        the path was replaced since it was opened (a stat by path would then name the newer file)."""
        return local_identity(os.fstat(opened.fileno()) if opened is not None else os.stat(uri))

    def size(self, uri: str, opened) -> int:
        return os.fstat(opened.fileno()).st_size

    def open_parquet(self, uri: str, size: int | None = None):
        return pa.OSFile(uri, "rb")

    def check_write_path(self, uri: str) -> None:
        super().check_write_path(uri)
        if posixpath.normpath(uri) != uri:
            raise ValueError(f"refusing to write {uri!r}: the path has '.'/'..' segments and could land outside "
                             "the output prefix")

    def write_parquet(self, write, uri: str, keep: bool = True) -> Written:
        """pyarrow writes straight into the temp file (no in-memory copy), which is fsynced and renamed; a check
        reads the file back (memory-mapped: no copy, no request)."""
        return Written(self._replace(uri, write))

    def put(self, uri: str, data: bytes) -> None:
        def write(sink) -> None:
            sink.write(data)

        self._replace(uri, write)

    @staticmethod
    def _replace(path: str, write) -> int:
        """`write(sink)` into a temp file (a pyarrow file open for writing), then fsync and rename to `path`."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = TempFile(path)
        with tracked(temp):
            try:
                with temp.open() as sink:
                    write(sink)
                with open(temp.path, "rb+") as f:
                    os.fsync(f.fileno())
                size = os.path.getsize(temp.path)
                temp.publish()
            except BaseException:
                temp.remove()
                temp.refuse_if_abandoned()
                raise
        return size

    def sweep_stale(self, prefix: str, older_than_seconds: float) -> int:
        """Remove temp files whose writer process (on this host) is gone or that are older than the threshold."""
        removed, cutoff = 0, time.time() - older_than_seconds
        for folder, _, files in os.walk(prefix):
            for name in files:
                path = os.path.join(folder, name)
                if name.startswith(TEMP_MARK) and not name.endswith(".parquet"):
                    try:
                        if writer_dead(name) or os.stat(path).st_mtime < cutoff:
                            os.unlink(path)
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed
