"""Issue 18, seen case 11: a source's identity is never newer than the data read from it, on every backend.

A resumed run trusts an output whose recorded input identities equal the current listing's. If a task recorded
the identity of a version it did not read (the file was replaced between opening it and taking the identity),
the next run would trust an output made from other data. Two tests:

- deterministic, per backend: the source is replaced exactly between the open and the identity (a wrapper
  around `storage.open_parquet`), then `apply_operation` reads it. Local disk and memory must record the identity of
  the version they read; S3 pins its ranged GETs to the ETag of the HEAD made at open, so the read fails (a
  transient error the task retries) instead of mixing versions.
- a flipping writer (local disk, a thread, < 5 s): the source flips between versions A and B while the reader
  reads; every read's identity must name the version its data came from. Timing decides only whether the
  unfixed code is caught, never whether the fixed code passes.
"""
from __future__ import annotations

import os
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from core_fixtures import build, read_table
from test_storage_backends import memory_root  # noqa: F401 - fixture

from tasks import kernel, storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ShardError
from tasks.kernel import Job

REL = relpaths(1)[0]
COLUMN = "dqm_d1_v6_1"
MTIME0 = 1_600_000_000 * 10**9  # local versions get mtime_ns = MTIME0 + generation: identity -> generation


def version_table(table: pa.Table, label: str) -> pa.Table:
    """The dqm sibling with its `model` field set to `label`: the data says which version was read."""
    col = table.column(COLUMN).combine_chunks()
    fields = [col.field(i) for i in range(col.type.num_fields)]
    names = [f.name for f in col.type]
    fields[names.index("model")] = pa.array([label] * len(table), pa.string())
    struct = pa.StructArray.from_arrays(fields, names=names)
    return table.set_column(table.schema.get_field_index(COLUMN), COLUMN, struct)


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def label_read(state) -> str:
    """The version label the merged table carries (every row the same)."""
    labels = set(pc.struct_field(state.table.column(COLUMN), "model").to_pylist())
    assert len(labels) == 1, labels
    return labels.pop()


class Versions:
    """Publishes the sibling as version A or B (alternating) and remembers which identity each write got."""

    def __init__(self, uri: str):
        self.uri, self.generation, self.label_of = uri, 0, {}
        original = read_table(uri).replace_schema_metadata(None)
        self.payload = {label: parquet_bytes(version_table(original, label)) for label in ("A", "B")}

    def publish(self) -> str:
        self.generation += 1
        label = "AB"[self.generation % 2]
        if storage.backend(self.uri).name == "local":
            replace_local(self.uri, self.payload[label], self.generation)
        else:
            storage.backend(self.uri).put(self.uri, self.payload[label])
        identity = storage.file_identity(self.uri)  # nobody else writes here: by path is exact
        self.label_of[identity] = label
        return label


def replace_local(path: str, data: bytes, generation: int) -> None:
    temp = f"{path}.flip-{generation}"
    with open(temp, "wb") as f:
        f.write(data)
    os.utime(temp, ns=(MTIME0 + generation, MTIME0 + generation))  # a distinct identity per write
    os.replace(temp, path)


@pytest.fixture(params=["local", "memory", "s3"])
def backend_root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "data") + "/"
    return request.getfixturevalue("memory_root" if request.param == "memory" else "s3_root")


def test_replace_between_open_and_identity_never_records_the_newer_identity(tmp_path, backend_root, monkeypatch):
    setup = build(tmp_path, backend_root, shards=1, watermark_gap=False)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    uri = setup.prefixes["dqm"] + REL
    versions = Versions(uri)
    assert versions.publish() == "B"
    state = kernel.read_base(job, REL)

    real_open, replaced = storage.open_parquet, []

    def open_then_replace(target, size=None):
        opened = real_open(target, size)
        if target == uri and not replaced:
            replaced.append(versions.publish())  # the fault point: after the open, before the identity
        return opened

    monkeypatch.setattr(storage, "open_parquet", open_then_replace)
    if storage.is_s3(uri):
        with pytest.raises(ShardError) as failed:  # reads pinned to the ETag seen at open
            kernel.apply_operation(job, REL, 0, state)
        assert failed.value.transient, failed.value
        return
    after = kernel.apply_operation(job, REL, 0, state)
    assert replaced == ["A"]
    identity = after.provenance_ops[-1]["input"]
    assert versions.label_of[identity] == label_read(after) == "B", "the identity names the version read"


def test_s3_file_opened_with_a_listed_size_is_pinned_when_its_identity_is_taken(tmp_path, s3_root):
    """A file opened with its listed size has made no HEAD: taking its identity makes one and pins the reads
    that follow to that ETag, so the data can never be of a later version than the identity."""
    setup = build(tmp_path, s3_root, shards=1, watermark_gap=False)
    uri = setup.prefixes["dqm"] + REL
    versions = Versions(uri)
    versions.publish()
    size = storage.list_prefix(setup.prefixes["dqm"]).shards[REL]
    with storage.open_parquet(uri, size) as f:
        identity = storage.file_identity(uri, f)
        versions.publish()
        with pytest.raises(OSError):
            pq.ParquetFile(f).read()
    assert versions.label_of[identity] == "B"


def test_flipping_writer_never_gives_an_identity_newer_than_the_data(tmp_path):
    """Local disk, a writer thread replacing the source A <-> B as fast as it can while the reader reads."""
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=1, rows=8, watermark_gap=False)
    uri = setup.prefixes["dqm"] + REL
    versions = Versions(uri)
    label_of_generation = {}
    stop, started = threading.Event(), threading.Event()

    def flip() -> None:
        generation = 0
        while not stop.is_set():
            generation += 1
            label = "AB"[generation % 2]
            label_of_generation[MTIME0 + generation] = label
            replace_local(uri, versions.payload[label], generation)
            started.set()
        started.set()

    writer = threading.Thread(target=flip, daemon=True)
    writer.start()
    started.wait()
    mismatches, reads = [], 0
    try:
        for _ in range(1500):
            with storage.open_parquet(uri) as f:
                identity = storage.file_identity(uri, f)
                table = pq.ParquetFile(f).read(columns=[COLUMN])
            reads += 1
            mtime_ns = int(identity.rsplit("mtime_ns=", 1)[1])
            label = set(pc.struct_field(table.column(COLUMN), "model").to_pylist()).pop()
            if label_of_generation[mtime_ns] != label:
                mismatches.append((identity, label))
    finally:
        stop.set()
        writer.join()
    assert not mismatches, f"{len(mismatches)} of {reads} reads recorded another version's identity"
