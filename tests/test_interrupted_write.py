"""A local write interrupted by Ctrl-C (KeyboardInterrupt) or SystemExit leaves no temp file beside its shard,
and the interruption reaches the caller as itself (never wrapped as a shard error). The interruption is
deterministic: the writer's callback, or the window iterator, raises it at a chosen point.
"""
from __future__ import annotations

import os

import pyarrow as pa
import pytest
from core_fixtures import build

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, merge_shard
from tasks.storage import local as local_backend

REL = relpaths(3)
INTERRUPTIONS = [KeyboardInterrupt, SystemExit]


def temp_files(folder: str) -> list[str]:
    return [name for _, _, files in os.walk(folder) for name in files if storage.TEMP_MARK in name]


@pytest.mark.parametrize("interruption", INTERRUPTIONS, ids=lambda e: e.__name__)
def test_a_write_stream_interrupted_half_way_leaves_no_temp_file(tmp_path, interruption):
    target = str(tmp_path / "out" / "a.parquet")

    def half_then_interrupted(sink) -> None:
        sink.write(b"PAR1" + b"x" * 1000)
        raise interruption()

    with pytest.raises(interruption):
        storage.write_stream(half_then_interrupted, target)
    assert temp_files(str(tmp_path)) == []
    assert not os.path.exists(target)


@pytest.mark.parametrize("interruption", INTERRUPTIONS, ids=lambda e: e.__name__)
def test_write_windows_interrupted_between_windows_leaves_no_temp_file(tmp_path, interruption):
    target = str(tmp_path / "out" / "a.parquet")

    def windows():
        yield pa.table({"id": list(range(100))})
        raise interruption()

    with pytest.raises(interruption):
        storage.write_windows(windows(), target)
    assert temp_files(str(tmp_path)) == []
    assert not os.path.exists(target)


@pytest.mark.parametrize("interruption", INTERRUPTIONS, ids=lambda e: e.__name__)
def test_a_shard_merge_interrupted_while_writing_leaves_no_temp_file(tmp_path, monkeypatch, interruption):
    """Through the kernel: Ctrl-C arrives once the shard's bytes are in the temp file, before the rename."""
    setup = build(tmp_path, str(tmp_path / "data") + "/")
    real, seen = local_backend.LocalBackend.write_parquet, []

    def written_then_interrupted(self, write, uri, keep=True):
        def whole_then_interrupt(sink):
            write(sink)
            seen.append(temp_files(setup.output))  # the temp file is there, with every byte
            raise interruption()

        return real(self, whole_then_interrupt, uri, keep)

    monkeypatch.setattr(local_backend.LocalBackend, "write_parquet", written_then_interrupted)
    with pytest.raises(interruption):
        merge_shard(Job(load_pipeline(setup.pipeline), setup.output), REL[0])
    assert len(seen) == 1 and len(seen[0]) == 1, seen  # the interruption came with a temp file in place
    assert temp_files(setup.output) == []
    assert not os.path.exists(setup.output + REL[0])


def test_a_shard_whose_write_was_abandoned_is_not_retried(tmp_path):
    """A shard that reaches its write after the run abandoned its writes (the grace period is over) fails with
    nothing written, and as a failure no retry would change: Prefect does not retry it (worth_retrying)."""
    from tasks.errors import ShardError
    from tasks.prefect_tasks import worth_retrying

    setup = build(tmp_path, str(tmp_path / "data") + "/")
    with storage.run_writes():
        storage.abandon_writes()
        with pytest.raises(ShardError, match="abandoned") as failed:
            merge_shard(Job(load_pipeline(setup.pipeline), setup.output), REL[0])
    assert failed.value.transient is False

    class Failed:
        def result(self, raise_on_failure=False):
            return failed.value

    assert worth_retrying(None, None, Failed()) is False
    assert temp_files(setup.output) == [] and not os.path.exists(setup.output + REL[0])
