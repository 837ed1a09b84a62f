"""Every other fsspec protocol: readable inputs (listing, identity, reading) through fsspec alone.

Writes need a guarantee fsspec does not state per implementation: that a reader never sees a partly written
object. Without it, an interrupted write could leave a truncated shard that resume would then have to
detect. So a generic protocol is read-only unless it is known here to write atomically; only `memory` is.
Object stores such as GCS or Azure Blob also publish objects whole, but their uploads (resumable, block
lists) and leftovers are not handled or tested here, so they are refused rather than assumed safe.
"""
from __future__ import annotations

from functools import cache
from urllib.parse import urlparse

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import known_implementations, registry

from tasks import fsspec_internals
from tasks.storage.backend import READ_INFO, Backend

try:  # the marker class of filesystems layered over another one (caches); recent fsspec only
    from fsspec.implementations.chained import ChainedFileSystem
except ImportError:
    ChainedFileSystem = type("ChainedFileSystem", (), {})

# Protocols that wrap another filesystem or a single file, or that reach no storage: never a prefix.
WRAPPERS = frozenset({"dir", "generic", "reference", "async_wrapper", "asyncwrapper", "data", "zip", "tar",
                      "libarchive", "chained", "cached", "blockcache", "filecache", "simplecache"})


def filesystem_class(protocol: str) -> type:
    """fsspec's implementation of `protocol`. ValueError (one line) when fsspec does not know it or it is
    not importable here (its package is not installed)."""
    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        raise ValueError(f"fsspec's implementation of {protocol!r} is not installed ({exc})") from None
    except ValueError:
        raise ValueError(f"fsspec knows no protocol {protocol!r}") from None


def is_wrapper(protocol: str, cls: type) -> bool:
    """True for protocols layered over another filesystem or a single file (caches, archives, dir://)."""
    return protocol in WRAPPERS or issubclass(cls, ChainedFileSystem)


def usable(protocol: str) -> bool:
    """True when `protocol` is importable, names storage, and is not local files under another name."""
    try:
        cls = filesystem_class(protocol)
    except Exception:  # noqa: BLE001 - any failure to import a third-party implementation means: not usable here
        return False
    return not is_wrapper(protocol, cls) and not issubclass(cls, LocalFileSystem)


@cache
def input_protocols() -> tuple[str, ...]:
    """Installed fsspec protocols usable for inputs, besides s3, local files and memory. Imports every
    implementation fsspec knows (under a second), so it is only called to word an error."""
    names = set(known_implementations) | set(registry)
    return tuple(sorted(p for p in names if p not in ("s3", "s3a", "file", "local", "memory") and usable(p)))


def normalize(uri: str, protocol: str) -> str:
    """A canonical prefix ending in '/' for a generic protocol; ValueError when it cannot be one."""
    if "::" in uri:
        raise ValueError(f"chained fsspec URL {uri!r} is not supported; give the storage location itself")
    cls = filesystem_class(protocol)
    if is_wrapper(protocol, cls):
        raise ValueError(f"{protocol!r} wraps another filesystem or a single file; give the storage itself")
    path = fsspec_internals.url_path(cls, uri)
    if "://" in path or fsspec_internals.url_options(cls, uri):
        # the URL itself carries the location (http) or the host (ftp, sftp, hdfs): keep it whole
        parsed = urlparse(uri)
        path = parsed.path.strip("/")
        return f"{protocol}://{parsed.netloc}/{path}/" if path else f"{protocol}://{parsed.netloc}/"
    path = path.strip("/")
    return f"{protocol}://{path}/" if path else f"{protocol}://"  # the root: every prefix lies inside


class GenericBackend(Backend):
    """An fsspec protocol with no backend of its own: inputs only."""

    def __init__(self, protocol: str):
        self.name = protocol


SNAPSHOT_ATTEMPTS = 5


class Snapshot(pa.BufferReader):
    """A BufferReader that can carry the info of the version it holds (READ_INFO)."""


class MemoryBackend(GenericBackend):
    """fsspec's in-process `memory` filesystem (one store per process; tests and demos).

    Atomic: `pipe_file` builds the complete MemoryFile from the bytes and only then puts it in the store
    dict, so a reader sees the old object or the whole new one. (Opening for "wb" would not be: that
    commits the empty file first and fills it while readers can see it, so writes use pipe_file only.)
    Identity is size + `created`, a new timestamp on every rewrite."""

    atomic_writes = True

    def __init__(self):
        super().__init__("memory")

    def open_parquet(self, uri: str, size: int | None = None):
        """A reader over a copy of the stored bytes (open("rb") hands every reader the same BytesIO, whose
        position concurrent readers would share), carrying the info of exactly the version copied: the info
        is read before and after the copy and the copy retried until both agree (a rewrite makes a new
        `created`), so the identity can never be newer than the bytes."""
        fs, path = self.filesystem(uri)
        for _ in range(SNAPSHOT_ATTEMPTS):
            info = fs.info(path)
            reader = Snapshot(fs.cat_file(path))
            if fs.info(path) == info:
                setattr(reader, READ_INFO, info)
                return reader
        raise OSError(f"{uri} was rewritten during each of {SNAPSHOT_ATTEMPTS} reads")

    def size(self, uri: str, opened) -> int:
        return int(opened.size())

    def put(self, uri: str, data: bytes) -> None:
        fs, path = self.filesystem(uri)
        fs.pipe_file(path, data)


def backend_for(protocol: str) -> GenericBackend:
    """The backend of a generic protocol: memory has its own, the rest share GenericBackend."""
    if issubclass(filesystem_class(protocol), MemoryFileSystem):
        return MemoryBackend()
    return GenericBackend(protocol)
