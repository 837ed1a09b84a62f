"""A fault-injecting HTTP proxy on loopback, in front of moto's S3 server.

Point AWS_ENDPOINT_URL at `FaultProxy.url` and a chosen share of requests is answered with
503 SlowDown, 500 InternalError, a connection reset (before or after moto saw the request) or a slow
response; the rest are forwarded unchanged. Plain threads, http.server and http.client: no dependency.

    with FaultProxy(upstream=moto_endpoint, rate=0.1, seed=1) as proxy:
        ...                      # proxy.stats: Counter of (fault, operation)

S3 semantics moto lacks: moto reports every multipart upload as `Initiated` 2010-11-10, so an age-based sweep
cannot tell a live run's upload from a dead one's. The proxy stamps each upload with the time the
CreateMultipartUpload went through it (even when its reply is then dropped) and reports that time in
ListMultipartUploads replies; `proxy.age(upload_id, seconds)` makes one older. An upload created behind the
proxy's back keeps moto's time. `proxy.unheard` holds the ids of uploads whose creation reply was dropped.
And where moto answers a part or a completion of an upload that is gone (aborted, completed) with a 500 (a
KeyError inside it), the proxy answers as S3 does: 404 NoSuchUpload. moto lists every pending upload in one reply;
with `page_size` the proxy answers in pages as S3 does past 1,000 (IsTruncated, NextKeyMarker/NextUploadIdMarker,
the next page after the markers a request names, in moto's order). `proxy.undated` holds ids reported without an
`Initiated`, as a store that omits it would.

`proxy.sent` holds every request's operation and headers (lower-cased names), with the body of each
CompleteMultipartUpload (its list of parts); `edit_reply(operation, headers)` returns the headers a successful
reply goes back with (a store that echoes no checksum, or one whose ETags are no MD5, as under SSE-KMS), and
`edit_request(operation, body)` the body moto is given (such a store's ETags named back in a completion).

A `Hold` makes a chosen request wait, without any timing: the proxy sets `hold.arrived` when the first
matching request comes in and keeps it (and any later match) until `hold.release` is set. A test waits for
`arrived` (the run is then provably at that point), acts, then releases.

    hold = Hold(lambda op, path, client: op == "GetObject" and path.endswith("/part-00005.parquet"))
    with FaultProxy(upstream=moto_endpoint, rate=0, host="10.0.0.1", hold=hold) as proxy: ...
"""
from __future__ import annotations

import http.client
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

FAULTS = ("slowdown", "internal", "reset", "reset_after", "slow")
# Chosen only by name, never by default: a write's body reaches moto with one byte changed (moto stores what it
# got and answers with the checksum of that, as a store behind a faulty network path would).
CORRUPT = "corrupt"
# Also by name only: a refusal the store gives every time (403 AccessDenied; 501 NotImplemented, as stores
# without lifecycle support answer).
DENIED, UNSUPPORTED = "denied", "unsupported"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}

ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
              '<RequestId>faultproxy</RequestId></Error>')


def operation(method: str, path: str) -> str:
    """The S3 operation a request performs, from its method and query string alone."""
    query = parse_qs(urlsplit(path).query, keep_blank_values=True)
    if "lifecycle" in query:
        return {"GET": "GetBucketLifecycleConfiguration", "PUT": "PutBucketLifecycleConfiguration",
                "DELETE": "DeleteBucketLifecycle"}.get(method, method)
    if "uploads" in query:
        return "ListMultipartUploads" if method == "GET" else "CreateMultipartUpload"
    if "uploadId" in query:
        return {"PUT": "UploadPart", "POST": "CompleteMultipartUpload", "DELETE": "AbortMultipartUpload",
                "GET": "ListParts"}.get(method, method)
    if method == "GET" and ("list-type" in query or urlsplit(path).path.rstrip("/").count("/") <= 1):
        return "ListObjects"
    return {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PutObject", "DELETE": "DeleteObject",
            "POST": "PostObject"}.get(method, method)


class Hold:
    """Requests `matches(operation, path, client address)` selects wait until `release` is set."""

    def __init__(self, matches: Callable[[str, str, str], bool]):
        self.matches = matches
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.held: list[tuple[str, str, str]] = []  # (operation, path, client address) of every request held
        self._changed = threading.Condition()

    def __call__(self, op: str, path: str, client: str) -> None:
        if self.release.is_set() or not self.matches(op, path, client):
            return
        with self._changed:
            self.held.append((op, path, client))
            self._changed.notify_all()
        self.arrived.set()
        self.release.wait()

    def wait_held(self, n: int, timeout: float) -> bool:
        """Whether `n` requests are being held at once within `timeout` seconds (a failure deadline)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.held) >= n, timeout)


WRITES = {"PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"}
MULTIPART = {"CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"}


class FaultProxy:
    """Forward to `upstream`, failing a `rate` share of the requests whose operation `applies` to.

    `faults` picks the kinds (uniformly); `slow_seconds` is the delay of a slow response. `host` is the address
    it listens on (another host reaches it only on a non-loopback one); `hold` keeps chosen requests waiting.
    """

    def __init__(self, upstream: str, rate: float = 0.1, seed: int = 0, faults: tuple[str, ...] = FAULTS,
                 applies: Callable[[str], bool] = lambda op: True, slow_seconds: float = 0.3,
                 host: str = "127.0.0.1", hold: Hold | None = None, page_size: int | None = None,
                 edit_reply: Callable[[str, list[tuple[str, str]]], list[tuple[str, str]]] | None = None,
                 edit_request: Callable[[str, bytes], bytes] | None = None):
        unknown = set(faults) - {*FAULTS, CORRUPT, DENIED, UNSUPPORTED}
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULTS)}, {CORRUPT}, "
                             f"{DENIED}, {UNSUPPORTED}")
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.rate, self.faults, self.applies, self.slow_seconds = rate, tuple(faults), applies, slow_seconds
        self.hold, self.page_size, self.edit_reply, self.edit_request = hold, page_size, edit_reply, edit_request
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.stats: Counter = Counter()  # (fault or "ok", operation) -> count
        self.log: list[tuple[str, str, str | None, int]] = []  # forwarded: (operation, path, Range, reply bytes)
        self.initiated: dict[str, float] = {}  # upload id -> POSIX time its CreateMultipartUpload went through
        self.unheard: set[str] = set()  # upload ids whose CreateMultipartUpload reply was dropped
        self.undated: set[str] = set()  # upload ids listed without an Initiated
        self.sent: list[tuple[str, dict[str, str], bytes]] = []  # (operation, headers, completion's body)
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.hold is not None:
            self.hold.release.set()
        self._server.shutdown()
        self._server.server_close()

    def faults_injected(self, op: str | None = None) -> int:
        return sum(n for (kind, o), n in self.stats.items() if kind != "ok" and (op is None or o == op))

    def age(self, upload_id: str, seconds: float) -> None:
        """Report the upload as initiated `seconds` before now."""
        with self._lock:
            self.initiated[upload_id] = time.time() - seconds

    def upload_gone(self, path: str) -> bool:
        """Whether moto no longer knows the upload a request's path names (ListParts answers 404)."""
        parts = urlsplit(path)
        upload_id = parse_qs(parts.query)["uploadId"][0]
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request("GET", f"{parts.path}?uploadId={upload_id}")
            return conn.getresponse().status == 404
        finally:
            conn.close()

    def stamped(self, op: str, status: int, data: bytes, dropped: bool, path: str = "") -> bytes:
        """The reply to pass on: a created upload's time recorded, a listing's `Initiated` times replaced (and
        the listing cut to one page with `page_size`)."""
        if op == "CreateMultipartUpload" and status == 200:
            upload_id = re.search(rb"<UploadId>(.*?)</UploadId>", data).group(1).decode()
            with self._lock:
                self.initiated[upload_id] = time.time()
                if dropped:
                    self.unheard.add(upload_id)
        if op == "ListMultipartUploads" and status == 200:
            if self.page_size is not None:
                data = self.page(data, path)
            data = re.sub(rb"<Upload>.*?</Upload>", self._restamp, data, flags=re.S)
        return data

    def page(self, data: bytes, path: str) -> bytes:
        """The page of a ListMultipartUploads reply after the request's key-marker and upload-id-marker."""
        query = parse_qs(urlsplit(path).query)
        uploads = re.findall(rb"<Upload>.*?</Upload>", data, flags=re.DOTALL)
        ids = [(re.search(rb"<Key>(.*?)</Key>", u).group(1).decode(),
                re.search(rb"<UploadId>(.*?)</UploadId>", u).group(1).decode()) for u in uploads]
        marker = (query.get("key-marker", [""])[0], query.get("upload-id-marker", [""])[0])
        start = ids.index(marker) + 1 if marker in ids else 0
        end = start + self.page_size
        listed = b"".join(uploads[start:end])
        if end < len(uploads):
            key, upload_id = ids[end - 1]
            listed += (f"<NextKeyMarker>{key}</NextKeyMarker>"
                       f"<NextUploadIdMarker>{upload_id}</NextUploadIdMarker>").encode()
        data = re.sub(rb"<Upload>.*?</Upload>", b"", data, flags=re.DOTALL)
        data = data.replace(b"<IsTruncated>false</IsTruncated>", f"<IsTruncated>{str(end < len(uploads)).lower()}"
                            f"</IsTruncated>".encode())
        return data.replace(b"</ListMultipartUploadsResult>", listed + b"</ListMultipartUploadsResult>")

    def _restamp(self, upload: re.Match) -> bytes:
        text = upload.group(0)
        upload_id = re.search(rb"<UploadId>(.*?)</UploadId>", text).group(1).decode()
        with self._lock:
            when = self.initiated.get(upload_id)
            undated = upload_id in self.undated
        if undated:
            return re.sub(rb"<Initiated>.*?</Initiated>", b"", text)
        if when is None:
            return text
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"
        return re.sub(rb"<Initiated>.*?</Initiated>", f"<Initiated>{stamp}</Initiated>".encode(), text)

    def choose(self, op: str) -> str | None:
        with self._lock:
            fault = None
            if self.applies(op) and self._rng.random() < self.rate:
                fault = self._rng.choice(self.faults)
            self.stats[(fault or "ok", op)] += 1
            return fault

    def _handler_class(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _reset(self) -> None:
                # SO_LINGER 0: close() sends RST, the client sees "connection reset by peer".
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def _error(self, status: int, code: str, message: str) -> None:
                body = ERROR_BODY.format(code=code, message=message).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    return resp.status, resp.getheaders(), data
                finally:
                    conn.close()

            def _handle(self) -> None:
                op = operation(self.command, self.path)
                body = self._body()
                with proxy._lock:
                    proxy.sent.append((op, {k.lower(): v for k, v in self.headers.items()},
                                       body if op == "CompleteMultipartUpload" else b""))
                if proxy.edit_request is not None:
                    body = proxy.edit_request(op, body)
                if proxy.hold is not None:
                    proxy.hold(op, urlsplit(self.path).path, self.client_address[0])
                fault = proxy.choose(op)
                if fault == "reset":
                    return self._reset()
                if fault == "slowdown":
                    return self._error(503, "SlowDown", "Please reduce your request rate.")
                if fault == "internal":
                    return self._error(500, "InternalError", "We encountered an internal error. "
                                                             "Please try again.")
                if fault == DENIED:
                    return self._error(403, "AccessDenied", "Access Denied")
                if fault == UNSUPPORTED:
                    return self._error(501, "NotImplemented", "A header you provided implies functionality "
                                                              "that is not implemented")
                if fault == CORRUPT and body:
                    middle = len(body) // 2
                    body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]
                status, headers, data = self._forward(body)
                if op in ("UploadPart", "CompleteMultipartUpload") and status == 500 and proxy.upload_gone(self.path):
                    status, headers = 404, [("Content-Type", "application/xml")]
                    data = ERROR_BODY.format(code="NoSuchUpload", message="The specified upload does not exist. "
                                             "The upload ID may be invalid, or the upload may have been aborted or "
                                             "completed.").encode()
                data = proxy.stamped(op, status, data, dropped=fault == "reset_after", path=self.path)
                if proxy.edit_reply is not None and status == 200:
                    headers = proxy.edit_reply(op, headers)
                with proxy._lock:
                    proxy.log.append((op, urlsplit(self.path).path, self.headers.get("Range"), len(data)))
                if fault == "reset_after":  # moto did the work; the client never hears of it
                    return self._reset()
                self.send_response(status)
                for name, value in headers:
                    keep_length = self.command == "HEAD"  # a HEAD reply states the object's size
                    if name.lower() not in HOP_BY_HOP and (name.lower() != "content-length" or keep_length):
                        self.send_header(name, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "slow":
                    self.wfile.flush()
                    time.sleep(proxy.slow_seconds)
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler


@pytest.fixture
def proxied(moto_endpoint, monkeypatch):
    """Start a proxy in front of moto and point this process's s3fs at it: `proxied(**FaultProxy kwargs)`
    (no faults unless asked). Import it into a test module to use it."""
    from tasks import storage

    started = []

    def start(**kw) -> FaultProxy:
        proxy = FaultProxy(moto_endpoint, **{"rate": 0.0, **kw}).__enter__()
        started.append(proxy)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        storage._s3.cache_clear()
        return proxy

    yield start
    for proxy in started:
        proxy.__exit__(None, None, None)
    storage._s3.cache_clear()
