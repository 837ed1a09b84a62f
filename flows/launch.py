"""Start a merge or verify run from the command line: one Prefect API, quiet consoles, the result at the end.

The run's own Prefect server starts first, as soon as the arguments are parsed: this process checks the YAMLs
and imports the flow module while it boots (the server needs ~3.5 s, this ~1.5 s), so nothing heavy may be
imported here at module level (flows.runconfig imports pyarrow and the config models: ~0.3 s).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flows import cluster, collector, compat
from flows.interrupt import Interrupted, flow_running
from flows.server import configured_api, prefect_api

if TYPE_CHECKING:
    from flows.runconfig import RunConfig, RunnerChoice

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


def server_host(use_ray: bool, ray_address: str | None) -> str:
    """Where a server this run starts must listen: loopback, unless Ray workers on other hosts report to it.
    Joining a cluster is checked here, before anything starts: token, reachable head, a route back."""
    if not use_ray:
        return "127.0.0.1"
    target = cluster.ray_target(ray_address)
    cluster.prepare(target)
    if target.all_on_this_host or configured_api():
        return "127.0.0.1"
    return cluster.driver_host(target)


@dataclass(frozen=True)
class Start:
    """What starting a command-line run needs before its YAMLs are read: the arguments that choose the API's
    server, and how to load the run's configuration (ConfigError, exit 2, for bad input)."""

    load_config: Callable[[], RunConfig]
    debug: bool = False
    use_ray: bool = False
    ray_address: str | None = None
    keep_history: bool = False


@contextlib.contextmanager
def session(start: Start, what: str, flow_module: str):
    """The RunConfig of one command-line run, with its Prefect API (a server of its own unless PREFECT_API_URL is
    set), a quiet console, and buffered logs sent before the server stops. A server of its own starts first;
    while it boots, this process loads the configuration and gets ready for the flow (`warm_up`), so the flow
    starts the moment the server answers. Bad input stops the server before it answers: no flow run, nothing
    written, its database removed."""
    loaded = []
    compat.tls_context_ahead()  # Prefect's API clients' SSL context, built while the imports run

    def meanwhile(booting: bool):
        loaded.append(start.load_config())
        warm_up(flow_module, start.debug, booting)
        collector.resume()  # the run's modules are imported (flows/collector.py)

    with prefect_api(ui=start.debug, host=server_host(start.use_ray, start.ray_address),
                     keep_history=start.keep_history, announce=start.debug, while_starting=meanwhile) as api_url:
        config = loaded[0]
        quiet_console(start.debug)
        quiet_ray(config.runner)
        print(f"{what} {config.pipeline.path} -> {config.output_prefix} (Prefect API {api_url})", file=sys.stderr)
        try:
            yield config
        finally:
            flush_api_logs()


def warm_up(flow_module: str, debug: bool, booting: bool = True) -> None:
    """What a flow run would otherwise do first, on the critical path: import the flow (Prefect with it) and set
    up logging. (Prefect would import FastAPI to record the flow run's parameters: flows/plainflow.py.) While the
    run's own server boots (`booting`), the CPU is free: what the first shard task would import is imported here
    too (pandas, which pyarrow imports at its first conversion from Python objects on the decode path, ~0.15 s;
    the copy path's Thrift codec). With a server kept running nothing is free: the shards import what they need."""
    importlib.import_module(flow_module)
    if booting:
        importlib.import_module("pyarrow").array([0])
        importlib.import_module("tasks.footer").codec()
    quiet_console(debug)
    compat.heartbeats_not_waited_for()  # the flow run's end does not wait up to 1 s for its heartbeat thread
    compat.one_tls_context()  # the run's API clients share one SSL context


def run_merge(start: Start) -> int:
    """`sidecar-ops run`: 0 when every shard is complete; RunFailed (exit 1) names the failed ones."""
    with session(start, "merging", "flows.merge") as config:
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


def run_verify(start: Start, json_path: str | None = None) -> int:
    """`sidecar-ops verify`: 0 when every check passes, 1 when any fails."""
    from tasks.report import table_lines, write_json

    with session(start, "verifying", "flows.verify") as config:
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
                    "grace_seconds", "continue_overwrite", "recompress")
VERIFY_PARAMETERS = (*COMMON_PARAMETERS, "samples", "all_shards", "seed")
