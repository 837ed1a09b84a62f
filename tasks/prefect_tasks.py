"""Thin Prefect task wrappers around the kernel in tasks/kernel.py.

Arguments are plain values (a small Job, a relpath, an index); tables pass only between the merge
steps of one shard, never cached or persisted by Prefect; the last step writes and returns small stats.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE, CachePolicy
from prefect.runtime import task_run
from prefect.states import Completed

from tasks import kernel, storage
from tasks.errors import ShardError
from tasks.kernel import Job, ShardState, ShardStats
from tasks.ops import Status
from tasks.plan import Plan, judge_output
from tasks.runcheck import RunCheck, RunCheckFailed, check_run


def worth_retrying(task, task_run, state) -> bool:
    """Retry I/O trouble; a misaligned or mistyped shard fails the same way every time."""
    exc = state.result(raise_on_failure=False)
    return not isinstance(exc, ShardError) or exc.transient


class ShardInputs(CachePolicy):
    """Cache key of a shard's output: pipeline fingerprint, merge semantics, relpath and input identities
    (kernel.shard_key, the same function the planner applies to listings in batch).

    Why the match is decided inside the task and not by Prefect's result-store lookup: Prefect calls a cache
    hit when a result record exists under the key in its own result storage. That record would be a second
    truth beside the output shard (kept after the shard is deleted or replaced, absent on a fresh PREFECT_HOME
    or another Ray node), and the key is computed before the task runs, so it cannot see the inputs the task
    is about to read. So the task computes this key from the inputs it actually read, compares it with the
    key the existing output recorded in its footer (`cached_output`), and on a match returns a Completed
    state named "Cached" carrying the output's real stats. The output shard stays the only truth."""

    def compute_key(self, task_ctx, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs) -> str | None:
        job, state = inputs.get("job"), inputs.get("state")
        if not isinstance(job, Job) or not isinstance(state, ShardState):
            return None
        return kernel.shard_key(job.fingerprint, inputs["relpath"], state.inputs())


SHARD_INPUTS = ShardInputs()
SHARD_TASK = dict(persist_result=False, cache_policy=NO_CACHE, retries=1, retry_delay_seconds=[2, 10, 30],
                  retry_condition_fn=worth_retrying, log_prints=False)


def cached_output(job: Job, relpath: str, inputs: dict, rows: int) -> ShardStats | None:
    """On a retry, stats of the existing output when it is exactly what these inputs would make (same
    fingerprint, row count and input key), else None. In an --overwrite run only an output that overwrite
    wrote counts (Job.kept_by_overwrite: its overwrite id, carried by continuations). A first attempt does not
    look (the plan just found no current output): no extra request per shard."""
    if task_run.run_count <= 1:
        return None  # the plan found no current output; only an earlier attempt of this task can have written it
    uri = job.output_uri(relpath)
    try:
        with storage.open_parquet(uri) as f:
            meta = pq.ParquetFile(f).metadata
            size = storage.file_size(uri, f)
    except Exception:
        return None  # absent or unreadable: write it
    prov = kernel.read_provenance(meta) or {}
    if judge_output(job, relpath, meta, inputs)[0] != "complete":  # its fingerprint and input key
        return None
    if meta.num_rows != rows or (job.overwrite and not job.kept_by_overwrite(prov)):
        return None
    skipped = sum(r.get("status") == Status.SKIPPED.value for r in prov.get("operations") or [])
    return ShardStats(relpath, rows=meta.num_rows, bytes=size, skipped_ops=skipped)


def first_attempt_reads(listed: dict[str, str] | None):
    """A shard task's first attempt reads the inputs the plan listed, as listed (no request to ask for their
    size and version again); a retry sees them as they are now (one may have been replaced since)."""
    first = task_run.run_count <= 1
    return storage.listed(listed if first and listed else {})


@contextmanager
def forgetting_on_failure(job: Job, relpath: str):
    """A failed step releases what was fetched ahead for the shard's later steps (they will not run)."""
    try:
        yield
    except BaseException:
        kernel.forget_inputs_ahead(job, relpath)
        raise


@task(name="merge", task_run_name="merge[{index}] {relpath}", **SHARD_TASK)
def operation_task(job: Job, relpath: str, index: int, state: ShardState | None = None,
               listed: dict[str, str] | None = None) -> ShardState | ShardStats:
    """Operation `index` on one shard: the first step reads the base, the last one writes and checks the
    output unless an output made from the same inputs is already there (then the task ends as Cached).
    `listed`: the plan's identities of the shard's inputs (Plan.listed)."""
    if isinstance(state, ShardStats):
        return state  # an upstream attempt found the shard already written
    with first_attempt_reads(listed), forgetting_on_failure(job, relpath):
        if state is None:
            state = kernel.read_base(job, relpath)
        state = kernel.apply_operation(job, relpath, index, state)
    if index < len(job.pipeline.operations) - 1:
        return state
    return write_unless_cached(job, relpath, state)


def write_unless_cached(job: Job, relpath: str, state: ShardState):
    """The written and checked output's stats, or a Completed state named Cached when a retry finds it already
    written. The post-write check (kernel.check_written) runs on the output returned: a fresh write checks what
    it stored, a found output is read back and checked (an earlier attempt's check may have failed on it)."""
    found = cached_output(job, relpath, state.inputs(), state.table.num_rows)
    if found is None:
        return kernel.write_output(job, relpath, state)
    return checked_cached(job, relpath, found, state.key_batches())


def checked_cached(job: Job, relpath: str, found: ShardStats, base_keys=None) -> Completed:
    stats = kernel.check_written(job, relpath, found, base_keys=base_keys)
    return Completed(name="Cached", message="output shard already made from these inputs", data=stats)


@task(name="merge-shard", task_run_name="merge {relpath}", **SHARD_TASK)
def shard_task(job: Job, relpath: str, listed: dict[str, str] | None = None) -> ShardStats:
    """Every operation of one shard, the write and its check in one task (`--fuse-operations`): one task
    run per shard instead of one per operation, for runs of very many shards. The shard streams
    (kernel.stream_output): its memory is bounded by a row group, not by the shard."""
    with first_attempt_reads(listed), kernel.opened_shard(job, relpath) as shard:
        found = cached_output(job, relpath, shard.inputs(), shard.rows)
        if found is not None:
            return checked_cached(job, relpath, found)
        return kernel.stream_output(job, relpath, shard)


def worth_listing_again(task, task_run, state) -> bool:
    """Retry a listing the store failed (a timeout, a 503); not one it refused or that found no bucket."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, OSError) and not isinstance(exc, (PermissionError, FileNotFoundError))


LISTING_TASK = dict(persist_result=False, cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[1, 5],
                    retry_condition_fn=worth_listing_again, log_prints=False)


@task(name="list", task_run_name="list {what}", **LISTING_TASK)
def list_shards(prefix: str, what: str) -> storage.Listing:
    """One paginated listing of a prefix the plan needs (the base, an input, the output), with its counts
    in the task run's log."""
    listing = storage.list_prefix(prefix)
    get_run_logger().info("%s %s: %d shards, %d bytes, %d other objects%s", what, prefix, len(listing.shards),
                          sum(listing.shards.values()), len(listing.others),
                          "" if listing.exists else " (does not exist)")
    return listing


class RunOutcome:
    """What a merge run holds when its shards are done: the plan (its listings) and each merged shard's
    stats. A plain holder: Prefect does not walk it as a task parameter (it would, item by item, a dict)."""

    def __init__(self, plan: Plan, merged: dict[str, ShardStats]):
        self.plan, self.merged = plan, merged


@task(name="verify-run", task_run_name="verify run {output_prefix}", **LISTING_TASK)
def verify_run(output_prefix: str, outcome: RunOutcome) -> RunCheck:
    """The run's check (tasks/runcheck.py): one fresh listing of the output prefix against what the run made;
    its table is published as the artifact `merge-run-check`. Fails (RunCheckFailed) on any problem."""
    check = check_run(outcome.plan, outcome.merged, storage.list_prefix(output_prefix))
    create_table_artifact(key="merge-run-check", table=check.table, description=check.line())
    get_run_logger().info(check.line())
    if not check.ok:
        raise RunCheckFailed(check)
    return check
