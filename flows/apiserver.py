"""The process of a run-scoped Prefect server: Prefect's API app on uvicorn, without Prefect's CLI.

    python -m flows.apiserver HOST PORT

`prefect server start` imports the whole Prefect CLI (about a second here) before it builds the same app;
this starts it directly. Everything else comes from the environment flows/server.py prepares (database,
services, UI, and whether the database still needs migrating).
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    host, port = argv[0], int(argv[1])
    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    uvicorn.run(create_app(final=True), host=host, port=port, log_level=settings.server.logging_level.lower(),
                timeout_keep_alive=settings.server.api.keepalive_timeout)


if __name__ == "__main__":
    main(sys.argv[1:])
