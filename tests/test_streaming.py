"""The streamed merge (a shard in one call: merge_shard, the fused task) against the whole-table one (the task
per operation: read_base, apply_operation, write_output): the same output or the same error, whatever the row groups
of the base and of each sibling, and memory bounded by a window, not by the shard."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unittest.mock import patch

from tasks import storage
from tasks.config import Dataset, Pipeline
from tasks.errors import ShardError
from tasks.kernel import PER_RUN_FIELDS, Job, apply_operation, merge_shard, read_base, read_provenance, write_output
from tasks.ops.merge_from_sidecar import MergeFromSidecar
from tasks import kernel, windows
from tasks.windows import WINDOW_BYTES, RowWindows
from test_property_merge import PERTURBATIONS, perturb

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REL = "a/part-0.parquet"


def job_for(root: str, output: str) -> Job:
    dataset = Dataset(name="stream", path="stream.yaml", main_prefix=f"{root}base/", sidecar_prefix=f"{root}side/",
                      key_column="key", image_column="image")
    ops = (MergeFromSidecar(f"{root}dqm/", ("dqm",)), MergeFromSidecar(f"{root}aes/", None, "fill_missing", "path",
                                                                         "path"))
    return Job(Pipeline("stream-pipeline.yaml", dataset, ops), f"{root}{output}/")


def write(table: pa.Table, uri: str, row_group: int) -> None:
    Path(uri).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, uri, row_group_size=max(row_group, 1))


def whole(job: Job, rel: str):
    state = read_base(job, rel)
    for index in range(len(job.pipeline.operations)):
        state = apply_operation(job, rel, index, state)
    return write_output(job, rel, state)


def outcome(merge, job: Job, rel: str):
    """("failed", message) or ("merged", table, row group sizes, provenance without its per-run fields)."""
    try:
        merge(job, rel)
    except ShardError as exc:
        return "failed", str(exc)
    with storage.open_parquet(job.output_uri(rel)) as f:
        pf = pq.ParquetFile(f)
        table = pf.read()
    prov = {k: v for k, v in read_provenance(pf.metadata).items() if k not in PER_RUN_FIELDS}
    groups = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    return "merged", table.replace_schema_metadata(None), sorted(table.schema.metadata), groups, prov


def step_of(message: str) -> int:
    return int(re.search(r"operations\[(\d+)\]", message).group(1))


@st.composite
def shards(draw):
    n = draw(st.integers(0, 120))
    keys = [f"k{i:04d}" for i in range(n)]
    paths = [f"s3://img/{k}.jpg" for k in keys]
    base = pa.table({"key": keys, "path": paths, "image": pa.array([b"img"] * n, pa.binary())})
    dqm_keys = perturb(draw, keys, draw(st.sampled_from(PERTURBATIONS)))
    aes_paths = perturb(draw, paths, draw(st.sampled_from(PERTURBATIONS)))
    dqm = pa.table({"key": pa.array(dqm_keys, pa.string()), "dqm": pa.array([float(i) for i in range(len(dqm_keys))])})
    aes = pa.table({"path": pa.array(aes_paths, pa.string()), "aes": pa.array([i % 7 for i in range(len(aes_paths))]),
                    "dqm": pa.array([-1.0] * len(aes_paths))})  # already there from the first step: kept
    groups = [draw(st.integers(1, max(n, 1))) for _ in range(3)]  # base, dqm, aes: rarely on the same boundaries
    return base, dqm, aes, groups


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shards())
def test_streamed_equals_whole_across_window_boundaries(case):
    """Every perturbation of either sibling's keys, at any row, whichever window it falls in: the streamed merge
    fails with the whole-table merge's message (every bad row counted, the first named) or writes what it writes:
    the same columns, types, values, row groups and provenance. (Where a later step's footer shows the shard
    cannot merge, the streamed merge says so before reading a row; the whole-table one may first fail an
    earlier step on its rows.)"""
    base, dqm, aes, groups = case
    with tempfile.TemporaryDirectory() as tmp:
        root = storage.normalize_prefix(tmp)
        for name, table, group in (("base", base, groups[0]), ("dqm", dqm, groups[1]),
                                   ("aes", aes, groups[2])):
            write(table, f"{root}{name}/{REL}", group)
        streamed = outcome(merge_shard, job_for(root, "streamed"), REL)
        expected = outcome(whole, job_for(root, "whole"), REL)
        assert streamed[0] == expected[0], (streamed[:2], expected[:2])
        if streamed[0] == "failed":
            if "key mismatch" in streamed[1] or step_of(streamed[1]) == step_of(expected[1]):
                assert streamed[1] == expected[1]
            else:  # a later step's footer check (row counts, key types) fails before any row is read
                assert step_of(expected[1]) < step_of(streamed[1]), (streamed[1], expected[1])
            assert not storage.list_prefix(f"{root}streamed/").shards  # nothing published
        else:
            _, table, meta_keys, row_groups, prov = streamed
            assert table.equals(expected[1]) and table.schema.equals(expected[1].schema)
            assert (meta_keys, row_groups, prov) == expected[2:]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shards(), st.integers(1, 6), st.integers(1, 40))
def test_windows_sized_by_the_budget_cut_any_row_groups_and_change_nothing_but_the_output_row_groups(
        case, probe, budget_rows):
    """Windows sized by the byte budget, not by the base's row groups, cut through the row groups of the base and
    of each sibling anywhere: the same outcome as the whole-table merge (every bad row counted and named by its
    row within the shard, nothing published) or the same rows, types, values and provenance; the output's row
    groups are the windows: the first `size` rows each, the last the rest."""
    base, dqm, aes, groups = case
    with tempfile.TemporaryDirectory() as tmp:
        root = storage.normalize_prefix(tmp)
        for name, table, group in (("base", base, groups[0]), ("dqm", dqm, groups[1]),
                                   ("aes", aes, groups[2])):
            write(table, f"{root}{name}/{REL}", group)
        seen = []
        real_window_rows = kernel.window_rows

        def measured(natural, row_bytes, budget):
            seen.append((real_window_rows(natural, row_bytes, budget), row_bytes))
            return seen[-1][0]

        streamed_job = replace(job_for(root, "streamed"), window_bytes=budget_rows * 40,  # ~40 bytes a row
                               recompress="zstd")  # windows are the decode path's; the copy keeps row groups
        with patch.object(windows, "PROBE_ROWS", probe), patch.object(kernel, "PROBE_ROWS", probe), \
                patch.object(kernel, "window_rows", measured):
            streamed = outcome(merge_shard, streamed_job, REL)
        expected = outcome(whole, job_for(root, "whole"), REL)
        assert streamed[0] == expected[0], (streamed[:2], expected[:2])
        if streamed[0] == "failed":
            if "key mismatch" in streamed[1] or step_of(streamed[1]) == step_of(expected[1]):
                assert streamed[1] == expected[1]
            else:
                assert step_of(expected[1]) < step_of(streamed[1]), (streamed[1], expected[1])
            assert not storage.list_prefix(f"{root}streamed/").shards
        else:
            _, table, meta_keys, row_groups, prov = streamed
            assert table.equals(expected[1]) and table.schema.equals(expected[1].schema)
            assert (meta_keys, prov) == (expected[2], expected[4])
            n, [(size, row_bytes)] = base.num_rows, seen
            assert row_groups == ([size] * (n // size) + ([n % size] if n % size else []) if n else [0])
            fit = max(probe, int(streamed_job.window_bytes // row_bytes))  # the budget's rows, or the floor
            natural = max(groups[0], 1) if n else 0
            assert size == (natural if 0 < natural <= fit else fit), (size, natural, fit)


@pytest.mark.parametrize("windows", [[4, 4, 4, 4, 4], [2, 3, 9, 6], [1, 19], [20], [7, 13]])
def test_row_windows_give_the_file_in_order_whatever_its_row_groups(tmp_path, windows):
    """Row groups of 3, 0 (an empty one), 5, 1 and 11 rows taken in windows that split them, join them or match
    them: the windows are the file's rows in order, and one that is exactly a row group comes as one chunk."""
    table = pa.table({"k": [f"key-{i:02d}" for i in range(20)], "v": list(range(20))})
    path = str(tmp_path / "f.parquet")
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for rows in (3, 0, 5, 1, 11):
            writer.write_table(table.slice(start, rows))
            start += rows
    reader = RowWindows(pq.ParquetFile(path), ["k", "v"], window_rows=max(windows))
    got = [reader.take(n) for n in windows]
    assert [w.num_rows for w in got] == windows
    assert pa.concat_tables(got).equals(table)
    assert reader.take(5).num_rows == 0
    whole = RowWindows(pq.ParquetFile(path), ["k", "v"], window_rows=3).take(3)
    assert whole.column("k").num_chunks == 1 and whole.equals(table.slice(0, 3))


def test_the_first_bad_row_is_named_in_the_shard_not_in_its_window(tmp_path):
    root = storage.normalize_prefix(str(tmp_path))
    keys = [f"k{i:04d}" for i in range(100)]
    bad = list(keys)
    bad[57], bad[93] = "zz", "yy"
    write(pa.table({"key": keys, "path": keys}), f"{root}base/{REL}", 10)
    write(pa.table({"key": bad, "dqm": [1.0] * 100}), f"{root}dqm/{REL}", 33)
    write(pa.table({"path": keys, "aes": [1] * 100}), f"{root}aes/{REL}", 100)
    job = job_for(root, "out")
    try:
        merge_shard(job, REL)
    except ShardError as exc:
        assert "key mismatch in 2 of 100 rows; first at row 57: key='k0057' vs source key='zz'" in str(exc)
    else:
        raise AssertionError("a misaligned shard merged")
    assert not storage.list_prefix(job.output_prefix).shards


def test_a_streamed_s3_output_goes_up_in_parts_while_its_windows_are_merged(s3_root, moto_endpoint, monkeypatch):
    """On S3 the output leaves as a multipart upload whose parts are sent as the windows fill them (the first
    part before the base's last window is read), completed after the last; the post-write check then reads the
    stored object (the streamed write keeps no payload) and it equals the whole-table merge's output."""
    from reliability_fixtures import allow_small_parts, pending_uploads
    from tasks.storage import s3 as s3_backend

    allow_small_parts(monkeypatch)
    monkeypatch.setattr(s3_backend, "MULTIPART_THRESHOLD", 16 * 1024)
    monkeypatch.setattr(s3_backend, "PART_SIZE", 8 * 1024)
    n = 20_000
    keys = [os.urandom(12).hex() for _ in range(n)]  # incompressible: ~0.5 MB of output, dozens of parts
    storage.write_atomic(pa.table({"key": keys, "path": keys}), f"{s3_root}base/{REL}", row_group_size=1000)
    storage.write_atomic(pa.table({"key": keys, "dqm": [1.0] * n}), f"{s3_root}dqm/{REL}", row_group_size=3000)
    storage.write_atomic(pa.table({"path": keys, "aes": [1] * n}), f"{s3_root}aes/{REL}", row_group_size=n)
    events, real_take, fs = [], RowWindows.take, storage._s3()
    real_call = fs.call_s3

    def take(self, rows):
        events.append("window")
        return real_take(self, rows)

    def call(method, *args, **kwargs):
        events.append(method)
        return real_call(method, *args, **kwargs)

    monkeypatch.setattr(RowWindows, "take", take)
    monkeypatch.setattr(fs, "call_s3", call)
    job = job_for(s3_root, "streamed")
    assert merge_shard(job, REL).rows == n
    monkeypatch.undo()
    assert events.count("upload_part") > 10, events
    assert events.index("upload_part") < len(events) - events[::-1].index("window")  # a part before the last window
    assert events.index("complete_multipart_upload") > len(events) - events[::-1].index("window")
    assert pending_uploads(moto_endpoint, s3_root) == []
    whole(job_for(s3_root, "whole"), REL)
    assert outcome(lambda *_: None, job, REL)[1].equals(outcome(lambda *_: None, job_for(s3_root, "whole"), REL)[1])


# ----------------------------------------------------------------- memory bounded by a window

def peak_of(mode: str, root: str, window_bytes: int = WINDOW_BYTES) -> dict:
    """One merge of the shard in a fresh process: "copy" (merge_shard, the copy path), "decode" (merge_shard
    with --recompress zstd: windows of rows) or "whole" (the task per operation's whole tables)."""
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}  # one pool for every allocation, C++'s too
    out = subprocess.run([sys.executable, __file__, mode, root, str(window_bytes)], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).parent.parent, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n, groups, budget", [(400_000, (10_000, 7_000, 64_000), WINDOW_BYTES),
                                               (1_000_000, (1_000_000,) * 3, 4 << 20)],
                         ids=["small-row-groups", "one-row-group"])
def test_a_streamed_shard_holds_a_window_not_the_shard(tmp_path, n, groups, budget, merge_path):
    """Peak arrow memory (the allocator's own high-water mark, in a fresh process each) of one shard: 400,000
    rows in row groups of 10,000 (the siblings' of 7,000 and 64,000) with the default budget, or 1,000,000 rows in
    one row group each (what pyarrow's defaults write for a shard of up to 1Mi rows) with a budget of a 20th of
    the shard: the streamed merge (by either path) stays under a third of the whole-table merge's, and both
    write the same rows."""
    root = storage.normalize_prefix(str(tmp_path))
    keys = [f"image-{i:09d}" for i in range(n)]
    paths = [f"s3://bucket/images/{k}.jpg" for k in keys]
    write(pa.table({"key": keys, "path": paths, "size": list(range(n)), "w": [0.5] * n}), f"{root}base/{REL}",
          groups[0])
    write(pa.table({"key": keys, "dqm": [float(i) for i in range(n)]}), f"{root}dqm/{REL}", groups[1])
    write(pa.table({"path": paths, "aes": list(range(n))}), f"{root}aes/{REL}", groups[2])
    streamed, held = peak_of(merge_path, root, budget), peak_of("whole", root)
    assert streamed["rows"] == held["rows"] == n
    assert streamed["peak"] < 0.3 * held["peak"], (streamed, held)
    print(f"peak arrow memory: {merge_path} {streamed['peak'] / 2**20:.1f} MiB, whole {held['peak'] / 2**20:.1f} MiB")


@pytest.mark.slow
def test_memory_grows_with_the_budget_by_one_window_held_at_a_time(tmp_path, merge_path):
    """1,000,000 rows in one row group each, at budgets of 4 and 32 MiB: the decode path's peak grows by under
    2.2 times what the budget grew (one window of each input and the merged rows held while it is written: 1.8x
    measured; holding the previous window while the next is read measured 2.7x); the copy path holds no window
    (a fixed buffer of bytes, the keys a batch at a time): its peak grows by under a tenth of it (0 measured)."""
    root = storage.normalize_prefix(str(tmp_path))
    n = 1_000_000
    keys = [f"image-{i:09d}" for i in range(n)]
    paths = [f"s3://bucket/images/{k}.jpg" for k in keys]
    write(pa.table({"key": keys, "path": paths, "size": list(range(n)), "w": [0.5] * n}), f"{root}base/{REL}", n)
    write(pa.table({"key": keys, "dqm": [float(i) for i in range(n)]}), f"{root}dqm/{REL}", n)
    write(pa.table({"path": paths, "aes": list(range(n))}), f"{root}aes/{REL}", n)
    small, large = peak_of(merge_path, root, 4 << 20), peak_of(merge_path, root, 32 << 20)
    assert small["rows"] == large["rows"] == n
    growth = (large["peak"] - small["peak"]) / (28 << 20)
    assert growth < (2.2 if merge_path == "decode" else 0.1), (small, large, growth)


if __name__ == "__main__":  # one merge in this fresh process: its peak arrow memory on stdout
    mode, root, budget = sys.argv[1:]
    job = replace(job_for(root, mode), window_bytes=int(budget), recompress="zstd" if mode == "decode" else "")
    stats = (whole if mode == "whole" else merge_shard)(job, REL)
    assert (mode == "whole") or stats.path == mode, (mode, stats)
    print(json.dumps({"rows": stats.rows, "peak": pa.default_memory_pool().max_memory()}))
