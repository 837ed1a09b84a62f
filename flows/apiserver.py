"""The process of a run-scoped Prefect server: Prefect's API app on uvicorn, without Prefect's CLI.

    python -m flows.apiserver --host HOST --port PORT [--fd FD]

`prefect server start` imports the whole Prefect CLI (about a second here) before it builds the same app;
this starts it directly. With `--fd` it serves on that inherited socket, already bound to HOST:PORT by the run
(flows/server.py), so the port is never free between its choice and this server. With SIDECAR_OPS_SERVER_ID in
the environment it answers GET /sidecar-ops/server-id with that value (the run's proof that it reached its own
server). Everything else comes from the environment flows/server.py prepares (database, services, UI, and
whether the database still needs migrating).

The server outlives SIGINT, SIGTERM and SIGHUP while the run that started it (its parent) lives: `ray job stop` and
systemd send SIGTERM to every process of a run, not just the run, and the run still needs its API for the
grace period, the summary and a Cancelled flow run. The run stops it with STOP_SIGNAL (SIGUSR1: an orderly
shutdown) or SIGKILL; once the run is gone (PR_SET_PDEATHSIG sends SIGTERM) any of them ends it.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

from flows import compat

IDENTITY_ENV = "SIDECAR_OPS_SERVER_ID"
IDENTITY_PATH = "/sidecar-ops/server-id"
STOP_SIGNAL = signal.SIGUSR1  # the run's own request for an orderly shutdown (flows/server.py)


def run_alive(run_pid: int) -> bool:
    """Whether the run that started this server is still its parent (when it dies, this process is reparented)."""
    return os.getppid() == run_pid


def outlive_signals_while_the_run_lives(run_pid: int) -> None:
    """SIGINT/SIGTERM (until uvicorn installs its handlers) and SIGHUP end this process only once the run is
    gone."""
    def on_signal(signum, _frame):
        if not run_alive(run_pid):
            sys.exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)


def with_identity(app, identity: str):
    """The ASGI app `app`, answering IDENTITY_PATH itself with `identity`, in front of Prefect's routes."""
    body = identity.encode()

    async def asgi(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == IDENTITY_PATH:
            headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return asgi


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m flows.apiserver", description=__doc__)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--fd", type=int, help="serve on this inherited socket, bound to HOST:PORT")
    args = p.parse_args(argv)
    run_pid = os.getppid()
    outlive_signals_while_the_run_lives(run_pid)
    identity = os.environ.pop(IDENTITY_ENV, None)
    import uvicorn
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    app = compat.prefect_api_app()
    config = uvicorn.Config(with_identity(app, identity) if identity else app, host=args.host, port=args.port,
                            log_level=settings.server.logging_level.lower(),
                            timeout_keep_alive=settings.server.api.keepalive_timeout)
    # A signal aimed at the run's whole process tree leaves this server to the run, which stops it last.
    server = compat.uvicorn_server_ending_only_if(config, lambda: not run_alive(run_pid))
    stopped = []

    def on_stop(_sig, _frame):
        stopped.append(True)
        compat.uvicorn_request_exit(server)

    signal.signal(STOP_SIGNAL, on_stop)
    server.run(sockets=[socket.socket(fileno=args.fd)] if args.fd is not None else None)
    if not compat.uvicorn_started(server):  # as uvicorn.run: a start-up failure is an exit status, not a quiet 0
        sys.exit(3)
    if stopped:  # shut down in order; like the SIGTERM uvicorn re-raises, skip joining Prefect's service threads
        logging.shutdown()
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
