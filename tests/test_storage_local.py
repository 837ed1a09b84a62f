"""Local disk (tasks/storage/local.py): what the sweep of killed writers' leftovers removes and what it keeps.

A temp file is named TEMP_MARK + host + "-" + pid + "-" + random. The sweep removes one whose writer, on this
host, no longer runs, or one older than the threshold; never a shard (*.parquet), never another file, never a
young temp file it cannot attribute to a dead writer of this host. Host names often have dashes (EC2's
ip-10-0-0-7), so the name is read from the right. The clock is fixed, so the threshold's edge is exact.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import threading

import pyarrow as pa
import pytest

from tasks import storage
from tasks.storage import local as local_backend

NOW = 1_700_000_000.0
THRESHOLD = 3600
NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max: never a running process


@pytest.fixture(autouse=True)
def no_hangup():
    """Asking whether a writer runs (signal 0) sends it nothing: were this process sent SIGHUP while it is asked
    about, the test fails (instead of the process ending)."""
    received = []
    previous = signal.signal(signal.SIGHUP, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert received == [], "a process asked about was sent SIGHUP"


def temp(host: str, pid: int | str, tail: str = "-0f3a9c") -> str:
    return f"{storage.TEMP_MARK}{host}-{pid}{tail}"


def leftovers(host: str) -> dict[str, tuple[float, bool]]:
    """name -> (age in seconds, removed by the sweep?)."""
    me = os.getpid()
    return {
        temp(host, NO_SUCH_PID): (0, True),                  # this host, its writer is gone
        temp(host, me): (0, False),                          # this host, its writer runs (this process)
        temp(host, me, "-0f3a9d"): (THRESHOLD + 1, True),    # ... but older than the threshold
        temp(host, me, "-0f3a9e"): (THRESHOLD, False),       # exactly at the threshold: not older
        temp("other-host", NO_SUCH_PID): (0, False),         # another host's: its writer cannot be checked
        temp("other-host", me): (THRESHOLD + 1, True),       # ... unless it is old
        temp(host, "x7"): (0, False),                        # not a pid
        temp(host, NO_SUCH_PID, ""): (0, False),             # not our naming (no random part)
        temp(host, NO_SUCH_PID, "-0f3a9f.parquet"): (THRESHOLD + 1, False),  # never a *.parquet
        "part-0.parquet": (THRESHOLD + 1, False),
        "report.json": (THRESHOLD + 1, False),
    }


@pytest.mark.parametrize("host", ["vm", "ip-10-0-0-7"])
def test_the_sweep_removes_a_dead_or_old_writers_temp_files_only(tmp_path, monkeypatch, host):
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    monkeypatch.setattr(local_backend.time, "time", lambda: NOW)
    folder = tmp_path / "out" / "a" / "b"  # the sweep walks every folder under the prefix
    folder.mkdir(parents=True)
    files = leftovers(host)
    for name, (age, _) in files.items():
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (NOW - age, NOW - age))
    removed = storage.sweep_stale(str(tmp_path / "out") + "/", older_than_seconds=THRESHOLD)
    kept = sorted(name for name, (_, gone) in files.items() if not gone)
    assert sorted(os.listdir(folder)) == kept
    assert removed == len(files) - len(kept) == 3


@pytest.mark.parametrize("path, prefix", [("/", "/"), ("/data/X", "/data/X/"), ("/data/x//", "/data/x/")])
def test_a_local_prefix_is_its_absolute_path_and_one_slash(path, prefix):
    assert storage.normalize_prefix(path) == prefix


def test_a_local_write_outside_its_normal_path_is_refused_in_one_line(tmp_path):
    uri = str(tmp_path) + "/out//x.parquet"
    with pytest.raises(ValueError) as refused:
        storage.write_atomic(pa.table({"k": [1]}), uri)
    assert str(refused.value) == (f"refusing to write {uri!r}: the path has '.'/'..' segments and could land "
                                  "outside the output prefix")


def test_the_listing_walks_every_folder_under_the_prefix(tmp_path, monkeypatch):
    """Relpaths, sizes and identities (size + st_mtime_ns) of every file under the prefix, however deep. The
    working directory is an empty folder: a walk that strayed there would list nothing, and stop."""
    prefix = tmp_path / "out"
    files = {"a.parquet": b"xy", "b/c.parquet": b"xyz", "b/d/e/f.parquet": b"", "b/notes.txt": b"n"}
    for rel, data in files.items():
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_bytes(data)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    listed = local_backend.LocalBackend().listing(str(prefix) + "/")
    assert sorted(listed) == sorted((rel, len(data), local_backend.local_identity(os.stat(prefix / rel)))
                                    for rel, data in files.items())


@contextlib.contextmanager
def signals_refused():
    """Signals to init (pid 1) are refused for the block, as to any process of another user: under root, the
    real and effective uid are nobody's meanwhile (root, the saved uid, takes them back)."""
    if os.geteuid() != 0:
        yield
        return
    os.setresuid(65534, 65534, 0)
    try:
        yield
    finally:
        os.setresuid(0, 0, 0)


def test_a_running_process_of_another_user_is_not_a_dead_writer(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    with signals_refused():
        try:
            os.kill(1, 0)
        except PermissionError:
            dead = local_backend.writer_dead(temp("vm", 1))
        else:
            dead = None
    if dead is None:
        pytest.skip("init (pid 1) runs as this user here: no process of another user to ask about")
    assert dead is False


def test_a_local_report_replaces_a_regular_file_whole_and_writes_through_anything_else(tmp_path, monkeypatch):
    """write_text to a regular file (or a new one) writes a temp file renamed over it: the old report's inode is
    gone, never truncated in place, and no temp file stays, also when relative; a symlink keeps pointing at
    its target, which gets the text; a FIFO (as /dev/stdout may be) is written into, not replaced."""
    report = tmp_path / "report.json"
    report.write_text("old")
    before = report.stat().st_ino
    storage.write_text(str(report), "new report\n")
    assert report.read_text() == "new report\n" and report.stat().st_ino != before
    monkeypatch.chdir(tmp_path)
    storage.write_text("relative.json", "relative\n")
    assert (tmp_path / "relative.json").read_text() == "relative\n"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(storage.TEMP_MARK)]
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    storage.write_text(str(link), "through the link\n")
    assert link.is_symlink() and target.read_text() == "through the link\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    storage.write_text(str(fifo), "into the pipe\n")
    reader.join(30)
    assert got == ["into the pipe\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
