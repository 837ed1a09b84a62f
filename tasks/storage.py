"""All I/O goes through fsspec: one helper turns a URI into a filesystem, plus listing, footers and atomic writes.

S3 settings come from the standard AWS environment (AWS_ENDPOINT_URL, AWS_PROFILE, AWS_REGION, the
credentials chain), so any S3-compatible store works. Filesystems are cached per process.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from functools import cache
from urllib.parse import urlparse

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

ACCEPTED = "s3://bucket/path/, file:///abs/path/, or a local path"
TEMP_MARK = ".sidecar-ops-tmp-"


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


@cache
def _s3():
    import s3fs

    # Listing cache off: resume decisions must see the bucket as it is now.
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True,
                             config_kwargs={"retries": {"max_attempts": 8, "mode": "adaptive"}})


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a normalized URI or prefix + relpath."""
    if is_s3(uri):
        return _s3(), uri[len("s3://"):]
    return fsspec.filesystem("file"), uri


def join(prefix: str, relpath: str) -> str:
    return prefix + relpath


def inside(a: str, b: str) -> bool:
    """True when normalized prefix `a` equals or lies inside normalized prefix `b`."""
    return a.startswith(b)


@dataclass(frozen=True)
class Listing:
    """One recursive listing of a prefix: parquet shards by relpath (with sizes), and everything else."""

    prefix: str
    shards: dict[str, int]
    others: tuple[str, ...]
    exists: bool = True


def list_prefix(prefix: str) -> Listing:
    """One paginated recursive listing; `*.parquet` objects are shards, the rest are counted."""
    fs, root = filesystem(prefix)
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        return Listing(prefix, {}, (), exists=False)
    shards, others = {}, []
    strip = len(root.rstrip("/")) + 1
    for path, info in found.items():
        if info.get("type") == "directory":
            continue
        rel = path[strip:] if not is_s3(prefix) else path[len(root):]
        if rel.endswith(".parquet") and info.get("size", 0) > 0:
            shards[rel] = int(info.get("size", 0))
        else:
            others.append(rel)
    return Listing(prefix, dict(sorted(shards.items())), tuple(sorted(others)), exists=True)


def read_footer(uri: str) -> pq.FileMetaData:
    fs, path = filesystem(uri)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f).metadata


def open_parquet(uri: str):
    """A context-managed file object for pyarrow to read from."""
    fs, path = filesystem(uri)
    return fs.open(path, "rb")


def write_atomic(table: pa.Table, uri: str, row_group_size: int | None = None) -> int:
    """Write `table` as zstd parquet so that readers only ever see the complete file; returns bytes."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_size)
    data = sink.getvalue()
    fs, path = filesystem(uri)
    if is_s3(uri):
        # One PUT (or multipart upload s3fs completes only at the end): the key appears whole or not at all.
        fs.pipe_file(path, data.to_pybytes())
        return data.size
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, f"{TEMP_MARK}{uuid.uuid4().hex}")
    try:
        with open(temp, "wb") as f:
            f.write(memoryview(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    return data.size
