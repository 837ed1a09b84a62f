"""Thin Prefect task wrappers around the kernel in tasks/merge.py.

Arguments are plain values (a small Job, a relpath, an index); tables pass only between the merge
steps of one shard, never cached or persisted by Prefect; the last step writes and returns small stats.
"""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run
from prefect.states import Completed

from tasks import merge
from tasks.errors import ShardError
from tasks.merge import Job, ShardState, ShardStats



def worth_retrying(task, task_run, state) -> bool:
    """Retry I/O trouble; a misaligned or mistyped shard fails the same way every time."""
    exc = state.result(raise_on_failure=False)
    return not isinstance(exc, ShardError) or exc.transient


SHARD_TASK = dict(persist_result=False, cache_policy=NO_CACHE, retries=1, retry_delay_seconds=[2, 10, 30],
                  retry_condition_fn=worth_retrying, log_prints=False)


def finished_earlier(job: Job, relpath: str):
    """On a retry, an earlier attempt may have written the shard before dying: trust it only if complete."""
    from tasks.plan import output_status

    status, rows = output_status(job, relpath)
    if status != "complete":
        return None
    return Completed(name="Cached", message="output shard already complete",
                     data=ShardStats(relpath, rows=int(rows), bytes=0))


@task(name="merge", task_run_name="merge[{index}] {relpath}", **SHARD_TASK)
def merge_step(job: Job, relpath: str, index: int, state: ShardState | None = None) -> ShardState | ShardStats:
    """Operation `index` on one shard: the first step reads the base, the last one writes the output."""
    if isinstance(state, ShardStats):
        return state  # an upstream attempt found the shard already written
    if task_run.run_count > 1 and (cached := finished_earlier(job, relpath)) is not None:
        return cached
    if state is None:
        state = merge.read_base(job, relpath)
    state = merge.apply_step(job, relpath, index, state)
    if index == len(job.pipeline.operations) - 1:
        return merge.write_output(job, relpath, state)
    return state


@task(name="verify-shard", task_run_name="verify {relpath}", **SHARD_TASK)
def verify_step(job: Job, relpath: str, stats: ShardStats) -> ShardStats:
    return merge.verify_output(job, relpath, stats)
