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
import io
import logging
import os
import threading
import time
import zlib
from datetime import datetime
from functools import cache

import pyarrow as pa

from tasks import fsspec_internals
from tasks.storage import ahead
from tasks.storage.backend import Backend, Written
from tasks.storage.inflight import WriteAbandoned, tracked

# Payloads of at least MULTIPART_THRESHOLD bytes go up in parts of PART_SIZE (S3's minimum part is 5 MiB): 8 MiB
# each, as boto3's transfers default to, so that a writer holds at most a part of its output.
MULTIPART_THRESHOLD = int(os.environ.get("SIDECAR_OPS_MULTIPART_THRESHOLD") or 8 * 2**20)
PART_SIZE = int(os.environ.get("SIDECAR_OPS_PART_SIZE") or 8 * 2**20)
ABORT_ATTEMPTS = 5
DEFAULT_MAX_ATTEMPTS = 8      # botocore attempts per request (AWS_MAX_ATTEMPTS overrides)
DEFAULT_RETRY_MODE = "adaptive"  # exponential backoff with jitter + client-side rate limiting on throttles
CONNECT_TIMEOUT, READ_TIMEOUT = 5, 120  # seconds, per attempt
# Seconds at most between two attempts to reach an endpoint that refused the connection or did not answer it:
# botocore's backoff (up to 20 s a wait) kept a closed port busy for ~55 s a request; capped, every attempt is
# still made, and an unreachable store fails within a minute: botocore's max_attempts counts the retries, so 9
# attempts, 8 waits of at most 5.5 s together and 9 connect timeouts of 5 s: under 51 s.
CONNECT_RETRY_DELAY = 1.0

log = logging.getLogger(__name__)


@cache
def _s3():
    """The process's s3fs filesystem (tests clear the cache to point it at another endpoint)."""
    import s3fs

    # Listing cache off: resume decisions must see the bucket as it is now. botocore retries throttling
    # (503 SlowDown), 5xx and connection errors with backoff; s3fs adds a few retries of its own on top.
    attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or DEFAULT_MAX_ATTEMPTS)
    mode = os.environ.get("AWS_RETRY_MODE") or DEFAULT_RETRY_MODE
    # A bounded connect timeout and wait between connection attempts: an unreachable endpoint fails (after
    # the retries) within a minute instead of hanging.
    from aiobotocore.session import AioSession

    session = AioSession()
    session.register("needs-retry.s3", connect_retry(attempts))
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, session=session,
                             config_kwargs={"retries": {"max_attempts": attempts, "mode": mode},
                                            "connect_timeout": CONNECT_TIMEOUT, "read_timeout": READ_TIMEOUT})


def connect_retry(max_attempts: int):
    """A botocore `needs-retry` handler (called before botocore's own): for an attempt that could not connect,
    the next one after at most CONNECT_RETRY_DELAY seconds while retries remain (`max_attempts` of them, as
    botocore counts: attempts 1 to max_attempts are each followed by one); anything else, and the last
    attempt, is left to botocore's retry mode (None), which then gives up."""
    from botocore.exceptions import ConnectionError as CannotConnect
    from botocore.exceptions import ConnectTimeoutError

    def delay(attempts: int, caught_exception=None, **_):
        if isinstance(caught_exception, (CannotConnect, ConnectTimeoutError)) and attempts <= max_attempts:
            return min(CONNECT_RETRY_DELAY, 0.1 * 2 ** (attempts - 1))
        return None
    return delay


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


class UploadAborted(ConnectionError):
    """Our multipart upload was aborted while it ran (NoSuchUpload on a part or the completion): by another run's
    sweep, a lifecycle rule or an operator. Worth another upload (transient)."""


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

    def fetch_ahead(self, uri: str, identity: str, wanted, limit: int | None = None) -> int:
        listed = parse_identity(identity)
        if listed is None:
            return 0
        size, etag = listed

        def read_range(start: int, end: int) -> bytes:  # one GET, pinned to the listed ETag
            with self.open_listed(uri, identity) as f:
                f.seek(start)
                return f.read(end - start)

        details = {"name": uri[len("s3://"):], "size": size, "type": "file", "ETag": etag}
        return ahead.fetch(uri, identity, size, details, wanted, read_range, limit)

    def open_parquet(self, uri: str, size: int | None = None):
        """Without fsspec's readahead cache: pyarrow already asks for exactly the byte ranges it needs."""
        fs, path = self.filesystem(uri)
        f = fs.open(path, "rb", cache_type="none", size=size)
        if size is not None:  # s3fs's range reads ask for `details` (a HEAD) unless they are already known
            f.details = {"name": path, "size": size, "type": "file"}  # fsspec's public setter
        return f

    def write_parquet(self, write, uri: str, keep: bool = True) -> Written:
        """The bytes `write(sink)` produces go up as they come (Upload: one PUT, or a multipart upload whose parts
        leave as they fill); the payload is handed back where S3's replies prove the object holds exactly it
        and the bytes were kept (`keep`, or an object small enough for one PUT), so a check of what was written
        reads nothing back."""
        fs, path = self.filesystem(uri)
        upload = Upload(fs, *path.split("/", 1), keep=keep)
        with tracked(upload):
            try:
                write(upload)
                return upload.finish()
            except BaseException:
                upload.abort()
                raise

    def put(self, uri: str, data: bytes) -> None:
        self.write_parquet(lambda sink: sink.write(data), uri)

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
        """Abort multipart uploads older than the threshold by the store's own `Initiated` (younger ones may
        belong to a run in progress, another process's or a lost CreateMultipartUpload reply's)."""
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

    def lifecycle_note(self, prefix: str) -> str | None:
        """A line for the dry run when nothing but our own sweep would ever abort an upload orphaned under
        `prefix`: the bucket has no enabled AbortIncompleteMultipartUpload rule covering it, or its rules
        cannot be read (denied, or a store without lifecycle support: said, never a failure)."""
        fs, root = self.filesystem(prefix)
        bucket, _, key_prefix = root.partition("/")
        try:
            rules = fs.call_s3("get_bucket_lifecycle_configuration", Bucket=bucket).get("Rules", [])
        except FileNotFoundError:  # NoSuchLifecycleConfiguration: no rules at all
            rules = []
        except Exception as exc:
            return (f"lifecycle: cannot read the lifecycle rules of bucket {bucket!r} ({type(exc).__name__}: "
                    f"{exc}); make sure an AbortIncompleteMultipartUpload rule covers the output (docs/storage.md)")
        if any(aborts_uploads_under(rule, key_prefix) for rule in rules):
            return None
        return (f"lifecycle: bucket {bucket!r} has no AbortIncompleteMultipartUpload rule for {prefix}: uploads "
                f"orphaned by killed writers or lost replies stay until a run's sweep (docs/storage.md)")

    def missing_root(self, prefix: str) -> str | None:
        bucket = prefix[len("s3://"):].split("/", 1)[0]
        fs, _ = self.filesystem(prefix)
        try:
            if fs.exists(f"{bucket}/"):
                return None
        except OSError:
            return None  # cannot tell; let the listing's own answer stand
        return f"bucket {bucket!r} does not exist; create it or choose another --output-prefix"


class Upload(io.RawIOBase):
    """A file object whose bytes become the object at s3://bucket/key, atomically: one PUT at `finish` while
    they stay under MULTIPART_THRESHOLD, else a multipart upload whose parts of PART_SIZE leave as they fill,
    completed at `finish`, aborted by `abort` (any failure: no object, no upload left). Every request carries
    a CRC32 S3 checks the body against. `keep`: hold every byte, so `finish` can hand back the payload.
    `abandon` (another thread: tasks/storage/inflight.py) aborts the upload and fails every later step.
    Only ever aborts its own upload: one whose CreateMultipartUpload reply was lost is never heard of, and is
    left to `sweep_stale` and the bucket's AbortIncompleteMultipartUpload rule (docs/storage.md)."""

    def __init__(self, fs, bucket: str, key: str, keep: bool = True):
        super().__init__()
        self.fs, self.bucket, self.key, self.keep = fs, bucket, key, keep
        self.pending, self.kept, self.size = bytearray(), bytearray(), 0
        self.upload: str | None = None
        self.parts: list[dict] = []
        self.proven, self.ended, self.abandoned = True, False, False
        self.lock = threading.RLock()  # `upload` and `abandoned` change together (abandon, from another thread)

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        if self.ended:  # a part failed, or the upload was finished or aborted: a late footer goes nowhere
            raise self.abandoned_error() if self.abandoned else OSError(f"upload of {self.uri} has ended")
        data = memoryview(data).cast("B")
        self.pending += data
        if self.keep:
            self.kept += data
        self.size += data.nbytes
        try:
            if self.upload is None and len(self.pending) >= MULTIPART_THRESHOLD:
                self.start()
            while self.upload is not None and len(self.pending) >= PART_SIZE:
                with memoryview(self.pending) as view:
                    part = bytes(view[:PART_SIZE])  # one copy (a slice of the bytearray would be another)
                del self.pending[:PART_SIZE]
                self.send(part)
        except BaseException:
            self.ended = True
            raise
        return data.nbytes

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def abandoned_error(self) -> WriteAbandoned:
        return WriteAbandoned(f"write of {self.uri} abandoned (the process is stopping): upload aborted")

    def start(self) -> None:
        reply = self.fs.call_s3("create_multipart_upload", Bucket=self.bucket, Key=self.key, ChecksumAlgorithm="CRC32")
        with self.lock:
            self.upload = reply["UploadId"]
            abandoned = self.abandoned
        if abandoned:  # while the request was in flight: abandon() had no id to abort
            self.abort()
            raise self.abandoned_error()

    def on_upload(self, method: str, **kw) -> dict:
        """A request on our multipart upload; NoSuchUpload says someone aborted it (abandon, or another party)."""
        try:
            return self.fs.call_s3(method, Bucket=self.bucket, Key=self.key, UploadId=self.upload, **kw)
        except FileNotFoundError as exc:
            if self.abandoned:
                raise self.abandoned_error() from exc
            raise UploadAborted(f"multipart upload {self.upload} of {self.uri} was aborted while it ran "
                                f"(NoSuchUpload on {method}: another run's sweep, a lifecycle rule or an "
                                f"operator); another upload may succeed") from exc

    def send(self, body: bytes) -> None:
        number = len(self.parts) + 1
        out = self.on_upload("upload_part", PartNumber=number, Body=body, ChecksumAlgorithm="CRC32")
        self.proven = stored_exactly(out, body) and self.proven
        checksum = {"ChecksumCRC32": out["ChecksumCRC32"]} if out.get("ChecksumCRC32") else {}
        self.parts.append({"PartNumber": number, "ETag": out["ETag"], **checksum})

    def finish(self) -> Written:
        with self.lock:
            if self.abandoned:
                raise self.abandoned_error()
            self.ended = True
        if self.upload is None:
            body = bytes(self.pending)
            reply = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=body,
                                    ChecksumAlgorithm="CRC32")
            try:
                proven = stored_exactly(reply, body)
            except UploadCorrupted:  # a store that took damaged bytes without checking: take them away again
                self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key)
                raise
            return Written(self.size, pa.py_buffer(body) if proven else None)
        if self.pending:
            self.send(bytes(self.pending))
            self.pending.clear()
        self.complete()
        return Written(self.size, pa.py_buffer(self.kept) if self.keep and self.proven else None)

    def complete(self) -> None:
        if self.upload is not None:
            self.on_upload("complete_multipart_upload", MultipartUpload={"Parts": self.parts})

    def abort(self) -> None:
        with self.lock:
            self.ended = True
            upload = self.upload
        if upload is not None:
            abort_upload(self.fs, self.bucket, self.key, upload)

    def abandon(self) -> None:
        with self.lock:
            self.abandoned = True
        self.abort()


def aborts_uploads_under(rule: dict, key_prefix: str) -> bool:
    """Whether a lifecycle rule aborts incomplete multipart uploads of every key under `key_prefix`."""
    scope = rule.get("Filter") or {}
    rule_prefix = scope.get("Prefix", (scope.get("And") or {}).get("Prefix", rule.get("Prefix", "")))
    tagged = "Tag" in scope or (scope.get("And") or {}).get("Tags")
    return (rule.get("Status") == "Enabled" and "AbortIncompleteMultipartUpload" in rule and not tagged
            and key_prefix.startswith(rule_prefix or ""))


def pin(opened, details: dict) -> None:
    """Make an open s3fs file read only the version `details` (a HEAD reply) describes (s3fs internals:
    tasks/fsspec_internals.py)."""
    fsspec_internals.pin_s3_file(opened, details)


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
