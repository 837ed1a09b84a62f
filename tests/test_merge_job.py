"""Which existing outputs an overwrite run keeps (tasks.merge.Job.kept_by_overwrite) and the times it compares
(parse_time), decided directly: the flow tests (test_overwrite_continue.py) show the same end to end."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tasks.merge import Job, parse_time

BEFORE = "2026-01-02T03:04:05.000006+00:00"


def overwrite(overwrite_id: str = "run-a", overwrite_before: str = "") -> Job:
    return Job(None, "out/", overwrite=True, overwrite_id=overwrite_id, continues=True,
               overwrite_before=overwrite_before)


@pytest.mark.parametrize("job, prov, kept", [
    (overwrite(), {"overwrite_id": "run-a"}, True),                    # written by this overwrite
    (overwrite(), {"overwrite_id": "run-b"}, False),                   # by another one
    (overwrite(), {}, False),                                          # by no overwrite
    (overwrite(), {"overwrite_id": "run-b", "run_started": BEFORE}, False),  # a start, but no --overwrite-before
    (overwrite(overwrite_before=BEFORE), {"overwrite_id": "run-b", "run_started": BEFORE}, True),  # started at TIME
    (overwrite(overwrite_before=BEFORE), {"run_started": "2026-01-02T04:00:00+01:00"}, False),  # 1 s before
    (overwrite(overwrite_before=BEFORE), {"run_started": "2026-01-03T00:00:00"}, False),  # no zone: not trusted
    (overwrite(overwrite_before=BEFORE), {"run_started": None}, False),
    (overwrite(overwrite_before=BEFORE), {}, False),
])
def test_an_overwrite_keeps_only_its_own_outputs_or_those_started_at_or_after_the_time_given(job, prov, kept):
    assert job.kept_by_overwrite(prov) is kept


def test_parse_time_reads_iso_8601_with_its_zone_and_nothing_else():
    assert parse_time(BEFORE) == datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)
    assert parse_time("2026-01-02T04:00:00+01:00").utcoffset() == timedelta(hours=1)
    assert parse_time("2026-01-02T03:04:05").tzinfo is None
    assert [parse_time(text) for text in ("", "yesterday", None, 5)] == [None] * 4
