"""All I/O goes through fsspec: one helper turns a URI into a filesystem, plus listing, footers and atomic writes.

S3 settings come from the standard AWS environment (AWS_ENDPOINT_URL, AWS_PROFILE, AWS_REGION, the
credentials chain, AWS_MAX_ATTEMPTS / AWS_RETRY_MODE for botocore's retries with backoff), so any
S3-compatible store works. Filesystems are cached per process.

Writes are atomic: a local shard is written to a temp file (TEMP_MARK..., never *.parquet) and renamed;
an S3 shard is one PUT, or a multipart upload that is completed only when every part is in and aborted
on any failure, so no partial object and no orphaned upload is left behind by a failed write.
"""
from __future__ import annotations

import logging
import os
import posixpath
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from urllib.parse import urlparse

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

ACCEPTED = "s3://bucket/path/, file:///abs/path/, or a local path"
TEMP_MARK = ".sidecar-ops-tmp-"
# S3 payloads of at least MULTIPART_THRESHOLD bytes go up in parts of PART_SIZE (S3's minimum part is 5 MiB).
MULTIPART_THRESHOLD = int(os.environ.get("SIDECAR_OPS_MULTIPART_THRESHOLD") or 64 * 2**20)
PART_SIZE = int(os.environ.get("SIDECAR_OPS_PART_SIZE") or 32 * 2**20)
ABORT_ATTEMPTS = 5
DEFAULT_MAX_ATTEMPTS = 8      # botocore attempts per request (AWS_MAX_ATTEMPTS overrides)
DEFAULT_RETRY_MODE = "adaptive"  # exponential backoff with jitter + client-side rate limiting on throttles

log = logging.getLogger(__name__)


def normalize_prefix(uri: str) -> str:
    """A canonical prefix ending in '/': `s3://bucket/path/`, or an absolute local path."""
    uri = uri.strip()
    if not uri:
        raise ValueError(f"empty prefix; expected {ACCEPTED}")
    parsed = urlparse(uri)
    if parsed.scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise ValueError(f"{uri!r} has no bucket; expected {ACCEPTED}")
        path = parsed.path.strip("/")
        return f"s3://{parsed.netloc}/{path}/" if path else f"s3://{parsed.netloc}/"
    if parsed.scheme == "file":
        uri = parsed.path
    elif parsed.scheme and len(parsed.scheme) > 1:
        raise ValueError(f"unsupported URI scheme {parsed.scheme!r} in {uri!r}; expected {ACCEPTED}")
    return os.path.abspath(os.path.expanduser(uri)).rstrip("/") + "/"


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


CONNECT_TIMEOUT, READ_TIMEOUT = 10, 120  # seconds, per attempt


@cache
def _s3():
    import s3fs

    # Listing cache off: resume decisions must see the bucket as it is now. botocore retries throttling
    # (503 SlowDown), 5xx and connection errors with backoff; s3fs adds a few retries of its own on top.
    attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or DEFAULT_MAX_ATTEMPTS)
    mode = os.environ.get("AWS_RETRY_MODE") or DEFAULT_RETRY_MODE
    # A bounded connect timeout: an unreachable endpoint fails (after the retries) instead of hanging.
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True,
                             config_kwargs={"retries": {"max_attempts": attempts, "mode": mode},
                                            "connect_timeout": CONNECT_TIMEOUT, "read_timeout": READ_TIMEOUT})


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a normalized URI or prefix + relpath."""
    if is_s3(uri):
        return _s3(), uri[len("s3://"):]
    return fsspec.filesystem("file"), uri


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


def _check_write_path(uri: str) -> None:
    path = uri[len("s3://"):] if is_s3(uri) else uri
    dotted = any(p in (".", "..") for p in path.split("/"))
    if dotted or (not is_s3(uri) and posixpath.normpath(path) != path):
        raise ValueError(f"refusing to write {uri!r}: the path has '.'/'..' segments and could land outside "
                         "the output prefix")


def inside(a: str, b: str) -> bool:
    """True when normalized prefix `a` equals or lies inside normalized prefix `b`."""
    return a.startswith(b)


@dataclass(frozen=True)
class Listing:
    """One recursive listing of a prefix: parquet shards by relpath (with sizes and identities), and the rest.

    A `*.parquet` object of 0 bytes is a shard (reading it fails, so it is never dropped unnoticed).
    `ids` holds each shard's identity (see `identity`), taken from the listing itself at no extra cost."""

    prefix: str
    shards: dict[str, int]
    others: tuple[str, ...]
    exists: bool = True
    ids: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def empty_shards(self) -> list[str]:
        return [rel for rel, size in self.shards.items() if size == 0]


def s3_identity(info: dict) -> str:
    """Identity of an S3 object from a listing entry or a HEAD reply: size plus ETag."""
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    return f"size={int(info.get('size', 0))};etag={etag}"


def local_identity(st: os.stat_result) -> str:
    """Identity of a local file: size plus st_mtime_ns (nanoseconds; an in-place rewrite changes it)."""
    return f"size={st.st_size};mtime_ns={st.st_mtime_ns}"


def file_identity(uri: str, opened=None) -> str:
    """Identity of an object being read. On S3 an open s3fs file already holds its HEAD reply (no extra
    request); locally one stat(). Taken before the data is read, so a concurrent rewrite makes the recorded
    identity older than the content, never newer: the next run then sees the output as stale, the safe side."""
    if is_s3(uri):
        fs, path = filesystem(uri)
        details = opened.details if opened is not None else fs.info(path)
        return s3_identity(details)
    return local_identity(os.stat(uri))


def file_size(uri: str, opened) -> int:
    """Size of an object opened with open_parquet, without another request."""
    return int(opened.size) if is_s3(uri) else os.path.getsize(uri)


def _walk_local(root: str):
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


def list_prefix(prefix: str) -> Listing:
    """One paginated recursive listing; `*.parquet` objects are shards, the rest are counted."""
    found: list[tuple[str, int, str]] = []  # (relpath, size, identity)
    if is_s3(prefix):
        fs, root = filesystem(prefix)
        try:
            entries = fs.find(root, detail=True)
        except FileNotFoundError:
            return Listing(prefix, {}, (), exists=False)
        found = [(path[len(root):], int(info.get("size", 0)), s3_identity(info))
                 for path, info in entries.items() if info.get("type") != "directory"]
    else:
        if not os.path.isdir(prefix):
            return Listing(prefix, {}, (), exists=False)
        found = [(rel, st.st_size, local_identity(st)) for rel, st in _walk_local(prefix)]
    shards, ids, others = {}, {}, []
    for rel, size, ident in sorted(found):
        if rel.endswith(".parquet"):
            shards[rel], ids[rel] = size, ident
        else:
            others.append(rel)
    return Listing(prefix, shards, tuple(others), exists=True, ids=ids)


def read_footer(uri: str, size: int | None = None) -> pq.FileMetaData:
    """The parquet footer; with the object's size known (from a listing), no HEAD request on S3."""
    with open_parquet(uri, size) as f:
        return pq.ParquetFile(f).metadata


def open_parquet(uri: str, size: int | None = None):
    """A context-managed file for pyarrow to read from: memory-mapped locally; on S3 without fsspec's
    readahead cache, since pyarrow already asks for exactly the byte ranges (footer, column chunks) it needs.
    `size` (from a listing) spares the HEAD request s3fs would otherwise make."""
    fs, path = filesystem(uri)
    if is_s3(uri):
        f = fs.open(path, "rb", cache_type="none", size=size)
        if size is not None:  # s3fs's range reads ask for `details` (a HEAD) unless they are already known
            f._details = {"name": path, "size": size, "type": "file"}
        return f
    return pa.memory_map(path, "r")


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

    for field in schema:
        walk(field, "")
    return out


def write_atomic(table: pa.Table, uri: str, row_group_size: int | None = None, plain: Iterable[str] = ()) -> int:
    """Write `table` as zstd parquet so that readers only ever see the complete file; returns bytes.
    `plain` names columns (such as unique keys) to keep out of dictionary encoding."""
    _check_write_path(uri)
    # An empty input shard reports row groups of 0 rows; pyarrow refuses row_group_size=0.
    options = dict(compression="zstd", row_group_size=row_group_size or None,
                   use_dictionary=dictionary_columns(table.schema, plain))
    fs, path = filesystem(uri)
    if is_s3(uri):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **options)
        data = sink.getvalue()
        _put_s3(fs, path, data.to_pybytes())
        return data.size
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    # host and pid in the name, so sweep_stale can tell a dead writer's leftovers from a live one's
    temp = os.path.join(directory, f"{TEMP_MARK}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}")
    try:
        pq.write_table(table, temp, **options)
        with open(temp, "rb+") as f:
            os.fsync(f.fileno())
        size = os.path.getsize(temp)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    return size


def _put_s3(fs, path: str, data: bytes) -> None:
    """One PUT, or a multipart upload completed only at the end and aborted on any failure."""
    if len(data) < MULTIPART_THRESHOLD:
        fs.call_s3("put_object", Bucket=path.split("/", 1)[0], Key=path.split("/", 1)[1], Body=data)
        return
    bucket, key = path.split("/", 1)
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    try:
        parts = []
        for number, start in enumerate(range(0, len(data), PART_SIZE), 1):
            out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                             Body=data[start:start + PART_SIZE])
            parts.append({"PartNumber": number, "ETag": out["ETag"]})
        fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload,
                   MultipartUpload={"Parts": parts})
    except BaseException:
        _abort_upload(fs, bucket, key, upload)
        raise


def _abort_upload(fs, bucket: str, key: str, upload: str) -> None:
    """Abort with its own retries; an upload already completed or aborted is fine."""
    for attempt in range(ABORT_ATTEMPTS):
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload)
            return
        except FileNotFoundError:  # NoSuchUpload: completed (the reply was lost) or aborted already
            return
        except Exception as exc:
            if attempt == ABORT_ATTEMPTS - 1:
                log.warning("could not abort multipart upload %s of s3://%s/%s: %s", upload, bucket, key, exc)
                return
            time.sleep(min(0.2 * 2**attempt, 5.0))


def pending_uploads(prefix: str) -> list[tuple[str, str, str]]:
    """(key, upload id, initiated ISO time) of every unfinished multipart upload under an s3:// prefix."""
    if not is_s3(prefix):
        return []
    fs, root = filesystem(prefix)
    bucket, _, key_prefix = root.partition("/")
    out, marker = [], {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key_prefix, **marker)
        out += [(u["Key"], u["UploadId"], str(u.get("Initiated", ""))) for u in page.get("Uploads", [])]
        if not page.get("IsTruncated"):
            return out
        marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


def sweep_stale(prefix: str, older_than_seconds: float = 6 * 3600) -> int:
    """Remove leftovers of killed writers under an output prefix: local temp files whose writer process (on
    this host) is gone or that are older than the threshold, and S3 multipart uploads older than the threshold
    (younger ones may belong to a run still in progress). Never touches *.parquet. Returns a count."""
    removed = 0
    if is_s3(prefix):
        fs, root = filesystem(prefix)
        bucket = root.partition("/")[0]
        cutoff = time.time() - older_than_seconds
        from datetime import datetime

        for key, upload, initiated in pending_uploads(prefix):
            try:
                started = datetime.fromisoformat(initiated).timestamp()
            except ValueError:
                continue
            if started < cutoff:
                _abort_upload(fs, bucket, key, upload)
                removed += 1
        return removed
    cutoff = time.time() - older_than_seconds
    for folder, _, files in os.walk(prefix):
        for name in files:
            path = os.path.join(folder, name)
            if name.startswith(TEMP_MARK) and not name.endswith(".parquet"):
                try:
                    if _writer_dead(name) or os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    pass
    return removed


def _writer_dead(temp_name: str) -> bool:
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
