"""A run's writes once it has abandoned them (tasks/storage/inflight.py, `run_writes`): a shard still reading when
the grace period ran out starts its write later, in a thread the run no longer waits for; the write is refused.
"""
from __future__ import annotations

import contextvars
import threading

import pytest
from core_fixtures import objects
from test_s3_uploads import DEADLINE, blobs, leftovers, small_parts  # noqa: F401 (a fixture)

from tasks import storage


@pytest.mark.parametrize("where", ["local", "s3-multipart", "s3-one-put"])
def test_a_write_starting_after_its_run_abandoned_its_writes_never_publishes(tmp_path, request, where):
    """Inside a run's `run_writes()` block, a shard that was still reading when the run abandoned its writes
    (its thread not waited for) starts its write later: the write is refused as it starts (WriteAbandoned), no
    object, no temp file, no upload. Outside the block, and in the next run's block, writes go on as before."""
    moto_endpoint = request.getfixturevalue("moto_endpoint") if where != "local" else None
    root = request.getfixturevalue("s3_root") if moto_endpoint else str(tmp_path / "data") + "/"
    if where == "s3-multipart":
        request.getfixturevalue("small_parts")
    table = blobs("w")
    late = []

    def a_task_that_writes_late() -> None:
        try:
            storage.write_atomic(table, root + "out/a.parquet")
        except storage.WriteAbandoned as exc:
            late.append(exc)

    with storage.run_writes():
        assert storage.abandon_writes() == 0  # nothing was in flight
        task = contextvars.copy_context()  # as Prefect's thread pool runs a task: in the submitter's context
        worker = threading.Thread(target=task.run, args=(a_task_that_writes_late,))
        worker.start()
        worker.join(DEADLINE)
    assert len(late) == 1, "the late write was not refused"
    assert objects(root + "out/") == [] and leftovers(root, moto_endpoint) == []
    storage.write_atomic(table, root + "out/b.parquet")  # no run: not abandoned
    with storage.run_writes():
        storage.write_atomic(table, root + "out/c.parquet")  # the next run's writes go on
    assert objects(root + "out/") == ["b.parquet", "c.parquet"]
    assert leftovers(root, moto_endpoint) == []

