"""One Prefect API for the whole run.

With PREFECT_API_URL set, that server is used. Otherwise the run starts one Prefect server of its own
(SQLite under PREFECT_HOME, one database per run: flows/rundb.py), tuned so its task run recorder keeps up with shard tasks, and stops it at the
end. Every Ray worker gets the same URL, so none starts a temporary server of its own. The server listens
on loopback, or, when workers on other hosts must reach it, on the address they know this host by; it is
then protected by a random per-run credential (Prefect's API auth string) that only the run's own
settings carry: never printed, never in the environment of a Ray job, an output or a Prefect record.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from flows.rundb import RunDatabase

# Measured: the default recorder (batches of 1) saturates near 20 task runs/s on one core; 100 keeps up.
SERVER_TUNING = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "DO_NOT_TRACK": "1",
    # A run-scoped server schedules nothing and serves no automations: skip those services (faster start, less
    # SQLite contention). Task runs, logs and artifacts are still recorded while the run lasts (and kept with
    # --keep-run-history, for `prefect server start` on the same PREFECT_HOME to show afterwards).
    **{f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in (
        "SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "CANCELLATION_CLEANUP", "TRIGGERS",
        "EVENT_PERSISTER")},
}
START_TIMEOUT = 120.0
LOG_LIMIT = 10 * 2**20  # bytes of the server log kept under PREFECT_HOME before it is rotated


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def _die_with_parent() -> None:
    """In the server's process: get SIGTERM when the run that started it dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the run still stops the server on any exit it survives


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser()


def configured_api() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()


@contextlib.contextmanager
def prefect_api(ui: bool = False, while_starting=None, host: str = "127.0.0.1", keep_history: bool = False,
                announce: bool = False):
    """Yield the API URL to use; start (and afterwards stop) a server when none is configured.

    `host` is the address to listen on; any other than loopback gets a per-run credential. The server's
    database lasts as long as the run (flows/rundb.py), unless `keep_history` (then Prefect's own database
    under PREFECT_HOME, which `prefect server start` shows later) or PREFECT_API_DATABASE_CONNECTION_URL is set.
    `while_starting` (e.g. importing the flow module) runs while the server boots, overlapping the two.
    `announce` says on stderr where the server's log and database are."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    configured = configured_api()
    if configured:
        yield configured
        return
    port = free_port(host)
    url = f"http://{host}:{port}/api"
    protect = host != "127.0.0.1"
    auth = f"sidecar-ops:{secrets.token_urlsafe(32)}" if protect else None
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "sidecar-ops-server.log"
    if log_path.exists() and log_path.stat().st_size > LOG_LIMIT:
        os.replace(log_path, log_path.with_suffix(".log.1"))  # one older generation, so the log stays bounded
    env = {**os.environ, **SERVER_TUNING, "PREFECT_UI_ENABLED": "true" if ui else "false"}
    env.pop("PREFECT_API_URL", None)
    if auth:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth  # the environment, never the command line
    db = None if keep_history or env.get("PREFECT_API_DATABASE_CONNECTION_URL") else RunDatabase(home)
    if db is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = db.url
    if announce:
        where = f"{db.path} (removed at the end; --keep-run-history keeps it)" if db else \
            env.get("PREFECT_API_DATABASE_CONNECTION_URL") or f"{home / 'prefect.db'} (kept)"
        print(f"Prefect server for this run: {url}, log {log_path}, database {where}", file=sys.stderr)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port),
             "--log-level", "WARNING", "--ui" if ui else "--no-ui"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        if while_starting is not None:
            while_starting()
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(f"local Prefect server exited with {proc.returncode}; see {log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"local Prefect server did not answer within {START_TIMEOUT:.0f}s; see {log_path}")
            time.sleep(0.2)
        if db is not None:
            db.save_template()
        from prefect.settings import temporary_settings

        # The URL and credential live in this process's Prefect settings only: the flow hands the URL to its Ray
        # workers (flows/scheduler.py make_runner), and the credential travels inside the settings each task
        # carries (flows/runners.py), never through an environment.
        # No flow run heartbeats: they serve crash detection on a long-lived server, and this one ends with the
        # run; their thread only delays the end of every run by up to a second.
        with temporary_settings({PREFECT_API_URL: url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
                                 **({PREFECT_API_AUTH_STRING: auth} if auth else {})}):
            yield url
    finally:
        stop(proc)
        if db is not None:
            db.remove()


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
