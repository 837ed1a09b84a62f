"""The garbage collector of a `sidecar-ops` process: paused while the command imports, never run over those imports.

A run imports Prefect, pyarrow and the config models (~300,000 objects, nearly all of them kept for the life of
the process). Python's collector walks them again and again as they are built (~10% of the import time, ~0.15 s
here), and at exit the interpreter's last collections walk every object once more (~0.3 s). So the console
entry point pauses the collector (`pause`), the command resumes it once its modules are imported (`resume`:
what exists then is frozen, i.e. left out of every later collection; the few thousand cycles the imports left
behind stay, a few hundred KiB), and `exiting` freezes what is left before the interpreter tears down. Objects
made while shards run are collected as usual. Nothing here runs in a process that did not call `pause`
(tests, a deployment's worker, `python -c`): `resume` and `exiting` then do nothing.
"""
from __future__ import annotations

import gc

_state = ""  # "paused" (by pause), "resumed" (imports frozen), "" (never paused: nothing to do)


def pause() -> None:
    global _state
    if not _state and gc.isenabled():
        gc.disable()
        _state = "paused"


def resume() -> None:
    """The imports are done: freeze what they made, collect again from here on. Idempotent."""
    global _state
    if _state == "paused":
        _state = "resumed"
        gc.freeze()
        gc.enable()


def exiting() -> None:
    """The command is done: the interpreter's final collections need not walk the run's objects."""
    if _state:
        resume()
        gc.freeze()
