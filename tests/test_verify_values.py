"""Verify's data checks on one sampled shard (tasks/verification/values.py): what each operation would have done when an
output has no provenance (derived from the sources' footers), and the lines a sampled shard's checks report."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from types import SimpleNamespace
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from core_fixtures import FILTER_EXTENSIONS, aes_op, build, dqm_op, read_table, remove, watermark_op, write_table

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ShardError
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.ops.base import NO_INPUT, Input
from tasks.ops.lineage import Status, StepRecord, absent, appended, renamed, transformed
from tasks.scorestats import StatSpec
from tasks.verification import values
from tasks.verification.checks import BASE, KEYS, MERGED
from tasks.verification.compare import read
from tasks.verification.footers import op_records
from tasks.verification.values import (DEEP_THREADS, ShardResult, ShardTask, ShardValues, Streams, _check,
                                       check_locally, check_shard, deep_failures, derived_records, fold_stats,
                                       open_deep, prefetch)
from tasks.windows import PROBE_ROWS

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

FIRST, LAST = relpaths(2)  # the demo's watermark sidecar has no sibling for the last shard
EXTENSIONS = FILTER_EXTENSIONS + [{"name": "ernie_image_aes", "type": "ernie_image_aes_score_v1"},
                                  {"name": "watermark", "type": "watermark_score_v1"}]


def ops(p: dict) -> list[dict]:
    """An optional dqm, a rename of its column, the required aes and the optional watermark."""
    return [dqm_op(p, required=False), {"type": "rename_columns", "columns": {"dqm_d1_v6_1": "dqm"}}, aes_op(p),
            watermark_op(p, required=False)]


def setup_job(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=2, ops=ops, extensions=EXTENSIONS)
    return setup, Job(load_pipeline(setup.pipeline), setup.output)


def derived(job: Job, relpath: str) -> list[tuple]:
    base = read(job.base_uri(relpath), drop=job.pipeline.dataset.image_column)
    return [(r.status, r.lineage, r.detail) for r in derived_records(job, base.schema, relpath)]


def test_derived_records_skip_missing_optional_siblings_and_fail_required_ones(tmp_path):
    """First shard: the optional dqm sibling and the required aes sibling removed. The rename then finds its
    column absent because the skipped step would have supplied it (so it needs the history of that shard)."""
    setup, job = setup_job(tmp_path)
    remove(setup.prefixes["dqm"] + FIRST)
    remove(setup.prefixes["aes"] + FIRST)
    assert derived(job, FIRST) == [
        (Status.SKIPPED, (), "sibling shard missing"),
        (Status.PLANNED, (absent("dqm_d1_v6_1", "dqm"),), ""),
        (Status.FAILED, (), "sibling shard missing"),
        (Status.PLANNED, (appended("watermark"),), ""),
    ]


def test_derived_records_name_why_a_step_cannot_be_derived(tmp_path):
    """Last shard: the aes sibling lacks its column (a ShardError, its first line is the detail), the optional
    watermark has no sibling there."""
    setup, job = setup_job(tmp_path)
    aes = setup.prefixes["aes"] + LAST
    write_table(read_table(aes).drop_columns(["ernie_image_aes"]), aes)
    names = pq.read_schema(aes).names
    assert derived(job, LAST) == [
        (Status.PLANNED, (appended("dqm_d1_v6_1"),), ""),
        (Status.PLANNED, (renamed("dqm_d1_v6_1", "dqm"),), ""),
        (Status.FAILED, (), f"column(s) ernie_image_aes not in the source shard (it has: {', '.join(names)}); "
                            "check `columns` against the score sidecar"),
        (Status.SKIPPED, (), "sibling shard missing"),
    ]
    assert derived_records(job, read(job.base_uri(LAST), drop="image").schema, LAST)[1].input == NO_INPUT


def test_a_sibling_gone_since_the_merge_is_named_by_the_merged_columns_check(tmp_path):
    setup, job = setup_job(tmp_path)
    merge_shard(job, FIRST)
    out = read_table(job.output_uri(FIRST))
    records = op_records(read_provenance(pq.read_metadata(job.output_uri(FIRST))), len(job.pipeline.operations))
    remove(setup.prefixes["aes"] + FIRST)
    failures = deep_failures(job, FIRST, out, records)
    assert list(failures) == [MERGED]
    assert re.fullmatch(r"operations\[2\]: source shard unreadable: FileNotFoundError: .*/aes/"
                        + re.escape(FIRST) + r".*", failures[MERGED]), failures[MERGED]


def with_image(uri: str) -> None:
    """The base shard with image bytes, as real bases have them (the demo's have none)."""
    table = read_table(uri).replace_schema_metadata(None)
    write_table(table.append_column("image", pa.array([b"\xff\xd8"] * table.num_rows)), uri)


def test_check_shard_follows_the_recorded_steps_and_leaves_the_image_out(tmp_path):
    """The last shard merged without its optional watermark sibling, which appears later: the recorded step
    (skipped) decides what the output must hold, not what the footers would say now. Without provenance the steps
    are derived; either way the base's image column is no column the output must have."""
    setup, job = setup_job(tmp_path)
    for rel in (FIRST, LAST):
        with_image(setup.prefixes["base"] + rel)
        merge_shard(job, rel)
    records = op_records(read_provenance(pq.read_metadata(job.output_uri(LAST))), len(job.pipeline.operations))
    assert records[3].status is Status.SKIPPED
    write_table(read_table(setup.prefixes["watermark"] + FIRST).replace_schema_metadata(None),
                setup.prefixes["watermark"] + LAST)
    result = check_shard(job, ShardTask(LAST, deep=True, stats=False, records=records, ranges={}), ())
    assert (result.rows, result.failures) == (40, {})
    result = check_shard(job, ShardTask(FIRST, deep=True, stats=False, records=None, ranges={}), ())
    assert (result.rows, result.failures) == (40, {})
    assert deep_failures(job, FIRST, read_table(job.output_uri(FIRST)), None) == {}


def test_unreadable_shards_are_one_line_failures(tmp_path):
    setup, job = setup_job(tmp_path)
    result = check_shard(job, ShardTask(FIRST, deep=True, stats=False, records=None, ranges={}), ())
    assert list(result.failures) == [BASE] and result.rows == 0
    assert re.fullmatch(r"output shard unreadable: FileNotFoundError: .*/out/" + re.escape(FIRST) + ".*",
                        result.failures[BASE]), result.failures
    merge_shard(job, FIRST)
    out = read_table(job.output_uri(FIRST))
    remove(setup.prefixes["base"] + FIRST)
    failures = deep_failures(job, FIRST, out, None)
    assert list(failures) == [BASE]
    assert re.fullmatch(r"base shard unreadable: FileNotFoundError: .*/base/" + re.escape(FIRST) + ".*",
                        failures[BASE]), failures


def test_a_checks_lines_are_joined_in_one_failure(tmp_path):
    setup, job = setup_job(tmp_path)
    merge_shard(job, FIRST)
    out = read_table(job.output_uri(FIRST))
    for name in ("width", "height"):
        out = out.set_column(out.schema.get_field_index(name), name, pc.add(out[name], 1).cast(out[name].type))
    failures = deep_failures(job, FIRST, out, None)
    assert list(failures) == [BASE]
    assert re.fullmatch(r"column 'width': 40 of 40 rows differ, first at row 0: \d+ vs \d+; "
                        r"column 'height': 40 of 40 rows differ, first at row 0: \d+ vs \d+", failures[BASE]), failures


def test_operations_compare_keys_across_integer_widths_when_they_ask():
    shard = ShardValues(job=None, relpath="", out=pa.table({}), base=pa.table({}), records=())
    wide, narrow = pa.chunked_array([[1, 2]], pa.int64()), pa.chunked_array([[1, 2]], pa.int32())
    assert shard.compare("k", wide, narrow, cast=True) is None
    assert shard.compare("k", wide, narrow) == "column 'k' is int64, expected int32"


def test_a_merges_key_is_compared_in_the_outputs_type_and_missing_columns_are_named(tmp_path):
    """The aes sibling keys its rows by s3_image_path as large_string, the base by string (one family: the merge
    aligns them): the deep check compares the key in the output's type and finds nothing. An output without
    that key and without the aes column: each named missing, by the operation that brought it."""
    setup, job = setup_job(tmp_path)
    aes = setup.prefixes["aes"] + FIRST
    sibling = read_table(aes).replace_schema_metadata(None)
    key = sibling.schema.get_field_index("s3_image_path")
    write_table(sibling.set_column(key, "s3_image_path", sibling["s3_image_path"].cast(pa.large_string())), aes)
    merge_shard(job, FIRST)
    out = read_table(job.output_uri(FIRST))
    assert out.schema.field("s3_image_path").type == pa.string()
    assert deep_failures(job, FIRST, out, None) == {}
    failures = deep_failures(job, FIRST, out.drop_columns(["s3_image_path", "ernie_image_aes"]), None)
    assert failures == {BASE: "base column 's3_image_path' missing from the output",
                        KEYS: "operations[2]: key column 's3_image_path' missing from the output",
                        MERGED: "operations[2]: column 'ernie_image_aes' missing from the output"}


def test_deep_failures_closes_every_file_it_opened(tmp_path, monkeypatch):
    """The base and the three siblings, opened once each, all closed when the checks return."""
    _, job = setup_job(tmp_path)
    merge_shard(job, FIRST)
    out = read_table(job.output_uri(FIRST))
    records = op_records(read_provenance(pq.read_metadata(job.output_uri(FIRST))), len(job.pipeline.operations))
    opened, open_parquet = [], storage.open_parquet

    def recorded(uri, size=None):
        opened.append(open_parquet(uri, size))
        return opened[-1]

    monkeypatch.setattr(storage, "open_parquet", recorded)
    assert deep_failures(job, FIRST, out, records) == {}
    assert len(opened) == 4 and all(f.closed for f in opened)


def test_statistics_leave_out_a_column_the_window_lacks_and_fold_windows_as_one_shard():
    """A skipped operation's column is not in the window: no statistics for it, those of the next column still."""
    scores = pa.array([{"raw_score": 1.0}, {"raw_score": 3.0}], pa.struct([("raw_score", pa.float64())]))
    specs = (StatSpec("skipped", ("raw_score",), False), StatSpec("score", ("raw_score",), False))
    stats: dict = {}
    for _ in range(2):
        fold_stats(stats, pa.table({"score": scores}), specs, {})
    assert list(stats) == ["score"] and (stats["score"].shards, stats["score"].rows) == (1, 4)


def test_streams_start_a_late_reader_at_its_rows_and_a_failed_one_stays_failed(tmp_path):
    """A 10-row shard read in windows of 3 (or 1, or of no size yet): a file first asked for at row 7 (or 1)
    starts there. A file of another row count fails where it is first asked; after row 0 that leaves the shard
    broken (the checks stop), and asking it again fails the same way."""
    whole, short = str(tmp_path / "whole.parquet"), str(tmp_path / "short.parquet")
    pq.write_table(pa.table({"k": list(range(10))}), whole, row_group_size=4)
    pq.write_table(pa.table({"k": list(range(5))}), short)
    with ExitStack() as stack:
        for window, offset in ((3, 7), (1, 1)):
            late = Streams(10, stack, window_rows=window).take(whole, ["k"], offset, window)
            assert late["k"].to_pylist() == list(range(offset, offset + window))
        assert Streams(10, stack).take(whole, ["k"], 7, 3)["k"].to_pylist() == [7, 8, 9]  # no window size yet
        for offset, broken in ((0, False), (1, True)):
            streams = Streams(10, stack, window_rows=3)
            with pytest.raises(ShardError) as first:
                streams.take(short, ["k"], offset, 3)
            assert str(first.value) == "source shard has 5 rows, the output has 10" and streams.broken is broken
            with pytest.raises(ShardError) as again:
                streams.take(short, ["k"], offset + 3, 3)
            assert again.value is first.value


# ---------------------------------------------------------------- the windows a check reads, built by hand

class Recorded(Streams):
    """Streams recording each take (uri's file name, columns, offset, rows); a check that asks more than `BOUND`
    windows has lost its way (it would never end)."""

    BOUND = 8
    made: ClassVar[list[Recorded]] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.takes: list[tuple] = []
        self.nbytes: list[int] = []  # of each window taken
        Recorded.made.append(self)

    def take(self, uri, columns, offset, n):
        self.takes.append((uri.rsplit("/", 1)[-1], list(columns), offset, n))
        assert len(self.takes) <= self.BOUND, f"windows without end: {self.takes}"
        window = super().take(uri, columns, offset, n)
        self.nbytes.append(window.nbytes)
        return window


def fake_job(tmp_path, operations=(), **fields) -> SimpleNamespace:
    """What the checks ask of a Job: the output and base of a relpath under tmp_path, the window budget."""
    return SimpleNamespace(output_uri=lambda rel: str(tmp_path / "out" / rel), base_uri=lambda rel: str(
        tmp_path / "base" / rel), window_bytes=fields.get("window_bytes", 32 << 20), pipeline=SimpleNamespace(
        dataset=SimpleNamespace(image_column="image"), operations=list(operations)))


def written(path, table: pa.Table):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return str(path)


def test_the_output_is_read_in_windows_measured_after_the_first_until_its_last_row(tmp_path):
    """10,000 int64 rows: the first window is PROBE_ROWS rows; from then on as many rows as fit in the budget of
    80,000 bytes at twice the bytes a row of the first window took (about 16: about 5,000 rows), the last what
    is left."""
    written(tmp_path / "out" / "a.parquet", pa.table({"k": pa.array(range(10_000), pa.int64())}))
    job = fake_job(tmp_path, window_bytes=80_000)
    task = ShardTask("a.parquet", deep=False, stats=False, records=None, ranges={})
    with ExitStack() as stack:
        streams = Recorded(0, stack)
        assert _check(job, task, (), None, streams) == ShardResult("a.parquet", 10_000)
    size = int(80_000 // (2 * streams.nbytes[0] / PROBE_ROWS))
    assert 4_500 < size < 5_000
    assert [t[2:] for t in streams.takes] == [(0, PROBE_ROWS), (PROBE_ROWS, size), (PROBE_ROWS + size,
                                                                                  10_000 - PROBE_ROWS - size)]
    with ExitStack() as stack:
        streams = Recorded(0, stack, window_rows=3_000)  # a window given is kept
        _check(job, task, (), None, streams)
    assert [t[2:] for t in streams.takes] == [(0, 3_000), (3_000, 3_000), (6_000, 3_000), (9_000, 1_000)]


def test_an_output_unreadable_after_opening_is_one_line_naming_the_shard_and_its_rows(tmp_path):
    written(tmp_path / "out" / "a.parquet", pa.table({"k": [1, 2, 3]}))
    job = fake_job(tmp_path)
    with ExitStack() as stack:
        streams = Streams(0, stack)
        streams.readers[(job.output_uri("a.parquet"), ("k",))] = OSError("the disk went away")
        result = _check(job, ShardTask("a.parquet", False, False, None, {}), (), None, streams)
    assert result == ShardResult("a.parquet", 3, {BASE: "output shard unreadable: OSError: the disk went away"})


def test_check_shard_reads_the_window_asked_for_and_only_the_statistics_columns(tmp_path, monkeypatch):
    scores = pa.array([{"raw_score": float(i)} for i in range(7)], pa.struct([("raw_score", pa.float64())]))
    written(tmp_path / "out" / "a.parquet", pa.table({"k": list(range(7)), "score": scores}))
    monkeypatch.setattr(values, "Streams", Recorded)
    monkeypatch.setattr(Recorded, "made", [])
    task, specs = ShardTask("a.parquet", deep=False, stats=True, records=None, ranges={}), (
        StatSpec("score", ("raw_score",), False),)
    result = check_shard(fake_job(tmp_path), task, specs, window=3)
    assert (result.rows, result.failures, result.stats["score"].rows) == (7, {}, 7)
    result = check_shard(fake_job(tmp_path), task, specs)
    assert [streams.takes for streams in Recorded.made] == [
        [("a.parquet", ["score"], 0, 3), ("a.parquet", ["score"], 3, 3), ("a.parquet", ["score"], 6, 1)],
        [("a.parquet", ["score"], 0, 7)]]


def test_the_output_is_prefetched_with_the_columns_the_check_reads(tmp_path, monkeypatch):
    fetched = []
    monkeypatch.setattr(storage, "fetch_ahead", lambda uri, wanted: fetched.append(
        (uri.rsplit("/", 1)[-1], [c for c in ("k", "score") if wanted(c)])))
    job, task = fake_job(tmp_path), ShardTask("a.parquet", deep=False, stats=True, records=None, ranges={})
    assert prefetch(job, task, None) == [job.output_uri("a.parquet")]
    assert prefetch(job, task, ["score"]) == [job.output_uri("a.parquet")]
    assert fetched == [("a.parquet", ["k", "score"]), ("a.parquet", ["score"])]


def test_check_locally_checks_at_most_deep_threads_shards_at_once(tmp_path, monkeypatch):
    sizes = []

    class Pool(ThreadPoolExecutor):
        def __init__(self, max_workers=None):
            sizes.append(max_workers)
            super().__init__(max_workers)
    monkeypatch.setattr(values, "ThreadPoolExecutor", Pool)
    written(tmp_path / "out" / "a.parquet", pa.table({"k": [1]}))
    results = list(check_locally(fake_job(tmp_path), (), [ShardTask("a.parquet", False, False, None, {})]))
    assert (sizes, [r.rows for r in results]) == ([DEEP_THREADS], [1])


# ---------------------------------------------------------------- what the operations' value checks are given

def test_a_window_alone_reads_other_files_rows_and_names_the_shards_rows_in_its_lines(tmp_path):
    """A ShardValues without streams is one window, the whole of its tables: `read` gives the same rows of another
    file. With the shard's streams, a line counts the shard's rows and names a row by its place in the shard."""
    sibling = written(tmp_path / "sibling.parquet", pa.table({"k": [1, 2], "s": [0.5, 0.25]}))
    alone = ShardValues(job=None, relpath="a.parquet", out=pa.table({"k": [1, 2]}), base=pa.table({}), records=())
    assert alone.read(sibling, ["s"]).to_pydict() == {"s": [0.5, 0.25]}
    with ExitStack() as stack:
        shard = ShardValues(None, "a.parquet", pa.table({"k": [4, 5, 6]}), pa.table({}), (), offset=3,
                            streams=Streams(10, stack, window_rows=3))
        assert shard.compare("k", shard.out["k"], pa.chunked_array([[4, 0, 6]])) == (
            "column 'k': 1 of 10 rows differ, first at row 4: 5 vs 0")


def test_before_a_step_a_column_is_the_bases_an_earlier_siblings_or_none(tmp_path):
    """Base a, t; step 0 renames a to b, step 1 appends s from its sibling's column raw, step 2 transforms t."""
    relpath = "p/a.parquet"
    written(tmp_path / "sib" / relpath, pa.table({"k": [1, 2], "raw": [0.5, 0.25]}))
    dataset = SimpleNamespace(image_column="image")

    class Merge:
        def input(self, ds):
            return Input(str(tmp_path / "sib") + "/", "k", "k") if ds is dataset else None
    job = SimpleNamespace(pipeline=SimpleNamespace(dataset=dataset, operations=[None, Merge(), None]))
    records = (StepRecord(Status.APPLIED, (renamed("a", "b"),), NO_INPUT),
               StepRecord(Status.MERGED, (appended("s", "raw"),), "id"),
               StepRecord(Status.APPLIED, (transformed("t"),), NO_INPUT))
    base = pa.table({"a": [10, 20], "t": [1.0, 2.0]})
    with ExitStack() as stack:
        shard = ShardValues(job, relpath, pa.table({"k": [1, 2]}), base, records, streams=Streams(2, stack))
        assert shard.before(0, "a").to_pylist() == [10, 20] and shard.before(0, "b") is None
        assert shard.before(3, "b").to_pylist() == [10, 20] and shard.before(3, "a") is None
        assert shard.before(3, "s").to_pylist() == [0.5, 0.25]
        assert shard.before(2, "t").to_pylist() == [1.0, 2.0] and shard.before(3, "t") is None


def test_deep_checks_whose_base_cannot_be_read_say_why_in_one_line(tmp_path):
    job = fake_job(tmp_path)
    with ExitStack() as stack:
        assert re.fullmatch(r"base shard unreadable: FileNotFoundError: .*/base/a\.parquet.*",
                            open_deep(job, "a.parquet", None, Streams(2, stack)))
        written(tmp_path / "base" / "a.parquet", pa.table({"k": [1, 2]}))
        streams = Streams(2, stack)
        deep = open_deep(job, "a.parquet", (), streams)
        streams.readers[(job.base_uri("a.parquet"), ("k",))] = OSError("the disk went away")
        deep.window(pa.table({"k": [1, 2]}), 0)
        assert deep.failures == {BASE: "base shard unreadable: OSError: the disk went away"}
