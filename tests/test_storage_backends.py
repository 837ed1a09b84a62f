"""Storage backends chosen from the URI (tasks/storage/), with real I/O only: local disk, fsspec's in-process
`memory://` store, and S3 on the moto server (the `s3_root` fixture)."""
from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import build, expected_output, read_meta, read_table

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ConfigError
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.plan import make_plan
from tasks.storage import generic

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REL = relpaths(2)


@pytest.fixture
def memory_root():
    """A fresh folder of fsspec's process-wide memory store, removed afterwards."""
    root = f"memory://sidecar-tests-{uuid.uuid4().hex[:12]}/"
    yield root
    fs, path = storage.filesystem(root)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture(params=["local", "memory", "s3"])
def any_root(request, tmp_path):
    """One writable root per backend."""
    if request.param == "local":
        return str(tmp_path / "data") + "/"
    return request.getfixturevalue("memory_root" if request.param == "memory" else "s3_root")


# ----------------------------------------------------------------- choosing the backend

@pytest.mark.parametrize("uri,prefix,kind,writable", [
    ("s3://bucket/a", "s3://bucket/a/", "S3Backend", True),
    ("s3a://bucket//a//", "s3://bucket/a/", "S3Backend", True),
    ("/data/x", "/data/x/", "LocalBackend", True),
    ("file:///data/x/", "/data/x/", "LocalBackend", True),
    ("memory://scratch/x", "memory://scratch/x/", "MemoryBackend", True),
    ("memory:///scratch/x/", "memory://scratch/x/", "MemoryBackend", True),
    ("ftp://host.example/pub/x", "ftp://host.example/pub/x/", "GenericBackend", False),
    ("https://host.example/data/", "https://host.example/data/", "GenericBackend", False),
])
def test_backend_chosen_per_uri(uri, prefix, kind, writable):
    normalized = storage.normalize_prefix(uri)
    assert normalized == prefix
    chosen = storage.backend(normalized)
    assert type(chosen).__name__ == kind
    assert chosen.atomic_writes is writable
    assert storage.backend(normalized + "a/b.parquet") is chosen, "a file under a prefix has the prefix's backend"


def test_memory_and_local_paths_inside_fsspec():
    fs, path = storage.filesystem("memory://scratch/x/a.parquet")
    assert type(fs).__name__ == "MemoryFileSystem" and path == "/scratch/x/a.parquet"
    fs, path = storage.filesystem("/data/x/a.parquet")
    assert type(fs).__name__ == "LocalFileSystem" and path == "/data/x/a.parquet"


@pytest.mark.parametrize("uri,why", [
    ("nosuch://bucket/base/", "fsspec knows no protocol 'nosuch'"),
    ("zip://inner/", "'zip' wraps another filesystem"),
    ("simplecache::s3://bucket/base/", "chained fsspec URL"),
])
def test_unknown_scheme_is_one_line_listing_the_supported_ones(uri, why):
    with pytest.raises(ValueError) as err:
        storage.normalize_prefix(uri)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"unsupported URI scheme {uri.split(':')[0]!r} in {uri!r}: {why}")
    for form in ("s3://bucket/path/", "file:///abs/path/", "a local path", "memory://path/"):
        assert form in message
    inputs = generic.input_protocols()
    assert inputs and "memory" not in inputs and "zip" not in inputs and "s3" not in inputs
    assert message.endswith("or for inputs only " + ", ".join(f"{p}://" for p in inputs))


def test_uninstalled_implementation_says_so():
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed here")
    with pytest.raises(ValueError, match=r"^unsupported URI scheme 'gs' in 'gs://b/x/': fsspec's implementation "
                                         r"of 'gs' is not installed \(.*gcsfs.*\); expected s3://"):
        storage.normalize_prefix("gs://b/x/")


def test_worker_env_names_are_settings_never_credentials():
    names = storage.worker_env_names()
    assert set(names) == {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
                          "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "SIDECAR_OPS_MULTIPART_THRESHOLD",
                          "SIDECAR_OPS_PART_SIZE", "SIDECAR_OPS_FETCH_AHEAD_BYTES"}
    assert not [n for n in names if any(s in n for s in ("SECRET", "KEY", "TOKEN", "PROFILE", "PASSWORD"))]


# ----------------------------------------------------------------- writes only where atomic

def test_output_on_a_non_atomic_backend_is_refused_in_one_line():
    prefix = storage.normalize_prefix("ftp://host.example/out/")
    with pytest.raises(ValueError) as err:
        storage.check_writable(prefix)
    assert str(err.value) == ("'ftp://host.example/out/': the 'ftp' storage cannot be written atomically, so "
                              "outputs cannot go there; writable: s3://, local paths (file://) and memory://")
    # and the write itself refuses, before any connection is made
    with pytest.raises(ValueError, match=r"^refusing to write 'ftp://host.example/out/a.parquet': the 'ftp' "
                                         "storage cannot be written atomically$"):
        storage.write_atomic(pa.table({"k": [1]}), prefix + "a.parquet")
    with pytest.raises(ValueError, match="cannot be written atomically"):
        storage.write_text(prefix + "report.json", "{}")


@pytest.mark.parametrize("prefix", ["s3://bucket/out/", "/tmp/out/", "memory://out/"])
def test_atomic_backends_accept_outputs(prefix):
    assert storage.check_writable(prefix) == prefix


def test_memory_write_is_one_store_update(memory_root):
    """The whole object appears at once: no empty or partial entry is ever in the store."""
    fs, _ = storage.filesystem(memory_root + "a.parquet")
    seen = []
    store = fs.store

    class Watch(dict):
        def __setitem__(self, key, value):
            seen.append(value.getbuffer().nbytes)
            super().__setitem__(key, value)

    watched = Watch(store)
    fs.store = watched
    try:
        size = storage.write_atomic(pa.table({"k": list(range(100))}), memory_root + "a.parquet").size
    finally:
        fs.store = store
        store.update(watched)
    assert seen == [size] and size > 0
    assert read_table(memory_root + "a.parquet").column("k").to_pylist() == list(range(100))


def test_report_text_on_memory(memory_root):
    storage.write_text(memory_root + "r/report.json", '{"ok": true}\n')
    fs, path = storage.filesystem(memory_root + "r/report.json")
    assert fs.cat_file(path) == b'{"ok": true}\n'


# ----------------------------------------------------------------- identities per backend

def same_size_rewrite(uri: str, value: int) -> None:
    storage.write_atomic(pa.table({"k": pa.array([value] * 10, pa.int64())}), uri)


def test_identity_changes_when_an_object_is_rewritten(any_root):
    uri = any_root + "shard/part-0.parquet"
    same_size_rewrite(uri, 1)
    listed = storage.list_prefix(any_root)
    first = listed.ids["shard/part-0.parquet"]
    with storage.open_parquet(uri, listed.shards["shard/part-0.parquet"]) as f:
        assert storage.file_identity(uri, f) == first, "reading and listing give the same identity"
        assert storage.file_size(uri, f) == listed.shards["shard/part-0.parquet"]
    assert storage.file_identity(uri) == first
    same_size_rewrite(uri, 2)
    relisted = storage.list_prefix(any_root)
    assert relisted.shards == listed.shards, "a same-size rewrite: only the identity can tell"
    second = relisted.ids["shard/part-0.parquet"]
    assert second != first
    assert storage.file_identity(uri) == second
    assert read_table(uri).column("k").to_pylist() == [2] * 10


def test_an_empty_shard_is_listed_with_its_size_zero(any_root):
    """A 0-byte `*.parquet` object is a shard of size 0 (Listing.empty_shards: the plan reports it)."""
    same_size_rewrite(any_root + "shard/part-0.parquet", 1)
    fs, path = storage.filesystem(any_root + "shard/empty.parquet")
    fs.pipe_file(path, b"")
    listing = storage.list_prefix(any_root)
    assert listing.empty_shards == ["shard/empty.parquet"]
    assert listing.shards["shard/empty.parquet"] == 0 and listing.shards["shard/part-0.parquet"] > 0


def test_listing_of_a_missing_prefix(any_root):
    listing = storage.list_prefix(any_root + "nothing-here/")
    assert listing.shards == {} and listing.others == ()
    assert storage.missing_root(any_root + "nothing-here/") is None


def test_missing_bucket_named(moto_endpoint):
    prefix = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/out/"
    assert storage.missing_root(prefix) == (f"bucket {prefix[5:].split('/')[0]!r} does not exist; create it or "
                                            "choose another --output-prefix")


# ----------------------------------------------------------------- the kernel on memory:// inputs

def test_memory_inputs_merged_into_local_output(tmp_path, memory_root):
    setup = build(tmp_path, memory_root, shards=len(REL), watermark_gap=False)
    out = storage.normalize_prefix(str(tmp_path / "out"))
    job = Job(load_pipeline(setup.pipeline), out)
    assert job.pipeline.dataset.main_prefix.startswith("memory://")
    for rel in REL:
        assert merge_shard(job, rel).rows == 40
    listings = {name: storage.list_prefix(prefix) for name, prefix in setup.prefixes.items()}
    for rel in REL:
        got = read_table(out + rel)
        want = expected_output(setup, rel, [("dqm", "dqm_d1_v6_1"), ("aes", "ernie_image_aes"),
                                            ("watermark", "watermark")])
        assert got.replace_schema_metadata(None).equals(want)
        inputs = read_provenance(read_meta(out + rel))["inputs"]
        assert inputs["base"] == listings["base"].ids[rel]
        assert inputs["operations"] == [listings[n].ids[rel] for n in ("dqm", "aes", "watermark")]
        assert inputs["base"].startswith("size=") and "created=" in inputs["base"]
    plan = make_plan(job)
    assert plan.complete == REL and plan.todo == [], "resume trusts outputs made from unchanged memory inputs"
    table = read_table(setup.prefixes["dqm"] + REL[0]).replace_schema_metadata(None)
    storage.write_atomic(table, setup.prefixes["dqm"] + REL[0])  # same content, a new object
    plan = make_plan(job)
    assert plan.todo == [REL[0]] and plan.stale == [(REL[0], "operations[0] sibling changed")]


def test_memory_output_and_footer(tmp_path, memory_root):
    setup = build(tmp_path, memory_root, shards=1, watermark_gap=False)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    stats = merge_shard(job, REL[0])
    listed = storage.list_prefix(setup.output)
    assert listed.shards == {REL[0]: stats.bytes} and listed.others == ()
    assert storage.read_footer(setup.output + REL[0], stats.bytes).num_rows == 40
    assert pq.ParquetFile(storage.open_parquet(setup.output + REL[0])).metadata.num_rows == 40


def test_plan_refuses_output_under_a_missing_bucket(tmp_path, moto_endpoint, memory_root):
    setup = build(tmp_path, memory_root, shards=1, watermark_gap=False)
    out = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/out/"
    with pytest.raises(ConfigError, match=rf"^output prefix {out}: bucket 'no-such-bucket-\w+' does not exist"):
        make_plan(Job(load_pipeline(setup.pipeline), out))


def test_run_with_a_non_atomic_output_stops_before_any_work(tmp_path, cli, prefect_api):
    """The command line refuses such an output prefix with one line and exit 2, before any flow run (a run's own
    server, started meanwhile, is stopped: tests/test_run_server.py)."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=2)
    code, out, err = cli("run", setup.pipeline, "--output-prefix", "ftp://host.example/out/")
    assert code == 2, err
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("error: --output-prefix: 'ftp://host.example/out/': ") and "writable:" in err
    assert "Prefect API" not in err
