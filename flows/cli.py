"""`sidecar-ops`: run (or dry-run) a merge, verify an output, build the demo.

Exit codes: 0 success; 1 shards failed (or verification failed, or an unexpected error: a bug of ours); 2 bad
configuration or arguments, or a store that fails a listing;
130 interrupted (Ctrl-C, SIGTERM or SIGHUP before the work was done: the summary says what was done and how to
resume; a signal once the work is done leaves the exit code it earned).
Errors are one line each; `--debug` adds tracebacks and Prefect/Ray logs.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

# Only light imports here: the signals are ours from `main`'s first line (flows/interrupt.py), and what runs
# before it (these imports) is a window in which a signal still has the system's default effect.
from flows import collector
from flows.interrupt import DEFAULT_GRACE, MAX_GRACE, Interrupted, grace_seconds, late_signals, owned
from tasks.errors import ConfigError, ShardError
from tasks.summary import RunFailed

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130


def quiet_environment(debug: bool) -> None:
    """Settings that must be in place before Prefect or Ray are imported: no telemetry, little noise."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("PREFECT_UI_ENABLED", "false" if not debug else "true")
    if not debug:
        # Prefect's own log level stays as configured (INFO by default), so every run and task log reaches the
        # API and the UI; flows/launch.py keeps those records off the console instead.
        os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("pipeline", help="pipeline YAML (pipelines/NAME.yaml)")
    p.add_argument("--output-prefix", help="where the all-in-one sidecar is written (default: a new "
                   "timestamped sibling of the dataset's sidecar_prefix)")
    p.add_argument("--datasets-dir", help="folder holding datasets/<name>.yaml (default: found by walking up "
                   "from the pipeline's folder)")
    p.add_argument("--samples", type=int, default=None, help="shards whose footers (dry run) or data (verify) "
                   "are sampled")
    p.add_argument("--window-mib", type=float, default=None, help="memory budget of a shard task: decoded MiB of "
                   "a window of rows read, merged (or compared) and written at a time; a merge writes each window as "
                   "one row group (default 32)")
    p.add_argument("--debug", action="store_true", help="tracebacks and full Prefect/Ray logs")
    p.add_argument("--keep-run-history", action="store_true", help="when the run starts its own Prefect server, "
                   "keep its records in $PREFECT_HOME/prefect.db (grows with every run) instead of a database "
                   "removed at the end")
    ray = p.add_argument_group("ray")
    ray.add_argument("--use-ray", action="store_true", help="run shard tasks on Ray (local, or --ray-address)")
    ray.add_argument("--ray-address", default=None, help="existing cluster: auto, or ray://head:10001 "
                     "(default: $RAY_ADDRESS, else a local Ray instance for this run)")
    ray.add_argument("--max-inflight", type=int, default=None, help="shards in flight at once (default 32)")
    ray.add_argument("--task-cpus", type=float, default=None, help="CPUs reserved per shard task (Ray)")
    ray.add_argument("--task-memory-gb", type=float, default=None, help="memory reserved per shard task (Ray)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="sidecar-ops", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="merge score sidecars into an all-in-one sidecar")
    add_common(run)
    run.add_argument("--dry-run", action="store_true", help="validate and print the plan; write nothing")
    resume = run.add_mutually_exclusive_group()
    resume.add_argument("--skip-existing", dest="overwrite", action="store_false", default=False,
                        help="resume: keep output shards already complete for this pipeline (default)")
    resume.add_argument("--overwrite", dest="overwrite", action="store_true",
                        help="recompute every shard, replacing existing outputs")
    resume.add_argument("--continue-overwrite", metavar="ID", default=None,
                        help="continue an interrupted --overwrite (ID: what its summary prints): keep the outputs it "
                        "wrote, recompute every other one")
    resume.add_argument("--overwrite-before", metavar="TIME", default=None,
                        help="recompute only outputs written by runs started before TIME (ISO 8601, UTC unless it "
                        "names a zone), by the clock of the machine that ran each (skew moves the line)")
    run.add_argument("--fail-fast", action="store_true", help="stop submitting shards after the first failure")
    run.add_argument("--grace-seconds", default=DEFAULT_GRACE, help="after a first Ctrl-C, SIGTERM or SIGHUP, "
                     f"how long shards in flight may take to finish before they are abandoned (default "
                     f"{DEFAULT_GRACE:g}, at most {MAX_GRACE:g}: no shard needs a day, and no scheduler waits that "
                     "long before killing); a second signal abandons them at once")
    run.add_argument("--recompress", choices=["zstd"], default=None, help="decode every column and encode it "
                     "again as zstd (the decode path); by default the base's and the siblings' column chunks are "
                     "copied as bytes, in their codec, and only the keys are decoded (docs/architecture.md)")
    run.add_argument("--retries", type=int, default=1, help="retries per shard task on I/O errors (default 1)")
    layout = run.add_mutually_exclusive_group()
    layout.add_argument("--fuse-operations", dest="fuse_operations", action="store_true", default=True,
                        help="one task per shard for all its operations, the write and its check, streaming the "
                        "shard a window at a time (--window-mib; default)")
    layout.add_argument("--task-per-operation", dest="fuse_operations", action="store_false",
                        help="a chain of one task per operation, the last writing and checking: each step shows in "
                        "the UI, but the whole shard is held in memory and handed from step to step")
    verify = sub.add_parser("verify", help="prove an all-in-one sidecar is complete, aligned and sane")
    add_common(verify)
    verify.add_argument("--all", action="store_true", help="score statistics over all shards, not the sample")
    verify.add_argument("--seed", type=int, default=0, help="seed of the deep-check sample")
    verify.add_argument("--json", dest="json_path", help="also write the report as JSON to this path")
    demo = sub.add_parser("demo", help="build the local demo dataset, then run and verify the merge")
    demo.add_argument("--root", default="demo-data", help="a local folder for the demo data and its YAMLs "
                      "(default ./demo-data); refused when it holds anything an earlier demo did not write")
    demo.add_argument("--shards", type=int, default=12)
    demo.add_argument("--rows", type=int, default=2000)
    demo.add_argument("--use-ray", action="store_true")
    demo.add_argument("--debug", action="store_true")
    return top


def run_config(args, command: str):
    """The RunConfig of `run` or `verify`, from the command line; ConfigError (exit 2) for bad input."""
    from flows.runconfig import (DEFAULT_MAX_INFLIGHT, DEFAULT_SAMPLES, DEFAULT_VERIFY_INFLIGHT, RunConfig,
                                 RunnerChoice)

    runner = RunnerChoice(args.use_ray, args.ray_address, args.task_cpus, args.task_memory_gb, debug=args.debug)
    if command == "verify":
        return RunConfig.load(args.pipeline, args.output_prefix, args.datasets_dir, runner=runner,
                              max_inflight=args.max_inflight or DEFAULT_VERIFY_INFLIGHT,
                              samples=DEFAULT_SAMPLES if args.samples is None else args.samples,
                              all_shards=args.all, seed=args.seed, window_mib=args.window_mib)
    config = RunConfig.load(args.pipeline, args.output_prefix, args.datasets_dir, writes=True,
                            runner=runner, max_inflight=args.max_inflight or DEFAULT_MAX_INFLIGHT,
                            overwrite=args.overwrite, fail_fast=args.fail_fast, retries=args.retries,
                            fuse_operations=args.fuse_operations, overwrite_before=args.overwrite_before,
                            continue_overwrite=args.continue_overwrite,
                            grace_seconds=grace_seconds(args.grace_seconds), window_mib=args.window_mib,
                            recompress=args.recompress)
    if config.new_output:
        print(f"NOTE: no --output-prefix given; writing to a NEW prefix {config.output_prefix}\n"
              f"      (sidecar_prefix in the YAML is {config.pipeline.dataset.sidecar_prefix}; pass --output-prefix "
              "to resume or to write elsewhere)", file=sys.stderr)
    return config


# Commands import what they run only once the arguments are checked: Prefect and Ray cost seconds to import,
# which a dry run, a config error or `--help` should not pay. A run or verify starts its Prefect server before
# its YAMLs are read (flows/launch.py): bad input then stops that server before it answers.

def cmd_run(args) -> int:
    if args.dry_run:
        config = run_config(args, "run")
        collector.resume()
        from tasks.dryrun import dry_run

        return dry_run(config.pipeline, config.output_prefix, samples=20 if args.samples is None else args.samples,
                       overwrite=config.overwrite, overwrite_before=config.overwrite_before,
                       continue_overwrite=config.continue_overwrite)
    from flows.launch import run_merge

    return run_merge(start(args, "run"))


def cmd_verify(args) -> int:
    from flows.launch import run_verify

    return run_verify(start(args, "verify"), json_path=args.json_path)


def start(args, command: str):
    """How flows/launch.py starts `command`: its server first, the YAMLs read (run_config) while it boots."""
    from flows.launch import Start

    return Start(lambda: run_config(args, command), debug=args.debug, use_ray=args.use_ray,
                 ray_address=args.ray_address, keep_history=args.keep_run_history)


def cmd_demo(args) -> int:
    """Build the demo data and its YAMLs under --root, then dry-run, merge and verify, as an operator would."""
    collector.resume()
    from tasks.demo import build_demo

    pipeline, output = build_demo(args.root, shards=args.shards, rows=args.rows)
    print(f"demo data and YAMLs written under {args.root.rstrip('/')}/ ({args.shards} shards x {args.rows} rows)",
          file=sys.stderr)
    out = ["--output-prefix", output]
    extra = (["--use-ray"] if args.use_ray else []) + (["--debug"] if args.debug else [])
    for argv in (["run", str(pipeline), *out, "--dry-run"], ["run", str(pipeline), *out, *extra],
                 ["verify", str(pipeline), *out, *extra]):
        print(f"\n$ sidecar-ops {' '.join(argv)}", file=sys.stderr)
        code = main(argv)
        if code:
            return code
    return 0


def main(argv: list[str] | None = None, for_good: bool = False) -> int:
    """`sidecar-ops ARGS`: the exit code. SIGINT, SIGTERM and SIGHUP are handled from the first line
    (flows/interrupt.py); `for_good` (the console's): until the process exits."""
    with owned(for_good=for_good):
        args = parser().parse_args(argv)
        quiet_environment(args.debug)
        code = outcome(args)
        if late := late_signals():
            print(f"({', '.join(late)} received after the work was done: ignored, the result stands)",
                  file=sys.stderr)
        return code


def outcome(args) -> int:
    """Run the command; every way it can end as an exit code, with one line (or the summary) on stderr."""
    try:
        return {"run": cmd_run, "verify": cmd_verify, "demo": cmd_demo}[args.command](args)
    except ConfigError as exc:
        _report(args, exc, "error")
        return EXIT_CONFIG
    except RunFailed as exc:
        print("\n".join(exc.summary.lines()), file=sys.stderr)
        return EXIT_FAILED
    except ShardError as exc:
        _report(args, exc, "error")
        return EXIT_FAILED
    except Interrupted as exc:
        if exc.result is None:  # verify: a partial report would say nothing of the shards not checked
            print(f"interrupted by {exc.reason}: {exc.unfinished}; rerun the same command", file=sys.stderr)
        else:
            print("\n".join(exc.result.lines()), file=sys.stderr)
        global abandoned_work
        abandoned_work = bool(getattr(exc.result, "abandoned", 0))
        return EXIT_INTERRUPTED
    except KeyboardInterrupt as exc:  # starting up: no flow run yet, nothing written
        print(f"interrupted{f' by {exc}' if str(exc) else ''} before any shard started: nothing written; rerun the "
              "same command", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # anything unexpected: still one line unless --debug
        _report(args, exc, f"unexpected {type(exc).__name__}")
        return EXIT_FAILED


def _report(args, exc: BaseException, label: str) -> None:
    if getattr(args, "debug", False):
        traceback.print_exception(exc)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"{label}: {message}", file=sys.stderr)
    logging.shutdown()


abandoned_work = False  # an interrupted run left shard tasks running in this process's threads (flows/console.py)


if __name__ == "__main__":
    from flows.console import console

    console()
