"""Shared fixtures: moto S3 in server mode on loopback, one real Prefect API, storage roots, CLI runner."""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid

import pytest

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


@pytest.fixture(scope="session")
def prefect_api():
    """One real local Prefect API for the whole session."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    # No flow run heartbeats, as on a run-scoped server (flows/server.py): they serve crash detection on a
    # long-lived server, and their thread makes the end of every in-process run wait up to a second.
    with prefect_test_harness(server_startup_timeout=120), \
            temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield PREFECT_API_URL.value()


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


@pytest.fixture
def run(cli, prefect_api):
    """`sidecar-ops run ARGS...` in-process on the session's Prefect API; returns (exit code, stdout, stderr)."""
    from core_fixtures import release_console_handlers

    def go(*argv):
        try:
            return cli("run", *argv)
        finally:
            release_console_handlers()
    return go


# ----------------------------------------------------------------- the two tiers

HEAVY = ("slow", "ray", "cluster", "postgres", "ui")
# What a fast test may not start: servers, Ray, PostgreSQL, browsers, network namespaces, or a `sidecar-ops`
# run or verify (each starts a Prefect server of its own). A dry run starts none and is allowed.
HEAVY_COMMANDS = ("flows.apiserver", "prefect.server", "uvicorn", "ray", "initdb", "pg_ctl", "postgres",
                  "chromium", "netns", "prefect")
CLI_COMMANDS = ("flows.cli", "sidecar-ops", "flows/merge.py", "flows/verify.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(name) for name in HEAVY):
            item.add_marker(pytest.mark.fast)


def heavy_command(args) -> str | None:
    """Why a command is too heavy for the fast tier, or None."""
    words = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    words = [os.fspath(w) if not isinstance(w, bytes) else w.decode() for w in words]
    line = " ".join(words)
    names = {os.path.basename(w) for w in words[:1]} | set(words[1:3])
    if any(name in HEAVY_COMMANDS or name.startswith(HEAVY_COMMANDS) for name in names):
        return line
    runs_cli = any(w in CLI_COMMANDS or w.endswith(CLI_COMMANDS) for w in words)
    if runs_cli and "--dry-run" not in words and "--help" not in words:
        return line
    return None


@pytest.fixture(autouse=True)
def fast_tier_guard(request, monkeypatch):
    """A test of the fast tier that starts something heavy fails, naming the marker it needs: the tier is a
    checked property, not a convention."""
    if not request.node.get_closest_marker("fast"):
        yield
        return
    import subprocess

    real_init = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kw):
        if heavy := heavy_command(args):
            pytest.fail(f"a fast test starts `{heavy[:120]}`: mark it with one of {HEAVY}", pytrace=False)
        real_init(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.fail(f"a fast test started Ray: mark it with one of {HEAVY}", pytrace=False)
