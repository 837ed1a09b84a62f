"""What an existing output's provenance is trusted for, decided directly (the flow tests,
test_provenance_trust.py and test_overwrite_continue.py, show the same end to end): provenance this tool could
have written or the one line saying why not (tasks.kernel.provenance_of), which outputs an overwrite run keeps
(Job.kept_by_overwrite), the times it compares (parse_time, now_utc) and the version an output records
(tool_version)."""
from __future__ import annotations

import json
import re
import tomllib
from datetime import datetime, timedelta, timezone
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks import kernel
from tasks.kernel import (PROVENANCE_KEY, Job, now_utc, overwrite_fields, parse_time, provenance_of, read_provenance,
                         tool_version)

BEFORE = "2026-01-02T03:04:05.000006+00:00"


def overwrite(overwrite_id: str = "run-a", overwrite_before: str = "") -> Job:
    return Job(None, "out/", overwrite=True, overwrite_id=overwrite_id, continues=True,
               overwrite_before=overwrite_before)


@pytest.mark.parametrize("job, prov, kept", [
    (overwrite(), {"overwrite_id": "run-a"}, True),                    # written by this overwrite
    (overwrite(), {"overwrite_id": "run-b"}, False),                   # by another one
    (overwrite(), {}, False),                                          # by no overwrite
    (overwrite(), {"overwrite_id": "run-b", "run_started": BEFORE}, False),  # no --overwrite-before
    (overwrite(overwrite_before=BEFORE), {"overwrite_id": "run-b", "run_started": BEFORE}, True),  # at TIME
    (overwrite(overwrite_before=BEFORE), {"run_started": "2026-01-02T04:04:05+01:00"}, False),  # 6 µs before
    (overwrite(overwrite_before=BEFORE), {"run_started": "2026-01-03T00:00:00"}, False),  # no zone: untrusted
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


def test_now_utc_is_an_iso_time_in_utc_to_the_microsecond():
    text = now_utc()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", text), text
    assert abs(datetime.now(timezone.utc) - parse_time(text)) < timedelta(minutes=5)


def test_tool_version_is_the_installed_packages_else_unknown(monkeypatch):
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert tool_version() == pyproject["project"]["version"]

    def not_installed(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(kernel, "version", not_installed)
    tool_version.cache_clear()  # read once a process
    try:
        assert tool_version() == "0+unknown"
    finally:
        tool_version.cache_clear()


def footer(metadata: dict | None) -> pq.FileMetaData:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"k": [1]}).replace_schema_metadata(metadata), sink)
    return pq.read_metadata(pa.BufferReader(sink.getvalue()))


def with_prov(prov) -> pq.FileMetaData:
    return footer({PROVENANCE_KEY: json.dumps(prov).encode()})


GOOD = {"fingerprint": "f1", "input_key": "k", "inputs": {"base": "b", "operations": ["s", "absent"]},
        "rows": 3, "operations": [{"type": "merge_from_sidecar"}], "merge_semantics": 2, "run_id": "r",
        "overwrite_id": None, "run_started": "2026-01-02T03:04:05+00:00"}
M = "sidecar_ops provenance malformed: "


@pytest.mark.parametrize("meta, why", [
    (footer(None), "no sidecar_ops provenance"),
    (footer({b"other": b"x"}), "no sidecar_ops provenance"),
    (footer({PROVENANCE_KEY: b"{not json"}), "sidecar_ops provenance is not JSON"),
    (with_prov([1]), M + "a JSON list, not an object"),
    (with_prov("sidecar"), M + "a JSON str, not an object"),
    (with_prov(None), M + "a JSON NoneType, not an object"),
    (with_prov({**GOOD, "fingerprint": None}), M + "no fingerprint"),
    (with_prov({"rows": 3}), M + "no fingerprint"),
    (with_prov({**GOOD, "fingerprint": ["f1"]}), M + "fingerprint is a JSON list, not a str"),
    (with_prov({**GOOD, "input_key": 7}), M + "input_key is a JSON int, not a str"),
    (with_prov({**GOOD, "inputs": [1]}), M + "inputs is a JSON list, not a dict"),
    (with_prov({**GOOD, "rows": "3"}), M + "rows is a JSON str, not a int"),
    (with_prov({**GOOD, "rows": True}), M + "rows is a JSON bool, not a int"),
    (with_prov({**GOOD, "operations": {}}), M + "operations is a JSON dict, not a list"),
    (with_prov({**GOOD, "merge_semantics": 2.0}),
     M + "merge_semantics is a JSON float, not a int"),
    (with_prov({**GOOD, "run_id": 1}), M + "run_id is a JSON int, not a str"),
    (with_prov({**GOOD, "run_started": 7}), M + "run_started is a JSON int, not a str"),
    (with_prov({**GOOD, "overwrite_id": False}),
     M + "overwrite_id is a JSON bool, not a str"),
    (with_prov({**GOOD, "inputs": {"base": 5, "operations": []}}),
     M + "inputs is not {base: str, operations: list}"),
    (with_prov({**GOOD, "inputs": {"base": "b", "operations": "s"}}),
     M + "inputs is not {base: str, operations: list}"),
    (with_prov({**GOOD, "operations": [{}, "merge"]}),
     M + "operations holds a record that is not an object"),
    (with_prov({**GOOD, "run_started": "yesterday"}),
     M + "run_started 'yesterday' is not an ISO 8601 time"),
])
def test_provenance_this_tool_could_not_have_written_is_refused_with_why(meta, why):
    assert provenance_of(meta) == (None, why)


@pytest.mark.parametrize("prov", [
    GOOD,
    {"fingerprint": "f1"},  # an older version's: every other field absent
    {**GOOD, "inputs": {}, "operations": [], "run_started": "", "rows": None, "run_id": None},
    {**GOOD, "inputs": {"base": "b"}},
    {**GOOD, "inputs": {"operations": []}},
])
def test_provenance_this_tool_could_have_written_is_read_as_it_is(prov):
    assert provenance_of(with_prov(prov)) == (prov, "")
    assert read_provenance(with_prov(prov)) == prov


def test_read_provenance_is_none_for_provenance_this_tool_could_not_have_written():
    assert read_provenance(footer(None)) is None
    assert read_provenance(with_prov({**GOOD, "rows": "3"})) is None


@pytest.mark.parametrize("args, fields", [
    ((False, "run-b"), {}),
    ((False, "run-b", "run-a", BEFORE), {}),
    ((True, "run-b"), {"overwrite": True, "overwrite_id": "run-b", "continues": False, "overwrite_before": ""}),
    ((True, "run-b", "run-a"), {"overwrite": True, "overwrite_id": "run-a", "continues": True,
                                "overwrite_before": ""}),
    ((True, "run-b", None, BEFORE), {"overwrite": True, "overwrite_id": "run-b", "continues": False,
                                     "overwrite_before": BEFORE}),
])
def test_an_overwrite_is_this_runs_or_the_one_it_continues(args, fields):
    assert overwrite_fields(*args) == fields
