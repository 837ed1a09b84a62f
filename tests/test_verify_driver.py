"""Verify's driver folds each shard's footers as they are read (tasks/verification/driver.py Found): it keeps the
counts, the problems and the facts of the statistics' scope, never a fact per shard; problems read in any order are
reported in the listings' order; a signal during the shard checks stops the footer reads still to come."""
from __future__ import annotations

import gc
import threading
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import make_dataset, relpaths
from tasks.kernel import Job, merge_shard
from tasks.plan import FOOTER_THREADS, make_plan
from tasks.progress import Progress
from tasks.scorestats import stat_specs
from tasks.verification import INPUTS, ROWS, verify
from tasks.verification import driver
from tasks.verification.checks import siblings_check
from test_verify import write_config

pytestmark = pytest.mark.fast
ROWS_PER_SHARD = 20


def merged(root, shards: int) -> Job:
    prefix = storage.normalize_prefix(str(root / "data"))
    make_dataset(prefix, shards=shards, rows=ROWS_PER_SHARD)
    job = Job(load_pipeline(write_config(root / "cfg", prefix)), prefix + "out/")
    for rel in relpaths(shards):
        merge_shard(job, rel)
    return job


def add_a_row(job: Job, rel: str) -> None:
    """The output of `rel` with its first row twice (its footer, provenance included, as before)."""
    path = job.output_uri(rel)
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), path)


def sibling_index(job: Job) -> int:
    return next(i for i, op in enumerate(job.pipeline.operations) if op.input(job.pipeline.dataset))


def fold(job: Job, scope: set[str]) -> driver.Found:
    plan = make_plan(job, overwrite=True)
    found = driver.Found(scope)
    driver.FooterReads(plan, plan.shards, stat_specs(job.pipeline.dataset), found, Progress("t", 0)).join()
    return found


def test_the_fold_keeps_counts_problems_and_the_scope_only(tmp_path):
    job = merged(tmp_path, 12)
    rels = relpaths(12)
    add_a_row(job, rels[3])
    index = sibling_index(job)
    source = job.pipeline.operations[index].input(job.pipeline.dataset)
    storage.filesystem(source.uri(rels[5]))[0].rm(storage.filesystem(source.uri(rels[5]))[1])
    found = fold(job, {rels[0], rels[7]})
    assert set(found.facts) == {rels[0], rels[7]}
    assert found.facts[rels[7]].ranges and found.facts[rels[7]].records
    assert found.rows == 12 * ROWS_PER_SHARD + 1
    assert found.problems[ROWS] == [(rels[3], f"output has {ROWS_PER_SHARD + 1} rows, base has {ROWS_PER_SHARD}")]
    assert [rel for rel, _ in found.problems[INPUTS]] == [rels[5]]  # the vanished sibling's shard, only
    assert set(found.problems) == {ROWS, INPUTS}
    assert found.siblings == {index: [(rels[5], "sibling merged into the output has since vanished")]}


def test_problems_folded_in_any_order_are_reported_in_the_listings_order(tmp_path):
    job = merged(tmp_path, 6)
    rels = relpaths(6)
    for rel in rels[1:]:
        add_a_row(job, rel)
    plan = make_plan(job, overwrite=True)
    found = fold(job, set())
    again = driver.Found(set())
    for rel in reversed(plan.shards):  # the fold's order is the threads': here the reverse of the listings'
        for name, detail in found.problems[ROWS]:
            if name == rel:
                again.problems.setdefault(ROWS, []).append((name, detail))
    ctx = driver.Context(job, plan, plan.shards, again)
    check = next(c for c in driver.make_checks(ctx, [], 0, 0) if c.name == ROWS)
    assert [f.path for f in check.failures] == sorted(rels[1:]) == [r for r in plan.shards if r in rels[1:]]


def test_a_failed_footer_read_is_raised_not_lost(tmp_path, monkeypatch):
    job = merged(tmp_path, 4)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(driver, "read_footers", broken)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        fold(job, set())


def test_a_signal_during_the_shard_checks_stops_the_footer_reads_to_come(tmp_path, monkeypatch):
    """The footers outside the sample wait on a gate; the shard checks raise KeyboardInterrupt; once verify has
    raised, the gate opens: only the reads already started finish (at most one a footer thread), never all."""
    shards = FOOTER_THREADS * 3
    job = merged(tmp_path, shards)
    gate, read = threading.Event(), []
    real = driver.read_footers

    def gated(job, rel, specs, want_ranges, *args):
        if not want_ranges:  # outside the sample (the statistics' scope)
            gate.wait()
            read.append(rel)
        return real(job, rel, specs, want_ranges, *args)

    def interrupted(job, specs, tasks):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(driver, "read_footers", gated)
    with pytest.raises(KeyboardInterrupt):
        verify(job, samples=2, run=interrupted)
    gate.set()
    for thread in [t for t in threading.enumerate() if t.name.startswith("verify-footers-")]:
        thread.join()
    assert 0 < len(read) <= FOOTER_THREADS < shards - 2


def held_at_the_report(job: Job, monkeypatch) -> int:
    """Python-allocated bytes the driver holds once every footer is folded in (at make_checks), garbage
    collected first: what stays for the report, not the transient peak of 32 reading threads."""
    held, real = [], driver.make_checks

    def measured(*args):
        gc.collect()
        held.append(tracemalloc.get_traced_memory()[0])
        return real(*args)

    monkeypatch.setattr(driver, "make_checks", measured)
    tracemalloc.start()
    try:
        assert verify(job, samples=2).ok
    finally:
        tracemalloc.stop()
    return held[0]


def test_the_driver_holds_the_listings_not_the_footers(tmp_path, monkeypatch):
    """Per extra shard, what the driver holds at the report is the listings' entries (5 prefixes in the demo
    pipeline, ~1 KiB), not the footer facts (several KiB) of a driver that keeps every shard's."""
    small, large = merged(tmp_path / "small", 40), merged(tmp_path / "large", 160)
    held_at_the_report(small, monkeypatch)  # imports and first-use caches
    per_shard = (held_at_the_report(large, monkeypatch) - held_at_the_report(small, monkeypatch)) / 120
    assert per_shard < 2048, f"{per_shard:.0f} bytes a shard"


def test_footer_reads_leave_no_garbage_only_a_full_collection_frees(tmp_path):
    """pyarrow's FileMetaData.schema refers back to its FileMetaData: a footer read through it stays in memory, C++
    metadata and all, until the cyclic GC runs a full collection, which over many shards is rarely."""
    job = merged(tmp_path, 6)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fold(job, set(relpaths(6)[:1]))
        gc.collect()
        cyclic = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not cyclic & {"FileMetaData", "ParquetSchema"}, cyclic
