"""Multipart uploads among several writers (issue 26), on moto behind tests/faultproxy.py, which reports the
time each upload really started (`Initiated`; moto's own is frozen in 2010):

- a writer only ever aborts its own upload: a retried CreateMultipartUpload never takes another writer's;
- an upload someone else aborted fails its write transiently (retried), never for good;
- a run's start-up sweep leaves a concurrent run's in-flight upload alone;
- `abandon_writes()` takes back every write in flight (no temp file, no upload) and fails those writers.

Every pause is a held request or an event, never a sleep.
"""
from __future__ import annotations

import itertools
import os
import threading

import boto3
import pyarrow as pa
import pytest
from core_fixtures import build, objects, read_table
from faultproxy import Hold, proxied  # noqa: F401 (a fixture)
from reliability_fixtures import allow_small_parts, pending_uploads
from test_flow_local import summary_counts

from tasks import kernel, storage
from tasks.demo import relpaths
from tasks.storage import s3 as s3_backend

DEADLINE = 60  # seconds: a failure deadline, never a pause
REL = relpaths(2)


@pytest.fixture
def small_parts(monkeypatch):
    """Outputs above 16 KB go up as multipart uploads of 8 KB parts (moto told to accept such parts)."""
    allow_small_parts(monkeypatch)
    monkeypatch.setattr(s3_backend, "MULTIPART_THRESHOLD", 16 * 1024)
    monkeypatch.setattr(s3_backend, "PART_SIZE", 8 * 1024)


def blobs(tag: str, rows: int = 4000) -> pa.Table:
    """~80 KB of parquet that does not compress: each half is above the multipart threshold."""
    return pa.table({"k": [f"{tag}-{i}" for i in range(rows)],
                     "blob": pa.array([os.urandom(16) for _ in range(rows)], pa.binary())})


def upload_ids(moto_endpoint: str, root: str) -> list[str]:
    return sorted(u["UploadId"] for u in pending_uploads(moto_endpoint, root))


class HeldWrite:
    """`storage.write_windows` of `table` in a worker thread, stopped after its first half went to the store
    (`first_in` set) until `go` is set; `finish()` lets it go on and returns what it raised (or None)."""

    def __init__(self, table: pa.Table, uri: str):
        self.first_in, self.go = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        half = table.num_rows // 2

        def windows():
            yield table.slice(0, half)
            self.first_in.set()  # the writer asks for the next window: the first one is written
            self.go.wait(DEADLINE)
            yield table.slice(half)

        self.thread = threading.Thread(target=self._write, args=(windows(), uri), name="held-write")
        self.thread.start()
        assert self.first_in.wait(DEADLINE), "the held write never wrote its first half"

    def _write(self, windows, uri: str) -> None:
        try:
            storage.write_windows(windows, uri)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> BaseException | None:
        self.go.set()
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive()
        return self.error


@pytest.fixture
def held():
    """`held(table, uri)` starts a HeldWrite; each is let go at teardown, so none outlives its test."""
    writes: list[HeldWrite] = []

    def start(table: pa.Table, uri: str) -> HeldWrite:
        writes.append(HeldWrite(table, uri))
        return writes[-1]

    yield start
    for write in writes:
        write.finish()


# ----------------------------------------------------------------- never abort what this process did not start

def test_a_retried_create_never_aborts_another_writers_upload(s3_root, moto_endpoint, small_parts,
                                                              proxied):  # noqa: F811
    """Writer B's first CreateMultipartUpload reaches the store but its reply is lost; B's retry is held at the
    proxy while writer A (another run writing the same shard) starts its upload; then B's retry goes on and B
    completes. A's upload survives and A's write completes (the object is A's, the last complete). The upload
    of B's lost reply is left pending, for the age-based sweep and the bucket's lifecycle rule."""
    uri = s3_root + "out/part-0.parquet"
    creates = itertools.count(1)
    hold = Hold(lambda op, path, client: op == "CreateMultipartUpload" and next(creates) == 2)
    lost = iter([True])
    proxy = proxied(rate=1.0, faults=("reset_after",), hold=hold,
                    applies=lambda op: op == "CreateMultipartUpload" and next(lost, False))
    a, b = blobs("a"), blobs("b")
    b_failed: list[BaseException] = []

    def write_b() -> None:
        try:
            storage.write_atomic(b, uri)
        except BaseException as exc:
            b_failed.append(exc)

    writer_b = threading.Thread(target=write_b, name="writer-b")
    writer_b.start()
    assert hold.arrived.wait(DEADLINE), "B's retried create never came"

    def a_windows():
        yield a.slice(0, 2000)  # A's upload is started and its first parts are in
        assert len(upload_ids(moto_endpoint, s3_root)) == 2  # B's lost one and A's (B's retry is held)
        hold.release.set()
        writer_b.join(DEADLINE)
        assert not writer_b.is_alive() and not b_failed, b_failed
        yield a.slice(2000)

    storage.write_windows(a_windows(), uri)
    assert read_table(uri).equals(a)
    assert proxy.stats[("reset_after", "CreateMultipartUpload")] == 1
    assert proxy.stats[("ok", "AbortMultipartUpload")] == 0
    assert upload_ids(moto_endpoint, s3_root) == sorted(proxy.unheard) and len(proxy.unheard) == 1


@pytest.mark.parametrize("aborted_before", ["upload_part", "complete_multipart_upload"])
def test_an_upload_someone_else_aborted_fails_the_write_transiently(s3_root, moto_endpoint, monkeypatch, small_parts,
                                                                  aborted_before, proxied):  # noqa: F811
    """Another party (a sweep, a lifecycle rule, an operator) aborts the upload before a part or before the
    completion: S3 answers NoSuchUpload (the proxy answers for moto, which fails with a 500), and the write fails
    with an error worth a retry, which succeeds."""
    uri = s3_root + "out/part-0.parquet"
    proxied()
    fs = storage._s3()
    real_call, aborted = fs.call_s3, []
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)

    def abort_first_upload(method, *args, **kw):
        if method == aborted_before and not aborted:
            s3.abort_multipart_upload(Bucket=kw["Bucket"], Key=kw["Key"], UploadId=kw["UploadId"])
            aborted.append(kw["UploadId"])
        return real_call(method, *args, **kw)

    monkeypatch.setattr(fs, "call_s3", abort_first_upload)
    table = blobs("t")
    with pytest.raises(s3_backend.UploadAborted, match=f"was aborted while it ran .NoSuchUpload on "
                                                       f"{aborted_before}") as info:
        storage.write_atomic(table, uri)
    assert aborted
    failure = kernel._fail(REL[0], f"writing {uri}", info.value)
    assert failure.transient, failure
    assert "NoSuchUpload" in str(failure)
    storage.write_atomic(table, uri)  # the retry
    assert read_table(uri).equals(table)
    assert pending_uploads(moto_endpoint, s3_root) == []


# ----------------------------------------------------------------- the sweep judges by the store's clock

def test_a_runs_start_up_sweep_never_touches_a_concurrent_runs_upload(tmp_path, s3_root, moto_endpoint, small_parts,
                                                                      held, run, proxied):  # noqa: F811
    """Writer A (another run writing a shard of the same output prefix) is mid-upload when a run starts and
    sweeps leftovers: A's upload is young by the store's clock and stays; A then completes."""
    setup = build(tmp_path, s3_root, shards=2)
    proxied()
    uri = setup.output + REL[0]
    a = blobs("a")
    writer_a = held(a, uri)
    assert len(pending_uploads(moto_endpoint, s3_root)) == 1
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0 and summary_counts(out) == (2, 2, 0, 0), out + err
    assert len(pending_uploads(moto_endpoint, s3_root)) == 1
    assert writer_a.finish() is None
    assert read_table(uri).equals(a)
    assert pending_uploads(moto_endpoint, s3_root) == []


# ----------------------------------------------------------------- abandoning the writes in flight

def leftovers(root: str, moto_endpoint: str | None) -> list[str]:
    """Temp files under a local root, pending uploads in an S3 root's bucket."""
    if storage.is_s3(root):
        return [u["Key"] for u in pending_uploads(moto_endpoint, root)]
    return [rel for rel in objects(root) if storage.TEMP_MARK in rel]


@pytest.mark.parametrize("where", ["local", "s3-multipart", "s3-one-put"])
def test_abandon_writes_takes_back_every_write_in_flight(tmp_path, request, held, where):
    """A writer is stopped half-way (a temp file, or a multipart upload with parts in, or bytes held for one
    PUT); abandon_writes() from this thread removes what it left and a second call finds nothing. Let go, the
    writer fails (WriteAbandoned): no object is published, nothing is left."""
    moto_endpoint = request.getfixturevalue("moto_endpoint") if where != "local" else None
    root = request.getfixturevalue("s3_root") if moto_endpoint else str(tmp_path / "data") + "/"
    if where == "s3-multipart":
        request.getfixturevalue("small_parts")
    uri = root + "out/part-0.parquet"
    writer = held(blobs("w"), uri)
    assert len(leftovers(root, moto_endpoint)) == (0 if where == "s3-one-put" else 1)
    assert storage.abandon_writes() == 1
    assert leftovers(root, moto_endpoint) == []
    assert storage.abandon_writes() == 0
    error = writer.finish()
    assert isinstance(error, storage.WriteAbandoned), repr(error)
    assert "abandoned (the process is stopping)" in str(error)
    assert objects(root + "out/") == []
    assert leftovers(root, moto_endpoint) == []
