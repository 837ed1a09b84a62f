"""Inputs fetched ahead (issue 19, deliverable 3): a shard's base and siblings are in flight at the same moment,
a large object comes in as its tail then parallel parts of the wanted columns only, and what is read from
memory is exactly what a plain read gives. Requests are seen at the proxy in front of moto; overlap is proved
by holding requests there (never by timing)."""
from __future__ import annotations

import itertools
import logging
import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import build, read_table
from faultproxy import FaultProxy, Hold
from test_s3_requests import proxied  # noqa: F401 (fixture)

from tasks import kernel, storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job
from tasks.errors import ShardError
from tasks.ops.merge_from_sidecar import MergeFromSidecar
from tasks.storage import ahead

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REL = relpaths(3)


def listed_inputs(setup) -> dict[str, str]:
    """uri -> listed identity of every input object, as a plan's listing gives them."""
    out = {}
    for prefix in setup.prefixes.values():
        listing = storage.list_prefix(prefix)
        out.update({prefix + rel: ident for rel, ident in listing.ids.items()})
    return out


def merged(job: Job, relpath: str, listed: dict[str, str]) -> kernel.ShardStats:
    with storage.listed(listed):
        return kernel.merge_shard(job, relpath)


def test_a_shards_inputs_are_all_in_flight_at_once(tmp_path, s3_root, proxied):  # noqa: F811
    """The first GET of the base, DQM and AES shards are held at the proxy: all three arrive while none is
    answered (read one after another, only the base's would). Released, the shard merges as a plain read does."""
    setup = build(tmp_path, s3_root, shards=3)
    names = ("base", "dqm", "aes")
    wanted = {setup.prefixes[name][len("s3://"):] + REL[0] for name in names}
    hold = Hold(lambda op, path, client: op == "GetObject" and path.split("?")[0].lstrip("/") in wanted)
    proxied(hold=hold)
    job = Job(load_pipeline(str(setup.pipeline)), setup.output)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(stats=merged(job, REL[0], listed_inputs(setup))))
    worker.start()
    try:
        assert hold.wait_held(len(names), timeout=60), f"in flight at once: {hold.held}"
    finally:
        hold.release.set()
        worker.join(120)
    assert result["stats"].rows == read_table(setup.prefixes["base"] + REL[0]).num_rows
    assert sum(ahead.waiting("s3://" + path) for path in wanted) == 0  # every input fetched was taken
    plain = Job(load_pipeline(str(setup.pipeline)), setup.root + "plain/", fetch_ahead=False)
    kernel.merge_shard(plain, REL[0])
    assert read_table(setup.output + REL[0]).equals(read_table(setup.root + "plain/" + REL[0]))


def test_a_large_object_comes_as_its_tail_then_parallel_parts_of_the_wanted_columns(
        tmp_path, s3_root, proxied, monkeypatch):  # noqa: F811
    """Objects above ahead.TAIL: one GET of the tail (footer), then the wanted columns' chunks in parts of at
    most ahead.PART, never a byte asked twice and nothing outside the wanted columns; the table read from
    memory equals a plain read."""
    monkeypatch.setattr(ahead, "TAIL", ahead.FOOTER_READ)
    monkeypatch.setattr(ahead, "PART", 8 * 1024)
    monkeypatch.setattr(ahead, "GAP", 0)
    rows = 20_000
    table = pa.table({"k": [f"key-{i:06d}" for i in range(rows)],
                      "image": pa.array([os.urandom(64) for _ in range(rows)], pa.binary()),
                      "score": pa.array(range(rows), pa.float64())})
    uri = s3_root + "big/part-0.parquet"
    storage.write_atomic(table, uri, row_group_size=5_000)
    size, identity = storage.list_prefix(s3_root + "big/").shards["part-0.parquet"], \
        storage.list_prefix(s3_root + "big/").ids["part-0.parquet"]
    assert size > 4 * ahead.PART
    proxy = proxied()
    not_image = lambda column: column != "image"  # noqa: E731
    with storage.listed({uri: identity}):
        storage.fetch_ahead(uri, not_image)
        with storage.open_parquet(uri) as f:
            assert isinstance(f, ahead.Fetched)
            got = pq.ParquetFile(f).read(columns=["k", "score"])
            assert storage.file_identity(uri, f) == identity
    assert got.equals(table.select(["k", "score"]))
    ranges = [rng for op, path, rng, _ in proxy.log if op == "GetObject"]
    spans = sorted(tuple(int(x) for x in r.split("=")[1].split("-")) for r in ranges)
    assert spans[-1][1] == size - 1 and spans[-1][0] == size - ahead.FOOTER_READ  # the tail first...
    assert len(spans) > 2, spans  # ...then parts
    assert all(end - start + 1 <= ahead.PART for start, end in spans[:-1]), spans
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), "a byte asked twice"
    meta = storage.read_footer(uri)
    chunks = [meta.row_group(g).column(1) for g in range(meta.num_row_groups)]  # the image column's
    starts = [min(o for o in (c.dictionary_page_offset, c.data_page_offset) if o) for c in chunks]
    image = [(start, start + c.total_compressed_size) for start, c in zip(starts, chunks)]
    fetched = sum(end - start + 1 for start, end in spans)
    assert fetched < size - sum(e - s for s, e in image[:-1]), "the image column was fetched"
    for start, end in spans[:-1]:
        assert not any(s <= start < e for s, e in image), (start, image)


def test_what_was_not_fetched_is_read_then_and_a_failed_fetch_reads_as_usual(tmp_path, caplog):
    data = bytes(range(256)) * 4
    asked = []

    def read_range(start, end):
        asked.append((start, end))
        return data[start:end]

    f = ahead.Fetched(len(data), {}, [(0, data[:100]), (100, data[100:200]), (600, data[600:])], read_range)
    f.seek(50)
    assert bytes(f.read(120)) == data[50:170] and asked == []  # across two ranges: no request
    f.seek(650)
    assert bytes(f.read()) == data[650:] and asked == []
    f.seek(150)
    assert bytes(f.read(100)) == data[150:250] and asked == [(150, 250)]  # a hole: read then
    f.seek(-4, 2)
    assert f.tell() == len(data) - 4

    def failing(start, end):
        raise ConnectionError("injected")

    ahead.fetch("s3://x/y.parquet", "size=10;etag=e", 10, {}, lambda c: True, failing)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=ahead.__name__):
        assert ahead.take("s3://x/y.parquet", "size=10;etag=e") is None  # open_parquet then reads as usual
    assert [r.getMessage() for r in caplog.records] == [("fetching s3://x/y.parquet ahead failed (injected): "
                                                         "reading it now")]
    assert ahead.waiting() == 0


def test_reads_through_a_wanted_span_that_was_not_fetched_make_one_get_a_read_on(monkeypatch):
    """Beyond what was fetched, a read inside a wanted span reads on READ_ON bytes (to the span's end at most)
    and the reads that follow come from it: reading a span in file order costs one GET per READ_ON, not one a
    read; a read outside every span is asked for exactly."""
    monkeypatch.setattr(ahead, "READ_ON", 100)
    data = bytes(range(256)) * 8
    asked: list = []
    f = ahead.Fetched(len(data), {}, [(1900, data[1900:])], recorded(data, asked), spans=[(200, 650), (1000, 1900)])
    got = b""
    for start in range(200, 650, 10):  # 45 reads of 10 bytes through the first span
        f.seek(start)
        got += bytes(f.read(10))
    assert got == data[200:650] and asked == [(200, 300), (300, 400), (400, 500), (500, 600), (600, 650)]
    del asked[:]
    f.seek(700)
    assert bytes(f.read(10)) == data[700:710] and asked == [(700, 710)]  # between spans: exactly
    f.seek(1850)
    assert bytes(f.read(100)) == data[1850:1950] and asked[1:] == [(1850, 1950)]  # across a hole: exactly
    f.seek(1000)
    assert bytes(f.read(250)) == data[1000:1250] and asked[2:] == [(1000, 1250)]  # larger than READ_ON: exactly


def test_a_fetched_object_reads_like_a_file_from_its_start_to_its_end(caplog):
    """From its first byte (before any seek), position kept across reads, read(0) and a read at the end give
    nothing; a read within one range is a view of the bytes fetched (no copy), one across two is joined, and
    one running past the last range fetched asks for the whole of it then (said at debug level)."""
    data = bytes(range(256)) * 4
    first, second = data[:100], data[100:200]
    asked = []

    def read_range(start, end):
        asked.append((start, end))
        return data[start:end]

    f = ahead.Fetched(len(data), {}, [(100, second), (0, first)], read_range)
    assert bytes(f.read(10)) == data[:10] and f.tell() == 10
    assert bytes(f.read(0)) == b"" and f.tell() == 10
    whole = f.read(90)  # up to the exact end of the first range
    assert isinstance(whole, memoryview) and whole.obj is first and bytes(whole) == data[10:100]
    assert f.read(60) == data[100:160] and f.tell() == 160 and asked == []
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=ahead.__name__):
        assert bytes(f.read(100)) == data[160:260] and asked == [(160, 260)]
    assert [r.getMessage() for r in caplog.records] == ["read of bytes 160-260 was not fetched ahead"]
    f.seek(0, 2)
    assert bytes(f.read()) == b"" and bytes(f.read(5)) == b"" and f.tell() == len(data)


def test_objects_that_fill_the_budget_exactly_are_all_fetched_and_an_empty_one_never(monkeypatch):
    monkeypatch.setattr(ahead, "BUDGET", 100)
    asked = []

    def read_range(start, end):
        asked.append((start, end))
        return b"x" * (end - start)

    ahead.fetch("s3://b/empty.parquet", "e", 0, {}, lambda c: True, read_range)
    assert ahead.waiting() == 0
    ahead.fetch("s3://b/one.parquet", "o", 1, {}, lambda c: True, read_range)
    ahead.fetch("s3://b/rest.parquet", "r", 99, {}, lambda c: True, read_range)
    assert ahead.waiting("s3://b/one.parquet") == ahead.waiting("s3://b/rest.parquet") == 1
    assert bytes(ahead.take("s3://b/one.parquet", "o").read()) == b"x"
    assert ahead.take("s3://b/rest.parquet", "r").size == 99
    ahead.fetch("s3://b/all.parquet", "a", 100, {}, lambda c: True, read_range)
    assert ahead.take("s3://b/all.parquet", "a").size == 100
    assert sorted(asked) == [(0, 1), (0, 99), (0, 100)]


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=100)
    return sink.getvalue().to_pybytes()


def recorded(data: bytes, asked: list):
    def read_range(start, end):
        asked.append((start, end))
        return data[start:end]
    return read_range


def chunk_ranges(meta: pq.FileMetaData, column: str) -> list[tuple[int, int]]:
    """(start, end) of every chunk of the leaves of a top-level column, in file order."""
    out = []
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            col = meta.row_group(g).column(c)
            if col.path_in_schema.split(".")[0] == column:
                start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
                out.append((start, start + col.total_compressed_size))
    return out


@pytest.mark.parametrize("tail", ["shorter than the footer", "exactly the footer", "from a wanted chunk"])
def test_a_footer_beyond_the_tail_is_fetched_before_the_wanted_columns(monkeypatch, tail):
    """The tail first; a footer longer than it, the rest of the footer in one more GET (none when the tail
    holds exactly the footer); then the chunks of the wanted (nested) column before the tail, in one span
    across gaps under GAP. The wanted column then reads from memory alone, another one through a GET then."""
    columns = {f"c{i}": pa.array(range(2000), pa.int64()) for i in range(100)}
    columns["s"] = pa.StructArray.from_arrays([pa.array(range(2000)), pa.array([f"v{i}" for i in range(2000)])],
                                              ["x", "y"])
    table = pa.table(columns)
    data = parquet_bytes(table)
    size, footer = len(data), int.from_bytes(data[-8:-4], "little") + 8
    assert footer > ahead.FOOTER_READ  # pyarrow's first read of a footer never holds all of this one
    wanted = chunk_ranges(pq.read_metadata(pa.BufferReader(data)), "s")
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(wanted)]
    monkeypatch.setattr(ahead, "GAP", max(gaps) + 1)
    assert wanted[-1][0] + wanted[-2][1] > ahead.GAP  # far into the object: a gap is not an offset
    length = {"shorter than the footer": ahead.FOOTER_READ, "exactly the footer": footer,
              "from a wanted chunk": size - wanted[-2][0]}[tail]  # the last row group's s.x: nothing of it
    monkeypatch.setattr(ahead, "TAIL", length)
    asked: list = []
    fetched = ahead._fetch(size, {}, lambda c: c == "s", recorded(data, asked), ahead._pools()[1])
    tail_start = size - length
    assert asked[0] == (tail_start, size)
    extended = footer > length
    if extended:
        assert asked[1] == (size - footer, tail_start)
    before_tail = [(s, e) for s, e in wanted if s < tail_start]
    assert asked[1 + extended:] == [(before_tail[0][0], before_tail[-1][1])]
    del asked[:]
    assert pq.ParquetFile(fetched).read(columns=["s"]).equals(table.select(["s"])) and asked == []
    assert pq.ParquetFile(fetched).read(columns=["c5"]).equals(table.select(["c5"])) and asked
    monkeypatch.setattr(ahead, "GAP", max(gaps))  # a gap of exactly GAP is not bridged
    spans = ahead._spans(pq.read_metadata(pa.BufferReader(data)), lambda c: c == "s", size)
    assert len(spans) == 1 + gaps.count(max(gaps)) > 1
    assert spans[0][0] == wanted[0][0] and spans[-1][1] == wanted[-1][1]


@pytest.mark.parametrize("parts", [0, 1, 2.5, 1000], ids=lambda p: f"{p} parts")
def test_a_limited_fetch_holds_its_tail_and_the_first_wanted_bytes_that_fit(monkeypatch, parts):
    """A fetch bounded by `limit` asks for the tail, then the wanted chunks in file order until the limit (the
    last part cut to fit), holds no more, and answers every other read then: the table reads as a plain read."""
    monkeypatch.setattr(ahead, "TAIL", ahead.FOOTER_READ)
    monkeypatch.setattr(ahead, "PART", 8 * 1024)
    table = pa.table({f"c{i}": pa.array(range(20_000), pa.int64()) for i in range(4)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=5_000)  # a footer within the tail
    data = sink.getvalue().to_pybytes()
    size = len(data)
    asked: list = []
    limit = ahead.FOOTER_READ + int(parts * ahead.PART)
    held = ahead.fetch("s3://b/limited.parquet", "limited", size, {}, lambda c: True, recorded(data, asked), limit)
    fetched = ahead.take("s3://b/limited.parquet", "limited")
    assert held == min(size, limit) and size > 4 * ahead.PART + ahead.FOOTER_READ
    assert asked[0] == (size - ahead.FOOTER_READ, size)
    body = sorted(asked[1:])
    assert sum(e - s for s, e in asked) <= held == min(size, limit)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(body)), "a byte asked twice"
    if body:  # the first wanted bytes, from the first chunk on, with no hole
        assert body[0][0] == chunk_ranges(pq.read_metadata(pa.BufferReader(data)), "c0")[0][0]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(body))
    del asked[:]
    assert pq.ParquetFile(fetched).read().equals(table)
    assert bool(asked) == (limit < size), "what did not fit is read when asked for, and only that"
    assert ahead.fetch("s3://b/small.parquet", "small", size, {}, lambda c: True, recorded(data, []),
                       ahead.FOOTER_READ - 1) == 0  # no room for the tail: not fetched at all
    assert ahead.waiting() == 0


def test_a_shards_inputs_share_its_window_budget_siblings_first(tmp_path, s3_root, monkeypatch):
    """fetch_inputs_ahead gives the siblings their fetch first and the base what is left of the job's window
    budget: the bytes the shard's fetches may hold never exceed it, and the shard merges as a plain read does."""
    monkeypatch.setattr(ahead, "TAIL", ahead.FOOTER_READ)
    setup = build(tmp_path, s3_root, shards=3, rows=20_000)  # a base beyond a tail
    listed = listed_inputs(setup)
    sizes = {uri: int(ident.split(";")[0].split("=")[1]) for uri, ident in listed.items()}
    base = setup.prefixes["base"] + REL[0]
    calls: list = []
    real = storage.fetch_ahead

    def fetch_ahead(uri, wanted, limit=None):
        calls.append((uri, limit, real(uri, wanted, limit)))
        return calls[-1][2]

    monkeypatch.setattr(storage, "fetch_ahead", fetch_ahead)
    job = Job(load_pipeline(str(setup.pipeline)), setup.output)
    order = [uri for uri, _ in kernel.input_reads(job, REL[0])][::-1]  # the last step's sibling first
    siblings = order[:-1]
    assert order[-1] == base and len(siblings) >= 2
    budget = sum(sizes[uri] for uri in siblings) + sizes[base] // 2  # the base does not fit whole
    job = Job(load_pipeline(str(setup.pipeline)), setup.output, window_bytes=budget)
    stats = merged(job, REL[0], listed)
    assert [uri for uri, _, _ in calls] == order
    assert [held for _, _, held in calls] == [sizes[uri] for uri in siblings] + [sizes[base] // 2]
    assert sum(held for _, _, held in calls) == budget
    assert stats.rows == read_table(base).num_rows
    plain = Job(load_pipeline(str(setup.pipeline)), setup.root + "plain/", fetch_ahead=False)
    kernel.merge_shard(plain, REL[0])
    assert read_table(setup.output + REL[0]).equals(read_table(setup.root + "plain/" + REL[0]))


@pytest.mark.parametrize("footer, magic", [(10, b"PAR2"), (ahead.FOOTER_READ * 2 + 1, b"PAR1"),
                                           (ahead.FOOTER_READ * 2 - 3, b"PAR1")],
                         ids=["another magic", "a footer longer than the object", "no room for the leading magic"])
def test_an_object_that_is_no_parquet_file_is_not_fetched_beyond_its_tail(monkeypatch, caplog, footer, magic):
    """Not a parquet file by its last 8 bytes: another magic, or a footer length that leaves no room for the
    footer and the leading magic (the object holds 2 * FOOTER_READ bytes besides its last 8)."""
    monkeypatch.setattr(ahead, "TAIL", ahead.FOOTER_READ)
    data = os.urandom(2 * ahead.FOOTER_READ) + footer.to_bytes(4, "little") + magic
    asked: list = []
    ahead.fetch("s3://b/x.parquet", "x", len(data), {}, lambda c: True, recorded(data, asked))
    with caplog.at_level(logging.DEBUG, logger=ahead.__name__):
        assert ahead.take("s3://b/x.parquet", "x") is None
    assert asked == [(len(data) - ahead.FOOTER_READ, len(data))]
    assert [r.getMessage() for r in caplog.records] == [
        "fetching s3://b/x.parquet ahead failed (not a parquet file): reading it now"]


def test_a_parquet_file_that_is_all_footer_is_fetched(monkeypatch):
    """A table of no columns is the leading magic then its footer (here a large one, metadata beyond the tail):
    the smallest parquet file for its footer, whose length leaves exactly room for the magic. It is fetched,
    its footer beyond the tail, and reads from memory."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({}).replace_schema_metadata({"note": "x" * ahead.FOOTER_READ}), sink)
    data = sink.getvalue().to_pybytes()
    assert int.from_bytes(data[-8:-4], "little") + 8 + 4 == len(data) > ahead.FOOTER_READ
    monkeypatch.setattr(ahead, "TAIL", ahead.FOOTER_READ)
    asked: list = []
    ahead.fetch("s3://b/empty.parquet", "e", len(data), {}, lambda c: True, recorded(data, asked))
    fetched = ahead.take("s3://b/empty.parquet", "e")
    tail_start = len(data) - ahead.FOOTER_READ
    assert asked == [(tail_start, len(data)), (4, tail_start)]
    assert fetched is not None and pq.ParquetFile(fetched).schema_arrow.metadata[b"note"] == b"x" * ahead.FOOTER_READ


def test_the_byte_budget_drops_the_oldest_and_never_fetches_what_exceeds_it(monkeypatch):
    monkeypatch.setattr(ahead, "BUDGET", 100)
    gate = threading.Event()

    def read_range(start, end):
        gate.wait(30)
        return b"x" * (end - start)

    ahead.fetch("s3://b/big.parquet", "big", 101, {}, lambda c: True, read_range)
    assert ahead.waiting() == 0
    for name in ("a", "b", "c"):
        ahead.fetch(f"s3://b/{name}.parquet", name, 40, {}, lambda c: True, read_range)
    assert ahead.waiting() == 2 and ahead.waiting("s3://b/a.parquet") == 0  # a was dropped to make room for c
    assert ahead.waiting("s3://b/b.parquet") == ahead.waiting("s3://b/c.parquet") == 1
    gate.set()
    assert ahead.take("s3://b/a.parquet", "a") is None
    assert ahead.take("s3://b/b.parquet", "b").size == 40
    assert ahead.take("s3://b/c.parquet", "c").size == 40
    assert ahead.waiting() == 0


@pytest.mark.parametrize("sizes", [(30, 30, 30, 90), (60, 50), (50, 50, 1), (99, 1, 100), (1, 1, 1, 1, 97, 3)],
                         ids=lambda s: "-".join(map(str, s)))
def test_the_bytes_held_never_exceed_the_budget_after_any_fetch(monkeypatch, sizes):
    """After every fetch (the only call that adds to the table) the bytes held are at most the budget, and the
    object just asked for is among them: the budget is spent on the newest, evicting as many of the oldest as
    it takes (one eviction is not always enough: 30+30+30, then 90), never more (a budget filled exactly)."""
    monkeypatch.setattr(ahead, "BUDGET", 100)
    gate = threading.Event()  # the fetches stay in flight: held bytes are counted from the start

    def read_range(start, end):
        gate.wait(30)
        return b"x" * (end - start)

    seen, order = [], []
    try:
        for i, size in enumerate(sizes):
            uri = f"s3://b/{i}.parquet"
            ahead.fetch(uri, str(i), size, {}, lambda c: True, read_range)
            order.append((uri, size))
            seen.append(ahead.held())
            assert ahead.waiting(uri) == 1, f"the newest object ({size} bytes) was not kept"
            kept, total = 0, 0  # what the budget keeps: the newest objects that fit, and no fewer
            for _, s in reversed(order):
                if total + s > 100:
                    break
                kept, total = kept + 1, total + s
            assert ahead.waiting() == kept and ahead.held() == total, (sizes[: i + 1], ahead.waiting())
        assert max(seen) <= 100, seen
    finally:
        gate.set()
        for i in range(len(sizes)):
            ahead.drop(f"s3://b/{i}.parquet")
    assert ahead.held() == 0


def test_backends_without_round_trips_fetch_nothing(tmp_path):
    """Local files are memory-mapped: fetching ahead would only copy them."""
    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"k": ["a"]}), path)
    with storage.listed({path: storage.file_identity(path)}):
        storage.fetch_ahead(path, lambda c: True)
    assert ahead.waiting() == 0


def test_a_shard_failing_before_its_last_sibling_releases_what_was_fetched_for_it(tmp_path, s3_root, monkeypatch):
    setup = build(tmp_path, s3_root, shards=3)
    job = Job(load_pipeline(str(setup.pipeline)), setup.output)

    def refuse(self, *args, **kwargs):
        raise ShardError("injected: the first operation fails")

    monkeypatch.setattr(MergeFromSidecar, "stream", refuse)
    with pytest.raises(ShardError, match="injected"):
        merged(job, REL[0], listed_inputs(setup))
    later = [setup.prefixes[name] + REL[0] for name in ("dqm", "aes", "watermark")]
    assert sum(map(ahead.waiting, later)) == 0


@pytest.mark.parametrize("use_ray, fused, ahead_", [(False, False, True), (False, True, True), (True, True, True),
                                                    (True, False, False)])
def test_only_steps_sharing_a_process_fetch_ahead(use_ray, fused, ahead_):
    """Ray's chain mode may run a shard's steps on different nodes: a first step fetching its siblings would
    fetch them for nobody."""
    from flows.merge import steps_share_a_process
    from flows.runconfig import RunConfig, RunnerChoice

    config = RunConfig(None, "", "", runner=RunnerChoice(use_ray=use_ray), fuse_operations=fused)
    assert steps_share_a_process(config) is ahead_


@pytest.fixture(autouse=True)
def nothing_waiting():
    """Every test starts and ends with nothing fetched ahead (other modules' failed shards may leave some)."""
    def forget_all():
        with ahead._lock:
            uris = {uri for uri, _ in ahead._waiting}
        storage.forget_ahead(uris)

    forget_all()
    yield
    forget_all()
