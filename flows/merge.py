"""The merge flow: plan -> per shard: merge op 0 -> op 1 -> ... -> verify -> summary.

Run it with `sidecar-ops run PIPELINE.yaml ...` or `python flows/merge.py PIPELINE.yaml ...`.
"""
from __future__ import annotations

import os
import queue
import time
import uuid

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from flows.artifacts import ProgressArtifact, publish_summary
from tasks.config import check_output_prefix, load_pipeline
from tasks.errors import one_line
from tasks.merge import Job
from tasks.plan import make_plan, refuse_foreign, refuse_unmatched
from tasks.prefect_tasks import merge_step, verify_step
from tasks.progress import Progress
from tasks.storage import sweep_stale
from tasks.summary import RunFailed, Summary

DEFAULT_MAX_INFLIGHT = 32
PLAN_LINES = 20  # untrusted outputs named one per log line; the rest are counted


def final_state(future):
    """The state the task ended in. `wait()` first: `.state` alone may ask the API, which can lag behind."""
    future.wait()
    return future.state


def chain_error(futures: list) -> str:
    """The first failure along one shard's chain (later steps only say their upstream failed)."""
    for future in futures:
        state = final_state(future)
        if state.is_failed() or state.is_crashed():
            return one_line(state.result(raise_on_failure=False))
    return one_line(final_state(futures[-1]).result(raise_on_failure=False))


def run_id() -> str:
    """This flow run's id (recorded in each output's provenance), or a fresh one outside a flow run."""
    from prefect.runtime import flow_run

    return str(flow_run.id or uuid.uuid4())


def submit_shard(runner, job: Job, relpath: str, merge, verify) -> list:
    """Submit the chain of one shard; returns its futures, the verify future last."""
    futures, upstream = [], None
    for index in range(len(job.pipeline.operations)):
        upstream = runner.submit(merge, {"job": job, "relpath": relpath, "index": index, "state": upstream})
        futures.append(upstream)
    futures.append(runner.submit(verify, {"job": job, "relpath": relpath, "stats": upstream}))
    return futures


def run_shards(runner, job: Job, todo: list[str], summary: Summary, max_inflight: int, fail_fast: bool,
               retries: int, progress: Progress, ui: ProgressArtifact, logger) -> None:
    """A sliding window of at most `max_inflight` shard chains; each shard's futures go once it is done."""
    finished: queue.Queue = queue.Queue()
    inflight: dict[str, list] = {}
    merge, verify = merge_step.with_options(retries=retries), verify_step.with_options(retries=retries)  # once

    def collect_one() -> None:
        relpath = finished.get()
        futures = inflight.pop(relpath)
        state = final_state(futures[-1])
        if state.is_completed():
            stats = state.result()
            summary.merged += 1
            summary.rows += stats.rows
            summary.bytes += stats.bytes
            summary.ops_skipped += stats.skipped_ops
            progress.update(done=1, rows=stats.rows)
            skipped = f", {stats.skipped_ops} operation(s) skipped (no sibling)" if stats.skipped_ops else ""
            logger.info("shard %s merged: %d rows, %d bytes%s", relpath, stats.rows, stats.bytes, skipped)
        else:
            error = chain_error(futures)
            summary.failed.append((relpath, error))
            progress.update(failed=1)
            logger.error("shard %s FAILED: %s", relpath, error)
        ui.update(summary.skipped + summary.merged + len(summary.failed))

    for relpath in todo:
        while len(inflight) >= max_inflight:
            collect_one()
        if fail_fast and summary.failed:
            break
        inflight[relpath] = futures = submit_shard(runner, job, relpath, merge, verify)
        futures[-1].add_done_callback(lambda _f, rel=relpath: finished.put(rel))
    while inflight:
        collect_one()


@flow(name="sidecar-merge", flow_run_name="merge {pipeline}", log_prints=False, validate_parameters=True)
def merge_flow(pipeline: str, output_prefix: str, skip_existing: bool = True, overwrite: bool = False,
               max_inflight: int = DEFAULT_MAX_INFLIGHT, fail_fast: bool = False, datasets_dir: str | None = None,
               retries: int = 1, use_ray: bool = False, ray_address: str | None = None,
               task_cpus: float | None = None, task_memory_gb: float | None = None,
               max_workers: int | None = None) -> dict:
    """Merge every shard of PIPELINE's base sidecar with its score sidecars into `output_prefix`."""
    logger = get_run_logger()
    start = time.monotonic()
    pipe = load_pipeline(pipeline, datasets_dir)
    replace = overwrite or not skip_existing
    job = Job(pipe, output_prefix, run_id=run_id(), overwrite=replace)
    check_output_prefix(pipe, output_prefix)
    plan = make_plan(job, overwrite=replace)
    refuse_unmatched(plan)
    if not overwrite:
        refuse_foreign(plan)
    if swept := sweep_stale(output_prefix):
        logger.info("removed %d leftover temp file(s)/upload(s) of killed writers under %s", swept, output_prefix)
    summary = Summary(output_prefix, total=len(plan.shards), skipped=len(plan.complete), stale=len(plan.stale))
    log_plan(logger, plan, summary)
    progress = Progress("merge", summary.total)
    progress.update(skipped=summary.skipped)
    ui = ProgressArtifact("merge-progress", summary.total, f"shards finished of {summary.total}: {output_prefix}")
    ui.update(summary.skipped)
    if plan.todo:
        with make_runner(use_ray, ray_address, max_workers, task_cpus, task_memory_gb) as runner:
            run_shards(runner, job, plan.todo, summary, max(1, max_inflight), fail_fast, retries, progress, ui,
                       logger)
    progress.close()
    ui.update(summary.skipped + summary.merged + len(summary.failed), final=True)
    summary.seconds = time.monotonic() - start
    for line in summary.lines():
        logger.info(line)
    publish_summary(summary, pipeline)
    if not summary.ok:
        raise RunFailed(summary)
    return summary.to_dict()


def log_plan(logger, plan, summary: Summary) -> None:
    logger.info("%d shards: %d complete, %d to merge (%d stale) (%d operations each) into %s", summary.total,
                summary.skipped, len(plan.todo), summary.stale, len(plan.job.pipeline.operations),
                plan.job.output_prefix)
    for index, op in enumerate(plan.job.pipeline.operations):
        missing = plan.missing_siblings(index)
        logger.info("operations[%d] %s: %d sibling shards found, %d missing%s", index, op.describe(),
                    len(plan.base.shards) - len(missing), len(missing),
                    " (skipped there: required: false)" if missing and not op.required else "")
    for what, outputs in (("made from other inputs", plan.stale), ("not trusted", plan.broken)):
        for relpath, why in outputs[:PLAN_LINES]:
            logger.info("shard %s: existing output %s (%s); recomputing", relpath, what, why)
        if len(outputs) > PLAN_LINES:
            logger.info("... and %d more outputs %s, recomputing", len(outputs) - PLAN_LINES, what)


# Non-secret settings every Ray worker needs to behave like the driver (the S3 endpoint and region, retry and
# upload tuning, Prefect log levels). Credentials never travel: each node uses its own credential chain.
FORWARDED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_MAX_ATTEMPTS",
                 "AWS_RETRY_MODE", "SIDECAR_OPS_PART_SIZE", "DO_NOT_TRACK")
FORWARDED_ENV_PREFIXES = ("PREFECT_LOGGING_",)


def forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in FORWARDED_ENV or k.startswith(FORWARDED_ENV_PREFIXES)}


def make_runner(use_ray: bool, ray_address: str | None, max_workers: int | None, task_cpus: float | None,
                task_memory_gb: float | None):
    if not use_ray:
        return ThreadPoolTaskRunner(max_workers=max_workers)
    from flows.runners import make_task_runner

    return make_task_runner(use_ray=True, ray_address=ray_address, max_workers=max_workers,
                            task_cpus=task_cpus, task_memory_gb=task_memory_gb,
                            debug=os.environ.get("SIDECAR_OPS_DEBUG") == "1",
                            init_kwargs={"runtime_env": {"env_vars": forwarded_env()}})


if __name__ == "__main__":
    import sys

    from flows.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
