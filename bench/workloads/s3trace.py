"""Which code issues each S3 request: a tracer for a `sidecar-ops run` process (W8's request analysis).

`install(path)` (before the run) makes every s3fs request record its S3 operation, key, range and the calling
code: the frames of this repository (tasks/, flows/) on the calling thread's stack at the moment it entered
s3fs, innermost last, plus the library frame it entered through (`fsspec/spec.py:read` = a read pyarrow made on
an open file; `s3fs/core.py:...` = a call of the project's). s3fs runs its requests on its own event loop
thread, so the caller's stack is taken where the call crosses into that loop (fsspec.asyn.sync) and carried
into the coroutine by a context variable; botocore's `before-parameter-build` event then
records the operation. Reads that pyarrow makes from its own I/O threads (column chunks, pre-buffering) carry
no caller frames: they are attributed to the code that last opened or read the same key.
`dump()` writes one JSON line per request. Costs a stack walk per request (~0.1 ms): used on one-shard runs.
"""
from __future__ import annotations

import contextvars
import json
import threading
import traceback
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2]) + "/"
_STACK: contextvars.ContextVar[tuple] = contextvars.ContextVar("sidecar_bench_stack", default=())
_RECORDS: list[dict] = []
_LAST_BY_KEY: dict[str, list[str]] = {}  # the code that last touched each key (pyarrow's I/O threads inherit it)
_LOCK = threading.Lock()
_PATH: list[str] = []


def _summary(stack) -> tuple[list[str], str]:
    """(repo frames outermost first as 'tasks/x.py:function', the first library frame below the innermost;
    with no repo frame at all, the first fsspec/s3fs frame: a read from a thread of pyarrow's own)."""
    repo, entry, first_lib = [], "", ""
    for frame in stack:
        if frame.filename.startswith(REPO) and "/.venv/" not in frame.filename and "/bench/" not in frame.filename:
            repo.append(f"{frame.filename[len(REPO):]}:{frame.name}")
            entry = ""
            continue
        lib = f"{frame.filename.split('/site-packages/')[-1]}:{frame.name}"
        if repo and not entry:
            entry = lib
        if not first_lib and lib.startswith(("fsspec/", "s3fs/")):
            first_lib = lib
    return (repo, entry) if repo else ([], first_lib)


def _before_call(params=None, model=None, **_):
    """botocore's before-parameter-build: `params` are the API call's (Bucket, Key, Range, Prefix, ...)."""
    repo, entry = _STACK.get() or ((), "")
    req = params or {}
    key = req.get("Key") or req.get("Prefix") or ""
    with _LOCK:
        if repo:
            _LAST_BY_KEY[key] = list(repo)
        elif key in _LAST_BY_KEY:  # pyarrow reading column chunks on its own I/O threads: no caller frames there
            repo, entry = _LAST_BY_KEY[key], f"pyarrow I/O thread via {entry}"
        _RECORDS.append({"op": getattr(model, "name", "?"), "key": key, "range": req.get("Range") or "",
                         "repo": list(repo), "entry": entry, "thread": threading.current_thread().name})


def install(path: str) -> None:
    import fsspec.asyn
    import s3fs.core

    _PATH[:] = [path]
    real_sync = fsspec.asyn.sync

    def sync(loop, func, *args, timeout=None, **kwargs):
        caller = _summary(traceback.extract_stack()[:-1])

        async def traced(*a, **k):
            _STACK.set(caller)
            return await func(*a, **k)

        return real_sync(loop, traced, *args, timeout=timeout, **kwargs)

    fsspec.asyn.sync = s3fs.core.sync = sync
    real_set_session = s3fs.core.S3FileSystem.set_session

    async def set_session(self, *args, **kwargs):
        client = await real_set_session(self, *args, **kwargs)
        if not getattr(client, "_sidecar_bench_traced", False):
            client.meta.events.register("before-parameter-build.s3", _before_call)
            client._sidecar_bench_traced = True
        return client

    s3fs.core.S3FileSystem.set_session = set_session


def dump() -> None:
    if not _PATH:
        return
    with _LOCK, open(_PATH[0], "w") as f:
        for rec in _RECORDS:
            f.write(json.dumps(rec) + "\n")
