"""The contract of a storage backend: what one kind of URI needs beyond the fsspec filesystem it maps to.

fsspec gives listing, reading and writing; it does not say which writes readers can never see half-done,
what identifies an object's content for resume, how to open an object cheaply for pyarrow, or which
leftovers a killed writer leaves behind. Each backend class answers those for its URIs. URIs handed to a
backend are normalized (see `tasks.storage.normalize_prefix`) prefixes or prefix + relpath.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import fsspec
import pyarrow as pa

TEMP_MARK = ".sidecar-ops-tmp-"
# Attribute of a file from open_parquet holding the info (listing-like entry) of the version it reads, where
# the handle cannot tell by itself (Backend.identity reads it).
READ_INFO = "sidecar_read_info"

# Listing/info fields that change when an object is rewritten, in the order they are recorded.
IDENTITY_FIELDS = ("ETag", "etag", "md5Hash", "md5", "crc32c", "checksum", "sha256", "generation",
                   "version_id", "VersionId", "mtime", "LastModified", "last_modified", "modified", "updated",
                   "created")


def entry_identity(info: dict) -> str:
    """Identity of an object from a generic fsspec listing or info entry: its size plus every field of
    IDENTITY_FIELDS the implementation gives. Datetimes are recorded as POSIX timestamps, so a listing that
    gives a float and an info() that gives a datetime for the same object (fsspec's memory filesystem does)
    agree. With no such field the identity is the size alone, which cannot see a same-size rewrite."""
    parts = [f"size={int(info.get('size') or 0)}"]
    for name in IDENTITY_FIELDS:
        value = info.get(name)
        if value is None or value == "":
            continue
        if isinstance(value, datetime):
            value = value.timestamp()
        parts.append(f"{name}={str(value).strip(chr(34))}")
    return ";".join(parts)


@dataclass(frozen=True)
class Written:
    """What a write stored: its size and, where the backend has proof that the stored object is exactly these
    bytes (a whole-object put, a checksummed S3 upload), the payload itself; None where the object must be
    read back to be seen as written (a local file pyarrow wrote straight to disk)."""

    size: int
    payload: pa.Buffer | None = None


class Backend:
    """One kind of storage. The defaults suit a read-only fsspec filesystem; subclasses override."""

    name = "generic"
    # True only where a reader can never see a partly written object (see write_parquet).
    atomic_writes = False
    # Non-secret environment variables a remote worker needs to reach this storage like the driver does.
    env_names: tuple[str, ...] = ()

    def filesystem(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """(filesystem, path inside it) for a normalized URI."""
        return fsspec.core.url_to_fs(uri)

    def listing(self, prefix: str) -> list[tuple[str, int, str]] | None:
        """(relpath, size, identity) of every object under `prefix`, recursively; None if it does not exist."""
        fs, root = self.filesystem(prefix)
        root = root.rstrip("/")
        try:
            entries = fs.find(root, detail=True)
        except FileNotFoundError:
            return None
        return [(path[len(root) + 1:], int(info.get("size") or 0), self.entry_identity(info))
                for path, info in entries.items()
                if info.get("type") != "directory" and path.startswith(root + "/")]

    def entry_identity(self, info: dict) -> str:
        return entry_identity(info)

    def identity(self, uri: str, opened=None) -> str:
        """Identity of the object at `uri`, the same string its listing entry gives. For a file from
        open_parquet, the info it carries (READ_INFO), taken no later than its bytes: never a newer version's."""
        info = getattr(opened, READ_INFO, None)
        if info is None:
            fs, path = self.filesystem(uri)
            info = fs.info(path)
        return self.entry_identity(info)

    def size(self, uri: str, opened) -> int:
        """Size of an object opened with open_parquet."""
        size = getattr(opened, "size", None)
        if isinstance(size, int):
            return size
        fs, path = self.filesystem(uri)
        return int(fs.size(path))

    def open_parquet(self, uri: str, size: int | None = None):
        """A context-managed binary file for pyarrow; `size` is the listed size, when known."""
        fs, path = self.filesystem(uri)
        info = fs.info(path)  # before the open: whatever the file then reads is this version or a later one
        f = fs.open(path, "rb")
        setattr(f, READ_INFO, info)
        return f

    def open_listed(self, uri: str, identity: str):
        """open_parquet for an object whose identity a listing just gave (`identity`): a backend where asking
        the store costs a request uses it instead, reading only that version. By default the same as
        open_parquet (the identity is taken from the open file as usual)."""
        return self.open_parquet(uri)

    def fetch_ahead(self, uri: str, identity: str, wanted, limit: int | None = None) -> int:
        """Start fetching a listed object's bytes in the background (storage.fetch_ahead), at most `limit`;
        returns the bytes it may hold. By default nothing: where a read costs no round trip there is nothing to
        overlap."""
        return 0

    def refusal(self) -> str | None:
        """Why outputs cannot go to this backend, or None when they can."""
        if self.atomic_writes:
            return None
        return f"the {self.name!r} storage cannot be written atomically"

    def check_write_path(self, uri: str) -> None:
        """Refuse a destination whose path could land outside the output prefix."""
        path = uri.partition("://")[2] if "://" in uri else uri
        if any(p in (".", "..") for p in path.split("/")):
            raise ValueError(f"refusing to write {uri!r}: the path has '.'/'..' segments and could land outside "
                             "the output prefix")

    def write_parquet(self, write, uri: str, keep: bool = True) -> Written:
        """Store what `write(sink)` writes into a pyarrow sink (a path or a file object) so that readers only
        ever see the complete object. By default the payload is built in memory and stored whole by `put`,
        which only returns once the store holds exactly those bytes: the payload is handed back, so a check of
        what was written needs no read. `keep=False` says the caller would rather not hold the whole payload
        (a streamed write); a backend may still, as this default does."""
        sink = pa.BufferOutputStream()
        write(sink)
        data = sink.getvalue()
        self.put(uri, data.to_pybytes())
        return Written(data.size, data)

    def put(self, uri: str, data: bytes) -> None:
        """Store `data` as the whole object at `uri`, atomically; backends that cannot refuse."""
        raise ValueError(f"refusing to write {uri!r}: {self.refusal()}")

    def pending_uploads(self, prefix: str) -> list[tuple[str, str, str]]:
        """(key, upload id, initiated ISO time) of unfinished uploads under `prefix`; none for most backends."""
        return []

    def sweep_stale(self, prefix: str, older_than_seconds: float) -> int:
        """Remove leftovers of killed writers under `prefix`; returns a count. Nothing to sweep by default."""
        return 0

    def lifecycle_note(self, prefix: str) -> str | None:
        """A line for the dry run when the store would keep a killed writer's leftovers under `prefix` forever
        (S3: no AbortIncompleteMultipartUpload rule); None where there is nothing to say."""
        return None

    def missing_root(self, prefix: str) -> str | None:
        """Why nothing could ever be written under `prefix` (a missing bucket), or None."""
        return None
