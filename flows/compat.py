"""The one door to the internals of Prefect, prefect-ray, Ray and uvicorn (tasks/fsspec_internals.py is the tasks
layer's, for s3fs and fsspec: nothing under tasks/ imports flows/).

Every use of a non-public attribute, module, signature or schema of those libraries is an entry here: a small
function or constant, with what it does and why the public API does not suffice. tests/test_compat.py checks
each one against the installed versions (constraints.txt is the set CI tests). An entry whose internal is gone
or has changed raises CompatError naming the installed versions, at its first use, never a silent fallback.
Importing this module imports none of those libraries: each entry imports what it needs when called.
"""
from __future__ import annotations

import functools
import logging
import re
import threading
from pathlib import Path
from typing import Any

from tasks.fsspec_internals import CompatError, installed  # noqa: F401  (CompatError: for callers and tests)
from tasks.fsspec_internals import broken as _broken

HERE = "flows/compat.py"


def broken(what: str, *dists: str) -> CompatError:
    return _broken(what, *dists, where=HERE)


def _require(ok: bool, what: str, *dists: str) -> None:
    if not ok:
        raise broken(what, *dists)


# ------------------------------------------------------------------------- Prefect: the thread pool runner

def cancel_events_of(runner) -> dict:
    """`ThreadPoolTaskRunner._cancel_events`: the threading.Event Prefect keeps per submitted task run, for the
    runner's whole life (~1 KB each; a 10^5-shard chain held 400,000). flows/scheduler.py pops a finished task's
    event; no public API forgets one. Gone or changed: loud, since a silent miss brings the memory growth back."""
    events = vars(runner).get("_cancel_events")
    _require(isinstance(events, dict), "prefect's ThreadPoolTaskRunner._cancel_events (task run id -> Event)",
             "prefect")
    return events


def abandon_thread_pool(runner) -> None:
    """Shut `ThreadPoolTaskRunner._executor` down without waiting for running tasks (queued ones cancelled) and
    forget it, so the runner's `__exit__` does not wait either: an interrupted run's grace period is over.
    Public `__exit__` always waits for every running task."""
    _require("_executor" in vars(runner), "prefect's ThreadPoolTaskRunner._executor", "prefect")
    if runner._executor is not None:
        runner._executor.shutdown(wait=False, cancel_futures=True)
        runner._executor = None


def thread_pool_size(runner) -> int:
    """`ThreadPoolTaskRunner._max_workers` (tests: the size a RunnerChoice asked for); no public accessor."""
    _require(isinstance(vars(runner).get("_max_workers"), int), "prefect's ThreadPoolTaskRunner._max_workers",
             "prefect")
    return runner._max_workers


# --------------------------------------------------------------------- Prefect: the flow run's result links

def result_links(context) -> dict:
    """`FlowRunContext.run_results`: id(result) -> (State, run type, ...) for every task result of the flow run,
    kept for the whole run (to find the upstream of a result passed on as a plain value). Not a documented
    field; no public API drops an entry."""
    links = getattr(context, "run_results", None)
    _require(isinstance(links, dict), "prefect's FlowRunContext.run_results", "prefect")
    return links


def forget_result_links(context, task_run_ids: set) -> None:
    """Drop `context`'s result links of these task runs (flows/scheduler.py: a finished shard's results go
    nowhere, and at 10^5 shards these links were most of the driver's memory)."""
    links = result_links(context)
    for key, link in list(links.items()):  # tasks running in other threads add links meanwhile
        state = link[0] if isinstance(link, tuple) and link else None
        details = getattr(state, "state_details", None)
        _require(details is not None and hasattr(details, "task_run_id"),
                 "prefect's FlowRunContext.run_results entries (State, run type, ...)", "prefect")
        if details.task_run_id in task_run_ids:
            links.pop(key, None)


# ------------------------------------------------------------------------ Prefect: the flow run's heartbeats

def heartbeats_not_waited_for() -> None:
    """The sync flow engine's heartbeat thread (`prefect.flow_engine._send_heartbeats`, used by
    `FlowRunEngine.run_context`) is stopped but no longer joined as the flow run ends: it sleeps a second at a
    time, so joining it kept every run waiting up to 1 s after its final state (0.5 s on average). Heartbeats
    are sent as before (the first as the flow run starts, then every PREFECT_FLOWS_HEARTBEAT_FREQUENCY); the
    stopped thread emits nothing more and ends within a second, on its own (a daemon: it never delays the
    exit). Prefect's async engine passes `join_on_exit=False` itself; there is no setting for the sync one.
    Idempotent; for the command line (flows/launch.py), not for a deployment's worker."""
    from prefect import flow_engine

    original = getattr(flow_engine, "_send_heartbeats", None)
    _require(callable(original) and "join_on_exit" in _parameters(original),
             "prefect.flow_engine._send_heartbeats(engine, join_on_exit)", "prefect")
    if getattr(original, "sidecar_ops_not_joined", False):
        return

    def not_joined(engine, join_on_exit: bool = True):
        return original(engine, join_on_exit=False)

    not_joined.sidecar_ops_not_joined = True
    flow_engine._send_heartbeats = not_joined


# ------------------------------------------------------------------------- Prefect: its API clients' TLS

def one_tls_context() -> None:
    """Prefect's API clients (`PrefectClient`, `SyncPrefectClient`) each build an SSL context from certifi's CA
    bundle in `__init__` unless `httpx_settings["verify"]` is given (~45 ms of CPU each here), and a run makes
    several: the flow run's, the log and event workers'. Given here once a process, built as Prefect builds it
    (PREFECT_API_SSL_CERT_FILE or certifi's bundle; unverified with PREFECT_API_TLS_INSECURE_SKIP_VERIFY), keyed
    by those settings: the same verification, and neither Prefect nor httpx changes a context it is given. A
    client given its own `verify` keeps it. Idempotent; for the command line (flows/launch.py)."""
    from prefect.client import orchestration

    for cls in (orchestration.PrefectClient, orchestration.SyncPrefectClient):
        original = cls.__init__
        _require("httpx_settings" in _parameters(original), f"prefect's {cls.__name__}(api, *, httpx_settings)",
                 "prefect")
        if getattr(original, "sidecar_ops_one_tls_context", False):
            continue

        def init(self, *args, httpx_settings=None, __original=original, **kwargs):
            settings = dict(httpx_settings or {})
            if "verify" not in settings:
                settings["verify"] = _tls_context(*_tls_settings())
            __original(self, *args, httpx_settings=settings, **kwargs)

        init.sidecar_ops_one_tls_context = True
        cls.__init__ = init


def _tls_settings() -> tuple[bool, str]:
    import certifi
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

    return bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value()), PREFECT_API_SSL_CERT_FILE.value() or certifi.where()


_tls_contexts: dict = {}
_tls_lock = threading.Lock()


def _tls_context(skip_verify: bool, cafile: str):
    """The context PrefectClient.__init__ would build for these settings, built once (a second caller waits)."""
    import ssl

    with _tls_lock:
        if (skip_verify, cafile) not in _tls_contexts:
            if skip_verify:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                ctx = ssl.create_default_context(cafile=cafile)
            _tls_contexts[skip_verify, cafile] = ctx
        return _tls_contexts[skip_verify, cafile]


def tls_context_ahead() -> None:
    """Build the context of Prefect's defaults (certifi's bundle; neither setting in the environment) in a
    thread, before any client wants it: OpenSSL releases the GIL while it loads the bundle, so the command's
    main thread does not wait for it (one_tls_context hands it to every client)."""
    import os

    if os.environ.get("PREFECT_API_TLS_INSECURE_SKIP_VERIFY") or os.environ.get("PREFECT_API_SSL_CERT_FILE"):
        return

    def build():
        import certifi

        _tls_context(False, certifi.where())

    # Not a daemon: the interpreter joins it before exiting. A process that exits early (a signal while starting
    # up) would otherwise run OpenSSL's exit-time clean-up while this thread is inside OpenSSL: a segfault.
    threading.Thread(target=build, name="sidecar-ops-tls-context").start()


def _parameters(fn) -> set[str]:
    import inspect

    return set(inspect.signature(fn).parameters)


# -------------------------------------------------------------- Prefect: running a task inside a Ray worker

# Keys of prefect.context.serialize_context() (3.9). flows/runners.py forwards all of them unchanged except
# "settings_context", which it replaces by a cached blob; tests/test_compat.py fails when Prefect adds or
# removes one, or when hydrated_context() stops skipping an empty settings_context.
KNOWN_CONTEXT_KEYS = frozenset({"flow_run_context", "task_run_context", "tags_context", "settings_context",
                                "asset_context", "deployment_id", "deployment_parameters"})
# Keys of SettingsContext.serialize(); a worker rebuilds the context with SettingsContext(**blob).
KNOWN_SETTINGS_KEYS = frozenset({"profile", "settings"})
# Keyword arguments flows/runners.py passes to prefect.task_engine.run_task_sync / run_task_async.
ENGINE_KWARGS = ("task", "task_run_id", "parameters", "wait_for", "dependencies", "context", "return_type")


@functools.cache
def _settings_placeholder():
    from prefect.context import SettingsContext

    class SettingsPlaceholder(SettingsContext):
        """A SettingsContext that serialises to `{}`."""

        def serialize(self, include_secrets: bool = True) -> dict[str, Any]:
            return {}

    return SettingsPlaceholder


def serialize_context_without_settings(asset_ctx_kwargs: dict[str, Any]) -> dict[str, Any]:
    """`prefect.context.serialize_context()` with an empty "settings_context": the public function does all the
    work except the settings dump (~the whole cost), which flows/runners.py does once per SettingsContext. Relies
    on serialize_context() serialising `SettingsContext.get()` and on hydrated_context() skipping an empty
    settings_context; stock prefect-ray serialises everything per task and no public API splits the two."""
    from prefect.context import SettingsContext, serialize_context

    current = SettingsContext.get()
    with _settings_placeholder().model_construct(profile=current.profile, settings=current.settings):
        context = serialize_context(asset_ctx_kwargs=asset_ctx_kwargs)
    _require(context.get("settings_context") == {},
             "prefect.context.serialize_context() serialising the current SettingsContext", "prefect")
    return context


def sharing_client(client):
    """A `SyncClientContext` around an already open SyncPrefectClient (`model_construct` skips the __init__ that
    opens a new one), so the engine's get_client() inside it reuses `client`: one HTTP client per Ray worker
    process instead of two per task. No public API hands the engine a client."""
    from prefect.context import SyncClientContext

    _require("client" in SyncClientContext.model_fields, "prefect's SyncClientContext.client", "prefect")
    return SyncClientContext.model_construct(client=client)


@functools.cache
def _engine():
    import inspect

    from prefect.task_engine import run_task_async, run_task_sync

    for fn in (run_task_sync, run_task_async):
        missing = set(ENGINE_KWARGS) - set(inspect.signature(fn).parameters)
        _require(not missing, f"prefect.task_engine.{fn.__name__}'s keyword arguments {sorted(missing)}", "prefect")
    return run_task_sync, run_task_async


def run_task_in_worker(task, **kwargs) -> Any:
    """Run one Prefect task to its final State in this (Ray worker) process: `prefect.task_engine`'s entry points,
    as prefect-ray's own worker function calls them (the engine module is not a public API). `kwargs`: the
    ENGINE_KWARGS but `task` and `return_type`."""
    run_sync, run_async = _engine()
    if task.isasync:
        import asyncio

        return asyncio.run(run_async(task=task, return_type="state", **kwargs))
    return run_sync(task=task, return_type="state", **kwargs)


def task_run_inputs(value: Any, future_cls) -> Any:
    """`prefect.utilities.engine.collect_task_run_inputs_sync`: the upstream task runs a parameter refers to (what
    Prefect records as a task run's inputs), as prefect-ray's submit() computes them; not a public API."""
    from prefect.utilities.engine import collect_task_run_inputs_sync

    return collect_task_run_inputs_sync(value, future_cls=future_cls)


# ------------------------------------------------------------------------------- prefect-ray: RayTaskRunner

RAY_RUNNER_STATE = ("_started", "_owns_ray", "_ray_context")


def _ray_runner_state(runner) -> None:
    missing = [name for name in RAY_RUNNER_STATE if name not in vars(runner)]
    _require(not missing, f"prefect-ray's RayTaskRunner attributes {missing}", "prefect-ray", "prefect")


def ray_runner_started(runner) -> bool:
    """`TaskRunner._started`: whether the runner was entered (submit() refuses work before); no public flag."""
    _ray_runner_state(runner)
    return runner._started


def enter_ray_runner(runner) -> None:
    """Enter `runner` as a plain Prefect TaskRunner, skipping RayTaskRunner.__enter__ (whose `ray.init` joins a
    stray cluster for address=None: flows/runners.py starts or joins Ray itself). No public hook for this."""
    from prefect.task_runners import TaskRunner

    _ray_runner_state(runner)
    TaskRunner.__enter__(runner)


_UNCHANGED = object()


def set_ray_owner(runner, owns: bool, ray_context: Any = _UNCHANGED) -> None:
    """Record what RayTaskRunner.__exit__ reads: `_owns_ray` (shut Ray down only if this runner started it) and
    `_ray_context` (the `ray.init` result). Needed because enter_ray_runner() skips the __enter__ that sets them."""
    _ray_runner_state(runner)
    if ray_context is not _UNCHANGED:
        runner._ray_context = ray_context
    runner._owns_ray = owns


def picklable_ray_runner_state(state: dict) -> dict:
    """A RayTaskRunner's `__dict__` for pickling (the flow, and so its runner, travels with every task's context):
    without `_ray_context`, which holds the live Ray client."""
    _require("_ray_context" in state, "prefect-ray's RayTaskRunner._ray_context", "prefect-ray")
    return {**state, "_ray_context": None}


def current_remote_options() -> dict:
    """The Ray options of the enclosing `prefect_ray.context.remote_options(...)` block (its context class and
    field are not documented: only the context manager is)."""
    from prefect_ray.context import RemoteOptionsContext

    options = getattr(RemoteOptionsContext.get(), "current_remote_options", None)
    _require(isinstance(options, dict), "prefect-ray's RemoteOptionsContext.current_remote_options", "prefect-ray")
    return options


# ------------------------------------------------------------------------------------ Prefect: logging

# Loggers of Prefect's background services and internals, by name: their chatter stays off the console.
PREFECT_BACKGROUND_LOGGERS = ("prefect._internal", "EventsWorker", "APILogWorker")


def prefect_setup_logging() -> None:
    """`prefect.logging.configuration.ensure_logging_setup`: Prefect's logging config now, not at its first flow
    run (so flows/launch.py can filter its console handlers first); `import prefect` has usually set it up
    already, and setting it up again costs ~0.1 s and changes nothing. Not a public API."""
    from prefect.logging import configuration

    _require(callable(getattr(configuration, "ensure_logging_setup", None)),
             "prefect.logging.configuration.ensure_logging_setup", "prefect")
    configuration.ensure_logging_setup()


@functools.cache
def prefect_console_handler_types() -> tuple[type, ...]:
    """The console handler classes Prefect's logging config installs (`_SafeStreamHandler` is private), and the
    plain StreamHandler; matched exactly (a FileHandler is a StreamHandler too, and stays unfiltered)."""
    try:
        from prefect.logging.handlers import PrefectConsoleHandler, _SafeStreamHandler
    except ImportError:
        raise broken("prefect.logging.handlers.PrefectConsoleHandler / _SafeStreamHandler", "prefect") from None
    return (PrefectConsoleHandler, logging.StreamHandler, _SafeStreamHandler)


def is_console_handler(handler: logging.Handler) -> bool:
    return type(handler) in prefect_console_handler_types()


def drain_prefect_workers(timeout: float) -> None:
    """Send the run's buffered logs and events now (`drain_all` of Prefect's APILogWorker and EventsWorker,
    services in prefect._internal): while the run's server is still up, else 'Error logging to API'. Prefect
    drains them only at interpreter exit."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        _require(callable(getattr(worker, "drain_all", None)), f"prefect's {worker.__name__}.drain_all", "prefect")
        worker.drain_all(timeout=timeout)


def route_api_logs(sink) -> None:
    """Hand every log Prefect's API handler makes in this process to `sink(log)` instead of queueing it for the
    APILogWorker (`prefect.logging.handlers.set_api_log_sink`, the hook Prefect's own ProcessPoolTaskRunner sets
    in its worker processes; not documented). `log` is a dict of LogCreate's fields plus LOG_SIZE_KEY."""
    from prefect.logging import handlers

    _require(callable(getattr(handlers, "set_api_log_sink", None)), "prefect.logging.handlers.set_api_log_sink",
             "prefect")
    handlers.set_api_log_sink(sink)


LOG_SIZE_KEY = "__payload_size__"  # APILogHandler.prepare's own key: the log's JSON size, not a LogCreate field


def api_log_batches(logs: list[dict]) -> list[list[dict]]:
    """`logs` from the sink as bodies for `client.create_logs`: without LOG_SIZE_KEY (the API refuses unknown
    fields), each body within PREFECT_LOGGING_TO_API_BATCH_SIZE bytes as APILogWorker keeps its batches."""
    from prefect.settings import PREFECT_LOGGING_TO_API_BATCH_SIZE

    _require(all(LOG_SIZE_KEY in log for log in logs), f"prefect's APILogHandler.prepare() {LOG_SIZE_KEY!r}",
             "prefect")
    limit, batches, size = PREFECT_LOGGING_TO_API_BATCH_SIZE.value(), [], 0
    for log in logs:
        if not batches or size + log[LOG_SIZE_KEY] + 1 > limit:
            batches.append([])
            size = 1
        batches[-1].append({k: v for k, v in log.items() if k != LOG_SIZE_KEY})
        size += log[LOG_SIZE_KEY] + 1
    return batches


def wait_for_events_sent() -> None:
    """Block until this process's EventsWorker (a QueueService in prefect._internal) has sent every event queued
    so far (`wait_until_empty`): a Ray worker calls it after each task, so the task's state events are on their
    way to the API before its result reaches the driver. Otherwise a runner that shuts its local Ray down once the
    last result is in kills workers with those events still queued, and the UI never shows those task runs."""
    from prefect.events.worker import EventsWorker

    _require(callable(getattr(EventsWorker, "wait_until_empty", None)), "prefect's EventsWorker.wait_until_empty",
             "prefect")
    EventsWorker.instance().wait_until_empty()


# ------------------------------------------------------------------ Prefect: a server without Prefect's CLI

def prefect_api_app():
    """Prefect's API (and UI) ASGI app, as `prefect server start` builds it (`create_app(final=True)`): the CLI
    costs a second of imports and cannot serve on an inherited socket (flows/apiserver.py)."""
    from prefect.server.api.server import create_app

    return create_app(final=True)


def uvicorn_started(server) -> bool:
    """`uvicorn.Server.started`: whether the server came up (uvicorn.run() exits 3 when it did not; serving an
    inherited socket needs Server.run(sockets=...), which only sets this flag)."""
    started = getattr(server, "started", None)
    _require(isinstance(started, bool), "uvicorn's Server.started", "uvicorn")
    return started


def uvicorn_server_ending_only_if(config, may_end):
    """A `uvicorn.Server` for `config` whose SIGINT/SIGTERM end it only while `may_end()` holds (flows/apiserver.py:
    once the run that started it is gone). Overrides `Server.handle_exit`, uvicorn's handler of both signals,
    installed by `Server.run`; uvicorn has no public switch for which signals end a server."""
    import uvicorn

    _require(callable(getattr(uvicorn.Server, "handle_exit", None)), "uvicorn's Server.handle_exit", "uvicorn")

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if may_end():
                super().handle_exit(sig, frame)

    return Server(config)


def uvicorn_request_exit(server) -> None:
    """Ask a serving `uvicorn.Server` to shut down in order (`Server.should_exit`, what its signal handler sets;
    the flag uvicorn's docs show for stopping a server from code)."""
    _require(isinstance(getattr(server, "should_exit", None), bool), "uvicorn's Server.should_exit", "uvicorn")
    server.should_exit = True


# Tables of Prefect's database no run of this tool can do without (a template's sanity check), and the table
# where Prefect's alembic migrations record the revision.
PREFECT_CORE_TABLES = frozenset({"alembic_version", "flow", "flow_run", "flow_run_state", "task_run",
                                 "task_run_state", "log", "artifact", "block_type", "block_schema", "block_document"})
REVISION_QUERY = "select version_num from alembic_version"
REVISION_IN_DUMP = r"""^INSERT INTO "?alembic_version"? VALUES\('(\w+)'\)"""  # in a database's SQL dump
SQLITE_MIGRATIONS = "server/database/_migrations/versions/sqlite"


def migrations_head() -> str:
    """The newest SQLite migration revision of the installed Prefect, read from its migration scripts without
    importing Prefect (a template's revision must equal it). The scripts' folder and form are Prefect's internal:
    no public API names the revision a Prefect version migrates to without a database."""
    from importlib.util import find_spec

    spec = find_spec("prefect")
    folder = Path(spec.submodule_search_locations[0]) / SQLITE_MIGRATIONS if spec else None
    revisions, parents = set(), set()
    for script in folder.glob("*.py") if folder and folder.is_dir() else ():
        text = script.read_text()
        revisions.update(re.findall(r'^revision = "(\w+)"', text, re.MULTILINE))
        parents.update(re.findall(r'^down_revision = "(\w+)"', text, re.MULTILINE))
    heads = revisions - parents
    _require(len(heads) == 1, f"prefect's SQLite migration scripts ({SQLITE_MIGRATIONS}, one head revision)",
             "prefect")
    return heads.pop()


def migrate_database() -> None:
    """Migrate the database PREFECT_API_DATABASE_CONNECTION_URL names and register Prefect's block types, as a
    Prefect server's start does (`provide_database_interface`, `run_block_auto_registration`: server internals;
    the public way is a whole server start)."""
    import asyncio

    from prefect.server.database import provide_database_interface
    from prefect.server.models.block_registration import run_block_auto_registration

    async def build() -> None:
        db = provide_database_interface()
        await db.create_db()
        async with await db.session() as session:
            await run_block_auto_registration(session=session)
            await session.commit()
        await (await db.engine()).dispose()

    asyncio.run(build())


# ------------------------------------------------------------------------------------------------------ Ray

# Loggers of Ray internals whose notices stay off the console: token auth enabled by default, and the worker's
# "SIGTERM handler is not set" in client mode.
RAY_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
RAY_WORKER_LOGGER = "ray._private.worker"


def _ray_private(module: str, name: str):
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise broken(f"{module}.{name}", "ray") from None


def find_local_ray_cluster() -> str | None:
    """The bootstrap address of the Ray cluster started on this host (`ray start`), or None: what `ray.init
    ("auto")` finds, without joining it (`ray._private.services.canonicalize_bootstrap_address`)."""
    return _ray_private("ray._private.services", "canonicalize_bootstrap_address")("auto")


def enable_ray_token_auth() -> None:
    """Use the cluster token when one is available and RAY_AUTH_MODE is unset, as `ray start` does
    (`ray._private.authentication...maybe_enable_token_auth_if_token_available`); no public API."""
    _ray_private("ray._private.authentication.authentication_token_setup",
                 "maybe_enable_token_auth_if_token_available")(warn_if_disabled=False)


def ray_cluster_id(bootstrap: str, timeout: float) -> None:
    """Ask the GCS at `bootstrap` for its cluster id over gRPC (Ray's own channel, with its token): a fast answer
    to 'is the head there, does it take our token' (grpc.RpcError when not). `ray.init` instead retries for a
    minute and ends in a traceback; the generated stubs and `init_grpc_channel` are Ray internals."""
    init_grpc_channel = _ray_private("ray._private.grpc_utils", "init_grpc_channel")
    # The modules themselves: `import ray` loads gcs_service_pb2 but not gcs_service_pb2_grpc, so an attribute of
    # the package would be missing.
    request = _ray_private("ray.core.generated.gcs_service_pb2", "GetClusterIdRequest")
    stub = _ray_private("ray.core.generated.gcs_service_pb2_grpc", "NodeInfoGcsServiceStub")
    channel = init_grpc_channel(bootstrap)
    try:
        stub(channel).GetClusterId(request(), timeout=timeout)
    finally:
        channel.close()


def ray_address_file() -> Path:
    """The file where Ray records this host's latest cluster address (tests: kept and restored around a test
    cluster, so a stray `auto` never finds it); `ray._private.utils.get_ray_address_file`."""
    return Path(_ray_private("ray._private.utils", "get_ray_address_file")(None))


def validate_ray_cluster_config(config: dict) -> None:
    """Validate a Ray cluster launcher config as `ray up` does (`ray.autoscaler._private.util`; tests)."""
    prepare = _ray_private("ray.autoscaler._private.util", "prepare_config")
    validate = _ray_private("ray.autoscaler._private.util", "validate_config")
    validate(prepare(config))


def validate_prefect_yaml(raw: dict) -> None:
    """Validate a prefect.yaml as `prefect deploy` does (`prefect.cli.deploy._models.PrefectYamlModel`; tests)."""
    try:
        from prefect.cli.deploy._models import PrefectYamlModel
    except ImportError:
        raise broken("prefect.cli.deploy._models.PrefectYamlModel", "prefect") from None
    PrefectYamlModel.model_validate(raw)
