"""Test hooks for child `sidecar-ops` processes (on PYTHONPATH only in tests that ask for it).

SIDECAR_OPS_TEST_BARRIER=DIR: every base read first waits until SIDECAR_OPS_TEST_PARTIES processes have
reached one (a file per process in DIR), so concurrent runs start their shard work together.

SIDECAR_OPS_TEST_HOLD=DIR: the SIDECAR_OPS_TEST_HOLD_AT-th base read of the process (1-based) creates
DIR/held and waits until DIR/release exists (forever if it never does): the test then knows exactly which
shards are done and which one is in flight when it acts (a signal, a kill).
"""
import os

if os.environ.get("SIDECAR_OPS_TEST_BARRIER") or os.environ.get("SIDECAR_OPS_TEST_HOLD"):
    import threading
    import time

    from tasks import merge

    _real_read_base = merge.read_base
    _reads = []
    _lock = threading.Lock()

    def wait_for(condition, deadline=None):
        while not condition() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)

    def read_base(job, relpath):
        if folder := os.environ.get("SIDECAR_OPS_TEST_BARRIER"):
            parties = int(os.environ["SIDECAR_OPS_TEST_PARTIES"])
            open(os.path.join(folder, f"ready-{os.getpid()}"), "w").close()
            wait_for(lambda: len(os.listdir(folder)) >= parties, time.monotonic() + 120)
        if folder := os.environ.get("SIDECAR_OPS_TEST_HOLD"):
            with _lock:
                _reads.append(relpath)
                count = len(_reads)
            if count == int(os.environ.get("SIDECAR_OPS_TEST_HOLD_AT", "1")):
                open(os.path.join(folder, "held"), "w").write(relpath)
                wait_for(lambda: os.path.exists(os.path.join(folder, "release")))
        return _real_read_base(job, relpath)

    merge.read_base = read_base
