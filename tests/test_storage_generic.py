"""Inputs on a storage with no backend of its own (tasks/storage/generic.py and the defaults of
tasks/storage/backend.py), read through fsspec alone: here plain HTTP (fsspec's `http` protocol), the objects
served by the moto server through tests/faultproxy.py, which logs every request."""
from __future__ import annotations

import os
import threading
import uuid
from datetime import datetime, timezone
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import objects
from faultproxy import FaultProxy

from tasks import storage
from tasks.storage import generic
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


# ----------------------------------------------------------------- which protocols are inputs, and their prefixes

def test_input_protocols_are_installed_storage_never_wrappers_or_local_files():
    generic.input_protocols.cache_clear()  # computed afresh here, not taken from an earlier test's call
    try:
        inputs = set(generic.input_protocols())
    finally:
        generic.input_protocols.cache_clear()
    assert {"http", "https", "ftp"} <= inputs
    wrappers = {"zip", "tar", "dir", "reference", "simplecache", "blockcache", "filecache", "cached", "data"}
    assert not inputs & (wrappers | {"s3", "s3a", "file", "local", "memory"})
    assert not inputs & {"gs", "gcs", "abfs", "az"}, "not installed here: not usable"
    assert [generic.usable(p) for p in ("http", "file", "local", "zip", "nosuch")] == [True] + [False] * 4


@pytest.mark.parametrize("uri, prefix", [
    ("ftp://host.example", "ftp://host.example/"),                 # a host's root
    ("ftp://host.example/Xdata/X", "ftp://host.example/Xdata/X/"),
    ("memory://", "memory://"),                                      # the store's root: every prefix is inside
    ("memory://Xscratch/X/", "memory://Xscratch/X/"),
])
def test_generic_prefixes_keep_every_character_of_the_path(uri, prefix):
    assert storage.normalize_prefix(uri) == prefix


def test_accepted_forms_without_other_input_protocols(monkeypatch):
    """Where no other fsspec implementation is installed, the list of accepted forms ends with memory://."""
    monkeypatch.setattr(generic, "input_protocols", lambda: ())
    assert storage.accepted() == "s3://bucket/path/, file:///abs/path/, or a local path, memory://path/"


def test_a_generic_backend_is_named_after_its_protocol():
    assert generic.backend_for("ftp").refusal() == "the 'ftp' storage cannot be written atomically"
    assert generic.backend_for("memory").refusal() is None


def test_a_memory_object_rewritten_during_every_read_fails_in_one_line(monkeypatch):
    """The copy is taken again until the info before and after it agree; an object rewritten during each of
    SNAPSHOT_ATTEMPTS copies is a (transient) OSError naming it."""
    uri = f"memory://snapshot-test-{uuid.uuid4().hex[:12]}/{REL}"
    storage.write_atomic(pa.table({"k": [1, 2]}), uri)
    fs, path = storage.filesystem(uri)
    real_cat, copies = fs.cat_file, []

    def cat_then_rewrite(target, *args, **kw):
        data = real_cat(target, *args, **kw)
        copies.append(target)
        fs.pipe_file(target, data + b"\0" * len(copies))  # a writer replaces the object while it is copied
        return data

    monkeypatch.setattr(fs, "cat_file", cat_then_rewrite)
    try:
        with pytest.raises(OSError) as failed:
            storage.open_parquet(uri)
        assert str(failed.value) == f"{uri} was rewritten during each of {generic.SNAPSHOT_ATTEMPTS} reads"
        assert len(copies) == generic.SNAPSHOT_ATTEMPTS
    finally:
        monkeypatch.undo()
        fs.rm(path.rsplit("/", 2)[0], recursive=True)


# ----------------------------------------------------------------- reports (write_text) wherever their URI says

@pytest.mark.parametrize("form", ["relative", "absolute", "file", "file-colon", "local", "s3"])
def test_a_report_is_written_where_its_uri_says(tmp_path, monkeypatch, request, form):
    """A local path as given (relative to the working folder; '#' is part of a file name, whereas in a URI it
    starts a fragment), a file:// or local:// URI by its path, an s3:// object with one PUT."""
    monkeypatch.chdir(tmp_path)
    name = "report#1.json" if form in ("relative", "absolute") else "report.json"
    if form == "s3":
        uri = request.getfixturevalue("s3_root") + "reports/" + name
    else:
        uri = {"relative": name, "absolute": str(tmp_path / name), "file": f"file://{tmp_path}/{name}",
               "file-colon": f"file://{tmp_path}/a://{name}", "local": f"local://{tmp_path}/{name}"}[form]
    if form == "file-colon":  # a folder named "a:" (the URI's scheme is its first "://")
        (tmp_path / "a:").mkdir()
        monkeypatch.chdir(tmp_path / "a:")
    storage.write_text(uri, '{"ok": true}\n')
    if form == "file-colon":
        assert os.listdir(tmp_path / "a:") == [name]
    elif form == "s3":
        fs, key = storage.filesystem(uri)
        assert fs.cat_file(key) == b'{"ok": true}\n'
    else:
        assert os.listdir(tmp_path) == [name]
        assert (tmp_path / name).read_text() == '{"ok": true}\n'


# ----------------------------------------------------------------- listings and identities of generic stores

def test_an_entry_identity_is_its_size_and_every_version_field_given():
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    entry = {"name": "x", "size": 12, "ETag": '"abc"', "md5": "", "generation": None, "mtime": when}
    assert storage.entry_identity(entry) == f"size=12;ETag=abc;mtime={when.timestamp()}"
    assert [storage.entry_identity(e) for e in ({}, {"size": None}, {"size": 0})] == ["size=0"] * 3


def test_the_listing_of_a_missing_prefix_names_it_and_says_it_does_not_exist(tmp_path):
    prefix = str(tmp_path / "never-made") + "/"
    listing = storage.list_prefix(prefix)
    assert listing == storage.Listing(prefix, {}, (), exists=False)
    assert listing.exists is False


def test_the_columns_worth_a_dictionary_are_the_leaves_by_dotted_path_but_keys_and_floats():
    schema = pa.schema([("id", pa.string()), ("label", pa.string()), ("score", pa.float32()),
                        ("dqm", pa.struct([("grade", pa.string()), ("raw", pa.float64()),
                                           ("meta", pa.struct([("model", pa.string())]))]))])
    assert storage.dictionary_columns(schema, plain=["id"]) == ["label", "dqm.grade", "dqm.meta.model"]


def test_no_window_at_all_is_refused_and_nothing_is_written(tmp_path):
    uri = str(tmp_path / "part-0.parquet")
    with pytest.raises(ValueError) as refused:
        storage.write_windows(iter(()), uri)
    assert str(refused.value) == f"nothing to write to {uri}: no window of rows, not even an empty one"
    assert list(tmp_path.iterdir()) == []


def test_an_unsafe_relpath_is_refused_with_what_to_do():
    with pytest.raises(ValueError) as refused:
        storage.check_relpath("a/../../b.parquet")
    assert str(refused.value) == ("unsafe shard path 'a/../../b.parquet': absolute, or with empty, '.' or '..' "
                                  "segments (it could escape its prefix); rename the object")


def test_a_size_given_opens_the_object_as_it_is_whatever_the_listing_said(tmp_path):
    """The caller that knows the size (the post-write check, of the output it just wrote) reads the object as it
    is now; a listing taken before (which had it absent) decides only for a caller without one."""
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"k": [1, 2]}), path)
    uri = str(path)
    with storage.listed({uri: storage.ABSENT}):
        with pytest.raises(FileNotFoundError, match="not in the listing"):
            storage.open_parquet(uri)
        with storage.open_parquet(uri, path.stat().st_size) as f:
            assert pq.read_table(f).column("k").to_pylist() == [1, 2]


def test_a_memory_write_hands_back_the_bytes_stored():
    """The default write stores the whole payload with one put and hands it back: the check reads nothing."""
    uri = f"memory://payload-test-{uuid.uuid4().hex[:12]}/{REL}"
    written = storage.write_windows([pa.table({"k": [1, 2]})], uri)  # keep=False: this backend keeps it anyway
    fs, path = storage.filesystem(uri)
    try:
        assert written.payload is not None and written.payload.to_pybytes() == fs.cat_file(path)
        assert written.size == len(fs.cat_file(path))
        assert storage.list_prefix(uri + "/") == storage.Listing(uri + "/", {}, (), exists=True), \
            "a prefix naming an object lists nothing under it"
    finally:
        fs.rm(path.rsplit("/", 2)[0], recursive=True)


def test_an_http_folder_index_lists_its_shards_by_relpath(tmp_path):
    """fsspec's http listing follows the links of a served folder index (http.server in a thread here)."""
    (tmp_path / "baseX" / "d").mkdir(parents=True)
    pq.write_table(pa.table({"k": [1, 2]}), tmp_path / "baseX" / "d" / "part-0.parquet")
    (tmp_path / "baseX" / "notes.txt").write_text("x")

    class Quiet(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kw):
            super().__init__(*args, directory=str(tmp_path), **kw)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, name="http-index", daemon=True)
    thread.start()
    try:
        prefix = storage.normalize_prefix(f"http://127.0.0.1:{server.server_address[1]}/baseX")
        listing = storage.list_prefix(prefix)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert (list(listing.shards), listing.others) == (["d/part-0.parquet"], ("notes.txt",))
