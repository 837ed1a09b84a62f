"""Counting what storage reads: a wrapper around tasks.storage.filesystem (local files, in-process) and a
tiny HTTP proxy in front of moto (S3 requests by type, from any process), optionally adding a first-byte
latency to every answer (W8: a round trip that costs what it costs on real S3, not loopback's ~0).

A read is a *footer read* when it reaches the last 8 bytes of the file (pyarrow reads parquet footers
from the tail); any other read touches column data.
"""
from __future__ import annotations

import collections
import contextlib
import http.client
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class ReadLog:
    def __init__(self):
        self.lock = threading.Lock()
        self.opens = 0
        self.footer_reads = self.data_reads = 0
        self.footer_bytes = self.data_bytes = 0
        self.files: set[str] = set()

    def add(self, path: str, start: int, n: int, size: int) -> None:
        with self.lock:
            if start + n >= size - 8:
                self.footer_reads += 1
                self.footer_bytes += n
            else:
                self.data_reads += 1
                self.data_bytes += n
            self.files.add(path)


class CountingFile:
    def __init__(self, f, path: str, log: ReadLog):
        self._f, self._path, self._log = f, path, log
        self._size = os.path.getsize(path)

    def read(self, n=-1):
        start = self._f.tell()
        data = self._f.read(n)
        self._log.add(self._path, start, len(data), self._size)
        return data

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


class CountingFS:
    def __init__(self, fs, log: ReadLog):
        self._fs, self._log = fs, log

    def open(self, path, mode="rb", **kwargs):
        f = self._fs.open(path, mode, **kwargs)
        if "r" not in mode:
            return f
        with self._log.lock:
            self._log.opens += 1
        return CountingFile(f, path, self._log)

    def __getattr__(self, name):
        return getattr(self._fs, name)


@contextlib.contextmanager
def count_local_reads():
    """Count every read made through tasks.storage in this process (thread-runner tasks included)."""
    from tasks import storage

    log, real, real_open = ReadLog(), storage.filesystem, storage.open_parquet

    def filesystem(uri):
        fs, path = real(uri)
        return (CountingFS(fs, log), path) if not storage.is_s3(uri) else (fs, path)

    def open_parquet(uri, size=None):
        # Local shards are memory-mapped, which no wrapper sees: read them through a counted file instead.
        if storage.is_s3(uri):
            return real_open(uri, size)
        fs, path = filesystem(uri)
        return fs.open(path, "rb")

    storage.filesystem, storage.open_parquet = filesystem, open_parquet
    try:
        yield log
    finally:
        storage.filesystem, storage.open_parquet = real, real_open


class RequestLog:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, int]] = []  # (kind, key, response bytes)
        self.entries: list[dict] = []  # one per request, in arrival order of the answers: see _Proxy._forward

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.entries.clear()

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.entries)

    def counts(self) -> collections.Counter:
        with self.lock:
            return collections.Counter(kind for kind, _, _ in self.requests)

    def bytes_by_kind(self) -> collections.Counter:
        out = collections.Counter()
        with self.lock:
            for kind, _, n in self.requests:
                out[kind] += n
        return out


def classify(method: str, path: str, query: str, headers) -> str:
    q = parse_qs(query, keep_blank_values=True)
    key = path.lstrip("/").partition("/")[2]
    if method == "GET" and ("list-type" in q or not key):
        return "LIST"
    if method == "GET":
        return "GET range" if headers.get("Range") else "GET whole"
    if method == "PUT" and "partNumber" in q:
        return "PUT part"
    if method == "POST" and ("uploads" in q or "uploadId" in q):
        return "multipart"
    return method


# W8's kinds: what a request costs on S3 (LIST, HEAD, GET, PUT, and each step of a multipart upload).
W8_KINDS = ("LIST", "HEAD", "GET", "PUT", "MPU create", "MPU part", "MPU complete", "MPU abort", "other")


def coarse_kind(method: str, path: str, query: str) -> str:
    """One of W8_KINDS. Listing multipart uploads (GET ?uploads) is a LIST; a bucket HEAD is a HEAD."""
    q = parse_qs(query, keep_blank_values=True)
    key = path.lstrip("/").partition("/")[2]
    if method == "GET":
        return "LIST" if ("list-type" in q or "uploads" in q or not key) else "GET"
    if method == "HEAD":
        return "HEAD"
    if method == "PUT":
        return "MPU part" if "partNumber" in q else "PUT"
    if method == "POST" and "uploads" in q:
        return "MPU create"
    if method == "POST" and "uploadId" in q:
        return "MPU complete"
    if method == "DELETE" and "uploadId" in q:
        return "MPU abort"
    return "other"


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    log: RequestLog
    latency: float = 0.0  # seconds added before every answer (first-byte latency)

    def _forward(self):
        t_in = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        if chunked:  # pyarrow's (AWS C++ SDK) uploads: de-chunk, forward with a Content-Length
            body = self._read_chunked()
            length = len(body)
        if self.latency:
            time.sleep(self.latency)
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("connection", "transfer-encoding", "expect")}
            if chunked:
                headers["Content-Length"] = str(length)
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        parts = urlsplit(self.path)
        kind = classify(self.command, parts.path, parts.query, self.headers)
        entry = {"t": t_in, "kind": coarse_kind(self.command, parts.path, parts.query), "method": self.command,
                 "path": parts.path, "query": parts.query, "range": self.headers.get("Range") or "",
                 "status": resp.status, "bytes": len(data), "sent": length}
        with self.log.lock:
            self.log.requests.append((kind, parts.path, len(data)))
            self.log.entries.append(entry)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog (5) drops connections of 8+ concurrent clients: 1 s SYN retries


@contextlib.contextmanager
def moto_with_proxy(latency_ms: float = 0.0):
    """moto in server mode on loopback, and a counting proxy in front of it; yields (proxy URL, RequestLog).
    `latency_ms` is added to every answer (each request waits that long before it is forwarded)."""
    import socket

    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    log = RequestLog()
    handler = type("Proxy", (_Proxy,), {"upstream": ("127.0.0.1", port), "log": log,
                                        "latency": latency_ms / 1000.0})
    proxy = _Server(("127.0.0.1", 0), handler)
    proxy.daemon_threads = True
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}", log
    finally:
        proxy.shutdown()
        moto.stop()


@contextlib.contextmanager
def bench_s3(latency_ms: float = 0.0):
    """moto_with_proxy, with this process (and the children it starts) pointed at the proxy: AWS_ENDPOINT_URL
    set, bench credentials where none are set, our S3 client made afresh on the way in and out."""
    from tasks import storage

    for key, value in {"AWS_ACCESS_KEY_ID": "bench-key-id", "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(key, value)
    old = os.environ.get("AWS_ENDPOINT_URL")
    with moto_with_proxy(latency_ms=latency_ms) as (url, log):
        os.environ["AWS_ENDPOINT_URL"] = url
        storage._s3.cache_clear()
        try:
            yield url, log
        finally:
            storage._s3.cache_clear()
            if old is None:
                os.environ.pop("AWS_ENDPOINT_URL", None)
            else:
                os.environ["AWS_ENDPOINT_URL"] = old
