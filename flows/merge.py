"""The merge flow: one listing task per prefix -> plan -> per shard: one task streaming every operation, the write
and its check (or a chain of one task per operation, the last writing and checking) -> the run's check -> summary.

Run it with `sidecar-ops run PIPELINE.yaml ...` or `python flows/merge.py PIPELINE.yaml ...`.
"""
from __future__ import annotations

import time
import uuid

from prefect import get_run_logger
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, State

from flows.artifacts import ProgressArtifact, publish_summary
from flows.interrupt import DEFAULT_GRACE, Interruption, Stop, grace_seconds, handling
from flows.plainflow import plain_flow
from flows.runconfig import DEFAULT_MAX_INFLIGHT, DEFAULT_RETRIES, RunConfig, RunnerChoice
from flows.scheduler import Window, make_runner, run_window
from tasks.kernel import Job, ShardStats, now_utc, overwrite_fields
from tasks.plan import Plan, list_or_refuse, make_plan, prefixes, refuse_foreign, refuse_unmatched
from tasks.prefect_tasks import RunOutcome, shard_task, list_shards, operation_task, verify_run
from tasks.progress import Progress
from tasks.runcheck import RunCheckFailed
from tasks.storage import Listing, abandon_writes, run_writes, sweep_stale
from tasks.summary import RunFailed, Summary

PLAN_LINES = 20  # untrusted outputs named one per log line; the rest are counted


def run_id() -> str:
    """This flow run's id (recorded in each output's provenance), or a fresh one outside a flow run."""
    return str(flow_run.id or uuid.uuid4())


def steps_share_a_process(config: RunConfig) -> bool:
    """Whether every step of a shard runs in one process (one fused task, or Prefect's thread pool), so its first
    step can fetch the inputs of the later ones ahead; Ray may run each step on another node."""
    return config.fuse_operations or not config.runner.use_ray


class ShardSteps:
    """The Prefect tasks of one shard, built once per run: one task streaming all its operations, the write and
    the check (`fuse_operations`, the default), or a chain of one task per operation, the last one writing and
    checking (each step shows in the UI; the whole table goes from step to step). Each task is handed the plan's
    listing of the shard's inputs (`Plan.listed`)."""

    def __init__(self, runner, plan: Plan, config: RunConfig):
        self.runner, self.plan, self.job, self.fused = runner, plan, plan.job, config.fuse_operations
        self.merge = operation_task.with_options(retries=config.retries)
        self.whole = shard_task.with_options(retries=config.retries)

    def submit(self, relpath: str) -> list:
        """The futures of one shard, its last task last."""
        listed = self.plan.listed(relpath)
        if self.fused:
            return [self.runner.submit(self.whole, {"job": self.job, "relpath": relpath, "listed": listed})]
        futures, upstream = [], None
        for index in range(len(self.job.pipeline.operations)):
            upstream = self.runner.submit(self.merge, {"job": self.job, "relpath": relpath, "index": index,
                                                       "state": upstream, "listed": listed})
            futures.append(upstream)
        return futures


def list_prefixes(job: Job) -> dict[str, Listing]:
    """One listing task per prefix the plan needs (the base, each input, the output), all at once; a listing
    the store refuses is one line (ConfigError)."""
    futures = {prefix: list_shards.submit(prefix, what) for prefix, what in prefixes(job).items()}
    return {prefix: list_or_refuse(prefix, prefixes(job)[prefix], future.result)
            for prefix, future in futures.items()}


def run_shards(steps: ShardSteps, todo: list[str], config: RunConfig, summary: Summary, progress: Progress,
               ui: ProgressArtifact, logger, stop: Stop, window: Window, merged: dict[str, ShardStats]) -> None:
    """Every shard to do through the scheduler's window; each finished one is counted (in `merged` by relpath
    too), logged and shown. A failure under --fail-fast, or a signal, stops new submissions (`stop`)."""
    for done in run_window(todo, steps.submit, config.max_inflight, stop, window):
        relpath = done.item
        if done.ok:
            stats = done.result()
            summary.add(stats)
            merged[relpath] = stats
            progress.update(done=1, rows=stats.rows)
            skipped = f", {stats.skipped_ops} operation(s) skipped (no sibling)" if stats.skipped_ops else ""
            logger.info("shard %s merged: %d rows, %d bytes%s", relpath, stats.rows, stats.bytes, skipped)
        else:
            error = done.error()
            summary.failed.append((relpath, error))
            progress.update(failed=1)
            logger.error("shard %s FAILED: %s", relpath, error)
            if config.fail_fast:
                stop.request("--fail-fast")
        ui.update(summary.finished)


@plain_flow(name="sidecar-merge", flow_run_name="merge {pipeline}", log_prints=False, validate_parameters=True)
def merge_flow(pipeline: str, output_prefix: str, overwrite: bool = False,
               max_inflight: int = DEFAULT_MAX_INFLIGHT, fail_fast: bool = False, datasets_dir: str | None = None,
               retries: int = DEFAULT_RETRIES, use_ray: bool = False, ray_address: str | None = None,
               task_cpus: float | None = None, task_memory_gb: float | None = None,
               fuse_operations: bool = True, debug: bool = False, max_workers: int | None = None,
               overwrite_before: str | None = None, grace_seconds: float = DEFAULT_GRACE,
               continue_overwrite: str | None = None, window_mib: float | None = None,
               recompress: str | None = None) -> Summary:
    """Merge every shard of PIPELINE's base sidecar with its score sidecars into `output_prefix`.
    `overwrite` recomputes every shard; otherwise complete outputs are kept (resume). `continue_overwrite`
    (the id an interrupted overwrite's summary prints) keeps the outputs that overwrite wrote and recomputes
    every other one. `overwrite_before` (an ISO time) recomputes only outputs written by runs started before
    it (by the clocks of the machines that ran them). `recompress` "zstd" decodes and encodes every column
    (else column chunks are copied as bytes where a shard allows it)."""
    runner = RunnerChoice(use_ray, ray_address, task_cpus, task_memory_gb, max_workers, debug)
    config = RunConfig.load(pipeline, output_prefix, datasets_dir, writes=True, runner=runner,
                            max_inflight=max_inflight, overwrite=overwrite, fail_fast=fail_fast, retries=retries,
                            fuse_operations=fuse_operations, overwrite_before=overwrite_before,
                            grace_seconds=grace_seconds, continue_overwrite=continue_overwrite,
                            window_mib=window_mib, recompress=recompress)
    return merge(config)


def merge(config: RunConfig) -> Summary | State:
    """The body of a merge flow run: plan, refuse what cannot be right, run the shards, summarize. A SIGINT,
    SIGTERM or SIGHUP stops it the documented way (flows/interrupt.py): a Cancelled state (with the summary
    once shards may have started), unless the work was done when it came."""
    stop = Stop()
    with handling(stop, grace_seconds(config.grace_seconds)):
        try:
            if stop.requested:  # a signal came as the flow run started
                raise Interruption(stop.reason)
            return merge_until(config, stop)
        except Interruption as exc:  # ... or while planning: no shard started, nothing written
            return Cancelled(message=f"interrupted by {exc}: no shard started", data=str(exc))


def merge_until(config: RunConfig, stop: Stop) -> Summary | State:
    logger = get_run_logger()
    start = time.monotonic()
    started, this_run = now_utc(), run_id()
    job = Job(config.pipeline, config.output_prefix, run_id=this_run, started=started,
              fetch_ahead=steps_share_a_process(config), **config.window_bytes, recompress=config.recompress or "",
              **overwrite_fields(config.overwrite, this_run, config.continue_overwrite, config.overwrite_before))
    with stop.nothing_written():  # a signal while planning ends the run at once
        plan = make_plan(job, overwrite=config.overwrite, listings=list_prefixes(job))
        refuse_unmatched(plan)
        if not config.overwrite:
            refuse_foreign(plan)
        if swept := sweep_stale(config.output_prefix):
            logger.info("removed %d leftover temp file(s)/upload(s) of killed writers under %s", swept,
                        config.output_prefix)
    summary = Summary(config.output_prefix, total=len(plan.shards), skipped=len(plan.complete),
                      stale_shards=[rel for rel, _ in plan.stale])
    summary.continue_with = continuation(job)
    log_plan(logger, plan, summary)
    progress = Progress("merge", summary.total)
    progress.update(skipped=summary.skipped)
    ui = ProgressArtifact("merge-progress", summary.total,
                          f"shards finished of {summary.total}: {config.output_prefix}")
    ui.update(summary.skipped)
    window, merged = Window(), {}
    if plan.todo and not stop.requested:
        # run_writes: once abandoned, a shard still reading never writes after the summary (its thread goes on)
        with run_writes(), make_runner(config.runner, PREFECT_API_URL.value()) as runner:
            run_shards(ShardSteps(runner, plan, config), plan.todo, config, summary, progress, ui, logger, stop,
                       window, merged)
            stop.done = True  # a signal from now on changes nothing
            if window.abandoned:
                abandon(runner)
    stop.done = True
    not_started = len(plan.todo) - window.submitted
    if not_started or window.abandoned or stop.reason == "--fail-fast":  # else the stop left nothing undone
        summary.stopped(stop.reason, not_started=not_started, abandoned=window.abandoned)
    progress.close()
    if not summary.failed and not summary.stop_reason:
        check_outputs(RunOutcome(plan, merged), summary)
    ui.update(summary.finished, final=True)
    summary.seconds = time.monotonic() - start
    for line in summary.lines():
        logger.info(line)
    publish_summary(summary, config.pipeline.path)
    if summary.stop_reason and stop.by_signal:  # the flow run ends Cancelled, not Crashed; the CLI exits 130
        return Cancelled(message=f"interrupted by {stop.reason}: {summary.headline()}", data=summary)
    if not summary.ok:
        raise RunFailed(summary)
    return summary


def check_outputs(outcome: RunOutcome, summary: Summary) -> None:
    """The run's check (the verify-run task), once every shard is merged or kept; a failure fails the run."""
    try:
        summary.run_check = verify_run(outcome.plan.job.output_prefix, outcome).line()
    except RunCheckFailed as exc:
        summary.run_check, summary.run_check_failed = exc.check.line(), True
    except OSError as exc:
        summary.run_check, summary.run_check_failed = f"run check FAILED: cannot list the output prefix: {exc}", True


def continuation(job: Job) -> str:
    """The option that continues this run if it is an overwrite and does not finish: the same TIME for one
    asked for by time, else this overwrite's id (nothing that compares two machines' clocks)."""
    if not job.overwrite:
        return ""
    if job.overwrite_before:
        return f"--overwrite-before {job.overwrite_before}"
    return f"--continue-overwrite {job.overwrite_id}"


def abandon(runner) -> None:
    """The grace period is over: this process's writes of the shards abandoned in flight are taken back (no temp
    file, no upload left) and the thread pool is not waited for. Ray's tasks end with this driver."""
    abandon_writes()
    if hasattr(runner, "abandon"):
        runner.abandon()


def log_plan(logger, plan, summary: Summary) -> None:
    logger.info("%d shards: %d complete, %d to merge (%d stale) (%d operations each) into %s", summary.total,
                summary.skipped, len(plan.todo), summary.stale, len(plan.job.pipeline.operations),
                plan.job.output_prefix)
    for index, op in enumerate(plan.job.pipeline.operations):
        source = plan.input(index)
        if source is None:
            logger.info("operations[%d] %s: reads no sibling shards", index, op.describe())
            continue
        missing = plan.missing_siblings(index)
        logger.info("operations[%d] %s: %d sibling shards found, %d missing%s", index, op.describe(),
                    len(plan.base.shards) - len(missing), len(missing),
                    " (skipped there: required: false)" if missing and not source.required else "")
    for what, outputs in (("made from other inputs", plan.stale), ("not trusted", plan.broken)):
        for relpath, why in outputs[:PLAN_LINES]:
            logger.info("shard %s: existing output %s (%s); recomputing", relpath, what, why)
        if len(outputs) > PLAN_LINES:
            logger.info("... and %d more outputs %s, recomputing", len(outputs) - PLAN_LINES, what)


if __name__ == "__main__":
    import sys

    from flows.console import console

    console(["run", *sys.argv[1:]])
