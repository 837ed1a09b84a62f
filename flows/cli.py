"""`sidecar-ops`: run (or dry-run) a merge, verify an output, build the demo.

Exit codes: 0 success; 1 shards failed (or verification failed); 2 bad configuration or arguments.
Errors are one line each; `--debug` adds tracebacks and Prefect/Ray logs.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from datetime import datetime

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


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
    run.add_argument("--fail-fast", action="store_true", help="stop submitting shards after the first failure")
    run.add_argument("--retries", type=int, default=1, help="retries per shard task on I/O errors (default 1)")
    verify = sub.add_parser("verify", help="prove an all-in-one sidecar is complete, aligned and sane")
    add_common(verify)
    verify.add_argument("--all", action="store_true", help="score statistics over all shards, not the sample")
    verify.add_argument("--seed", type=int, default=0, help="seed of the deep-check sample")
    verify.add_argument("--json", dest="json_path", help="also write the report as JSON to this path")
    demo = sub.add_parser("demo", help="build the local demo dataset, then run and verify the merge")
    demo.add_argument("--root", default="demo-data", help="where the demo data goes (default ./demo-data)")
    demo.add_argument("--shards", type=int, default=12)
    demo.add_argument("--rows", type=int, default=2000)
    demo.add_argument("--use-ray", action="store_true")
    demo.add_argument("--debug", action="store_true")
    return top


def effective_output(args, pipeline) -> str:
    from tasks.storage import normalize_prefix

    if args.output_prefix:
        try:
            return normalize_prefix(args.output_prefix)
        except ValueError as exc:
            from tasks.errors import ConfigError

            raise ConfigError(f"--output-prefix: {exc}") from None
    stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
    out = pipeline.dataset.sidecar_prefix.rstrip("/") + f"_run_{stamp}/"
    print(f"NOTE: no --output-prefix given; writing to a NEW prefix {out}\n"
          f"      (sidecar_prefix in the YAML is {pipeline.dataset.sidecar_prefix}; pass --output-prefix to "
          "resume or to write elsewhere)", file=sys.stderr)
    return out


def cmd_run(args) -> int:
    from tasks.config import check_output_prefix, load_pipeline

    pipeline = load_pipeline(args.pipeline, args.datasets_dir)
    output = effective_output(args, pipeline)
    check_output_prefix(pipeline, output)
    if args.dry_run:
        from tasks.dryrun import dry_run

        return dry_run(pipeline, output, samples=args.samples or 20, overwrite=args.overwrite)
    from flows.launch import run_merge

    return run_merge(args, output)


def cmd_verify(args) -> int:
    from flows.verify import main as verify_main

    return verify_main(args)


def cmd_demo(args) -> int:
    from tasks.demo import run_demo

    return run_demo(args)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    quiet_environment(args.debug)
    from tasks.errors import ConfigError, ShardError
    from tasks.summary import RunFailed

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
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume (complete shards are kept)", file=sys.stderr)
        return 130
    except Exception as exc:  # anything unexpected: still one line unless --debug
        _report(args, exc, f"unexpected {type(exc).__name__}")
        return EXIT_FAILED


def _report(args, exc: BaseException, label: str) -> None:
    if getattr(args, "debug", False):
        traceback.print_exception(exc)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"{label}: {message}", file=sys.stderr)
    logging.shutdown()


if __name__ == "__main__":
    sys.exit(main())
