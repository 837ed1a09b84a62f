"""Test hook for child `sidecar-ops` processes (on PYTHONPATH only in tests that ask for it): with
SIDECAR_OPS_TEST_BARRIER=DIR, every base read first waits until SIDECAR_OPS_TEST_PARTIES processes have
reached one (a file per process in DIR), so concurrent runs start their shard work together."""
import os

if os.environ.get("SIDECAR_OPS_TEST_BARRIER"):
    import time

    from tasks import merge

    _real_read_base = merge.read_base

    def read_base(job, relpath):
        folder, parties = os.environ["SIDECAR_OPS_TEST_BARRIER"], int(os.environ["SIDECAR_OPS_TEST_PARTIES"])
        open(os.path.join(folder, f"ready-{os.getpid()}"), "w").close()
        deadline = time.monotonic() + 120
        while len(os.listdir(folder)) < parties and time.monotonic() < deadline:
            time.sleep(0.01)
        return _real_read_base(job, relpath)

    merge.read_base = read_base
