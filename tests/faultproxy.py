"""A fault-injecting HTTP proxy on loopback, in front of moto's S3 server.

Point AWS_ENDPOINT_URL at `FaultProxy.url` and a chosen share of requests is answered with
503 SlowDown, 500 InternalError, a connection reset (before or after moto saw the request) or a slow
response; the rest are forwarded unchanged. Plain threads, http.server and http.client: no dependency.

    with FaultProxy(upstream=moto_endpoint, rate=0.1, seed=1) as proxy:
        ...                      # proxy.stats: Counter of (fault, operation)

A `Hold` makes a chosen request wait, without any timing: the proxy sets `hold.arrived` when the first
matching request comes in and keeps it (and any later match) until `hold.release` is set. A test waits for
`arrived` (the run is then provably at that point), acts, then releases.

    hold = Hold(lambda op, path, client: op == "GetObject" and path.endswith("/part-00005.parquet"))
    with FaultProxy(upstream=moto_endpoint, rate=0, host="10.0.0.1", hold=hold) as proxy: ...
"""
from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

FAULTS = ("slowdown", "internal", "reset", "reset_after", "slow")
# Chosen only by name, never by default: a write's body reaches moto with one byte changed (moto stores what it
# got and answers with the checksum of that, as a store behind a faulty network path would).
CORRUPT = "corrupt"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}

ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
              '<RequestId>faultproxy</RequestId></Error>')


def operation(method: str, path: str) -> str:
    """The S3 operation a request performs, from its method and query string alone."""
    query = parse_qs(urlsplit(path).query, keep_blank_values=True)
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
                 host: str = "127.0.0.1", hold: Hold | None = None):
        unknown = set(faults) - {*FAULTS, CORRUPT}
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULTS)}, {CORRUPT}")
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.rate, self.faults, self.applies, self.slow_seconds = rate, tuple(faults), applies, slow_seconds
        self.hold = hold
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.stats: Counter = Counter()  # (fault or "ok", operation) -> count
        self.log: list[tuple[str, str, str | None, int]] = []  # forwarded: (operation, path, Range, reply bytes)
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
                if fault == CORRUPT and body:
                    middle = len(body) // 2
                    body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]
                status, headers, data = self._forward(body)
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
