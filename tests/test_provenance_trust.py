"""What a resume may trust in an existing output's provenance (issue 26, cases 2-4).

- an output cut short by a row, rewritten with the same `sidecar_ops` metadata, is not complete: recomputed;
- provenance that is valid JSON but not an object, or has a field of the wrong type, is not ours: foreign,
  refused (exit 2, naming the shard) or replaced under --overwrite; never an unexpected error;
- a `run_started` without a zone, with --overwrite-before: not trusted (recomputed), never a TypeError;
- --overwrite-before honours the zone it names (10:00-05:00 is 15:00Z: a run of 12:00Z is before it).
"""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
from core_fixtures import build, get_bytes, identities, read_meta, read_table, write_table
from test_flow_local import REL, SHARDS, assert_output_equals_inputs, summary_counts

import flows.merge
from tasks import kernel
from tasks.kernel import PROVENANCE_KEY, read_provenance
from tasks.verification import PROVENANCE

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path


def rewrite(uri: str, change_table=lambda t: t, change_prov=lambda p: p) -> None:
    """Rewrite an output with its table and its provenance changed (the rest of its metadata kept)."""
    table = read_table(uri)
    meta = dict(table.schema.metadata)
    meta[PROVENANCE_KEY] = json.dumps(change_prov(json.loads(meta[PROVENANCE_KEY]))).encode()
    write_table(change_table(table).replace_schema_metadata(meta), uri)


@pytest.fixture
def merged(tmp_path, root, run):
    setup = build(tmp_path, root, shards=SHARDS)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    return setup


def test_an_output_cut_short_with_its_provenance_kept_is_recomputed(merged, run, cli):
    uri = merged.output + REL[1]
    before = read_provenance(read_meta(uri))
    rewrite(uri, change_table=lambda t: t.slice(0, t.num_rows - 1))
    assert read_provenance(read_meta(uri)) == before and read_meta(uri).num_rows == before["rows"] - 1

    code, out, err = cli("run", merged.pipeline, "--output-prefix", merged.output, "--dry-run")
    assert code == 0, out + err
    assert f"outputs complete:       {SHARDS - 1}\n" in out, out
    assert f"{REL[1]} ({before['rows'] - 1} rows, {before['rows']} recorded)" in out, out
    code, out, err = run(merged.pipeline, "--output-prefix", merged.output)
    assert code == 0 and summary_counts(out) == (SHARDS, 1, SHARDS - 1, 0), out + err
    assert read_meta(uri).num_rows == before["rows"]
    assert_output_equals_inputs(merged)


def test_an_output_with_a_row_more_than_its_provenance_records_is_recomputed(merged, run, cli):
    """The other side of a cut-short output: its last row written twice, its provenance kept."""
    uri = merged.output + REL[1]
    before = read_provenance(read_meta(uri))
    rewrite(uri, change_table=lambda t: pa.concat_tables([t, t.slice(t.num_rows - 1)]))
    assert read_provenance(read_meta(uri)) == before and read_meta(uri).num_rows == before["rows"] + 1

    code, out, err = cli("run", merged.pipeline, "--output-prefix", merged.output, "--dry-run")
    assert code == 0, out + err
    assert f"outputs complete:       {SHARDS - 1}\n" in out, out
    assert f"{REL[1]} ({before['rows'] + 1} rows, {before['rows']} recorded)" in out, out
    code, out, err = run(merged.pipeline, "--output-prefix", merged.output)
    assert code == 0 and summary_counts(out) == (SHARDS, 1, SHARDS - 1, 0), out + err
    assert read_meta(uri).num_rows == before["rows"]
    assert_output_equals_inputs(merged)


MALFORMED = {
    "a-list": lambda p: [1],
    "a-string": lambda p: "sidecar",
    "null": lambda p: None,
    "fingerprint-missing": lambda p: {k: v for k, v in p.items() if k != "fingerprint"},
    "fingerprint-a-list": lambda p: {**p, "fingerprint": [p["fingerprint"]]},
    "inputs-a-list": lambda p: {**p, "inputs": [1], "input_key": "x"},
    "operations-a-string": lambda p: {**p, "inputs": {**p["inputs"], "operations": "x"}, "input_key": "x"},
    "rows-a-string": lambda p: {**p, "rows": str(p["rows"])},
    "input-key-a-number": lambda p: {**p, "input_key": 7},
    "run-started-a-number": lambda p: {**p, "run_started": 7},
    "run-started-not-a-time": lambda p: {**p, "run_started": "yesterday"},
}


@pytest.mark.parametrize("change", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_provenance_is_foreign_refused_then_replaced_by_overwrite(tmp_path, run, change):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    rewrite(setup.output + REL[2], change_prov=change)
    before = get_bytes(setup.output + REL[2])

    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    last = err.strip().splitlines()[-1]
    assert code == 2, out + err
    assert last.startswith("error: 1 existing output shard(s) under ") and f"e.g. {REL[2]};" in last, err
    assert "use --overwrite to replace them" in last and "Traceback" not in err, err
    assert get_bytes(setup.output + REL[2]) == before, "a refused run writes nothing"

    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite")
    assert code == 0 and summary_counts(out) == (SHARDS, SHARDS, 0, 0), out + err
    assert_output_equals_inputs(setup)


def test_a_run_started_without_a_zone_is_not_trusted_by_overwrite_before(tmp_path, run):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    for rel in REL[:2]:
        rewrite(setup.output + rel, change_prov=lambda p: {**p, "run_started": "2999-01-01T00:00:00"})
    before = identities(setup.output)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite-before",
                         "2000-01-01T00:00:00Z")
    assert code == 0, out + err
    assert summary_counts(out) == (SHARDS, 2, SHARDS - 2, 0), out + err
    after = identities(setup.output)
    assert [rel for rel in REL if after[rel] != before[rel]] == REL[:2], "a start without a zone is not trusted"


def test_overwrite_before_honours_the_zone_it_names(tmp_path, run, monkeypatch):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    with monkeypatch.context() as m:
        m.setattr(flows.merge, "now_utc", lambda: "2026-01-01T12:00:00.000000+00:00")
        assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    assert read_provenance(read_meta(setup.output + REL[0]))["run_started"] == "2026-01-01T12:00:00.000000+00:00"
    before = identities(setup.output)

    # 10:00 at -05:00 is 15:00Z: the run of 12:00Z started before it, so every output is recomputed.
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite-before",
                         "2026-01-01T10:00:00-05:00")
    assert code == 0 and summary_counts(out) == (SHARDS, SHARDS, 0, 0), out + err
    assert all(identities(setup.output)[rel] != before[rel] for rel in REL)
    # and 06:00 at -05:00 is 11:00Z: the outputs of this run (started now) and any since are kept
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite-before",
                         "2026-01-01T06:00:00-05:00")
    assert code == 0 and summary_counts(out) == (SHARDS, 0, SHARDS, 0), out + err


def test_merge_module_has_the_clock_the_tests_patch():
    assert flows.merge.now_utc is kernel.now_utc  # the run's start comes from here (Job.started)


@pytest.mark.parametrize("change", [MALFORMED["a-list"], MALFORMED["operations-a-string"]],
                         ids=["a-list", "operations-a-string"])
def test_verify_fails_an_output_with_malformed_provenance_without_crashing(tmp_path, run, cli, change):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    rewrite(setup.output + REL[2], change_prov=change)
    report_path = tmp_path / "report.json"
    code, out, err = cli("verify", setup.pipeline, "--output-prefix", setup.output, "--samples", "0",
                         "--json", report_path)
    assert code == 1 and "unexpected" not in err, out + err
    report = json.loads(report_path.read_text())
    failed = {c["name"]: c["failures"] for c in report["checks"] if not c["passed"]}
    assert failed == {PROVENANCE: [{"path": REL[2], "detail": "no sidecar_ops provenance in the footer"}]}, failed
