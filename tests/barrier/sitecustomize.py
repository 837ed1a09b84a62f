"""Test hooks for child `sidecar-ops` processes (on PYTHONPATH only in tests that ask for it).

SIDECAR_OPS_TEST_BARRIER=DIR: every base read (kernel.read_base in the chain, kernel.open_shard in one task a
shard) first waits until SIDECAR_OPS_TEST_PARTIES processes have reached one (a file per process in DIR), so
concurrent runs start their shard work together.

SIDECAR_OPS_TEST_HOLD=DIR: the SIDECAR_OPS_TEST_HOLD_AT-th base read of the process (1-based) creates
DIR/held and waits until DIR/release exists (forever if it never does): the test then knows exactly which
shards are done and which one is in flight when it acts (a signal, a kill). With
SIDECAR_OPS_TEST_HOLD_WRITE_AT=N instead, the N-th output write holds half-way: on local disk once its temp
file is written (before the fsync and the rename), on S3 once the first part of its multipart upload is in
(before the rest and the completion).

SIDECAR_OPS_TEST_HOLD_IN=PHASE instead holds the run's main thread once, at a phase of a run: `startup` (its
first configuration load, before its Prefect server answers), `summary` (publishing the summary artifact, every
shard finished) or `exit` (the last exit handler, the summary printed): a signal sent then lands in that phase.

SIDECAR_OPS_TEST_HOLD_ARMED=1 (for processes started before the test acts, e.g. a Ray cluster's workers): the
first base read in any process, once DIR/armed exists, claims DIR/held (writing "PID RELPATH") and holds;
every other read goes on.
"""
import os

if os.environ.get("SIDECAR_OPS_TEST_BARRIER") or os.environ.get("SIDECAR_OPS_TEST_HOLD"):
    import threading
    import time

    from tasks import kernel

    _lock = threading.Lock()

    def wait_for(condition, deadline=None):
        while not condition() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)

    def announce(folder: str, what: str) -> None:
        """`held` appears with its content (written aside, then renamed): a test never reads it empty."""
        temp = os.path.join(folder, f".held-{os.getpid()}")
        with open(temp, "w") as f:
            f.write(what)
        os.replace(temp, os.path.join(folder, "held"))

    def hold(what: str) -> None:
        folder = os.environ["SIDECAR_OPS_TEST_HOLD"]
        announce(folder, what)
        wait_for(lambda: os.path.exists(os.path.join(folder, "release")))

    def counted(name: str) -> int:
        with _lock:
            _counts[name] = _counts.get(name, 0) + 1
            return _counts[name]

    _counts = {}

    def claim(relpath: str) -> bool:
        folder = os.environ["SIDECAR_OPS_TEST_HOLD"]
        if not os.path.exists(os.path.join(folder, "armed")):
            return False
        try:  # one process wins the claim; it then announces itself
            os.close(os.open(os.path.join(folder, "claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        announce(folder, f"{os.getpid()} {relpath}")
        return True

    def before_base_read(relpath):
        if folder := os.environ.get("SIDECAR_OPS_TEST_BARRIER"):
            parties = int(os.environ["SIDECAR_OPS_TEST_PARTIES"])
            open(os.path.join(folder, f"ready-{os.getpid()}"), "w").close()
            wait_for(lambda: len(os.listdir(folder)) >= parties, time.monotonic() + 120)
        at = os.environ.get("SIDECAR_OPS_TEST_HOLD_AT")
        if at and counted("read") == int(at):
            hold(relpath)
        if os.environ.get("SIDECAR_OPS_TEST_HOLD_ARMED") and claim(relpath):
            wait_for(lambda: os.path.exists(os.path.join(os.environ["SIDECAR_OPS_TEST_HOLD"], "release")))

    _real_read_base, _real_open_shard = kernel.read_base, kernel.open_shard

    def read_base(job, relpath):  # the task-per-operation chain's first step
        before_base_read(relpath)
        return _real_read_base(job, relpath)

    def open_shard(job, relpath, *args, **kwargs):  # a shard in one task (the default layout)
        before_base_read(relpath)
        return _real_open_shard(job, relpath, *args, **kwargs)

    kernel.read_base, kernel.open_shard = read_base, open_shard

    def hold_in(phase: str, real):
        """`real`, the first call of which holds first, if the test asked to hold in `phase`."""
        if os.environ.get("SIDECAR_OPS_TEST_HOLD_IN") != phase:
            return real

        def held(*args, **kwargs):
            if counted(phase) == 1:
                hold(phase)
            return real(*args, **kwargs)
        return held

    if os.environ.get("SIDECAR_OPS_TEST_HOLD_IN") == "startup":
        from flows.runconfig import RunConfig

        RunConfig.load = classmethod(hold_in("startup", RunConfig.load.__func__))
    if os.environ.get("SIDECAR_OPS_TEST_HOLD_IN") == "summary":
        from flows import artifacts  # before flows.merge imports its publish_summary

        artifacts.publish_summary = hold_in("summary", artifacts.publish_summary)
    if os.environ.get("SIDECAR_OPS_TEST_HOLD_IN") == "exit":
        import atexit

        atexit.register(hold_in("exit", lambda: None))  # registered first: runs last

    if os.environ.get("SIDECAR_OPS_TEST_HOLD_WRITE_AT"):
        from tasks.storage.local import LocalBackend
        from tasks.storage.s3 import S3Backend

        write_at = int(os.environ["SIDECAR_OPS_TEST_HOLD_WRITE_AT"])
        _real_replace, _real_s3_filesystem = LocalBackend._replace, S3Backend.filesystem

        def _replace(path, write):
            def write_then_hold(temp):
                write(temp)
                if counted("write") == write_at:
                    hold(f"local temp file of {path}")
            return _real_replace(path, write_then_hold)

        class HeldUploads:
            """The s3fs filesystem, but the first part of the held write's upload holds once it is in."""

            def __init__(self, fs):
                self._fs = fs

            def __getattr__(self, name):
                return getattr(self._fs, name)

            def call_s3(self, method, *args, **kwargs):
                out = self._fs.call_s3(method, *args, **kwargs)
                if method == "create_multipart_upload":
                    self._write = counted("write")
                if method == "upload_part" and kwargs.get("PartNumber") == 1 and self._write == write_at:
                    hold(f"multipart upload of {kwargs.get('Key')}, part 1 in")
                if method == "put_object":
                    counted("write")
                return out

        def s3_filesystem(self, uri):
            fs, path = _real_s3_filesystem(self, uri)
            return HeldUploads(fs), path

        LocalBackend._replace = staticmethod(_replace)
        S3Backend.filesystem = s3_filesystem
