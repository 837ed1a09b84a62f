"""Every entry of the compat modules (flows/compat.py: Prefect, prefect-ray, Ray, uvicorn; tasks/fsspec_internals.py:
s3fs, fsspec) against the installed versions: each test fails naming them when the internal it checks is gone or
has changed, and an entry whose internal is missing raises CompatError naming them instead of falling back.

Fast tier: imports Ray (no Ray instance) and uses the session's one in-process Prefect API for the two checks
that need a flow run.
"""
from __future__ import annotations

import gzip
import inspect
import logging
import re
import signal
import sqlite3
from contextlib import closing
from importlib.metadata import version

import pytest

from flows import compat, rundb
from tasks import fsspec_internals as tasks_compat
from tasks.fsspec_internals import CompatError


def versions(*dists: str) -> str:
    return tasks_compat.installed(*dists)


def need(ok, what: str, *dists: str) -> None:
    """Fail the test naming the internal and the installed versions."""
    if not ok:
        pytest.fail(f"{what}: gone or changed in the installed {versions(*dists)} (see the compat modules)")


def raises_naming(dist: str):
    """CompatError whose message names `dist` and its installed version."""
    return pytest.raises(CompatError, match=re.escape(f"{dist} {version(dist)}"))


# ----------------------------------------------------------------------------------------- the error itself

def test_the_error_names_versions_constraints_and_the_module():
    message = str(compat.broken("prefect's X._y", "prefect", "prefect-ray"))
    assert f"prefect {version('prefect')}, prefect-ray {version('prefect-ray')}" in message
    assert "constraints.txt" in message and "flows/compat.py" in message
    assert "(not installed)" in tasks_compat.installed("no-such-distribution-xyz")


# -------------------------------------------------------------------------- Prefect: the thread pool runner

def test_cancel_events_of():
    from prefect.task_runners import ThreadPoolTaskRunner

    runner = ThreadPoolTaskRunner(max_workers=2)
    events = compat.cancel_events_of(runner)
    need(events == {} and "self._cancel_events[" in inspect.getsource(ThreadPoolTaskRunner.submit),
         "ThreadPoolTaskRunner.submit keeping an Event per task run in _cancel_events", "prefect")
    assert compat.thread_pool_size(runner) == 2
    del runner._cancel_events
    with raises_naming("prefect"):  # not `{}`: that silently brought the memory growth back
        compat.cancel_events_of(runner)


def test_abandon_thread_pool():
    from concurrent.futures import ThreadPoolExecutor

    from flows.scheduler import ShardThreadRunner

    runner = ShardThreadRunner(max_workers=1)
    with runner:
        need(isinstance(runner._executor, ThreadPoolExecutor), "ThreadPoolTaskRunner._executor", "prefect")
        runner.abandon()
    assert runner._executor is None
    del runner._executor
    with raises_naming("prefect"):
        compat.abandon_thread_pool(runner)


# ------------------------------------------------------------- Prefect: inside a flow run (one, in-process)

def test_flow_run_internals(prefect_api):
    """In one flow run: the result links (FlowRunContext.run_results) and the context serialisation split."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.context import FlowRunContext, serialize_context

    from flows.runners import serialize_context_fast

    @task(persist_result=False, cache_policy=NO_CACHE)
    def one() -> list:
        return [1]

    @flow
    def capture():
        future = one.submit()
        future.result()
        context = FlowRunContext.get()
        linked = {link[0].state_details.task_run_id for link in compat.result_links(context).values()}
        compat.forget_result_links(context, {future.task_run_id})
        left = {link[0].state_details.task_run_id for link in compat.result_links(context).values()}
        stock = serialize_context()
        fast, key, _ = serialize_context_fast({"task": one, "task_run_id": None, "task_inputs": {}})
        return future.task_run_id, linked, left, stock, fast, key

    task_run_id, linked, left, stock, fast, key = capture()
    need(task_run_id in linked and task_run_id not in left, "FlowRunContext.run_results", "prefect")
    need(set(stock) == compat.KNOWN_CONTEXT_KEYS,
         f"serialize_context()'s keys ({sorted(set(stock) ^ compat.KNOWN_CONTEXT_KEYS)} differ)", "prefect")
    need(set(stock["settings_context"]) <= compat.KNOWN_SETTINGS_KEYS, "SettingsContext.serialize()'s keys",
         "prefect")
    assert set(fast) == set(stock) and fast["settings_context"] == {} and len(key) == 40
    for k in compat.KNOWN_CONTEXT_KEYS - {"settings_context", "asset_context", "flow_run_context"}:
        assert fast[k] == stock[k], k


def test_result_links_missing_or_changed():
    class Context:
        run_results = {1: ("not a state",)}

    with raises_naming("prefect"):
        compat.forget_result_links(Context(), set())
    with raises_naming("prefect"):
        compat.result_links(object())


def test_hydrated_context_reads_the_known_keys_and_skips_an_empty_settings_context():
    from prefect.context import hydrated_context

    src = inspect.getsource(hydrated_context)
    need(set(re.findall(r'serialized_context\.get\("(\w+)"\)', src)) == compat.KNOWN_CONTEXT_KEYS,
         "hydrated_context()'s keys", "prefect")
    need('if settings_context := serialized_context.get("settings_context")' in src,
         "hydrated_context() skipping an empty settings_context", "prefect")


def test_task_engine_and_client_sharing():
    from prefect.client.orchestration import get_client
    from prefect.utilities.engine import collect_task_run_inputs_sync

    compat._engine.cache_clear()
    compat._engine()  # CompatError naming the version when a keyword argument is gone
    need("future_cls" in inspect.signature(collect_task_run_inputs_sync).parameters,
         "collect_task_run_inputs_sync(future_cls=...)", "prefect")
    class Client:  # an open SyncPrefectClient: entering it again only counts (its own __enter__)
        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return None

        def raise_for_api_version_mismatch_once(self):
            return None

    client = Client()
    with compat.sharing_client(client):
        need(get_client(sync_client=True) is client, "get_client() reusing SyncClientContext.client", "prefect")


def test_task_engine_changed(monkeypatch):
    import prefect.task_engine

    def run_task_sync(task, parameters=None, return_type="result"):  # a Prefect without `context`, ...
        raise AssertionError("not called")

    monkeypatch.setattr(prefect.task_engine, "run_task_sync", run_task_sync)
    compat._engine.cache_clear()
    try:
        with raises_naming("prefect"):
            compat._engine()
    finally:
        compat._engine.cache_clear()


# ------------------------------------------------------------------------------- prefect-ray: RayTaskRunner

def test_ray_task_runner_state():
    from prefect_ray.context import remote_options
    from prefect_ray.task_runners import RayTaskRunner

    runner = RayTaskRunner()
    assert compat.ray_runner_started(runner) is False
    need("self._owns_ray" in inspect.getsource(RayTaskRunner.__exit__),
         "RayTaskRunner.__exit__ reading _owns_ray", "prefect-ray")
    compat.set_ray_owner(runner, owns=False)
    assert runner._owns_ray is False and runner._ray_context is None
    state = compat.picklable_ray_runner_state({**vars(runner), "_ray_context": "live"})
    assert state["_ray_context"] is None
    with remote_options(num_cpus=0.5):
        assert compat.current_remote_options() == {"num_cpus": 0.5}
    del runner._owns_ray
    with raises_naming("prefect-ray"):
        compat.ray_runner_started(runner)


def test_entering_as_a_plain_task_runner():
    from prefect.task_runners import TaskRunner
    from prefect_ray.task_runners import RayTaskRunner

    runner = RayTaskRunner()
    compat.enter_ray_runner(runner)
    try:
        need(runner._started is True, "TaskRunner.__enter__ setting _started", "prefect")
    finally:
        TaskRunner.__exit__(runner, None, None, None)


# ------------------------------------------------------------------------------------- Prefect: logging

def test_console_handlers_and_background_loggers():
    import prefect.logging

    from flows import launch

    types = compat.prefect_console_handler_types()
    assert compat.is_console_handler(logging.StreamHandler())
    assert not compat.is_console_handler(logging.FileHandler("/dev/null", delay=True))
    shipped = (inspect.getfile(prefect.logging).rsplit("/", 1)[0]) + "/logging.yml"
    text = open(shipped).read()
    need(all(f"prefect.logging.handlers.{t.__name__}" in text for t in types if t.__module__.startswith("prefect")),
         "Prefect's console handlers in its logging.yml", "prefect")
    from prefect._internal.concurrency.services import QueueService
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    need("logging.getLogger(f\"{type(self).__name__}\")" in inspect.getsource(QueueService.__init__)
         and {EventsWorker.__name__, APILogWorker.__name__} <= set(compat.PREFECT_BACKGROUND_LOGGERS),
         "Prefect's background services' loggers, named by class", "prefect")
    for worker in (EventsWorker, APILogWorker):
        need("timeout" in inspect.signature(worker.drain_all).parameters, f"{worker.__name__}.drain_all", "prefect")
    assert set(compat.PREFECT_BACKGROUND_LOGGERS) <= set(launch.NOISY_ON_CONSOLE)


def test_drain_missing(monkeypatch):
    from prefect.logging.handlers import APILogWorker

    monkeypatch.setattr(APILogWorker, "drain_all", None)  # inherited from QueueService: shadowed
    with raises_naming("prefect"):
        compat.drain_prefect_workers(timeout=0)


def test_wait_for_events_sent(monkeypatch, prefect_api):
    """Waits on the process's EventsWorker queue (nothing queued here: returns at once); gone, it says so.
    On the session's API: without one, the worker would start a server of its own (a process)."""
    from prefect.events.worker import EventsWorker

    compat.wait_for_events_sent()
    monkeypatch.setattr(EventsWorker, "wait_until_empty", None)
    with raises_naming("prefect"):
        compat.wait_for_events_sent()


def test_route_api_logs_and_their_batches(monkeypatch):
    """A log Prefect's API handler makes reaches the sink (with its size), not the APILogWorker; the batches for
    the client drop the size and stay within PREFECT_LOGGING_TO_API_BATCH_SIZE. Gone, each entry says so."""
    from uuid import uuid4

    from prefect.logging import handlers
    from prefect.settings import (PREFECT_LOGGING_TO_API_BATCH_SIZE, PREFECT_LOGGING_TO_API_MAX_LOG_SIZE,
                                  temporary_settings)

    held = []
    monkeypatch.setattr(handlers.APILogWorker, "instance", None)  # a log that reached it would fail the test
    compat.route_api_logs(held.append)
    try:
        for n in range(3):
            record = logging.LogRecord("sidecar-ops", logging.INFO, __file__, 1, "line %d", (n,), None)
            record.flow_run_id = uuid4()
            handlers.APILogHandler().emit(record)
    finally:
        compat.route_api_logs(None)
    assert [log["message"] for log in held] == ["line 0", "line 1", "line 2"]
    size = held[0][compat.LOG_SIZE_KEY]
    need(size == len(__import__("json").dumps({k: v for k, v in held[0].items() if k != compat.LOG_SIZE_KEY},
                                              separators=(",", ":"))),
         f"APILogHandler.prepare()'s {compat.LOG_SIZE_KEY!r}: the log's JSON size", "prefect")
    assert compat.api_log_batches(list(held)) == [[{k: v for k, v in log.items() if k != compat.LOG_SIZE_KEY}
                                                    for log in held]]
    two = 1 + held[0][compat.LOG_SIZE_KEY] + 1 + held[1][compat.LOG_SIZE_KEY] + 1  # "[", two logs, their "," / "]"
    with temporary_settings({PREFECT_LOGGING_TO_API_BATCH_SIZE: two, PREFECT_LOGGING_TO_API_MAX_LOG_SIZE: two}):
        assert [len(batch) for batch in compat.api_log_batches(list(held))] == [2, 1]
    with raises_naming("prefect"):
        compat.api_log_batches([{"message": "no size"}])
    monkeypatch.setattr(handlers, "set_api_log_sink", None)
    with raises_naming("prefect"):
        compat.route_api_logs(held.append)


def test_logging_set_up_once(monkeypatch):
    """`import prefect` set Prefect's logging up; the entry does not set it up again, and says so when gone."""
    from prefect.logging import configuration

    calls = []
    monkeypatch.setattr(configuration, "setup_logging", lambda *a, **k: calls.append(a))
    need(bool(configuration.PROCESS_LOGGING_CONFIG), "prefect.logging.configuration.PROCESS_LOGGING_CONFIG",
         "prefect")
    compat.prefect_setup_logging()
    assert calls == []
    monkeypatch.setattr(configuration, "PROCESS_LOGGING_CONFIG", {})
    compat.prefect_setup_logging()
    assert calls == [()]
    monkeypatch.delattr(configuration, "ensure_logging_setup")
    with raises_naming("prefect"):
        compat.prefect_setup_logging()


# ------------------------------------------------------------------------ Prefect: the flow run's heartbeats

def test_the_sync_engine_sends_heartbeats_through_the_module_function():
    """FlowRunEngine.run_context enters `_send_heartbeats(self)` by its module-level name, with Prefect's
    default join_on_exit=True: what heartbeats_not_waited_for replaces."""
    from prefect import flow_engine

    need("with _send_heartbeats(self):" in inspect.getsource(flow_engine.FlowRunEngine.run_context),
         "prefect's FlowRunEngine.run_context using _send_heartbeats(self)", "prefect")
    parameters = inspect.signature(flow_engine._send_heartbeats).parameters
    need(parameters.get("join_on_exit") is not None and parameters["join_on_exit"].default is True,
         "prefect.flow_engine._send_heartbeats(engine, join_on_exit=True)", "prefect")


def test_heartbeats_are_sent_but_not_waited_for(monkeypatch):
    import contextlib

    from prefect import flow_engine

    seen = []

    @contextlib.contextmanager
    def send(engine, join_on_exit: bool = True):
        seen.append((engine, join_on_exit))
        yield

    monkeypatch.setattr(flow_engine, "_send_heartbeats", send)
    compat.heartbeats_not_waited_for()
    compat.heartbeats_not_waited_for()  # once is enough: not wrapped twice
    with flow_engine._send_heartbeats("engine"):
        pass
    assert seen == [("engine", False)]
    monkeypatch.setattr(flow_engine, "_send_heartbeats", lambda engine: None)
    with raises_naming("prefect"):
        compat.heartbeats_not_waited_for()


# ------------------------------------------------------------------------- Prefect: its API clients' TLS

def test_prefect_clients_share_one_tls_context_unless_given_their_own(monkeypatch):
    """After one_tls_context, Prefect's API clients are built with one SSL context a process (certifi's bundle
    loaded once, not once a client); a client given its own `verify` keeps it; a client without
    `httpx_settings` in its signature is loud."""
    import ssl

    from prefect.client.orchestration import PrefectClient, SyncPrefectClient

    compat._tls_contexts.clear()
    built = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(k) or real(*a, **k))
    monkeypatch.setattr(PrefectClient, "__init__", PrefectClient.__init__)  # restored after the test
    monkeypatch.setattr(SyncPrefectClient, "__init__", SyncPrefectClient.__init__)
    compat.one_tls_context()
    compat.one_tls_context()  # once is enough: not wrapped twice
    clients = [SyncPrefectClient("http://127.0.0.1:9/api"), SyncPrefectClient("http://127.0.0.1:9/api"),
               PrefectClient("http://127.0.0.1:9/api")]
    assert len(built) == 1, built  # Prefect alone builds one a client
    SyncPrefectClient("http://127.0.0.1:9/api", httpx_settings={"verify": False})
    assert len(built) == 2, built  # given its own: Prefect builds (and discards) one, as without the hook
    del clients
    monkeypatch.setattr(SyncPrefectClient, "__init__", lambda self, api: None)
    with raises_naming("prefect"):
        compat.one_tls_context()


@pytest.mark.slow  # a fresh interpreter
def test_the_copy_paths_thrift_codec_loads_without_pandas_or_fastparquets_package():
    """tasks/footer.py loads fastparquet's codec on its own: a fresh interpreter that reads a footer with it has
    imported neither pandas nor the fastparquet package (~0.27 s)."""
    import subprocess
    import sys

    code = ("import sys, pyarrow as pa, pyarrow.parquet as pq; from tasks import footer; "
            "sink = pa.BufferOutputStream(); pq.ParquetWriter(sink, pa.schema([('a', pa.int64())])).close(); "
            "buf = sink.getvalue(); meta, _ = footer.read(pa.BufferReader(buf), pq.read_metadata(pa.BufferReader(buf))"
            ".serialized_size); print(meta.num_rows, 'pandas' in sys.modules, 'fastparquet' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False", "False"], out


# ---------------------------------------------------------------- Prefect: a server without Prefect's CLI

def test_api_app_and_uvicorn():
    import uvicorn
    from prefect.server.api.server import create_app

    need("final" in inspect.signature(create_app).parameters, "create_app(final=...)", "prefect")
    server = uvicorn.Server(uvicorn.Config(app=None))
    assert compat.uvicorn_started(server) is False
    need("sockets" in inspect.signature(uvicorn.Server.run).parameters, "uvicorn.Server.run(sockets=...)",
         "uvicorn")
    with raises_naming("uvicorn"):
        compat.uvicorn_started(object())
    ending = []
    server = compat.uvicorn_server_ending_only_if(uvicorn.Config(app=None), lambda: bool(ending))
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit is False  # ignored while it may not end
    ending.append(True)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit is True
    server = uvicorn.Server(uvicorn.Config(app=None))
    compat.uvicorn_request_exit(server)
    assert server.should_exit is True
    with raises_naming("uvicorn"):
        compat.uvicorn_request_exit(object())


def test_migrations_head_is_the_shipped_templates_revision():
    script = gzip.decompress(rundb.shipped_dump().read_bytes()).decode()
    expected = rundb.Expected.of(script)
    need(compat.migrations_head() == expected.revision, "Prefect's SQLite migration scripts", "prefect")
    need(compat.PREFECT_CORE_TABLES <= expected.tables, "Prefect's database tables", "prefect")
    with closing(sqlite3.connect(":memory:")) as con:
        con.executescript(script)
        assert [rev for (rev,) in con.execute(compat.REVISION_QUERY)] == [expected.revision]


def test_migrations_head_missing(monkeypatch):
    monkeypatch.setattr(compat, "SQLITE_MIGRATIONS", "server/database/no-such-folder")
    with raises_naming("prefect"):
        compat.migrations_head()


def test_database_migration_entry_points():
    from prefect.server.database import provide_database_interface
    from prefect.server.models.block_registration import run_block_auto_registration

    need("session" in inspect.signature(run_block_auto_registration).parameters,
         "run_block_auto_registration(session=...)", "prefect")
    interface = inspect.signature(provide_database_interface).return_annotation
    assert interface  # the database interface: create_db(), session(), engine() (tests/test_run_database.py)


# ------------------------------------------------------------- the shipped template: only for its Prefect

def test_shipped_template_is_used_only_by_the_prefect_it_was_made_by(tmp_path, monkeypatch):
    shipped = sorted(p.name for p in rundb.SHIPPED.glob("prefect-*.sql.gz"))
    assert shipped == [f"prefect-{version('prefect')}.sql.gz"], \
        f"templates {shipped} for the installed prefect {version('prefect')}: rebuild with `python -m flows.rundb`"
    db = rundb.RunDatabase(tmp_path / "same")
    assert db.from_template and db.template.name == f"template-prefect-{version('prefect')}.db"
    db.remove()

    monkeypatch.setattr(rundb, "version", lambda dist: "3.99.0")  # another Prefect, within the range
    other = rundb.RunDatabase(tmp_path / "same")  # the folder already holds the 3.9.1 template: not used
    assert not rundb.shipped_dump().exists()
    assert not other.from_template and other.template.name == "template-prefect-3.99.0.db"
    assert not other.template.exists()  # the server migrates; its first run saves the template
    other.remove()


# ------------------------------------------------------------------------------------------------------ Ray

def test_ray_internals_exist():
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    for module, name in [("ray._private.services", "canonicalize_bootstrap_address"),
                         ("ray._private.authentication.authentication_token_setup",
                          "maybe_enable_token_auth_if_token_available"),
                         ("ray._private.grpc_utils", "init_grpc_channel"),
                         ("ray._private.utils", "get_ray_address_file"),
                         ("ray.autoscaler._private.util", "prepare_config"),
                         ("ray.autoscaler._private.util", "validate_config")]:
        fn = compat._ray_private(module, name)  # CompatError naming ray's version when gone
        assert callable(fn)
    token = compat._ray_private("ray._private.authentication.authentication_token_setup",
                                "maybe_enable_token_auth_if_token_available")
    need("warn_if_disabled" in inspect.signature(token).parameters, "maybe_enable_token_auth...(warn_if_disabled)",
         "ray")
    need(hasattr(gcs_service_pb2, "GetClusterIdRequest")
         and hasattr(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer, "GetClusterId"), "GCS GetClusterId", "ray")
    assert compat.ray_address_file().name
    for name in (compat.RAY_TOKEN_NOTICE_LOGGER, compat.RAY_WORKER_LOGGER):
        module = __import__(name, fromlist=["logger"])
        need(getattr(module, "logger", None) is logging.getLogger(name), f"the logger {name}", "ray")


def test_ray_internal_gone(monkeypatch):
    import ray._private.services

    monkeypatch.delattr(ray._private.services, "canonicalize_bootstrap_address")
    with raises_naming("ray"):
        compat.find_local_ray_cluster()


def test_prefect_yaml_model():
    compat.validate_prefect_yaml({"deployments": []})


# ------------------------------------------------------------------------------------- s3fs and fsspec

def test_s3_file_pin():
    import s3fs

    fs = s3fs.S3FileSystem(anon=True, skip_instance_cache=True, endpoint_url="http://127.0.0.1:9")
    opened = fs.open("bucket/key", "rb", size=10, cache_type="none")  # no request: the size is given
    need(isinstance(opened.read_kw, dict) and isinstance(fs.local_expiry_check, bool)
         and "req_kw=self.read_kw" in inspect.getsource(type(opened)._fetch_range),
         "s3fs's S3File.read_kw / S3FileSystem.local_expiry_check", "s3fs")
    tasks_compat.pin_s3_file(opened, {"ETag": '"abc"', "size": 10})
    assert opened.details["ETag"] == '"abc"'
    assert opened.read_kw.get("IfMatch") == ('"abc"' if not fs.local_expiry_check else None)
    del opened.read_kw
    with raises_naming("s3fs"):
        tasks_compat.pin_s3_file(opened, {"ETag": '"abc"'})


def test_fsspec_url_helpers():
    import fsspec

    ftp = fsspec.get_filesystem_class("ftp")
    need(tasks_compat.url_options(ftp, "ftp://host:2121/a/b").get("host") == "host", "fsspec _get_kwargs_from_urls",
         "fsspec")
    need(tasks_compat.url_path(fsspec.get_filesystem_class("memory"), "memory://a/b").strip("/") == "a/b",
         "fsspec _strip_protocol", "fsspec")

    class Bare:
        pass

    with raises_naming("fsspec"):
        tasks_compat.url_path(Bare, "x://y")
