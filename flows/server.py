"""One Prefect API for the whole run.

With PREFECT_API_URL set, that server is used. Otherwise the run starts one Prefect server of its own
(flows/apiserver.py: Prefect's API app, without Prefect's CLI) the moment the run's arguments are checked, on
SQLite under PREFECT_HOME with one database per run copied from a migrated template (flows/rundb.py), tuned so
its task run recorder keeps up with shard tasks, and stops it at the end. Every Ray worker gets the same URL, so
none starts a temporary server of its own. The server listens on loopback, or, when workers on other hosts must
reach it, on the address they know this host by; it is then protected by a random per-run credential (Prefect's
API auth string) that only the run's own settings carry: never printed, never in the environment of a Ray job,
an output or a Prefect record.

The run talks only to its own server: the port is bound here and the bound socket handed to the server
process (nothing can take the port between its choice and the server's start), and the health check asks
the server for a random per-run identity only it was given. An unwritable PREFECT_HOME is a ConfigError
(exit 2) naming the directory and the two fixes, raised before the server starts and anything is written.
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
import urllib.error
import urllib.request
from pathlib import Path

from flows.apiserver import IDENTITY_ENV, IDENTITY_PATH, STOP_SIGNAL
from flows.rundb import RunDatabase
from tasks.errors import ConfigError

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
    """A port free now (for others' servers, e.g. tests'); a run's own server gets `bound_socket`."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bound_socket(host: str) -> socket.socket:
    """A socket bound to a free port of `host`, for the run's server process to inherit and listen on: the
    port stays held from the moment it is chosen (no SO_REUSEADDR: no other socket can bind it meanwhile)."""
    sock = socket.socket()
    sock.bind((host, 0))
    return sock


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def identity_at(url: str, timeout: float = 2.0) -> str | None:
    """The identity the server at `url` (an API URL, ".../api") was started with; None while nothing answers
    there; "" when something answers without one (not a run's server)."""
    try:
        with urllib.request.urlopen(f"{url.removesuffix('/api')}{IDENTITY_PATH}", timeout=timeout) as resp:
            return resp.read().decode() if resp.status == 200 else ""
    except urllib.error.HTTPError:
        return ""
    except OSError:
        return None


def unwritable(home: Path, exc: OSError) -> str:
    return (f"PREFECT_HOME {home} is not writable ({exc.strerror or exc}): set PREFECT_HOME to a writable "
            "directory, or PREFECT_API_URL to a running Prefect server")


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
    The server process starts before this process imports Prefect: the two boot side by side, and
    `while_starting(booting)` (checking the run's YAMLs, importing the flow module, ...) runs meanwhile, once,
    whether or not a server was started (`booting`: one is starting); what it raises stops the server (its errors
    come before an unwritable PREFECT_HOME's). `announce` says on stderr where the server's log and database are."""
    if os.environ.get("PREFECT_API_URL"):  # the usual way to name a server; no need to import Prefect to see it
        _call(while_starting, False)
        yield os.environ["PREFECT_API_URL"]
        return
    server = home_error = None
    try:
        server = RunServer(host, ui, keep_history)
    except ConfigError as exc:  # PREFECT_HOME unwritable: fine if a Prefect profile names a server after all
        home_error = exc
    try:
        _call(while_starting, server is not None)
        configured = configured_api()  # a Prefect profile or settings file may name a server as well
        if server is None and not configured:
            raise home_error
        if configured:
            if server is not None:
                server.stop()
            yield configured
            return
        if announce:
            print(f"Prefect server for this run: {server.url}, log {server.log_path}, database {server.where()}",
                  file=sys.stderr)
        server.wait_healthy()
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY
        from prefect.settings import temporary_settings

        # The URL and credential live in this process's Prefect settings only: the flow hands the URL to its Ray
        # workers (flows/scheduler.py make_runner), and the credential travels inside the settings each task
        # carries (flows/runners.py), never through an environment.
        # No flow run heartbeats: they serve crash detection on a long-lived server, and this one ends with the
        # run; their thread only delays the end of every run by up to a second.
        with temporary_settings({PREFECT_API_URL: server.url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
                                 **({PREFECT_API_AUTH_STRING: server.auth} if server.auth else {})}):
            yield server.url
    finally:
        if server is not None:
            server.stop()


def _call(fn, booting: bool) -> None:
    if fn is not None:
        fn(booting)


class RunServer:
    """A Prefect server process for one run (flows/apiserver.py), on a free port of `host`, with its database."""

    def __init__(self, host: str, ui: bool, keep_history: bool):
        protect = host != "127.0.0.1"
        self.auth = f"sidecar-ops:{secrets.token_urlsafe(32)}" if protect else None
        self.identity = secrets.token_urlsafe(16)
        env = {**os.environ, **SERVER_TUNING, "PREFECT_SERVER_UI_ENABLED": str(ui).lower(),
               "PREFECT_UI_ENABLED": str(ui).lower(), IDENTITY_ENV: self.identity}
        env.pop("PREFECT_API_URL", None)
        home = prefect_home()
        own_db = not keep_history and not env.get("PREFECT_API_DATABASE_CONNECTION_URL")
        try:  # every write to PREFECT_HOME before the server starts
            log = self.prepare_home(home, own_db)
        except OSError as exc:
            raise ConfigError(unwritable(home, exc)) from None
        with log, bound_socket(host) as sock:  # the server process keeps its own copies
            port = sock.getsockname()[1]
            self.url = f"http://{host}:{port}/api"
            if ui:  # the UI asks the API at 127.0.0.1:4200 unless told where it is
                env["PREFECT_UI_API_URL"] = self.url
            if self.auth:
                env["PREFECT_SERVER_API_AUTH_STRING"] = self.auth  # the environment, never the command line
            if self.db is not None:
                env["PREFECT_API_DATABASE_CONNECTION_URL"] = self.db.url
                if self.db.from_template:  # already migrated, block types registered: skip both (about a second)
                    env.update(PREFECT_API_DATABASE_MIGRATE_ON_START="false",
                               PREFECT_API_BLOCKS_REGISTER_ON_START="false")
            self.kept_db = env.get("PREFECT_API_DATABASE_CONNECTION_URL") or f"{home / 'prefect.db'} (kept)"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flows.apiserver", "--host", host, "--port", str(port),
                 "--fd", str(sock.fileno())], pass_fds=(sock.fileno(),), stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True, preexec_fn=_die_with_parent)

    def prepare_home(self, home: Path, own_db: bool):
        """The server's log (returned open) and database under `home`; OSError when it cannot be written."""
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / "sidecar-ops-server.log"
        if self.log_path.exists() and self.log_path.stat().st_size > LOG_LIMIT:
            os.replace(self.log_path, self.log_path.with_suffix(".log.1"))  # one older generation: bounded
        log = open(self.log_path, "ab")
        try:
            self.db = RunDatabase(home) if own_db else None
        except BaseException:
            log.close()
            raise
        return log

    def where(self) -> str:
        if self.db is None:
            return self.kept_db
        return f"{self.db.path} (removed at the end; --keep-run-history keeps it)"

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not self.answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"local Prefect server exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"local Prefect server did not answer within {START_TIMEOUT:.0f}s; "
                                   f"see {self.log_path}")
            time.sleep(0.05)
        if self.db is not None:
            self.db.save_template()

    def answers(self) -> bool:
        """Whether this run's own server answers at its URL (any other server there is an error)."""
        identity = identity_at(self.url)
        if identity is not None and identity != self.identity:
            raise RuntimeError(f"{self.url} is answered by a server this run did not start; "
                               f"see {self.log_path}")
        return identity == self.identity and healthy(self.url)

    def stop(self) -> None:
        # A database removed right after needs no orderly shutdown (uvicorn's takes ~0.2 s); a kept one does.
        # It ignores SIGTERM while this run lives (flows/apiserver.py): STOP_SIGNAL asks it to shut down.
        stop(self.proc, grace=10.0 if self.db is None else 0.0, signum=STOP_SIGNAL)
        if self.db is not None:
            self.db.remove()


def stop(proc: subprocess.Popen, grace: float = 10.0, signum: int = signal.SIGTERM) -> None:
    """`signum` (SIGTERM), then SIGKILL after `grace` seconds (at once with no grace)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum if grace else signal.SIGKILL)
    try:
        proc.wait(grace or None)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
