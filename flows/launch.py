"""Start a merge run from the command line: one Prefect API, quiet consoles, the summary at the end."""
from __future__ import annotations

import importlib
import logging
import os
import sys

from flows.server import configured_api, prefect_api

NOISY_ON_CONSOLE = ("prefect.flow_runs", "prefect.task_runs", "prefect.engine", "prefect.task_engine",
                    "prefect.flow_engine", "prefect._internal", "prefect.task_runner",
                    "EventsWorker", "APILogWorker")  # Prefect's background senders, named by class


class _ConsoleFilter(logging.Filter):
    """Keep per-run Prefect chatter (and its failure tracebacks) off the terminal; the API still gets it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(NOISY_ON_CONSOLE)


def quiet_console(debug: bool) -> None:
    if debug:
        return
    from prefect.logging.configuration import setup_logging

    setup_logging()
    for logger in (logging.getLogger(), logging.getLogger("prefect")):
        for handler in logger.handlers:
            if type(handler).__name__ in ("PrefectConsoleHandler", "StreamHandler", "_SafeStreamHandler"):
                handler.addFilter(_ConsoleFilter())


# Ray's notice that a new local cluster enabled token authentication (a default, nothing for the user to do).
RAY_NOTICES = ("ray._private.authentication.authentication_token_setup",)
# Ray client mode connects from a thread Prefect runs the flow in, and says so; nothing for the user to do.
RAY_CHATTER = ("SIGTERM handler is not set",)


class _RayChatterFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(RAY_CHATTER)


def prepare_ray(args) -> None:
    """Ray wiring from the command line: workers learn about --debug; Ray's notices stay off the console."""
    if not args.use_ray:
        return
    if args.debug:
        os.environ["SIDECAR_OPS_DEBUG"] = "1"
        return
    os.environ.pop("SIDECAR_OPS_DEBUG", None)
    for name in RAY_NOTICES:
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("ray._private.worker").addFilter(_RayChatterFilter())


def flush_api_logs() -> None:
    """Send buffered run logs while the server is still up (else: 'Error logging to API')."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    EventsWorker.drain_all(timeout=5)


def server_host(args) -> str:
    """Where a server this run starts must listen: loopback, unless Ray workers on other hosts report to it.
    Joining a cluster is checked here, before anything starts: token, reachable head, a route back."""
    if not args.use_ray:
        return "127.0.0.1"
    from flows import cluster

    target = cluster.ray_target(args.ray_address)
    cluster.prepare(target)
    if target.all_on_this_host or configured_api():
        return "127.0.0.1"
    return cluster.driver_host(target)


def run_merge(args, output_prefix: str) -> int:
    host = server_host(args)
    with prefect_api(ui=args.debug, host=host, keep_history=args.keep_run_history, announce=args.debug,
                     while_starting=lambda: importlib.import_module("flows.merge")) as api_url:
        quiet_console(args.debug)
        prepare_ray(args)
        from flows.merge import merge_flow

        print(f"merging {args.pipeline} -> {output_prefix} (Prefect API {api_url})", file=sys.stderr)
        try:
            summary = merge_flow(
                pipeline=os.path.abspath(args.pipeline), output_prefix=output_prefix,
                skip_existing=not args.overwrite, overwrite=args.overwrite, max_inflight=args.max_inflight or 32,
                fail_fast=args.fail_fast, datasets_dir=args.datasets_dir, retries=args.retries,
                use_ray=args.use_ray, ray_address=args.ray_address, task_cpus=args.task_cpus,
                task_memory_gb=args.task_memory_gb)
        finally:
            flush_api_logs()
    from tasks.summary import Summary

    print("\n".join(Summary(**summary).lines()))
    return 0
