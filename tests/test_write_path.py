"""The write path's guarantees, each shown by a fault injected at a chosen point (no timing involved):

- a write that fails half-way leaves nothing at the final name (or the previous complete file there, untouched),
  and a reader looking at the final name while the bytes are going in sees no partial file (local disk);
- a multipart upload failing after a part is in leaves no object and no pending upload (S3 on moto);
- the backstops `check_relpath` and `check_write_path` refuse paths that could land outside the prefix;
- the post-write check (`kernel.check_written`) fails an output a faulty writer got wrong (a row lost, keys
  out of order, another pipeline's fingerprint), directly and through both task layouts of a run.

Each of these is killed by a mutant of `tests/mutants.py` (docs/guarantees.md, "Mutation table").
"""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_fixtures import build, objects, read_table
from faultproxy import proxied  # noqa: F401 (a fixture)
from reliability_fixtures import allow_small_parts, pending_uploads
from test_flow_local import summary_counts

from tasks import chunkcopy, kernel, storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ShardError
from tasks.kernel import PROVENANCE_KEY, Job, merge_shard
from tasks.storage import local as local_backend
from tasks.storage import s3 as s3_backend

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REL = relpaths(3)


def job_for(setup) -> Job:
    return Job(load_pipeline(setup.pipeline), setup.output)


def file_state(path: str) -> str:
    """What a reader at `path` finds: 'absent', 'whole:<rows>' or 'partial'."""
    if not os.path.exists(path):
        return "absent"
    try:
        return f"whole:{pq.read_table(path).num_rows}"
    except Exception:
        return "partial"


# ----------------------------------------------------------------- atomic local writes

def write_to(where, data: bytes) -> None:
    """What a local write's `write(sink)` does with bytes: `where` is the open temp file (or, under mutant A1,
    the final path)."""
    if isinstance(where, str):
        with open(where, "wb") as f:
            f.write(data)
    else:
        where.write(data)


@pytest.mark.parametrize("earlier", [False, True], ids=["fresh", "over-a-complete-output"])
def test_a_write_failing_half_way_never_shows_at_the_final_name(tmp_path, monkeypatch, earlier):
    """The writer is stopped after half the bytes are on disk (disk full): a reader of the final name saw the
    earlier complete file (or nothing) during the write and sees it after; no temp file is left behind."""
    setup = build(tmp_path, str(tmp_path / "data") + "/")
    job, final = job_for(setup), setup.output + REL[0]
    if earlier:
        merge_shard(job, REL[0])
    before = open(final, "rb").read() if earlier else None
    real_write, seen = local_backend.LocalBackend.write_parquet, []

    def half_then_disk_full(self, write, uri, keep=True):
        def half(where):
            sink = pa.BufferOutputStream()
            write(sink)
            data = sink.getvalue().to_pybytes()
            write_to(where, data[: len(data) // 2])
            seen.append(file_state(final))  # a reader, mid-write
            raise OSError(28, "No space left on device (injected)")

        return real_write(self, half, uri, keep)

    monkeypatch.setattr(local_backend.LocalBackend, "write_parquet", half_then_disk_full)
    with pytest.raises(ShardError, match=f"shard {REL[0]}: writing {final}: .*No space left"):
        merge_shard(job, REL[0])
    want = "whole:40" if earlier else "absent"
    assert seen == [want], seen
    assert file_state(final) == want
    if earlier:
        assert open(final, "rb").read() == before
    assert not any(storage.TEMP_MARK in n for n in os.listdir(os.path.dirname(final)))


def test_text_writes_are_atomic_too(tmp_path, monkeypatch):
    """`put` (reports on backends written through the same rename): a fault before the rename leaves the
    earlier text whole."""
    target = str(tmp_path / "out" / "report.json")
    local_backend.LocalBackend().put(target, b'{"old": true}')
    real_replace = os.replace

    def fail_replace(src, dst):
        assert open(dst, "rb").read() == b'{"old": true}'  # mid-write, the final name holds the old text
        raise OSError(5, "I/O error (injected)")

    monkeypatch.setattr(local_backend.os, "replace", fail_replace)
    with pytest.raises(OSError, match="injected"):
        local_backend.LocalBackend().put(target, b'{"new": true, "padding": "' + b"x" * 4096 + b'"}')
    monkeypatch.setattr(local_backend.os, "replace", real_replace)
    assert open(target, "rb").read() == b'{"old": true}'
    assert os.listdir(tmp_path / "out") == ["report.json"]


# ----------------------------------------------------------------- S3 multipart

def test_a_multipart_upload_failing_after_a_part_leaves_no_object_and_no_upload(s3_root, moto_endpoint,
                                                                                 monkeypatch):
    allow_small_parts(monkeypatch)
    monkeypatch.setattr(s3_backend, "MULTIPART_THRESHOLD", 16 * 1024)
    monkeypatch.setattr(s3_backend, "PART_SIZE", 8 * 1024)
    table = pa.table({"k": pa.array([f"key-{i}" for i in range(4000)]),
                      "blob": pa.array([os.urandom(16) for _ in range(4000)], pa.binary())})
    uri = s3_root + "out/part-0.parquet"
    fs = storage._s3()
    real_call, calls, seen = fs.call_s3, [], []

    def flaky(method, *args, **kw):
        calls.append(method)
        if method == "upload_part" and kw.get("PartNumber") == 2:
            seen.append((len(pending_uploads(moto_endpoint, s3_root)), fs.exists(uri[len("s3://"):])))
            raise ConnectionResetError("injected: connection reset during part 2")
        return real_call(method, *args, **kw)

    monkeypatch.setattr(fs, "call_s3", flaky)
    with pytest.raises(ConnectionResetError, match="injected"):
        storage.write_atomic(table, uri)
    assert calls[:3] == ["create_multipart_upload", "upload_part", "upload_part"], calls
    assert seen == [(1, False)], seen  # mid-upload: one upload pending, no object a reader could see
    assert "complete_multipart_upload" not in calls
    assert pending_uploads(moto_endpoint, s3_root) == []
    assert not fs.exists(uri[len("s3://"):])


# ----------------------------------------------------------------- backstops against escaping the prefix

@pytest.mark.parametrize("relpath", ["../x.parquet", "a/../../x.parquet", "/abs.parquet", "a//b.parquet",
                                     "./a.parquet", "a/./b.parquet", "a/", "", "a\0b.parquet"])
def test_check_relpath_refuses_paths_that_could_escape(tmp_path, relpath):
    with pytest.raises(ValueError, match="unsafe shard path"):
        storage.check_relpath(relpath)
    with pytest.raises(ValueError, match="unsafe shard path"):
        storage.join(str(tmp_path) + "/out/", relpath)
    setup_free_job = Job.__new__(Job)  # output_uri goes through join: no config needed
    object.__setattr__(setup_free_job, "output_prefix", str(tmp_path) + "/out/")
    with pytest.raises(ValueError, match="unsafe shard path"):
        setup_free_job.output_uri(relpath)


@pytest.mark.parametrize("where, tail", [
    *((where, tail) for where in ("local", "memory") for tail in ("a/../../escaped.parquet", "./escaped.parquet")),
    ("memory", "a/../b://escaped.parquet"),  # a key may hold '://': every segment after the scheme's counts
])
def test_write_atomic_refuses_dot_segments_on_every_backend(tmp_path, where, tail):
    prefix = str(tmp_path / "out") + "/" if where == "local" else "memory://write-path-test/out/"
    table = pa.table({"k": ["a", "b"]})
    with pytest.raises(ValueError) as refused:
        storage.write_atomic(table, prefix + tail)
    assert str(refused.value) == (f"refusing to write {prefix + tail!r}: the path has '.'/'..' segments and could "
                                  "land outside the output prefix")
    assert not (tmp_path / "escaped.parquet").exists() and not (tmp_path / "out").exists()
    if where == "memory":
        fs, _ = storage.filesystem(prefix)
        assert not fs.exists("/write-path-test")


def test_local_write_refuses_a_path_that_normalizes_differently(tmp_path):
    table = pa.table({"k": ["a"]})
    with pytest.raises(ValueError, match="refusing to write"):
        storage.write_atomic(table, str(tmp_path) + "/out//x.parquet")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- the post-write check must be able to fail

def lose_last_row(table):
    return table.slice(0, table.num_rows - 1)


def repeat_last_row(table):
    return pa.concat_tables([table, table.slice(table.num_rows - 1)])


def swap_first_rows(table):
    return table.take([1, 0, *range(2, table.num_rows)])


def foreign_fingerprint(table):
    meta = dict(table.schema.metadata)
    prov = json.loads(meta[PROVENANCE_KEY])
    prov["fingerprint"] = "0" * 16
    meta[PROVENANCE_KEY] = json.dumps(prov).encode()
    return table.replace_schema_metadata(meta)


FAULTY = {"row-lost": (lose_last_row, "output has 39 rows, expected 40"),
          "row-repeated": (repeat_last_row, "output has 41 rows, expected 40"),
          "keys-out-of-order": (swap_first_rows, "key column 'image_key' of the output differs from the base"),
          "foreign-fingerprint": (foreign_fingerprint, "provenance fingerprint missing or different")}


def faulty_writer(monkeypatch, damage, only: str | None = None):
    """storage.write_windows (behind write_atomic too) writes `damage(table)` of all its windows (for the shard
    `only`, or every shard) and reports success. Shards take the decode path, whose writer this damages (the copy
    path's own wrong outputs: tests/test_chunkcopy.py, test_the_post_write_check_fails_a_wrong_copy)."""
    real = storage.write_windows

    def not_copied(*args, **kw):
        raise chunkcopy.NotCopyable("the test damages the decode path's writer")

    monkeypatch.setattr(chunkcopy, "plan", not_copied)

    def write(windows, uri, *args, **kw):
        table = pa.concat_tables(list(windows))
        return real([damage(table) if only is None or uri.endswith(only) else table], uri, *args, **kw)

    monkeypatch.setattr(storage, "write_windows", write)


@pytest.mark.parametrize("fault", FAULTY)
def test_post_write_check_fails_an_output_the_writer_got_wrong(tmp_path, monkeypatch, fault):
    setup = build(tmp_path, str(tmp_path / "data") + "/")
    damage, message = FAULTY[fault]
    faulty_writer(monkeypatch, damage)
    with pytest.raises(ShardError, match=f"shard {REL[0]}: verifying .*{message}") as info:
        merge_shard(job_for(setup), REL[0])
    assert not info.value.transient or fault in ("row-lost", "row-repeated")  # never retried into a success


@pytest.mark.parametrize("layout", [["--task-per-operation"], []], ids=["chain", "fused"])
def test_a_run_fails_the_shard_whose_output_fails_the_check(tmp_path, monkeypatch, run, layout):
    """In a real (in-process) run on both task layouts: the shard whose written keys differ from the base fails
    with the check's message, the others merge; a retry does not turn it into a success."""
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=3)
    faulty_writer(monkeypatch, swap_first_rows, only=REL[1])
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--retries", "1", *layout)
    assert code == 1, out + err
    assert summary_counts(out + err) == (3, 2, 0, 1), out + err
    failed = [line for line in (out + err).splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1 and failed[0].startswith(f"FAILED {REL[1]}: shard {REL[1]}: verifying "), failed
    assert "key column 'image_key' of the output differs from the base" in failed[0]
    assert sorted(objects(setup.output)) == sorted(REL)  # the bad output is there, and named failed
    assert read_table(setup.output + REL[0]).num_rows == 40


# ----------------------------------------------------------------- two writers of one shard, interleaved

def test_two_interleaved_writers_of_one_shard_leave_one_whole_file(tmp_path, monkeypatch):
    """Writer A is stopped half-way through its bytes while writer B writes the same shard from start to end
    (what two runs on one output prefix, or two tasks of one process, can do); then A finishes. No lock: the
    final file is one writer's, whole (here A's, the last rename), and no temp file is left."""
    uri = str(tmp_path / "out" / "shard.parquet")
    a, b = pa.table({"k": [f"a{i}" for i in range(500)]}), pa.table({"k": [f"b{i}" for i in range(700)]})
    real_write, nested = local_backend.LocalBackend.write_parquet, []

    def interleaved(self, write, where, keep=True):
        def in_halves(temp):
            sink = pa.BufferOutputStream()
            write(sink)
            data = sink.getvalue().to_pybytes()
            temp.write(data[: len(data) // 2])
            if not nested:  # A, half-way: B writes the whole shard now
                nested.append("B")
                storage.write_atomic(b, uri)
                nested.append(file_state(uri))
            temp.write(data[len(data) // 2:])

        return real_write(self, in_halves, where, keep)

    monkeypatch.setattr(local_backend.LocalBackend, "write_parquet", interleaved)
    storage.write_atomic(a, uri)
    monkeypatch.undo()
    assert nested == ["B", "whole:700"], nested
    assert file_state(uri) == "whole:500"
    assert pq.read_table(uri).equals(a)
    assert os.listdir(tmp_path / "out") == ["shard.parquet"]


# ----------------------------------------------------------------- sweeping a killed writer's leftovers

def test_sweep_removes_a_dead_writers_temp_file_only(tmp_path):
    """A temp file named after a process of this host that has exited is removed; a live writer's temp file
    (this process's) and shards stay."""
    import socket
    import subprocess

    out = tmp_path / "out"
    out.mkdir()
    child = subprocess.Popen(["true"])
    child.wait()  # exited and reaped: a writer that is gone
    host = socket.gethostname()
    dead = out / f"{storage.TEMP_MARK}{host}-{child.pid}-abc"
    alive = out / f"{storage.TEMP_MARK}{host}-{os.getpid()}-def"
    shard = out / "part-0.parquet"
    for path in (dead, alive, shard):
        path.write_bytes(b"x")
    assert storage.sweep_stale(str(out) + "/", older_than_seconds=3600) == 1
    assert sorted(p.name for p in out.iterdir()) == sorted([alive.name, shard.name])


def test_sweep_aborts_old_uploads_and_keeps_young_ones(s3_root, moto_endpoint, proxied):  # noqa: F811
    """The age is the store's own `Initiated` (the proxy reports when each upload really started; moto's own is
    frozen in 2010): an upload started just now is kept (a live run's), one started two hours ago is aborted
    with a one-hour threshold, and with the run's default threshold (6 h) both stay."""
    proxy = proxied()
    fs, bucket = storage._s3(), s3_root[len("s3://"):].rstrip("/")
    young = fs.call_s3("create_multipart_upload", Bucket=bucket, Key="out/part-0.parquet")["UploadId"]
    old = fs.call_s3("create_multipart_upload", Bucket=bucket, Key="out/part-1.parquet")["UploadId"]
    proxy.age(old, 2 * 3600)
    assert storage.sweep_stale(s3_root + "out/") == 0
    assert storage.sweep_stale(s3_root + "out/", older_than_seconds=3600) == 1
    assert [u["UploadId"] for u in pending_uploads(moto_endpoint, s3_root)] == [young]


# ----------------------------------------------------------------- which failures are worth a retry

@pytest.mark.parametrize("exc, transient", [
    (ConnectionResetError("connection reset by peer"), True),   # flaky storage: retried
    (TimeoutError("read timed out"), True),
    (OSError(5, "I/O error"), True),
    (FileNotFoundError("no such object"), False),                 # the same on every attempt
    (PermissionError("access denied"), False),
    (pa.ArrowInvalid("schema mismatch"), False),
    (ShardError("key mismatch in 2 of 40 rows"), False),          # alignment: never retried
    (ShardError("reset mid-read", transient=True), True),
])
def test_only_io_trouble_is_retried(exc, transient):
    """The classification behind Prefect's retry condition (`prefect_tasks.worth_retrying`)."""
    from tasks.prefect_tasks import worth_retrying

    failure = kernel._fail(REL[0], "writing x", exc)
    assert failure.transient is transient
    state = type("State", (), {"result": lambda self, raise_on_failure: failure})()
    assert worth_retrying(None, None, state) is transient
