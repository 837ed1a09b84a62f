"""Task runners for sidecar-ops flows: Prefect's thread pool, or a fast Ray runner.

Tested against the versions in constraints.txt. The Prefect and prefect-ray
internals this relies on (the context serialisation split, a shared client,
the task engine's entry points, RayTaskRunner's state) are entries of
``flows/compat.py``, each checked by ``tests/test_compat.py``.

Why a subclass: stock ``prefect_ray.RayTaskRunner`` costs ~110-200 ms per task
on a 2-core box. Per submit it re-serialises the whole Prefect settings and
builds a new ``ray.remote`` function; per task, the worker re-validates those
settings, builds two HTTP clients, and ``ray.get``s upstream results inside
the worker (which blocks it and makes Ray spawn extra workers).
``FastRayTaskRunner`` instead

1. serialises the settings once per ``SettingsContext`` (driver-side cache)
   and ships a small pickled blob plus a content key with each task;
2. caches the ``ray.remote`` function per set of remote options;
3. keeps, per worker process, one hydrated ``SettingsContext`` and one open
   ``SyncPrefectClient`` per settings key;
4. passes upstream ``ObjectRef``s as top-level Ray arguments, so Ray resolves
   them (to upstream final ``State``s) before the task starts.

Task semantics (retries, NotReady on failed upstreams, names, API reporting)
are untouched: the worker still runs Prefect's task engine (``compat.run_task_in_worker``).
Its API logs are held in the worker and sent when the task ends, before its
result is returned (``_send_held_logs``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import sys
import threading
from collections import OrderedDict
from typing import Any, Iterable
from uuid import uuid4

import ray
from prefect.client.orchestration import get_client
from prefect.context import SettingsContext
from prefect.futures import PrefectFuture
from prefect.settings import PREFECT_API_URL
from prefect.utilities.collections import visit_collection
from prefect_ray.task_runners import PrefectRayFuture, RayTaskRunner

from flows import cluster, compat
from tasks.errors import ConfigError, one_line

__all__ = ["FastRayTaskRunner", "make_task_runner", "serialize_context_fast"]

_CACHE_SIZE = 16


# --------------------------------------------------------------------------
# Driver side: settings serialised once per SettingsContext
# --------------------------------------------------------------------------


_settings_lock = threading.Lock()
# id(SettingsContext) -> (the context (kept alive so ids are not reused), key, blob)
_settings_blobs: OrderedDict[int, tuple[SettingsContext, str, bytes]] = OrderedDict()


def _settings_blob(ctx: SettingsContext) -> tuple[str, bytes]:
    """Pickled ``ctx.serialize()`` and its content hash, cached per context object."""
    with _settings_lock:
        hit = _settings_blobs.get(id(ctx))
        if hit is not None and hit[0] is ctx:
            return hit[1], hit[2]
    blob = pickle.dumps(ctx.serialize(), protocol=pickle.HIGHEST_PROTOCOL)
    key = hashlib.sha1(blob).hexdigest()
    with _settings_lock:
        _settings_blobs[id(ctx)] = (ctx, key, blob)
        while len(_settings_blobs) > _CACHE_SIZE:
            _settings_blobs.popitem(last=False)
    return key, blob


def serialize_context_fast(asset_ctx_kwargs: dict[str, Any]) -> tuple[dict[str, Any], str, bytes]:
    """Prefect's serialised task context with ``settings_context`` split off and cached.

    Returns ``(context_without_settings, settings_key, settings_blob)``.
    """
    key, blob = _settings_blob(SettingsContext.get())
    return compat.serialize_context_without_settings(asset_ctx_kwargs), key, blob


class _Upstream:
    """Placeholder for the i-th top-level upstream ObjectRef argument."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


# --------------------------------------------------------------------------
# Worker side: per-process caches and the Ray entry point
# --------------------------------------------------------------------------

_worker_lock = threading.Lock()
_worker_settings: OrderedDict[str, SettingsContext] = OrderedDict()
_worker_clients: dict[str, Any] = {}
_held_logs: list[dict[str, Any]] = []  # this worker's API logs not sent yet (see _send_held_logs)
_logs_lock = threading.Lock()


def _hold_log(log: dict[str, Any]) -> None:
    with _logs_lock:
        _held_logs.append(log)


def _send_held_logs(client: Any) -> None:
    """Send this worker's logs, held since the last task ended, with the task's client: the API has them before
    the task's result leaves the process. Prefect's APILogWorker would send them from a background thread every
    PREFECT_LOGGING_TO_API_BATCH_INTERVAL, and Ray ends a job's workers at once when its driver disconnects
    ("Worker force exited because its job has finished", no exit hooks run): a batch not sent by then was lost.
    A failure to send is reported as Prefect's log worker reports it, and does not fail the task."""
    with _logs_lock:
        logs = _held_logs[:]
        _held_logs.clear()
    for batch in compat.api_log_batches(logs):
        try:
            client.create_logs(batch)
        except Exception as exc:
            sys.stderr.write(f"--- Error logging to API ---\n{one_line(exc)}\n")


def _worker_state(key: str, blob: bytes) -> tuple[SettingsContext, Any]:
    """The hydrated SettingsContext and open SyncPrefectClient for ``key``; the first call routes this process's
    API logs to ``_hold_log``."""
    with _worker_lock:
        if not _worker_settings:
            compat.route_api_logs(_hold_log)
        settings = _worker_settings.get(key)
        if settings is None:
            settings = SettingsContext(**pickle.loads(blob))
            with settings.model_copy():
                client = get_client(sync_client=True)
                client.__enter__()  # kept open for the life of the worker process
            _worker_settings[key] = settings
            _worker_clients[key] = client
            while len(_worker_settings) > _CACHE_SIZE:
                old, _ = _worker_settings.popitem(last=False)
                _worker_clients.pop(old).__exit__(None, None, None)
        else:
            _worker_settings.move_to_end(key)
        return settings, _worker_clients[key]


def _run_prefect_task_fast(
    *upstream_values: Any,
    task: Any,
    task_run_id: Any,
    parameters: dict[str, Any],
    wait_for: Any,
    dependencies: Any,
    context: dict[str, Any],
    settings_key: str,
    settings_blob: bytes,
) -> Any:
    """Ray entry point: run one Prefect task and return its final State.

    ``upstream_values`` are the already-resolved top-level ObjectRefs (each an
    upstream's final ``State``); they replace the ``_Upstream`` placeholders.
    """
    if upstream_values:

        def fill(expr: Any) -> Any:
            return upstream_values[expr.index] if isinstance(expr, _Upstream) else expr

        parameters = visit_collection(parameters, visit_fn=fill, return_data=True)
        if wait_for:
            wait_for = visit_collection(wait_for, visit_fn=fill, return_data=True)

    settings, client = _worker_state(settings_key, settings_blob)
    # The engine's client lookup picks up the shared client (compat.sharing_client),
    # so no new HTTP client is built per task.
    with settings.model_copy(), compat.sharing_client(client):
        try:
            state = compat.run_task_in_worker(
                task,
                task_run_id=task_run_id,
                parameters=parameters,
                wait_for=wait_for,
                dependencies=dependencies,
                context=context,
            )
        finally:
            _send_held_logs(client)
        compat.wait_for_events_sent()  # the task run's states reach the API before its result reaches the driver
        return state


# --------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------


class FastRayTaskRunner(RayTaskRunner):
    """``RayTaskRunner`` with per-task overhead cut from ~110 ms to ~15-20 ms.

    Args:
        address: ``None`` starts a local Ray (or joins ``$RAY_ADDRESS`` if set);
            ``"auto"`` / ``"ray://host:10001"`` / ``"host:6379"`` join a cluster.
        init_kwargs: passed to ``ray.init`` (``runtime_env``, ``log_to_driver``...).
        remote_options: default Ray options for every task (``num_cpus``,
            ``memory`` in bytes, ...). Options from ``prefect_ray.context.remote_options``
            override them key by key.

    Workers must be able to import ``flows.runners`` (true on a local Ray; on a
    remote cluster install the project or ship it with ``runtime_env``).
    """

    def __init__(
        self,
        address: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
        remote_options: dict[str, Any] | None = None,
    ):
        super().__init__(address=address, init_kwargs=init_kwargs)
        self.remote_options = dict(remote_options or {})
        self._remote_fns: dict[bytes, Any] = {}

    def duplicate(self) -> "FastRayTaskRunner":
        return type(self)(
            address=self.address,
            init_kwargs=self.init_kwargs,
            remote_options=self.remote_options,
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FastRayTaskRunner)
            and super().__eq__(other)
            and self.remote_options == other.remote_options
        )

    def __getstate__(self) -> dict[str, Any]:
        # The flow (and so its task runner) travels with every task's context.
        state = compat.picklable_ray_runner_state(self.__dict__)
        state["_remote_fns"] = {}
        return state

    def _remote_function(self) -> Any:
        """The ``ray.remote`` entry point for the current options, cached."""
        options = {**self.remote_options, **compat.current_remote_options()}
        key = pickle.dumps(sorted(options.items()))
        fn = self._remote_fns.get(key)
        if fn is None:
            decorator = ray.remote(**options) if options else ray.remote
            fn = decorator(_run_prefect_task_fast)
            self._remote_fns[key] = fn
        return fn

    @staticmethod
    def _swap_refs(expr: Any, refs: list[Any]) -> Any:
        """Replace Ray futures / ObjectRefs in ``expr`` by ``_Upstream`` placeholders."""

        def swap(value: Any) -> Any:
            if isinstance(value, PrefectRayFuture):
                value = value.wrapped_future
            if isinstance(value, ray.ObjectRef):
                refs.append(value)
                return _Upstream(len(refs) - 1)
            return value

        return visit_collection(expr, visit_fn=swap, return_data=True)

    def submit(
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Iterable[PrefectFuture[Any]] | None = None,
        dependencies: dict[str, set[Any]] | None = None,
    ) -> PrefectRayFuture[Any]:
        if not compat.ray_runner_started(self):
            raise RuntimeError("The task runner must be started before submitting work.")
        task_run_id = uuid4()
        task_inputs = {
            k: compat.task_run_inputs(v, future_cls=PrefectRayFuture)
            for k, v in parameters.items()
        }
        context, settings_key, settings_blob = serialize_context_fast(
            {
                "task": task,
                "task_run_id": task_run_id,
                "task_inputs": task_inputs,
                "copy_to_child_ctx": True,
            }
        )
        refs: list[Any] = []
        parameters = self._swap_refs(parameters, refs)
        if wait_for:
            wait_for = self._swap_refs(list(wait_for), refs)

        object_ref = (
            self._remote_function()
            .options(name=task.name)
            .remote(
                *refs,
                task=task,
                task_run_id=task_run_id,
                parameters=parameters,
                wait_for=wait_for,
                dependencies=dependencies,
                context=context,
                settings_key=settings_key,
                settings_blob=settings_blob,
            )
        )
        return PrefectRayFuture(task_run_id=task_run_id, wrapped_future=object_ref)

    def __enter__(self) -> "FastRayTaskRunner":
        """Start or join Ray. Unlike stock, ``address=None`` never joins a stray cluster."""
        compat.enter_ray_runner(self)
        if ray.is_initialized():  # e.g. inside a Ray worker, or a caller's ray.init()
            compat.set_ray_owner(self, owns=False)
            return self
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no telemetry
        target = cluster.ray_target(self.address)
        cluster.prepare(target)
        self.logger.info("Starting Ray (address=%s)", target.address or "local")
        kwargs, env_vars = self.init_kwargs, {}
        if not target.joins_cluster:
            kwargs, env_vars = inherited_env(kwargs)
        try:
            with environment(env_vars):
                ray_context = connect(target, kwargs, self.logger)
        except (ConnectionError, RuntimeError, ray.exceptions.AuthenticationError) as exc:
            raise ConfigError(f"cannot join Ray at {target.address}: {one_line(exc)}") from None
        compat.set_ray_owner(self, owns=True, ray_context=ray_context)
        api_url = PREFECT_API_URL.value()
        if api_url and not target.all_on_this_host:
            cluster.check_api_reachable(api_url)
        return self


# Ray's proxy (Ray Client, ray://) starts each client's own server by forking a process that runs gRPC threads, and
# the child sometimes dies at once (ray-project/ray#63202, ~7% of connects there): the connect then fails with one
# of these, before anything of the run has started on the cluster.
CLIENT_SERVER_DIED = ("Starting Ray client server failed", "psutil.ZombieProcess")
CLIENT_CONNECT_ATTEMPTS = 3


def connect(target: cluster.RayTarget, kwargs: dict[str, Any], logger: logging.Logger) -> Any:
    """`ray.init` to `target`; through Ray Client, tried again when the proxy's server for this client died at its
    start (up to CLIENT_CONNECT_ATTEMPTS in all). Any other failure is raised at once."""
    for attempt in range(1, CLIENT_CONNECT_ATTEMPTS + 1):
        try:
            return ray.init(address=target.address or "local", **kwargs)
        except ConnectionAbortedError as exc:
            if not (target.client_mode and attempt < CLIENT_CONNECT_ATTEMPTS
                    and any(sign in str(exc) for sign in CLIENT_SERVER_DIED)):
                raise
            logger.warning("Ray's proxy at %s could not start this client's server (ray-project/ray#63202): "
                           "connecting again (attempt %d of %d)", target.address, attempt + 1,
                           CLIENT_CONNECT_ATTEMPTS)


def inherited_env(init_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """For a local instance (its raylet and workers are this process's children, and inherit its environment as
    `ray.init` starts them): `init_kwargs` without the runtime env's variables, and those variables. A runtime
    env makes Ray start new workers for the tasks instead of the ones it started with the instance (~0.9 s
    before the first task here); the inherited environment gives them the same variables."""
    runtime_env = dict(init_kwargs.get("runtime_env") or {})
    env_vars = runtime_env.pop("env_vars", None) or {}
    kwargs = {k: v for k, v in init_kwargs.items() if k != "runtime_env"}
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    return kwargs, dict(env_vars)


@contextlib.contextmanager
def environment(env_vars: dict[str, str]):
    """`env_vars` in this process's environment for the block, then as they were."""
    before = {k: os.environ.get(k) for k in env_vars}
    os.environ.update(env_vars)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def without_job_env(env_vars: dict[str, str]) -> dict[str, str]:
    """`env_vars` less those the Ray job this driver runs as (``ray job submit --runtime-env-json``) already
    gives every task with the same value. Ray refuses to start a driver whose ``ray.init`` runtime env names a
    variable the job's names too, even with an equal value ("Failed to merge the Job's runtime env"), and the
    job's variables are in this process's environment, so they would always be forwarded twice."""
    try:
        job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
        job_vars = (job.get("runtime_env") or {}).get("env_vars") or {}
    except (ValueError, AttributeError):
        return env_vars
    return {k: v for k, v in env_vars.items() if job_vars.get(k) != v}


def make_task_runner(
    ray_address: str | None = None,
    task_cpus: float | None = None,
    task_memory_gb: float | None = None,
    *,
    debug: bool = False,
    api_url: str | None = None,
    init_kwargs: dict[str, Any] | None = None,
) -> FastRayTaskRunner:
    """A ``FastRayTaskRunner`` whose tasks request ``num_cpus=task_cpus`` and
    ``memory=task_memory_gb GiB`` when given (concurrency follows the cluster's
    CPUs and ``task_cpus``). Ray is quiet unless ``debug``
    (``log_to_driver=False``, ``logging_level=WARNING``). ``api_url`` (the
    Prefect API of the run) reaches workers through ``runtime_env.env_vars``
    unless ``init_kwargs`` already sets it, so no worker starts a temporary
    server of its own.
    """
    kwargs: dict[str, Any] = dict(init_kwargs or {})
    if not debug:
        kwargs.setdefault("log_to_driver", False)
        kwargs.setdefault("logging_level", logging.WARNING)
    runtime_env = dict(kwargs.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    if api_url:
        env_vars.setdefault("PREFECT_API_URL", api_url)
    env_vars.setdefault("ARROW_DEFAULT_MEMORY_POOL", os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or "jemalloc")
    runtime_env["env_vars"] = without_job_env(env_vars)
    kwargs["runtime_env"] = runtime_env

    remote_options: dict[str, Any] = {}
    if task_cpus is not None:
        remote_options["num_cpus"] = task_cpus
    if task_memory_gb is not None:
        remote_options["memory"] = int(task_memory_gb * 2**30)
    return FastRayTaskRunner(address=ray_address, init_kwargs=kwargs, remote_options=remote_options)
