"""All I/O goes through fsspec; this facade picks a storage backend from each URI and keeps the callers'
functions: normalizing prefixes, listing with identities, footers, reading for pyarrow, atomic writes.

Backends (`tasks.storage.backend.Backend`): `s3` (s3fs, size+ETag identities, PUT or multipart upload with
abort), `local` (memory-mapped reads, temp file + rename, size+mtime_ns), `memory` (fsspec's in-process
store, atomic by construction) and, for inputs only, any other installed fsspec protocol (size plus whatever
checksum or time its listing gives). Outputs go only to backends that write atomically (`check_writable`).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from urllib.parse import urlparse

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.storage import ahead, generic
from tasks.storage.backend import TEMP_MARK, Backend, Written, entry_identity
from tasks.storage.inflight import WriteAbandoned, abandon_writes, run_writes
from tasks.storage.local import LocalBackend, local_identity
from tasks.storage.s3 import MULTIPART_THRESHOLD, PART_SIZE, S3Backend, s3_identity
from tasks.storage.s3 import _s3 as _s3  # tests and benchmarks clear its cache to switch endpoints

__all__ = ["ABSENT", "MULTIPART_THRESHOLD", "PART_SIZE", "TEMP_MARK", "Backend", "Listing", "WriteAbandoned",
           "Written", "abandon_writes", "backend", "check_relpath", "check_writable", "dictionary_columns",
           "entry_identity", "fetch_ahead", "file_identity", "file_size", "filesystem", "forget_ahead", "inside",
           "is_s3", "join", "lifecycle_note", "list_prefix", "listed", "local_identity", "missing_root", "normalize_prefix", "open_parquet", "pending_uploads", "read_footer",
           "run_writes", "s3_identity", "store_errors", "sweep_stale", "worker_env_names", "write_atomic", "write_text", "write_windows"]

ACCEPTED = "s3://bucket/path/, file:///abs/path/, or a local path"
WRITABLE = "s3://, local paths (file://) and memory://"
LOCAL, S3 = LocalBackend(), S3Backend()
# Protocols with a backend of their own, resolved without importing their implementation (s3fs stays lazy).
BUILTIN = {"s3": S3, "s3a": S3, "file": LOCAL, "local": LOCAL}


def accepted() -> str:
    """Every accepted prefix form, in one line (imports fsspec's implementations: for error messages)."""
    others = ", ".join(f"{p}://" for p in generic.input_protocols())
    return f"{ACCEPTED}, memory://path/" + (f", or for inputs only {others}" if others else "")


def normalize_prefix(uri: str) -> str:
    """A canonical prefix ending in '/': `s3://bucket/path/`, an absolute local path, or `protocol://path/`
    for another fsspec protocol. ValueError (one line) for an empty prefix or an unsupported scheme."""
    uri = uri.strip()
    if not uri:
        raise ValueError(f"empty prefix; expected {ACCEPTED}")
    parsed = urlparse(uri)
    if parsed.scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise ValueError(f"{uri!r} has no bucket; expected {ACCEPTED}")
        path = parsed.path.strip("/")
        return f"s3://{parsed.netloc}/{path}/" if path else f"s3://{parsed.netloc}/"
    if parsed.scheme in ("file", "local"):
        return LOCAL.normalize(parsed.path)
    if not parsed.scheme or len(parsed.scheme) == 1:  # a relative path, or a Windows drive letter
        return LOCAL.normalize(uri)
    try:
        return generic.normalize(uri, parsed.scheme)
    except ValueError as exc:
        raise ValueError(f"unsupported URI scheme {parsed.scheme!r} in {uri!r}: {exc}; expected {accepted()}") \
            from None


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def backend(uri: str) -> Backend:
    """The backend of a normalized URI (a prefix, or prefix + relpath)."""
    scheme, sep, _ = uri.partition("://")
    return _backend(scheme) if sep else LOCAL


@cache
def _backend(scheme: str) -> Backend:
    return BUILTIN.get(scheme) or generic.backend_for(scheme)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a normalized URI or prefix + relpath."""
    return backend(uri).filesystem(uri)


def check_writable(prefix: str) -> str:
    """`prefix` itself when outputs can go there; ValueError (one line) when its backend cannot write
    atomically. Callers turn it into a ConfigError, like normalize_prefix's."""
    why = backend(prefix).refusal()
    if why:
        raise ValueError(f"{prefix!r}: {why}, so outputs cannot go there; writable: {WRITABLE}")
    return prefix


def missing_root(prefix: str) -> str | None:
    """Why nothing can be written under an output prefix that does not exist yet (S3: a missing bucket)."""
    return backend(prefix).missing_root(prefix)


def lifecycle_note(prefix: str) -> str | None:
    """One line for the dry run when nothing but a run's own sweep would abort uploads orphaned under an output
    prefix (S3 without an AbortIncompleteMultipartUpload rule, or rules it may not read); else None."""
    return backend(prefix).lifecycle_note(prefix)


def worker_env_names() -> tuple[str, ...]:
    """Non-secret environment variables remote workers need to reach storage like the driver (the S3
    endpoint and region, retry and upload tuning). Never credentials: each node uses its own chain."""
    return tuple(dict.fromkeys(name for b in (S3, LOCAL) for name in b.env_names))


def check_relpath(relpath: str) -> str:
    """`relpath` itself if it stays inside any prefix it is appended to; ValueError otherwise."""
    parts = relpath.split("/")
    if not relpath or "\0" in relpath or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"unsafe shard path {relpath!r}: absolute, or with empty, '.' or '..' segments "
                         "(it could escape its prefix); rename the object")
    return relpath


def join(prefix: str, relpath: str) -> str:
    """prefix + relpath, refusing relpaths that could escape the prefix."""
    return prefix + check_relpath(relpath)


def inside(a: str, b: str) -> bool:
    """True when normalized prefix `a` equals or lies inside normalized prefix `b`."""
    return a.startswith(b)


@dataclass(frozen=True)
class Listing:
    """One recursive listing of a prefix: parquet shards by relpath (with sizes and identities), and the rest.

    A `*.parquet` object of 0 bytes is a shard (reading it fails, so it is never dropped unnoticed).
    `ids` holds each shard's identity (see `file_identity`), taken from the listing itself at no extra cost."""

    prefix: str
    shards: dict[str, int]
    others: tuple[str, ...]
    exists: bool = True
    ids: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def empty_shards(self) -> list[str]:
        return [rel for rel, size in self.shards.items() if size == 0]


def list_prefix(prefix: str) -> Listing:
    """One paginated recursive listing; `*.parquet` objects are shards, the rest are counted."""
    found = backend(prefix).listing(prefix)
    if found is None:
        return Listing(prefix, {}, (), exists=False)
    shards, ids, others = {}, {}, []
    for rel, size, ident in sorted(found):
        if rel.endswith(".parquet"):
            rel = sys.intern(rel)  # one string per relpath across the base's, each source's and the output's listing
            shards[rel], ids[rel] = size, ident
        else:
            others.append(rel)
    return Listing(prefix, shards, tuple(others), exists=True, ids=ids)


def store_errors() -> tuple[type[BaseException], ...]:
    """The error families a store's client raises for trouble of the store, never of our code: OSError (what
    fsspec's implementations turn most errors into, and its FSTimeoutError), botocore's (BotoCoreError: cannot
    connect, timeouts, bad credentials; ClientError: an error reply) and aiohttp's (fsspec's http), each only
    once its library is imported: nothing else can raise them."""
    errors: list[type[BaseException]] = [OSError]
    if "fsspec.exceptions" in sys.modules:
        errors.append(sys.modules["fsspec.exceptions"].FSTimeoutError)
    if "botocore.exceptions" in sys.modules:
        errors += [sys.modules["botocore.exceptions"].BotoCoreError, sys.modules["botocore.exceptions"].ClientError]
    if "aiohttp" in sys.modules:
        errors.append(sys.modules["aiohttp"].ClientError)
    return tuple(errors)


def file_identity(uri: str, opened=None) -> str:
    """Identity of an object being read (the same string its listing entry gives), never newer than the data
    read through `opened` (a file from open_parquet): locally fstat() of the open descriptor (the very file
    mapped); on S3 the HEAD reply the open s3fs file holds, its reads pinned to that ETag (a replace mid-read
    fails the read); in memory the info of the copy taken; elsewhere the info taken just before the open. So
    a concurrent rewrite can make the recorded identity older than the content, never newer: the next run
    then sees the output as stale, the safe side. Without `opened`, the current identity by path."""
    return backend(uri).identity(uri, opened)


def file_size(uri: str, opened) -> int:
    """Size of an object opened with open_parquet, without another request."""
    return backend(uri).size(uri, opened)


def read_footer(uri: str, size: int | None = None) -> pq.FileMetaData:
    """The parquet footer; with the object's size known (from a listing), no HEAD request on S3."""
    with open_parquet(uri, size) as f:
        return pq.ParquetFile(f).metadata


def read_footer_schema(uri: str, size: int | None = None) -> tuple[pq.FileMetaData, pa.Schema]:
    """The parquet footer and its Arrow schema. Read over many shards, use this rather than
    `read_footer(...).schema.to_arrow_schema()`: pyarrow's FileMetaData.schema is a ParquetSchema that refers back
    to it, a cycle only the cyclic GC frees, so each footer's C++ metadata would stay in memory until a full
    collection (verify's driver grew by the footers of every shard)."""
    with open_parquet(uri, size) as f:
        pf = pq.ParquetFile(f)
        return pf.metadata, pf.schema_arrow


ABSENT = "absent"  # listed as not there
# uri -> identity from a listing, for the objects the code running in this context is about to read (`listed`).
_LISTED: ContextVar[dict[str, str]] = ContextVar("sidecar_ops_listed", default={})


@contextmanager
def listed(identities: dict[str, str]) -> Iterator[None]:
    """Within it, open_parquet of one of these URIs trusts the identity a listing gave (`uri -> identity`)
    instead of asking the store again: on S3 no HEAD, reads pinned to the listed ETag (a replace since the
    listing fails the read, a transient error); one listed as ABSENT is not there (FileNotFoundError, no
    request), as the listing said. A shard task's first attempt reads under the plan's listing;
    a retry does not, and sees the objects as they are then."""
    token = _LISTED.set({**_LISTED.get(), **identities})
    try:
        yield
    finally:
        _LISTED.reset(token)


def fetch_ahead(uri: str, wanted: Callable[[str], bool], limit: int | None = None) -> int:
    """Start fetching an object the code running in this context will read, if `listed` named its version and
    its backend gains from it (S3: tasks/storage/ahead.py); `wanted(column)` says which top-level columns the
    read needs, `limit` how many bytes it may take. open_parquet of it then reads from what was fetched; nothing
    changes for a reader otherwise. Returns the bytes the fetch may hold (0: not fetched)."""
    identity = _LISTED.get().get(uri)
    if identity and identity != ABSENT:
        return backend(uri).fetch_ahead(uri, identity, wanted, limit)
    return 0


def forget_ahead(uris: Iterable[str]) -> None:
    """Release what was fetched ahead of these objects and not read (the shard stopped before reading them)."""
    for uri in uris:
        ahead.drop(uri)


def open_parquet(uri: str, size: int | None = None):
    """A context-managed file for pyarrow to read from: memory-mapped locally; on S3 without fsspec's
    readahead cache, since pyarrow already asks for exactly the byte ranges (footer, column chunks) it needs.
    `size` (from a listing) spares the HEAD request s3fs would otherwise make; so does an identity from
    `listed`, which also names the version read."""
    identity = _LISTED.get().get(uri) if size is None else None
    if identity == ABSENT:
        raise FileNotFoundError(f"{uri} (not in the listing)")
    if identity:
        return ahead.take(uri, identity) or backend(uri).open_listed(uri, identity)
    return backend(uri).open_parquet(uri, size)


def dictionary_columns(schema: pa.Schema, plain: Iterable[str]) -> list[str]:
    """Leaf columns worth dictionary encoding: not the unique key columns, not floating-point scores.
    Both are high-cardinality, where a dictionary costs CPU and bytes for nothing."""
    plain = set(plain)
    out: list[str] = []

    def walk(field: pa.Field, prefix: str) -> None:
        name = prefix + field.name
        if pa.types.is_struct(field.type):
            for i in range(field.type.num_fields):
                walk(field.type.field(i), name + ".")
        elif name not in plain and not pa.types.is_floating(field.type):
            out.append(name)

    for top in schema:
        walk(top, "")
    return out


def write_atomic(table: pa.Table, uri: str, row_group_size: int | None = None,
                 plain: Iterable[str] = ()) -> Written:
    """Write `table` as zstd parquet so that readers only ever see the complete file; returns its size and,
    where the backend proved the stored object is exactly those bytes, the payload (`Written`). `plain` names
    columns (such as unique keys) to keep out of dictionary encoding. ValueError on a backend that cannot
    write atomically."""
    return write_windows([table], uri, row_group_size, plain, keep=True)


def parquet_writer(sink, schema: pa.Schema, plain: Iterable[str] = ()) -> pq.ParquetWriter:
    """The writer of every output: zstd, a dictionary for the columns worth one (dictionary_columns)."""
    return pq.ParquetWriter(sink, schema, compression="zstd", use_dictionary=dictionary_columns(schema, plain))


def as_stored(schema: pa.Schema) -> pa.Schema:
    """The schema as Parquet stores and reads it back: some Arrow types come back as others (date64 as date32,
    timestamp[s] as timestamp[ms], time32[s] as time32[ms]), so a prediction names what the output will hold."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema):  # not pq.write_table, which imports pandas (~0.15 s) to look at its input
        pass
    return pq.read_schema(pa.BufferReader(sink.getvalue())).with_metadata(schema.metadata)


def write_stream(write, uri: str, keep: bool = False) -> Written:
    """write_atomic of the bytes `write(sink)` writes into a sink (anything with `write`): published whole once
    it returns, never if it raises."""
    store = backend(uri)
    store.check_write_path(uri)
    return store.write_parquet(write, uri, keep)


def write_windows(windows: Iterable[pa.Table], uri: str, row_group_size: int | None = None,
                  plain: Iterable[str] = (), keep: bool = False) -> Written:
    """write_atomic of the rows of `windows` in order (the first one's schema, metadata included, is the
    file's), each window cut into row groups of `row_group_size` rows, written as they come: the file is
    published only after the last one, and never if the iterator raises. `keep=False`: no need to hold the
    whole payload (Written.payload may then be None and a check reads the object back)."""
    def write(sink) -> None:
        writer = None
        try:
            for window in windows:
                if writer is None:
                    writer = parquet_writer(sink, window.schema, plain)
                # An empty input shard reports row groups of 0 rows; pyarrow refuses row_group_size=0.
                writer.write_table(window, row_group_size=row_group_size or None)
                del window  # not held while the next one is read
        except BaseException:
            if writer is not None:
                with suppress(Exception):  # the object is never published; the first error is the one to tell
                    writer.close()
            raise
        if writer is None:
            raise ValueError(f"nothing to write to {uri}: no window of rows, not even an empty one")
        writer.close()

    return write_stream(write, uri, keep)


def write_text(uri: str, text: str) -> None:
    """Write a small text file (a report) in one piece: a local path as given (relative allowed), through a
    temp file renamed over it (a reader never sees half a report) unless it is something else than a regular
    file (`/dev/stdout`, a pipe, a symlink: written through, in place); an s3:// object with one PUT, or an
    object on another backend that writes atomically."""
    scheme, sep, _ = uri.partition("://")
    if not sep or scheme in ("file", "local"):
        path = urlparse(uri).path if sep else uri
        if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
            with open(path, "w") as f:
                f.write(text)
        else:
            LOCAL.put(os.path.abspath(path), text.encode())
    elif is_s3(uri):
        fs, key = filesystem(uri)
        fs.pipe_file(key, text.encode())
    else:
        backend(uri).put(uri, text.encode())  # refused (ValueError) where writes are not atomic


def pending_uploads(prefix: str) -> list[tuple[str, str, str]]:
    """(key, upload id, initiated ISO time) of every unfinished multipart upload under an s3:// prefix."""
    return backend(prefix).pending_uploads(prefix)


def sweep_stale(prefix: str, older_than_seconds: float = 6 * 3600) -> int:
    """Remove leftovers of killed writers under an output prefix: local temp files whose writer process (on
    this host) is gone or that are older than the threshold, and S3 multipart uploads older than the threshold
    (younger ones may belong to a run still in progress). Never touches *.parquet. Returns a count."""
    return backend(prefix).sweep_stale(prefix, older_than_seconds)
