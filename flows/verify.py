"""The verify flow: cheap checks on every shard, deep checks on sampled shards as Prefect tasks, two artifacts.

Run it with `sidecar-ops verify PIPELINE.yaml --output-prefix URI ...` or `python flows/verify.py PIPELINE.yaml
--output-prefix URI ...`. The checks themselves are plain pyarrow in tasks/verification/; this module only runs
them (thread pool, or Ray with --use-ray), publishes the artifacts and prints the report.
"""
from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled

from flows.interrupt import Interrupted, Stop, handling
from flows.plainflow import plain_flow
from flows.runconfig import DEFAULT_SAMPLES, DEFAULT_VERIFY_INFLIGHT, RunConfig, RunnerChoice
from flows.scheduler import Window, make_runner, run_window
from tasks.kernel import Job
from tasks.prefect_tasks import worth_retrying
from tasks.report import artifact_rows, stats_markdown
from tasks.verification import BASE, Halted, ShardResult, ShardTask, check_shard, verify


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


def scheduled_checks(runner, max_inflight: int, stop: Stop):
    """A tasks.verification Runner: shard checks as Prefect tasks through the shard scheduler's window. A signal
    ends it with Interrupted if it left a shard unchecked: a report of some shards would say nothing of the
    others."""

    def run(job: Job, specs: tuple, shards: list[ShardTask]):
        submit = lambda shard: [runner.submit(verify_shard, {"job": job, "shard": shard, "specs": specs})]  # noqa: E731
        window = Window()
        for done in run_window(shards, submit, max_inflight, stop, window):
            if done.ok:
                yield done.result()
            else:
                yield ShardResult(done.item.relpath, failures={BASE: f"shard check did not finish: {done.error()}"})
        if stop.by_signal and (window.abandoned or window.submitted < len(shards)):
            raise Interrupted(stop.reason)

    return run


@plain_flow(name="sidecar-verify", flow_run_name="verify {pipeline}", log_prints=False, validate_parameters=True)
def verify_flow(pipeline: str, output_prefix: str, samples: int = DEFAULT_SAMPLES, all_shards: bool = False,
                seed: int = 0, datasets_dir: str | None = None, use_ray: bool = False,
                ray_address: str | None = None, max_inflight: int = DEFAULT_VERIFY_INFLIGHT,
                task_cpus: float | None = None, task_memory_gb: float | None = None, debug: bool = False,
                window_mib: float | None = None) -> dict:
    """Verify the all-in-one sidecar at `output_prefix` against PIPELINE; publishes a checks table artifact
    ('verify-checks') and a statistics markdown artifact ('verify-statistics'); fails when any check fails."""
    runner = RunnerChoice(use_ray, ray_address, task_cpus, task_memory_gb, debug=debug)
    config = RunConfig.load(pipeline, output_prefix, datasets_dir, runner=runner, max_inflight=max_inflight,
                            samples=samples, all_shards=all_shards, seed=seed, window_mib=window_mib)
    return check(config)


def check(config: RunConfig) -> dict:
    """The body of a verify flow run: the report, as a dict, and its two artifacts."""
    job = Job(config.pipeline, config.output_prefix, **config.window_bytes)
    stop = Stop()
    try:
        with handling(stop, grace=0.0), make_runner(config.runner, PREFECT_API_URL.value()) as runner:
            report = verify(job, samples=config.samples, seed=config.seed, all_shards=config.all_shards,
                            run=scheduled_checks(runner, config.max_inflight, stop),
                            halted=lambda: stop.by_signal).to_dict()
    except (Interrupted, Halted) as exc:  # the flow run ends Cancelled; the command line exits 130
        reason = exc.reason if isinstance(exc, Interrupted) else stop.reason
        return Cancelled(message=f"interrupted by {reason}: verification incomplete", data=reason)
    verdict = "PASS" if report["ok"] else "FAIL"
    create_table_artifact(key="verify-checks", table=artifact_rows(report),
                          description=f"verify {verdict}: {config.output_prefix} ({config.pipeline.path})")
    create_markdown_artifact(key="verify-statistics", markdown=stats_markdown(report),
                             description=f"score statistics of {config.output_prefix}")
    if not report["ok"]:
        raise VerifyFailed(report)
    return report


if __name__ == "__main__":
    import sys

    from flows.console import console

    console(["verify", *sys.argv[1:]])
