"""Verify's deep checks a window of rows at a time (tasks/verification/values.py): windows of any size that cut through
the row groups of the output, the base and each sibling find exactly the differences a whole-shard comparison
finds, counted over the shard and named by their row within it; statistics fold window by window to the same
numbers; on S3 each object is read once, as listed (no HEAD), in as few requests as its layout allows."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from arrowpeak import arrow_peak
from core_fixtures import FILTER_EXTENSIONS, aes_op, build, dqm_op, read_table
from faultproxy import proxied  # noqa: F401 (a fixture)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_s3_requests import per_object

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, merge_shard
from tasks.scorestats import stat_specs
from tasks.verification import BASE, KEYS, MERGED, NO_NAN, verify
from tasks.verification.values import ShardTask, check_shard

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

ROWS = 40
REL = relpaths(1)[0]
GROUPS = st.sampled_from([1, 7, 1000])
WINDOWS = st.sampled_from([1, 3, ROWS - 1, ROWS])
PLANTED = st.sets(st.integers(0, ROWS - 1), max_size=4)
EXTENSIONS = FILTER_EXTENSIONS + [{"name": "ernie_image_aes", "type": "ernie_image_aes_score_v1"}]


def ops(p: dict) -> list[dict]:
    """dqm (its column renamed after) and aes, keyed by another column: every kind of data check has work."""
    return [dqm_op(p), {"type": "rename_columns", "columns": {"dqm_d1_v6_1": "dqm"}}, aes_op(p)]


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """One merged shard, with the pristine tables of its output, base and siblings to rewrite from."""
    tmp = tmp_path_factory.mktemp("windows")
    setup = build(tmp, str(tmp / "data"), shards=1, rows=ROWS, ops=ops, extensions=EXTENSIONS)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    merge_shard(job, REL)
    uris = {"out": job.output_uri(REL), "base": setup.prefixes["base"] + REL,
            "dqm": setup.prefixes["dqm"] + REL, "aes": setup.prefixes["aes"] + REL}
    return job, uris, {name: read_table(uri) for name, uri in uris.items()}


def lay_out(uris: dict, tables: dict, groups: dict) -> None:
    """Each file rewritten from its table with row groups of groups[name] rows."""
    for name, uri in uris.items():
        storage.write_atomic(tables[name], uri, row_group_size=groups[name])


def with_values(table: pa.Table, name: str, rows: set[int], value) -> pa.Table:
    values = table[name].to_pylist()
    for row in rows:
        values[row] = value(values[row], row)
    return table.set_column(table.schema.get_field_index(name), table.schema.field(name),
                            pa.array(values, table[name].type))


def deep(job: Job, window: int) -> dict[str, str]:
    return check_shard(job, ShardTask(REL, deep=True, stats=False, records=None, ranges={}), (), window).failures


def nan_score(value, _row):
    return None if value is None else {**value, "score": float("nan")}


@pytest.mark.parametrize("window", [1, 3, ROWS - 1, ROWS])
@pytest.mark.parametrize("rows", [{0}, {ROWS - 1}, {2, ROWS - 2}, set()], ids=["first", "last", "both-ends", "none"])
def test_a_nan_score_is_counted_over_the_shard_whatever_the_window(shard, window, rows):
    """A NaN `score` in the aes sibling, merged as it is (the merged columns equal): the NaN check counts every
    NaN row of the shard and names the first, in the first window, the last, or both; none: no failure."""
    job, uris, tables = shard
    rows = {r for r in rows if tables["aes"]["ernie_image_aes"][r].as_py() is not None}  # a null row has no score
    planted = {**tables, "out": with_values(tables["out"], "ernie_image_aes", rows, nan_score),
               "aes": with_values(tables["aes"], "ernie_image_aes", rows, nan_score)}
    lay_out(uris, planted, {"out": 7, "base": 1000, "dqm": 1, "aes": 7})
    try:
        want = {NO_NAN: f"column 'ernie_image_aes.score': {len(rows)} of {ROWS} rows NaN, first at row "
                        f"{min(rows)}: nan"} if rows else {}
        assert deep(job, window) == want
    finally:
        lay_out(uris, tables, {"out": 1000, "base": 1000, "dqm": 1000, "aes": 1000})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(groups=(7, 1000, 1, 7), window=3, widths={ROWS - 1}, keys=set())        # only in the last window
@example(groups=(1000, 7, 7, 1), window=3, widths={2, ROWS - 1}, keys={ROWS - 2})  # the first and the last
@example(groups=(1, 1, 1, 1), window=ROWS, widths=set(), keys=set())
@given(groups=st.tuples(GROUPS, GROUPS, GROUPS, GROUPS), window=WINDOWS, widths=PLANTED, keys=PLANTED)
def test_windows_through_any_row_groups_find_every_difference_by_its_shard_row(shard, groups, window, widths,
                                                                                keys):
    """The output's width changed at rows `widths` (a base column) and the dqm sibling's key at rows `keys`:
    the lines count them over the whole shard and name the first by its row, whatever the windows and the row
    groups of the output, the base, the dqm and the aes sibling."""
    job, uris, tables = shard
    planted = {**tables, "out": with_values(tables["out"], "width", widths, lambda w, _: w + 1),
               "dqm": with_values(tables["dqm"], "image_key", keys, lambda _, row: f"moved-{row}")}
    lay_out(uris, planted, dict(zip(["out", "base", "dqm", "aes"], groups)))
    want = {}
    if widths:
        first = min(widths)
        width = tables["base"]["width"][first].as_py()
        want[BASE] = (f"column 'width': {len(widths)} of {ROWS} rows differ, first at row {first}: "
                      f"{width + 1} vs {width}")
    if keys:
        first = min(keys)
        key = tables["out"]["image_key"][first].as_py()
        want[KEYS] = (f"operations[0] image_key vs source image_key: column 'image_key': {len(keys)} of {ROWS} "
                      f"rows differ, first at row {first}: {key!r} vs 'moved-{first}'")
    assert deep(job, window) == want


@pytest.mark.parametrize("window", [1, 3, ROWS - 1, ROWS])
@pytest.mark.parametrize("more", [-1, 1], ids=["one-row-short", "one-row-more"])
def test_a_sibling_with_other_row_counts_fails_alignment_in_every_window_size(shard, window, more):
    job, uris, tables = shard
    aes = tables["aes"].slice(1) if more < 0 else pa.concat_tables([tables["aes"], tables["aes"].slice(ROWS - 1)])
    lay_out(uris, {**tables, "aes": aes}, {"out": 7, "base": 7, "dqm": 7, "aes": 7})
    line = f"source shard has {ROWS + more} rows, the output has {ROWS}"
    assert deep(job, window) == {
        KEYS: f"operations[2] s3_image_path vs source s3_image_path: {line}", MERGED: f"operations[2]: {line}"}


@pytest.mark.parametrize("window", [1, 3, ROWS])
def test_statistics_fold_window_by_window_to_the_whole_shard(shard, window):
    job, uris, tables = shard
    lay_out(uris, tables, {"out": 7, "base": 7, "dqm": 7, "aes": 7})
    specs = stat_specs(job.pipeline.dataset)
    ranges = {f"{s.column}.{f}": (-10.0, 10.0) for s in specs for f in s.fields}
    task = ShardTask(REL, deep=False, stats=True, records=None, ranges=ranges)
    whole = check_shard(job, task, specs, ROWS).stats
    assert check_shard(job, task, specs, window).stats == whole
    assert {part.shards for part in whole.values()} == {1}
    aes = tables["out"]["ernie_image_aes"]
    count = pc.sum(pc.invert(pc.is_null(pc.struct_field(aes, "score")))).as_py()
    assert whole["ernie_image_aes"].fields["score"].count == count


def test_on_s3_each_object_is_read_once_as_listed(tmp_path, s3_root, proxied):
    """verify --samples all --all: one listing a prefix; per shard no HEAD, both footers read once for the
    footer checks (one GET each, sizes from the listing), then the output, the base and each sibling fetched
    whole in one GET each (all are smaller than what a fetch ahead asks for first): 2 + 2 + 1 a sibling."""
    shards = 3
    setup = build(tmp_path, s3_root, shards=shards)  # dqm, aes and an optional watermark the last shard lacks
    job = Job(load_pipeline(setup.pipeline), setup.output)
    for rel in relpaths(shards):
        merge_shard(job, rel)
    proxy = proxied()
    report = verify(job, samples=shards, all_shards=True)
    assert report.ok
    counts = per_object(proxy, s3_root)
    assert not [k for k in counts if k[0] != "GetObject"], counts
    assert counts == Counter({("GetObject", "base"): 2 * shards, ("GetObject", "out"): 2 * shards,
                              ("GetObject", "dqm"): shards, ("GetObject", "aes"): shards,
                              ("GetObject", "watermark"): shards - 1})
    lists = [op for op, *_ in proxy.log if op == "ListObjects"]
    assert len(lists) == 5  # base, three sidecars, the output


def test_a_deep_check_holds_a_window_not_the_shard(tmp_path):
    """Deep checks and statistics of one 100,000-row shard whose files are one row group each, at a budget of
    about a 30th of the shard: arrow's peak stays under half of what reading the same files whole takes (a whole
    read of the shard's output alone would exceed it)."""
    rows = 100_000
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=rows, ops=ops, extensions=EXTENSIONS)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    merge_shard(job, REL)
    files = [job.output_uri(REL), *(setup.prefixes[name] + REL for name in ("base", "dqm", "aes"))]
    assert {pq.read_metadata(uri).num_row_groups for uri in files} == {1}
    with arrow_peak() as pool:
        tables = [pq.read_table(uri) for uri in files]
    whole, output = pool.max_memory(), tables[0].nbytes
    del tables
    specs = stat_specs(job.pipeline.dataset)
    task = ShardTask(REL, deep=True, stats=True, records=None, ranges={})
    with arrow_peak() as pool:
        result = check_shard(replace(job, window_bytes=output // 30), task, specs)
    assert (result.rows, result.failures) == (rows, {})
    assert pool.max_memory() < 0.5 * whole and pool.max_memory() < output, (pool.max_memory(), whole, output)
    print(f"arrow peak: {pool.max_memory() / 2**20:.1f} MiB, whole {whole / 2**20:.1f} MiB, output {output / 2**20:.1f} MiB")
