"""The `sidecar-ops` console script (pyproject.toml [project.scripts]) and `python flows/merge.py`,
`python flows/verify.py`, `python -m flows.console`: the command line as a process.

The top of the import arrows: it imports the command layer (flows/cli.py), which imports the flows, which import
tasks/; nothing imports it but entry points (the console script, main guards), so the flows never point back at
the commands. What only a process that is about to end may do lives here: pausing the garbage collector while
the command's modules are imported (flows/collector.py) and not waiting for shard threads an interrupted run
abandoned.
"""
from __future__ import annotations

import os
import sys

from flows import cli, collector


def console(argv: list[str] | None = None) -> None:
    """The `sidecar-ops` command. After an interrupted run whose grace period ran out, exit without waiting for
    the shard threads still running (Python would join them first): their writes never appear (atomic)."""
    collector.pause()  # until the command's modules are imported (flows/collector.py)
    code = cli.main(argv, for_good=True)
    collector.exiting()
    if cli.abandoned_work:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
