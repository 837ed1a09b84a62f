"""Start a merge or verify run from the command line: one Prefect API, quiet consoles, the result at the end.

The flow modules are imported while the run's own Prefect server starts (the two overlap: ~1.5 s each).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import sys

from flows import cluster, compat
from flows.interrupt import Interrupted, flow_running
from flows.runconfig import RunConfig, RunnerChoice
from flows.server import configured_api, prefect_api
from tasks.report import table_lines, write_json

NOISY_ON_CONSOLE = ("prefect.flow_runs", "prefect.task_runs", "prefect.engine", "prefect.task_engine",
                    "prefect.flow_engine", "prefect.task_runner", *compat.PREFECT_BACKGROUND_LOGGERS)


class _ConsoleFilter(logging.Filter):
    """Keep per-run Prefect chatter (and its failure tracebacks) off the terminal; the API still gets it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(NOISY_ON_CONSOLE)


@functools.cache  # once a process: setting Prefect's logging up again costs ~0.3 s and changes nothing
def quiet_console(debug: bool) -> None:
    if debug:
        return
    compat.prefect_setup_logging()
    for logger in (logging.getLogger(), logging.getLogger("prefect")):
        for handler in logger.handlers:
            if compat.is_console_handler(handler):
                handler.addFilter(_ConsoleFilter())


# Ray's notice that a new local cluster enabled token authentication (a default, nothing for the user to do).
RAY_NOTICES = (compat.RAY_TOKEN_NOTICE_LOGGER,)
# Ray client mode connects from a thread Prefect runs the flow in, and says so; nothing for the user to do.
RAY_CHATTER = ("SIGTERM handler is not set",)


class _RayChatterFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(RAY_CHATTER)


def quiet_ray(choice: RunnerChoice) -> None:
    """Ray's notices stay off the console unless --debug."""
    if not choice.use_ray or choice.debug:
        return
    for name in RAY_NOTICES:
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger(compat.RAY_WORKER_LOGGER).addFilter(_RayChatterFilter())


def flush_api_logs() -> None:
    """Send buffered run logs while the server is still up (else: 'Error logging to API')."""
    compat.drain_prefect_workers(timeout=5)


def server_host(choice: RunnerChoice) -> str:
    """Where a server this run starts must listen: loopback, unless Ray workers on other hosts report to it.
    Joining a cluster is checked here, before anything starts: token, reachable head, a route back."""
    if not choice.use_ray:
        return "127.0.0.1"
    target = cluster.ray_target(choice.ray_address)
    cluster.prepare(target)
    if target.all_on_this_host or configured_api():
        return "127.0.0.1"
    return cluster.driver_host(target)


@contextlib.contextmanager
def session(config: RunConfig, what: str, flow_module: str, keep_history: bool = False):
    """The Prefect API of one command-line run (a server of its own unless PREFECT_API_URL is set), a quiet
    console, and buffered logs sent before the server stops. While a server of its own boots, this process
    gets ready for the flow (`warm_up`), so the flow starts the moment the server answers."""
    debug = config.runner.debug
    with prefect_api(ui=debug, host=server_host(config.runner), keep_history=keep_history, announce=debug,
                     while_starting=lambda: warm_up(flow_module, debug)) as api_url:
        quiet_console(debug)
        quiet_ray(config.runner)
        print(f"{what} {config.pipeline.path} -> {config.output_prefix} (Prefect API {api_url})", file=sys.stderr)
        try:
            yield api_url
        finally:
            flush_api_logs()


def warm_up(flow_module: str, debug: bool) -> None:
    """What a flow run would otherwise do first, on the critical path: import the flow (Prefect with it), set up
    logging, and import what Prefect itself imports lazily to record the flow run's parameters."""
    importlib.import_module(flow_module)
    importlib.import_module("fastapi.encoders")  # prefect.flows.serialize_parameters; ~0.6 s here
    quiet_console(debug)


def run_merge(config: RunConfig, keep_history: bool = False) -> int:
    """`sidecar-ops run`: 0 when every shard is complete; RunFailed (exit 1) names the failed ones."""
    with session(config, "merging", "flows.merge", keep_history):
        from flows.merge import merge_flow  # imported while the server started

        with flow_running(config.grace_seconds):
            state = merge_flow(**config.flow_parameters(*MERGE_PARAMETERS), return_state=True)
        if state.is_cancelled():  # stopped by a signal: the summary says what was and was not done
            summary = state.result(raise_on_failure=False)
            if isinstance(summary, str):  # the signal's name: it came before any shard started
                raise Interrupted(summary, unfinished="no shard started, nothing written")
            raise Interrupted(summary.stop_reason, summary)
        summary = state.result()  # RunFailed (exit 1) when shards failed
    print("\n".join(summary.lines()))
    return 0


def run_verify(config: RunConfig, keep_history: bool = False, json_path: str | None = None) -> int:
    """`sidecar-ops verify`: 0 when every check passes, 1 when any fails."""
    with session(config, "verifying", "flows.verify", keep_history):
        from flows.verify import VerifyFailed, verify_flow

        try:
            with flow_running(0.0):
                state = verify_flow(**config.flow_parameters(*VERIFY_PARAMETERS), return_state=True)
            if state.is_cancelled():
                raise Interrupted(state.result(raise_on_failure=False))
            report = state.result()
        except VerifyFailed as exc:
            report = exc.report
    print("\n".join(table_lines(report)))
    if json_path:
        write_json(report, json_path)
    return 0 if report["ok"] else 1


COMMON_PARAMETERS = ("pipeline", "output_prefix", "datasets_dir", "use_ray", "ray_address", "task_cpus",
                     "task_memory_gb", "max_inflight", "debug", "window_mib")
MERGE_PARAMETERS = (*COMMON_PARAMETERS, "overwrite", "overwrite_before", "fail_fast", "retries", "fuse_operations",
                    "grace_seconds", "continue_overwrite")
VERIFY_PARAMETERS = (*COMMON_PARAMETERS, "samples", "all_shards", "seed")
