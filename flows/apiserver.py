"""The process of a run-scoped Prefect server: Prefect's API app on uvicorn, without Prefect's CLI.

    python -m flows.apiserver --host HOST --port PORT [--fd FD]

`prefect server start` imports the whole Prefect CLI (about a second here) before it builds the same app;
this starts it directly. With `--fd` it serves on that inherited socket, already bound to HOST:PORT by the run
(flows/server.py), so the port is never free between its choice and this server. With SIDECAR_OPS_SERVER_ID in
the environment it answers GET /sidecar-ops/server-id with that value (the run's proof that it reached its own
server). Everything else comes from the environment flows/server.py prepares (database, services, UI, and
whether the database still needs migrating).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

from flows import compat

IDENTITY_ENV = "SIDECAR_OPS_SERVER_ID"
IDENTITY_PATH = "/sidecar-ops/server-id"


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
    identity = os.environ.pop(IDENTITY_ENV, None)
    import uvicorn
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    app = compat.prefect_api_app()
    config = uvicorn.Config(with_identity(app, identity) if identity else app, host=args.host, port=args.port,
                            log_level=settings.server.logging_level.lower(),
                            timeout_keep_alive=settings.server.api.keepalive_timeout)
    server = uvicorn.Server(config)
    server.run(sockets=[socket.socket(fileno=args.fd)] if args.fd is not None else None)
    if not compat.uvicorn_started(server):  # as uvicorn.run: a start-up failure is an exit status, not a quiet 0
        sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1:])
