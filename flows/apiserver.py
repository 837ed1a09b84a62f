"""The process of a run-scoped Prefect server: Prefect's API app on uvicorn, without Prefect's CLI.

    python -m flows.apiserver --host HOST --port PORT

`prefect server start` imports the whole Prefect CLI (about a second here) before it builds the same app;
this starts it directly. Everything else comes from the environment flows/server.py prepares (database,
services, UI, and whether the database still needs migrating).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m flows.apiserver", description=__doc__)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    uvicorn.run(create_app(final=True), host=args.host, port=args.port,
                log_level=settings.server.logging_level.lower(),
                timeout_keep_alive=settings.server.api.keepalive_timeout)


if __name__ == "__main__":
    main(sys.argv[1:])
