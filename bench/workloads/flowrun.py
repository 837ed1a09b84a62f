"""Running the real merge flow in this process against one warm local Prefect server."""
from __future__ import annotations

import contextlib
import time


@contextlib.contextmanager
def prefect_session():
    """One local Prefect server (flows/server.py, as `sidecar-ops run` starts it) for many flow runs."""
    from flows.launch import flush_api_logs, quiet_console
    from flows.server import prefect_api

    with prefect_api() as url:
        quiet_console(False)
        try:
            yield url
        finally:
            flush_api_logs()


def run_flow(pipeline: str, output: str, *, overwrite: bool = False, use_ray: bool = False,
             max_inflight: int = 32) -> tuple[float, dict]:
    """Wall time of merge_flow (plan + shards + summary), excluding server start; and its summary."""
    from flows.merge import merge_flow

    t0 = time.perf_counter()
    summary = merge_flow(pipeline=pipeline, output_prefix=output, overwrite=overwrite, max_inflight=max_inflight,
                         use_ray=use_ray)
    return time.perf_counter() - t0, summary.to_dict()
