"""Inputs on a storage with no backend of its own (tasks/storage/generic.py and the defaults of
tasks/storage/backend.py), read through fsspec alone: here plain HTTP (fsspec's `http` protocol), the objects
served by the moto server through tests/faultproxy.py, which logs every request."""
from __future__ import annotations

import uuid

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import objects
from faultproxy import FaultProxy

from tasks import storage
from tasks.storage.generic import GenericBackend

REL = "shard/part-0.parquet"


class HttpObject:
    """One public object on moto, read as http://<proxy>/<bucket>/<key>."""

    def __init__(self, s3_root: str, moto_endpoint: str, proxy: FaultProxy):
        self.s3 = boto3.client("s3", endpoint_url=moto_endpoint)
        self.bucket, self.proxy = s3_root[len("s3://"):].rstrip("/"), proxy
        self.uri = f"{proxy.url}/{self.bucket}/{REL}"

    def put(self, values: list[int]) -> int:
        """Store a parquet file of `values`; returns its size."""
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"k": pa.array(values, pa.int64())}), sink)
        body = sink.getvalue().to_pybytes()
        self.s3.put_object(Bucket=self.bucket, Key=REL, Body=body, ACL="public-read")
        return len(body)

    def requests(self) -> int:
        return len(self.proxy.log)


@pytest.fixture
def http_object(s3_root, moto_endpoint):
    with FaultProxy(moto_endpoint, rate=0.0) as proxy:
        yield HttpObject(s3_root, moto_endpoint, proxy)


def read_k(f) -> list[int]:
    return pq.ParquetFile(f).read().column("k").to_pylist()


def test_a_generic_input_records_the_identity_of_the_version_opened(http_object):
    """The info is taken before the open and carried by the file: its size and identity cost no request, and
    an object replaced since the open keeps the identity of the version opened (never a newer one)."""
    uri = http_object.uri
    assert isinstance(storage.backend(uri), GenericBackend)
    size = http_object.put(list(range(50)))
    first = storage.file_identity(uri)
    assert first.startswith(f"size={size};ETag=")
    with storage.open_parquet(uri) as f:
        assert read_k(f) == list(range(50))
        before = http_object.requests()
        assert storage.file_size(uri, f) == size
        newer_size = http_object.put(list(range(100, 150)))
        after_put = http_object.requests()
        assert storage.file_identity(uri, f) == first
        assert http_object.requests() == after_put == before, "the open file answers without a request"
    newer = storage.file_identity(uri)
    assert newer != first and newer.startswith(f"size={newer_size};ETag=")


def test_a_generic_handle_without_a_size_asks_the_store(http_object):
    """A streamed HTTP file does not know its size: file_size asks the store (a HEAD)."""
    size = http_object.put(list(range(50)))
    fs, path = storage.filesystem(http_object.uri)
    with fs.open(path, "rb", block_size=0) as stream:
        assert stream.size is None
        before = http_object.requests()
        assert storage.file_size(http_object.uri, stream) == size
        assert http_object.requests() == before + 1


def test_a_listed_generic_input_is_opened_as_usual(http_object):
    """Under `listed`, a generic input (no pinned reads, no fetch ahead) is opened like any other read."""
    uri = http_object.uri
    http_object.put(list(range(50)))
    identity = storage.file_identity(uri)
    with storage.listed({uri: identity}):
        storage.fetch_ahead(uri, lambda column: True)  # nothing to overlap: the default does nothing
        with storage.open_parquet(uri) as f:
            assert read_k(f) == list(range(50))
            assert storage.file_identity(uri, f) == identity


def test_nothing_to_sweep_in_memory():
    """A memory:// output never has a killed writer's leftovers (a write is one store update): the sweep finds
    nothing and removes nothing."""
    root = f"memory://sweep-test-{uuid.uuid4().hex[:12]}/"
    storage.write_atomic(pa.table({"k": [1, 2]}), root + REL)
    storage.write_text(root + "report.json", "{}")
    assert storage.sweep_stale(root, older_than_seconds=0) == 0
    assert objects(root) == ["report.json", REL]
    fs, path = storage.filesystem(root)
    fs.rm(path, recursive=True)
