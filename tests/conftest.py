"""Shared fixtures: moto S3 in server mode on loopback, one real Prefect API, storage roots, CLI runner."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import uuid

import pytest

# The two tiers and the guard of the fast one (a test without a heavy marker starts no process); the two streams
# of `make test-all` (tests/streams.py).
pytest_plugins = ("pytester", "tier_guard", "streams")

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
# Test credentials for moto; never real ones.
os.environ["AWS_ACCESS_KEY_ID"] = "testing-key-id"
os.environ["AWS_SECRET_ACCESS_KEY"] = "testing-secret-key"
os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
os.environ.pop("AWS_PROFILE", None)
# moto's in-process werkzeug server logs every request at INFO; keep it off the consoles tests inspect.
logging.getLogger("werkzeug").setLevel(logging.WARNING)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """moto in server mode on 127.0.0.1; s3fs reaches it through AWS_ENDPOINT_URL like any S3 store."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    yield endpoint
    server.stop()
    os.environ.pop("AWS_ENDPOINT_URL", None)


@pytest.fixture
def s3_root(moto_endpoint):
    """A fresh bucket for one test, as an s3:// prefix."""
    import boto3

    bucket = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/"


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    """The same test over a local folder and an S3 bucket on moto."""
    if request.param == "local":
        return str(tmp_path / "data") + "/"
    return request.getfixturevalue("s3_root")


@pytest.fixture(params=["copy", "decode"])
def merge_path(request, monkeypatch):
    """Each merge of the test by one path of the kernel (tasks/kernel.py:stream_output): "copy" leaves the copy
    path to be chosen wherever every step allows it (the default), "decode" refuses every copy plan (as
    `--recompress zstd` or an uncopyable input would). Modules whose tests merge in this process use it for
    every test (`pytestmark = pytest.mark.usefixtures("merge_path")`): each test passes on both paths."""
    if request.param == "decode":
        from tasks import chunkcopy

        def refused(*args, **kwargs):
            raise chunkcopy.NotCopyable("the decode path, by the test's parameter")

        monkeypatch.setattr(chunkcopy, "plan", refused)
    return request.param


@pytest.fixture(scope="session")
def prefect_api():
    """One real local Prefect API for the whole session: a server subprocess, started once, which the fast tier
    may use by name (tests/tier_guard.py, ALLOWED_FIXTURES)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    # No flow run heartbeats, as on a run-scoped server (flows/server.py): they serve crash detection on a
    # long-lived server, and their thread makes the end of every in-process run wait up to a second.
    with prefect_test_harness(server_startup_timeout=120), \
            temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), quick_retries_of_a_busy_database():
        yield PREFECT_API_URL.value()


BUSY_RETRY_SCALE = 1 / 20


@contextlib.contextmanager
def quick_retries_of_a_busy_database():
    """Prefect's client retries a 503 after 2, 4, 8... s. The session's server answers 503 to nearly every flow
    run created right after another run's tasks ended: its task-run recorder is still writing their states, and
    SQLite refuses the creating transaction (SQLITE_BUSY_SNAPSHOT, which no busy timeout waits out). Every other
    flow test waited 2 s for that, over a minute of the fast tier. Here the client waits a twentieth (0.1, 0.2,
    0.4... s), and retries up to 9 times rather than 5: on a loaded machine the recorder of a run of hundreds of
    task runs is still writing after the 3 s five retries add up to (seen failing a test twice in a row with
    another test suite beside it); nine give it 51 s, and a run never waits longer than the recorder takes."""
    from prefect.client import base
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    backoff = base.clamped_poisson_interval
    with pytest.MonkeyPatch.context() as patch, temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 9}):
        patch.setattr(base, "clamped_poisson_interval",
                      lambda average, *args, **kwargs: backoff(average, *args, **kwargs) * BUSY_RETRY_SCALE)
        yield


def snapshot(prefix: str) -> dict[str, str]:
    """relpath -> md5 of every object under a prefix (to prove inputs were not touched)."""
    from tasks import storage

    fs, path = storage.filesystem(prefix)
    try:
        found = fs.find(path)
    except FileNotFoundError:
        return {}
    strip = len(path)
    return {p[strip:].lstrip("/"): hashlib.md5(fs.cat_file(p)).hexdigest() for p in found}


@pytest.fixture
def cli(request, capsys, monkeypatch):
    """Run `sidecar-ops ARGS...` in-process; returns (exit code, stdout, stderr). In a test that uses the
    session's Prefect API, runs talk to it (named in the environment, as a user would): none starts a server."""
    from flows.cli import main

    if "prefect_api" in request.fixturenames:
        monkeypatch.setenv("PREFECT_API_URL", request.getfixturevalue("prefect_api"))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


QUICK_RETRY_DELAY = 0.05  # seconds between a task's attempts in the fast tier's runs (the shipped: 2, 10, 30)


@pytest.fixture
def run(cli, prefect_api, monkeypatch):
    """`sidecar-ops run ARGS...` in-process on the session's Prefect API; returns (exit code, stdout, stderr).
    A failed shard or listing task is retried after QUICK_RETRY_DELAY, not the shipped delays: the retry is
    Prefect's own (AwaitingRetry, scheduled, run again), only the wait is shorter."""
    import flows.merge
    from core_fixtures import release_console_handlers

    for name in ("shard_task", "operation_task", "list_shards"):
        task = getattr(flows.merge, name)
        monkeypatch.setattr(flows.merge, name, task.with_options(retry_delay_seconds=QUICK_RETRY_DELAY))

    def go(*argv):
        try:
            return cli("run", *argv)
        finally:
            release_console_handlers()
    return go
