"""A shard's inputs fetched ahead, all at once, where each request costs a round trip (S3).

When a shard starts, its base and every sibling are fetched concurrently, each in as few GETs as its layout
allows: first the last TAIL bytes (the footer, and all of a small object), then the column chunks the read
needs, coalesced across gaps under GAP and cut into parts of at most PART bytes fetched in parallel. Every GET
is pinned to the listed ETag, like any read of a listed object, so the bytes are the version the listing named.
`take` hands the fetched object to `open_parquet` as a file read from memory; a fetch that failed, or was
dropped to stay under the byte budget, is simply not there, and the input is read the usual way.

Only objects whose identity a listing gave are fetched (a shard task's first attempt): a retry reads afresh.
Fetched bytes wait in a per-process table until taken, bounded by SIDECAR_OPS_FETCH_AHEAD_BYTES (512 MiB; 0
turns fetching ahead off): beyond it the oldest are dropped. A caller may also bound one object's fetch (a
shard task's inputs share its window budget): its tail and the first wanted chunks that fit are fetched, the rest
read when asked for.
"""
from __future__ import annotations

import bisect
import io
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache

import pyarrow.parquet as pq

TAIL = 1 << 20   # the first GET of an object: its last MiB (footer, and the whole of a small object)
FOOTER_READ = 64 << 10  # pyarrow's first read of a footer (kDefaultFooterReadSize): a tail always holds it
GAP = 1 << 20    # wanted ranges closer than this are fetched as one (a gap costs less than a round trip)
PART = 8 << 20   # larger spans are fetched in parallel parts of this size
READ_ON = 4 << 20  # a read beyond a limited fetch reads on this far into its wanted span
BUDGET = int(os.environ.get("SIDECAR_OPS_FETCH_AHEAD_BYTES") or 512 * 2**20)

log = logging.getLogger(__name__)
_lock = threading.Lock()
_waiting: OrderedDict[tuple[str, str], tuple[int, Future]] = OrderedDict()  # (uri, identity) -> (size, fetch)


@cache
def _pools() -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
    """Objects and ranges in separate pools: an object's fetch waits for its ranges, never the other way."""
    return (ThreadPoolExecutor(8, thread_name_prefix="sidecar-ops-fetch"),
            ThreadPoolExecutor(16, thread_name_prefix="sidecar-ops-range"))


class Fetched(io.RawIOBase):
    """A read-only, seekable view of one object from the ranges fetched; a read outside them (a column the
    fetch did not expect, or wanted bytes beyond a limited fetch) is made then, pinned like the rest. A read
    inside a wanted span (`spans`) reads on to PART bytes of it, kept for the reads that follow (one such
    buffer at a time): a reader going through the chunks in file order makes one GET a PART, not one a chunk.
    `details` and `size` answer file_identity and file_size like an open s3fs file's."""

    def __init__(self, size: int, details: dict, ranges: list[tuple[int, bytes]], read_range: Callable,
                 spans: list[tuple[int, int]] = ()):
        super().__init__()
        self.size, self.details = size, details
        self._ranges = sorted(ranges, key=lambda r: r[0])
        self._starts = [start for start, _ in self._ranges]
        self._read_range = read_range
        self._spans = sorted(spans)
        self._ahead: tuple[int, bytes] = (0, b"")  # the last read made on beyond what was asked
        self._pos = 0

    def close(self) -> None:
        self._ranges, self._starts = [], []
        super().close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence] + offset
        return self._pos

    def read(self, n: int = -1):
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        data = self._slice(self._pos, end)
        self._pos = end
        return data

    def _slice(self, start: int, end: int):
        if start >= end:
            return b""
        i = bisect.bisect_right(self._starts, start) - 1
        pieces, at = [], start
        while 0 <= i < len(self._ranges) and at < end:  # consecutive ranges covering start..end
            first, data = self._ranges[i]
            if not first <= at < first + len(data):
                break
            pieces.append(memoryview(data)[at - first:min(end, first + len(data)) - first])
            at, i = first + len(data), i + 1
        if at >= end:
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # one piece: no copy (pyarrow takes it)
        first, data = self._ahead
        if first <= start and end <= first + len(data):
            return memoryview(data)[start - first:end - first]
        log.debug("read of bytes %d-%d was not fetched ahead", start, end)
        i = bisect.bisect_right(self._spans, (start, self.size)) - 1
        stop = max(end, min(self._spans[i][1], start + READ_ON)) if i >= 0 and start < self._spans[i][1] else end
        if stop == end:
            return self._read_range(start, end)
        self._ahead = (start, self._read_range(start, stop))
        return memoryview(self._ahead[1])[:end - start]


def fetch(uri: str, identity: str, size: int, details: dict, wanted: Callable[[str], bool],
          read_range: Callable, limit: int | None = None) -> int:
    """Start fetching one listed object of `size` bytes unless the budget is spent; `wanted(name)` says which
    top-level columns the read will need; `read_range(start, end)` makes one pinned GET; `details` is what
    the backend's file_identity reads from an open file. At most `limit` bytes are fetched (its tail, then
    the wanted chunks in file order: what does not fit is read when asked for). Returns the bytes it may hold."""
    held = size if limit is None else min(size, limit)
    if size <= 0 or held > BUDGET or held < min(size, max(TAIL, FOOTER_READ)):
        return 0
    with _lock:
        if (uri, identity) in _waiting:
            return 0
        while _waiting and _held() + held > BUDGET:
            _, (_, dropped) = _waiting.popitem(last=False)
            dropped.cancel()
        objects, ranges = _pools()
        _waiting[(uri, identity)] = (held, objects.submit(_fetch, size, details, wanted, read_range, ranges, held))
    return held


def take(uri: str, identity: str) -> Fetched | None:
    """The object as fetched (waiting for the fetch to end), or None when it was not fetched or failed."""
    with _lock:
        entry = _waiting.pop((uri, identity), None)
    if entry is None:
        return None
    try:
        return entry[1].result()
    except Exception as exc:  # the usual read will meet the same trouble and say so; or it was a passing one
        log.debug("fetching %s ahead failed (%s): reading it now", uri, exc)
        return None


def drop(uri: str) -> None:
    """Forget whatever was fetched of `uri` (its reader will not come: the shard failed before it)."""
    with _lock:
        for key in [key for key in _waiting if key[0] == uri]:
            _waiting.pop(key)[1].cancel()


def held() -> int:
    """Bytes of the fetched objects waiting to be taken (or in flight): never more than BUDGET."""
    with _lock:
        return _held()


def _held() -> int:
    return sum(size for size, _ in _waiting.values())


def waiting(uri: str | None = None) -> int:
    """How many fetched objects (of `uri`, or all) wait to be taken."""
    with _lock:
        return sum(uri is None or key[0] == uri for key in _waiting)


def _fetch(size: int, details: dict, wanted: Callable[[str], bool], read_range: Callable,
           pool: ThreadPoolExecutor, limit: int | None = None) -> Fetched:
    tail_start = max(0, size - max(TAIL, FOOTER_READ))
    tail = read_range(tail_start, size)
    if tail_start == 0:
        return Fetched(size, details, [(0, tail)], read_range)
    footer = struct.unpack("<I", tail[-8:-4])[0] + 8
    if tail[-4:] != b"PAR1" or footer + 4 > size:  # no room for the footer and the leading magic
        raise ValueError("not a parquet file")  # the usual read will say so
    if footer > len(tail):
        tail = read_range(size - footer, tail_start) + tail
        tail_start = size - footer
    spans = _spans(pq.ParquetFile(Fetched(size, details, [(tail_start, tail)], read_range)).metadata, wanted,
                   tail_start)
    parts, room = [], (size if limit is None else limit) - len(tail)
    for s, e in ((s, min(s + PART, end)) for start, end in spans for s in range(start, end, PART)):
        if room <= 0:
            break
        parts.append((s, min(e, s + room)))
        room -= parts[-1][1] - s
    futures = [(s, pool.submit(read_range, s, e)) for s, e in parts]
    return Fetched(size, details, [(s, f.result()) for s, f in futures] + [(tail_start, tail)], read_range, spans)


def _spans(meta: pq.FileMetaData, wanted: Callable[[str], bool], limit: int) -> list[tuple[int, int]]:
    """Byte ranges of the wanted columns' chunks before `limit` (what the tail already holds is not asked
    again), coalesced across gaps under GAP."""
    chunks = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            if not wanted(col.path_in_schema.split(".")[0]):
                continue
            start = col.dictionary_page_offset if col.has_dictionary_page and col.dictionary_page_offset \
                else col.data_page_offset
            chunks.append((start, min(start + col.total_compressed_size, limit)))
    spans: list[list[int]] = []
    for start, end in sorted(c for c in chunks if c[0] < c[1]):
        if spans and start - spans[-1][1] < GAP:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return [(s, e) for s, e in spans]
