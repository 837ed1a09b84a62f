"""S3 and S3-compatible stores through s3fs (imported on first use).

Settings come from the standard AWS environment (AWS_ENDPOINT_URL, AWS_PROFILE, AWS_REGION, the credentials
chain, AWS_MAX_ATTEMPTS / AWS_RETRY_MODE for botocore's retries with backoff). A shard is one PUT, or a
multipart upload that is completed only when every part is in and aborted on any failure, so a failed write
leaves no partial object and no orphaned upload. Identity is size + ETag, from the listing or the HEAD reply
an open s3fs file already holds; that file's reads are pinned to that ETag (If-Match), so the identity recorded
for a read is the version read, and a replace mid-read is a (transient) read error.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import time
import zlib
from datetime import datetime
from functools import cache

import pyarrow as pa

from tasks import compat
from tasks.storage import ahead
from tasks.storage.backend import Backend, Written, parquet_bytes

# Payloads of at least MULTIPART_THRESHOLD bytes go up in parts of PART_SIZE (S3's minimum part is 5 MiB).
MULTIPART_THRESHOLD = int(os.environ.get("SIDECAR_OPS_MULTIPART_THRESHOLD") or 64 * 2**20)
PART_SIZE = int(os.environ.get("SIDECAR_OPS_PART_SIZE") or 32 * 2**20)
ABORT_ATTEMPTS = 5
DEFAULT_MAX_ATTEMPTS = 8      # botocore attempts per request (AWS_MAX_ATTEMPTS overrides)
DEFAULT_RETRY_MODE = "adaptive"  # exponential backoff with jitter + client-side rate limiting on throttles
CONNECT_TIMEOUT, READ_TIMEOUT = 10, 120  # seconds, per attempt

log = logging.getLogger(__name__)


@cache
def _s3():
    """The process's s3fs filesystem (tests clear the cache to point it at another endpoint)."""
    import s3fs

    # Listing cache off: resume decisions must see the bucket as it is now. botocore retries throttling
    # (503 SlowDown), 5xx and connection errors with backoff; s3fs adds a few retries of its own on top.
    attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or DEFAULT_MAX_ATTEMPTS)
    mode = os.environ.get("AWS_RETRY_MODE") or DEFAULT_RETRY_MODE
    # A bounded connect timeout: an unreachable endpoint fails (after the retries) instead of hanging.
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True,
                             config_kwargs={"retries": {"max_attempts": attempts, "mode": mode},
                                            "connect_timeout": CONNECT_TIMEOUT, "read_timeout": READ_TIMEOUT})


def s3_identity(info: dict) -> str:
    """Identity of an S3 object from a listing entry or a HEAD reply: size plus ETag."""
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    return f"size={int(info.get('size', 0))};etag={etag}"


def parse_identity(identity: str) -> tuple[int, str] | None:
    """(size, ETag) of an s3_identity string; None for anything else (an absent sibling, another backend's)."""
    fields = dict(part.partition("=")[::2] for part in identity.split(";"))
    if set(fields) != {"size", "etag"} or not fields["etag"] or not fields["size"].isdigit():
        return None
    return int(fields["size"]), fields["etag"]


class UploadCorrupted(ConnectionError):
    """The store holds other bytes than were sent: damaged on the way, worth another upload (transient)."""


def stored_exactly(reply: dict, body: bytes) -> bool:
    """Whether S3's reply to a PUT of `body` (an object or a part) proves the store holds exactly those bytes.
    Unencrypted or SSE-S3, the ETag is the MD5 of what the store received: equal to ours proves it, different
    is a corrupted upload (UploadCorrupted, transient: the retry uploads again). Under SSE-KMS or SSE-C the ETag is no
    MD5: then the CRC32 we send with every upload, which S3 checks the body against (BadDigest otherwise) and
    echoes, must be ours; without one the upload is unproven (False) and the caller reads the object back."""
    md5 = hashlib.md5(body, usedforsecurity=False).hexdigest()
    etag = str(reply.get("ETag") or "").strip('"')
    encrypted = str(reply.get("ServerSideEncryption") or "").startswith("aws:kms") or reply.get("SSECustomerAlgorithm")
    if etag == md5:
        return True
    if etag and not encrypted:
        raise UploadCorrupted(f"S3 stored other bytes than were sent (ETag {etag}, MD5 of the upload {md5})")
    crc = reply.get("ChecksumCRC32")
    if not crc:
        return False
    ours = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    if crc != ours:
        raise UploadCorrupted(f"S3 stored other bytes than were sent (CRC32 {crc}, sent {ours})")
    return True


class S3Backend(Backend):
    """s3://bucket/key URIs (s3a:// is normalized to s3://)."""

    name = "s3"
    atomic_writes = True
    env_names = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_MAX_ATTEMPTS",
                 "AWS_RETRY_MODE", "SIDECAR_OPS_MULTIPART_THRESHOLD", "SIDECAR_OPS_PART_SIZE",
                 "SIDECAR_OPS_FETCH_AHEAD_BYTES")

    def filesystem(self, uri: str):
        return _s3(), uri[len("s3://"):]

    def listing(self, prefix: str):
        fs, root = self.filesystem(prefix)
        try:
            entries = fs.find(root, detail=True)
        except FileNotFoundError:
            return None
        return [(path[len(root):], int(info.get("size", 0)), s3_identity(info))
                for path, info in entries.items() if info.get("type") != "directory"]

    def identity(self, uri: str, opened=None) -> str:
        """An open s3fs file already holds its HEAD reply (no extra request), and s3fs sends every ranged GET
        of that file with `If-Match: <that ETag>`: a replace after the open fails the read (412, FileExpired,
        a transient error) rather than return another version's bytes, so the identity is exactly the data's.
        A file opened with a listed size holds no ETag and no pin (see open_parquet): it costs one HEAD here,
        and its reads from then on are pinned to that ETag."""
        fs, path = self.filesystem(uri)
        details = opened.details if opened is not None else None
        if not details or not (details.get("ETag") or details.get("etag")):
            details = fs.info(path)
            if opened is not None:
                pin(opened, details)
        return s3_identity(details)

    def size(self, uri: str, opened) -> int:
        return int(opened.size)

    def open_listed(self, uri: str, identity: str):
        """Opened with the listed size and ETag: no HEAD, and every ranged GET pinned to that ETag (If-Match), so
        an object replaced since the listing fails the read (412, FileExpired: transient; the retry, which is
        not given the listing, opens it afresh) instead of mixing versions."""
        listed = parse_identity(identity)
        if listed is None:
            return self.open_parquet(uri)
        size, etag = listed
        f = self.open_parquet(uri, size)
        pin(f, {**f.details, "ETag": etag})
        return f

    def fetch_ahead(self, uri: str, identity: str, wanted) -> None:
        listed = parse_identity(identity)
        if listed is None:
            return
        size, etag = listed

        def read_range(start: int, end: int) -> bytes:  # one GET, pinned to the listed ETag
            with self.open_listed(uri, identity) as f:
                f.seek(start)
                return f.read(end - start)

        details = {"name": uri[len("s3://"):], "size": size, "type": "file", "ETag": etag}
        ahead.fetch(uri, identity, size, details, wanted, read_range)

    def open_parquet(self, uri: str, size: int | None = None):
        """Without fsspec's readahead cache: pyarrow already asks for exactly the byte ranges it needs."""
        fs, path = self.filesystem(uri)
        f = fs.open(path, "rb", cache_type="none", size=size)
        if size is not None:  # s3fs's range reads ask for `details` (a HEAD) unless they are already known
            f.details = {"name": path, "size": size, "type": "file"}  # fsspec's public setter
        return f

    def write_parquet(self, table: pa.Table, uri: str, options: dict) -> Written:
        """The payload is built in memory and uploaded; it is handed back when S3's replies prove the object holds
        exactly those bytes (then a check of what was written reads nothing back)."""
        data = parquet_bytes(table, options)
        return Written(data.size, data if self.store(uri, data.to_pybytes()) else None)

    def put(self, uri: str, data: bytes) -> None:
        self.store(uri, data)

    def store(self, uri: str, data: bytes) -> bool:
        """One PUT, or a multipart upload completed only at the end and aborted on any failure; each with a
        CRC32 that S3 checks the body against. Returns whether the replies prove the object is `data`."""
        fs, path = self.filesystem(uri)
        bucket, key = path.split("/", 1)
        if len(data) < MULTIPART_THRESHOLD:
            reply = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="CRC32")
            try:
                return stored_exactly(reply, data)
            except UploadCorrupted:  # a store that took damaged bytes without checking: take them away again
                fs.call_s3("delete_object", Bucket=bucket, Key=key)
                raise
        started = time.monotonic()
        reply = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")
        upload = reply["UploadId"]
        if reply.get("ResponseMetadata", {}).get("RetryAttempts"):
            abort_unheard_of(fs, bucket, key, upload, time.monotonic() - started)
        try:
            parts, proven = [], True
            for number, start in enumerate(range(0, len(data), PART_SIZE), 1):
                body = data[start:start + PART_SIZE]
                out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                                 Body=body, ChecksumAlgorithm="CRC32")
                proven = stored_exactly(out, body) and proven
                checksum = {"ChecksumCRC32": out["ChecksumCRC32"]} if out.get("ChecksumCRC32") else {}
                parts.append({"PartNumber": number, "ETag": out["ETag"], **checksum})
            fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload,
                       MultipartUpload={"Parts": parts})
        except BaseException:
            abort_upload(fs, bucket, key, upload)
            raise
        return proven

    def pending_uploads(self, prefix: str) -> list[tuple[str, str, str]]:
        fs, root = self.filesystem(prefix)
        bucket, _, key_prefix = root.partition("/")
        out, marker = [], {}
        while True:
            page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key_prefix, **marker)
            out += [(u["Key"], u["UploadId"], str(u.get("Initiated", ""))) for u in page.get("Uploads", [])]
            if not page.get("IsTruncated"):
                return out
            marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def sweep_stale(self, prefix: str, older_than_seconds: float) -> int:
        """Abort multipart uploads older than the threshold (younger ones may belong to a run in progress)."""
        fs, root = self.filesystem(prefix)
        bucket = root.partition("/")[0]
        removed, cutoff = 0, time.time() - older_than_seconds
        for key, upload, initiated in self.pending_uploads(prefix):
            try:
                started = datetime.fromisoformat(initiated).timestamp()
            except ValueError:
                continue
            if started < cutoff:
                abort_upload(fs, bucket, key, upload)
                removed += 1
        return removed

    def missing_root(self, prefix: str) -> str | None:
        bucket = prefix[len("s3://"):].split("/", 1)[0]
        fs, _ = self.filesystem(prefix)
        try:
            if fs.exists(f"{bucket}/"):
                return None
        except OSError:
            return None  # cannot tell; let the listing's own answer stand
        return f"bucket {bucket!r} does not exist; create it or choose another --output-prefix"


def pin(opened, details: dict) -> None:
    """Make an open s3fs file read only the version `details` (a HEAD reply) describes (s3fs internals:
    tasks/compat.py)."""
    compat.pin_s3_file(opened, details)


def abort_unheard_of(fs, bucket: str, key: str, ours: str, call_seconds: float) -> None:
    """A retried CreateMultipartUpload may have started an upload whose reply was lost: no one knows its id, so
    nothing would abort it. Abort the uploads of `key` that S3 started while our call was in flight (Initiated
    within its duration before ours, both S3's clocks); a concurrent writer of the same shard starting in that
    window loses its upload, and its write fails transiently and is retried."""
    uploads = [u for u in fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key).get("Uploads", [])
               if u["Key"] == key]
    mine = next((u["Initiated"] for u in uploads if u["UploadId"] == ours), None)
    if mine is None:
        return
    window = call_seconds + 1.0  # Initiated has a resolution of a second on some stores
    for u in uploads:
        if u["UploadId"] != ours and 0 <= (mine - u["Initiated"]).total_seconds() <= window:
            log.info("aborting multipart upload %s of s3://%s/%s: started by a retried request", u["UploadId"],
                     bucket, key)
            abort_upload(fs, bucket, key, u["UploadId"])


def abort_upload(fs, bucket: str, key: str, upload: str) -> None:
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
