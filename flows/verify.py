"""The verify flow: cheap checks on every shard, deep checks on sampled shards as Prefect tasks, two artifacts.

Run it with `sidecar-ops verify PIPELINE.yaml --output-prefix URI ...` or `python flows/verify.py PIPELINE.yaml
--output-prefix URI ...`. The checks themselves are plain pyarrow in tasks/verify.py; this module only runs
them (thread pool, or Ray with --use-ray), publishes the artifacts and prints the report.
"""
from __future__ import annotations

import os
import queue
import sys
from collections import deque

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.config import check_output_prefix, load_pipeline
from tasks.errors import ConfigError
from tasks.merge import Job
from tasks.prefect_tasks import worth_retrying
from tasks.report import artifact_rows, stats_markdown, table_lines, write_json
from tasks.verify import BASE, ShardResult, ShardTask, check_shard, verify

DEFAULT_SAMPLES = 50
DEFAULT_MAX_INFLIGHT = 8  # each deep check holds a base, an output and a source table


class VerifyFailed(RuntimeError):
    """Raised at the end of a flow run in which checks failed (the flow run shows Failed), carrying the report."""

    def __init__(self, report: dict):
        failed = [c["name"] for c in report["checks"] if not c["passed"]]
        super().__init__(f"verification failed: {', '.join(failed)}")
        self.report = report

    def __reduce__(self):
        return (type(self), (self.report,))


@task(name="verify-shard", task_run_name="verify {shard.relpath}", persist_result=False, cache_policy=NO_CACHE,
      retries=1, retry_delay_seconds=[2, 10], retry_condition_fn=worth_retrying, log_prints=False)
def verify_shard(job: Job, shard: ShardTask, specs: tuple) -> ShardResult:
    return check_shard(job, shard, specs)


def prefect_runner(runner, max_inflight: int):
    """A tasks.verify Runner that submits shard checks to a Prefect task runner, at most max_inflight at once."""
    from flows.merge import final_state
    from tasks.errors import one_line

    def run(job: Job, specs: tuple, shards: list[ShardTask]):
        pending, inflight, finished = deque(shards), {}, queue.Queue()
        while pending or inflight:
            while pending and len(inflight) < max_inflight:
                shard = pending.popleft()
                future = runner.submit(verify_shard, {"job": job, "shard": shard, "specs": specs})
                inflight[shard.relpath] = future
                future.add_done_callback(lambda _f, rel=shard.relpath: finished.put(rel))
            relpath = finished.get()
            state = final_state(inflight.pop(relpath))
            if state.is_completed():
                yield state.result()
            else:
                yield ShardResult(relpath, failures={
                    BASE: f"shard check did not finish: {one_line(state.result(raise_on_failure=False))}"})

    return run


@flow(name="sidecar-verify", flow_run_name="verify {pipeline}", log_prints=False, validate_parameters=True)
def verify_flow(pipeline: str, output_prefix: str, samples: int = DEFAULT_SAMPLES, all_shards: bool = False,
                seed: int = 0, datasets_dir: str | None = None, use_ray: bool = False,
                ray_address: str | None = None, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                task_cpus: float | None = None, task_memory_gb: float | None = None) -> dict:
    """Verify the all-in-one sidecar at `output_prefix` against PIPELINE; publishes a checks table artifact
    ('verify-checks') and a statistics markdown artifact ('verify-statistics'); fails when any check fails."""
    from flows.merge import make_runner

    pipe = load_pipeline(pipeline, datasets_dir)
    output = _normalized(output_prefix)
    check_output_prefix(pipe, output)
    job = Job(pipe, output)
    with make_runner(use_ray, ray_address, None, task_cpus, task_memory_gb) as runner:
        report = verify(job, samples=samples, seed=seed, all_shards=all_shards,
                        run=prefect_runner(runner, max(1, max_inflight))).to_dict()
    verdict = "PASS" if report["ok"] else "FAIL"
    create_table_artifact(key="verify-checks", table=artifact_rows(report),
                          description=f"verify {verdict}: {output} ({pipe.path})")
    create_markdown_artifact(key="verify-statistics", markdown=stats_markdown(report),
                             description=f"score statistics of {output}")
    if not report["ok"]:
        raise VerifyFailed(report)
    return report


def _normalized(prefix: str | None) -> str:
    from tasks.storage import normalize_prefix

    if not prefix:
        raise ConfigError("verify needs --output-prefix: the all-in-one sidecar to check")
    try:
        return normalize_prefix(prefix)
    except ValueError as exc:
        raise ConfigError(f"--output-prefix: {exc}") from None


def main(args) -> int:
    """`sidecar-ops verify`: 0 when every check passes, 1 when any fails; ConfigError (exit 2) for bad input."""
    from flows.launch import flush_api_logs, prepare_ray, quiet_console, server_host
    from flows.server import prefect_api

    output = _normalized(args.output_prefix)
    pipe = load_pipeline(args.pipeline, args.datasets_dir)  # config errors before any server starts
    check_output_prefix(pipe, output)
    samples = DEFAULT_SAMPLES if args.samples is None else args.samples
    if samples < 0:
        raise ConfigError(f"--samples must be 0 or more, got {samples}")
    with prefect_api(ui=args.debug, host=server_host(args), keep_history=args.keep_run_history,
                     announce=args.debug) as api_url:
        quiet_console(args.debug)
        prepare_ray(args)
        print(f"verifying {args.pipeline} -> {output} (Prefect API {api_url})", file=sys.stderr)
        try:
            report = verify_flow(
                pipeline=os.path.abspath(args.pipeline), output_prefix=output, samples=samples,
                all_shards=args.all, seed=args.seed, datasets_dir=args.datasets_dir, use_ray=args.use_ray,
                ray_address=args.ray_address, max_inflight=args.max_inflight or DEFAULT_MAX_INFLIGHT,
                task_cpus=args.task_cpus, task_memory_gb=args.task_memory_gb)
        except VerifyFailed as exc:
            report = exc.report
        finally:
            flush_api_logs()
    print("\n".join(table_lines(report)))
    if args.json_path:
        write_json(report, args.json_path)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    from flows.cli import main as cli_main

    sys.exit(cli_main(["verify", *sys.argv[1:]]))
