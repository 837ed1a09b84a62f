"""`sidecar-ops verify`: a good output passes; each planted defect fails with the shard and the check named;
statistics match numbers computed independently; --json validates against the documented schema; the flow
publishes its two artifacts to a real Prefect API; one run on S3 (moto server)."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import jsonschema
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import DEMO_PIPELINE, make_dataset, relpaths
from tasks.kernel import PROVENANCE_KEY, Job, merge_shard
from tasks.scorestats import BINS, StatSpec, column_partial
from tasks.verification import (BASE, MERGED, PROVENANCE, ROWS, SCHEMA, SHARD_SET, STRAYS, choose_sample,
                          verify)
from tasks.verification.registry import report_order

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REPO = Path(__file__).resolve().parents[1]
SCHEMA_DOC = REPO / "docs" / "verify-report.schema.json"
SHARDS, ROWS_PER_SHARD = 4, 300
DEMO_DATASET = "datasets/demo_filters_dqm_ernie_image_aes.yaml"


def write_config(cfg: Path, root: str) -> Path:
    """The demo dataset + pipeline YAMLs with every demo-data/ prefix moved under ROOT."""
    for rel in (DEMO_DATASET, DEMO_PIPELINE):
        target = cfg / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((REPO / rel).read_text().replace("demo-data/", root))
    return cfg / DEMO_PIPELINE


def build_merged(root: str, cfg: Path) -> tuple[Path, str]:
    """Demo sidecars under ROOT, merged shard by shard with the kernel into ROOT/out/."""
    root = storage.normalize_prefix(root)
    make_dataset(root, shards=SHARDS, rows=ROWS_PER_SHARD)
    pipeline = write_config(cfg, root)
    job = Job(load_pipeline(pipeline), root + "out/")
    for rel in relpaths(SHARDS):
        merge_shard(job, rel)
    return pipeline, job.output_prefix


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    base = tmp_path_factory.mktemp("verify")
    pipeline, out = build_merged(str(base / "data"), base / "cfg")
    return pipeline, out


@pytest.fixture
def merged(pristine, tmp_path):
    """A private copy of the merged output; the inputs are shared and never touched."""
    pipeline, out = pristine
    copy = str(tmp_path / "out") + "/"
    shutil.copytree(out, copy)
    return pipeline, copy


def run_verify(pipeline, out, **kw):
    return verify(Job(load_pipeline(pipeline), storage.normalize_prefix(out)), **kw)


def check_names(pipeline) -> list[str]:
    """The checks a report on this pipeline holds, in order, as the registry lists them."""
    pipe = load_pipeline(pipeline)
    return [name for name, _, _ in report_order(pipe.operations, pipe.dataset)]


def failing(report) -> dict[str, list]:
    return {c.name: c.failures for c in report.checks if not c.passed}


def rewrite(out: str, rel: str, change, **write_kw) -> None:
    """Rewrite an output shard through `change(table) -> table`, keeping its footer metadata (provenance)."""
    table = pq.read_table(out + rel)
    table = change(table).replace_schema_metadata(table.schema.metadata)
    pq.write_table(table, out + rel, **write_kw)


def set_column(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


# ---------------------------------------------------------------- pass, and each planted defect

def test_good_output_passes(merged):
    pipeline, out = merged
    report = run_verify(pipeline, out)
    assert report.ok, failing(report)
    assert report.sampled == sorted(relpaths(SHARDS))  # default 50 samples > 4 shards: all of them
    assert [c.name for c in report.checks] == check_names(pipeline)
    assert {c.name: c.checked for c in report.checks}[BASE] == SHARDS


def test_missing_output_shard(merged):
    pipeline, out = merged
    rel = relpaths(SHARDS)[1]
    Path(out + rel).unlink()
    report = run_verify(pipeline, out)
    assert set(failing(report)) == {SHARD_SET}
    assert [(f.path, f.detail) for f in failing(report)[SHARD_SET]] == [(rel, "output shard missing")]
    assert rel not in report.sampled


def test_stray_objects(merged):
    pipeline, out = merged
    Path(out + "_SUCCESS").write_text("")
    Path(out + "2023/.sidecar-ops-tmp-0123abcd").write_bytes(b"half a shard")
    shutil.copy(out + relpaths(SHARDS)[0], out + "2023/part-99999.parquet")  # a shard the base does not have
    report = run_verify(pipeline, out)
    assert set(failing(report)) == {STRAYS, SHARD_SET}
    strays = {f.path: f.detail for f in failing(report)[STRAYS]}
    assert set(strays) == {"_SUCCESS", "2023/.sidecar-ops-tmp-0123abcd"}
    assert "temporary file" in strays["2023/.sidecar-ops-tmp-0123abcd"]
    assert [f.path for f in failing(report)[SHARD_SET]] == ["2023/part-99999.parquet"]


def test_one_row_dropped(merged):
    pipeline, out = merged
    rel = relpaths(SHARDS)[2]
    rewrite(out, rel, lambda t: t.slice(1))
    report = run_verify(pipeline, out)
    assert set(failing(report)) == {ROWS, BASE}
    [row_failure] = failing(report)[ROWS]
    assert row_failure.path == rel
    assert f"{ROWS_PER_SHARD - 1} rows, base has {ROWS_PER_SHARD}" in row_failure.detail
    assert [f.path for f in failing(report)[BASE]] == [rel]


def duplicated(row: int):
    """The table with row `row` written twice (one row more than the base, every key still there)."""
    return lambda t: pa.concat_tables([t.slice(0, row + 1), t.slice(row)])


@pytest.mark.parametrize("row", [0, ROWS_PER_SHARD - 1], ids=["first-row", "last-row"])
@pytest.mark.parametrize("samples", [50, 0], ids=["sampled", "footers-only"])
def test_one_row_duplicated(merged, row, samples):
    """More rows than the base fails the row counts as fewer does, from the footers alone (no shard sampled)."""
    pipeline, out = merged
    rel = relpaths(SHARDS)[1]
    rewrite(out, rel, duplicated(row))
    report = run_verify(pipeline, out, samples=samples)
    assert set(failing(report)) == ({ROWS, BASE} if samples else {ROWS})
    assert [(f.path, f.detail) for f in failing(report)[ROWS]] == [
        (rel, f"output has {ROWS_PER_SHARD + 1} rows, base has {ROWS_PER_SHARD}")]
    if samples:
        assert [f.path for f in failing(report)[BASE]] == [rel]


def test_base_column_altered(merged):
    pipeline, out = merged
    rel = relpaths(SHARDS)[0]

    def alter(t):
        width = t["width"].to_pylist()
        width[7] += 1
        return set_column(t, "width", pa.array(width, pa.int32()))

    rewrite(out, rel, alter)
    report = run_verify(pipeline, out)
    assert set(failing(report)) == {BASE}
    [failure] = failing(report)[BASE]
    assert failure.path == rel
    assert "column 'width': 1 of 300 rows differ, first at row 7" in failure.detail


def test_merged_column_shuffled(merged):
    pipeline, out = merged
    rel = relpaths(SHARDS)[3]
    order = pa.array(list(range(ROWS_PER_SHARD))[::-1])
    rewrite(out, rel, lambda t: set_column(t, "dqm_d1_v6_1", pc.take(t["dqm_d1_v6_1"], order)))
    report = run_verify(pipeline, out)
    assert set(failing(report)) == {MERGED}
    [failure] = failing(report)[MERGED]
    assert failure.path == rel
    assert "operations[0]: column 'dqm_d1_v6_1'" in failure.detail and "first at row 0" in failure.detail


def test_stale_fingerprint(merged):
    pipeline, out = merged
    rel = relpaths(SHARDS)[1]
    table = pq.read_table(out + rel)
    meta = dict(table.schema.metadata)
    prov = json.loads(meta[PROVENANCE_KEY])
    prov["fingerprint"] = "0123456789abcdef"
    meta[PROVENANCE_KEY] = json.dumps(prov).encode()
    pq.write_table(table.replace_schema_metadata(meta), out + rel)
    report = run_verify(pipeline, out)
    assert set(failing(report)) == {PROVENANCE}
    [failure] = failing(report)[PROVENANCE]
    assert failure.path == rel and "stale" in failure.detail and "0123456789abcdef" in failure.detail


def test_extension_with_wrong_type(merged):
    pipeline, out = merged
    rel = relpaths(SHARDS)[2]

    def mistype(t):
        aes = t["ernie_image_aes"].combine_chunks()
        score = pc.cast(aes.field("score"), pa.string())
        wrong = pa.StructArray.from_arrays([aes.field("raw_score"), score, aes.field("error")],
                                           names=["raw_score", "score", "error"])
        return set_column(t, "ernie_image_aes", wrong)

    rewrite(out, rel, mistype)
    report = run_verify(pipeline, out)
    assert set(failing(report)) == {SCHEMA, MERGED}
    [failure] = failing(report)[SCHEMA]
    assert failure.path == rel
    assert "column 'ernie_image_aes': field 'score' must be floating, found string" in failure.detail


def test_sample_is_seeded_sorted_and_bounded():
    shards = [f"s/{i:03d}.parquet" for i in range(40)]
    a, b, c = choose_sample(shards, 5, 1), choose_sample(shards, 5, 1), choose_sample(shards, 5, 2)
    assert a == b == sorted(a) and len(set(a)) == 5 and set(a) <= set(shards)
    assert a != c
    assert choose_sample(shards, 50, 3) == shards


def test_deep_checks_cover_only_the_sample(merged):
    pipeline, out = merged
    report = run_verify(pipeline, out, samples=2, seed=7)
    assert report.sampled == choose_sample(relpaths(SHARDS), 2, 7)
    assert report.stats_shards == 2
    assert all(s["shards"] <= 2 for s in report.statistics)


# ---------------------------------------------------------------- statistics, computed independently

def expected_stats(out: str, shards: list[str], column: str, fields: tuple[str, ...]) -> dict:
    rows = []
    for rel in shards:
        rows += pq.read_table(out + rel, columns=[column])[column].to_pylist()
    get = lambda row, name: None if row is None else row.get(name)  # noqa: E731
    want = {"rows": len(rows), "errors": sum(1 for r in rows if get(r, "error")),
            "null_raw_score": (sum(1 for r in rows if get(r, "raw_score") is None)
                               if "raw_score" in fields else None), "fields": {}}
    for name in fields:
        values = [get(r, name) for r in rows]
        values = [v for v in values if v is not None and not math.isnan(v)]
        lo, hi = min(values), max(values)
        width = (hi - lo) / BINS
        counts = [0] * BINS
        for v in values:
            counts[min(int((v - lo) / width), BINS - 1)] += 1
        want["fields"][name] = {"count": len(values), "min": lo, "max": hi, "mean": sum(values) / len(values),
                                "counts": counts}
    return want


def assert_stats(report, out: str, shards: list[str]) -> None:
    by_column = {s["column"]: s for s in report.to_dict()["statistics"]}
    expected_columns = {"dqm_d1_v6_1": ("raw_score",), "ernie_image_aes": ("raw_score", "score"),
                        "filter_clarity": ("score",), "watermark": ("score",)}
    for column, fields in expected_columns.items():
        have = [rel for rel in shards if column in pq.read_schema(out + rel).names]
        want, got = expected_stats(out, have, column, fields), by_column[column]
        assert (got["rows"], got["errors"], got["null_raw_score"]) == (want["rows"], want["errors"],
                                                                      want["null_raw_score"]), column
        assert set(got["fields"]) == set(fields)
        for name in fields:
            g, w = got["fields"][name], want["fields"][name]
            assert (g["count"], g["min"], g["max"]) == (w["count"], w["min"], w["max"]), (column, name)
            assert g["mean"] == pytest.approx(w["mean"], rel=1e-9)
            assert g["histogram"]["counts"] == w["counts"], (column, name)
            assert g["histogram"]["edges"][0] == w["min"] and g["histogram"]["edges"][-1] == w["max"]
    assert by_column["dqm_d1_v6_1"]["errors"] > 0 and by_column["dqm_d1_v6_1"]["null_raw_score"] > 0


def test_statistics_match_an_independent_count(merged):
    pipeline, out = merged
    report = run_verify(pipeline, out, samples=2, seed=3, all_shards=True)
    assert report.ok and report.stats_scope == "all" and report.stats_shards == SHARDS
    assert_stats(report, out, relpaths(SHARDS))
    sampled = run_verify(pipeline, out, samples=2, seed=3)
    assert sampled.stats_shards == 2
    assert_stats(sampled, out, sampled.sampled)


def test_statistics_without_footer_statistics(merged):
    """A shard written without column statistics: the histogram range comes from a second, exact pass."""
    pipeline, out = merged
    rewrite(out, relpaths(SHARDS)[0], lambda t: t, write_statistics=False)
    report = run_verify(pipeline, out)
    assert report.ok, failing(report)
    assert_stats(report, out, relpaths(SHARDS))


def test_null_struct_rows_empty_errors_and_nan():
    struct = pa.StructArray.from_arrays(
        [pa.array([1.0, None, float("nan"), 3.0, 5.0]), pa.array(["", None, "boom", None, "x"])],
        names=["raw_score", "error"], mask=pa.array([False, False, False, False, True]))
    part = column_partial(pa.table({"c": struct}), StatSpec("c", ("raw_score",), True), {"c.raw_score": (1.0, 3.0)})
    # row 1: all children null; row 2: NaN; row 4: the struct row itself is null (its children are ignored)
    assert (part.rows, part.errors, part.null_raw_score) == (5, 1, 3)
    field = part.fields["raw_score"]
    assert (field.count, field.min, field.max, field.total) == (2, 1.0, 3.0, 4.0)
    assert field.hist == [1] + [0] * 8 + [1]


# ---------------------------------------------------------------- CLI, JSON, flow artifacts, S3

def validate_json(path: Path) -> dict:
    data = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_DOC.read_text()))
    jsonschema.validate(data, json.loads(SCHEMA_DOC.read_text()), cls=jsonschema.Draft202012Validator)
    return data


def test_cli_pass_prints_table_and_valid_json(merged, cli, prefect_api, tmp_path):
    pipeline, out = merged
    code, stdout, stderr = cli("verify", pipeline, "--output-prefix", out, "--json", tmp_path / "r.json")
    assert code == 0, stdout + stderr
    names = check_names(pipeline)
    width = max(map(len, names))
    for line in (*(f"{name:<{width}}  PASS" for name in names), f"verify: PASS (all {len(names)} checks)"):
        assert line in stdout
    assert "dqm_d1_v6_1" in stdout and "score statistics over 4 sampled shards" in stdout
    data = validate_json(tmp_path / "r.json")
    assert data["ok"] is True and data["sampled"] == sorted(relpaths(SHARDS))


def test_cli_failure_names_shard_and_check(merged, cli, prefect_api, tmp_path):
    pipeline, out = merged
    rel = relpaths(SHARDS)[1]
    Path(out + rel).unlink()
    Path(out + "_SUCCESS").write_text("")
    code, stdout, stderr = cli("verify", pipeline, "--output-prefix", out, "--json", tmp_path / "r.json")
    assert code == 1
    assert "output shard set        FAIL" in stdout and f"    {rel}: output shard missing" in stdout
    assert "stray objects           FAIL" in stdout and "    _SUCCESS:" in stdout
    assert f"verify: FAIL (2 of {len(check_names(pipeline))} checks failed: {SHARD_SET}, {STRAYS})" in stdout
    assert "Traceback" not in stderr
    data = validate_json(tmp_path / "r.json")
    assert data["ok"] is False
    assert [f["path"] for c in data["checks"] if c["name"] == SHARD_SET for f in c["failures"]] == [rel]


def test_cli_configuration_errors(cli, prefect_api, pristine, tmp_path):
    pipeline, out = pristine
    code, _, stderr = cli("verify", pipeline)
    assert code == 2 and stderr.strip() == "error: verify needs --output-prefix: the all-in-one sidecar to check"
    code, _, stderr = cli("verify", tmp_path / "nope.yaml", "--output-prefix", out)
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    code, _, stderr = cli("verify", pipeline, "--output-prefix", out, "--samples", "-1")
    assert code == 2 and "--samples" in stderr


def read_artifacts(flow_run_id) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {a.key: a for a in found if a.key}  # a failed run also has an unkeyed result artifact


def test_flow_publishes_artifacts(merged, prefect_api):
    from flows.verify import verify_flow

    pipeline, out = merged
    rel = relpaths(SHARDS)[0]
    rewrite(out, rel, lambda t: t.slice(1))
    state = verify_flow(pipeline=str(pipeline), output_prefix=out, return_state=True)
    assert state.is_failed()
    artifacts = read_artifacts(state.state_details.flow_run_id)
    assert set(artifacts) == {"verify-checks", "verify-statistics"}
    checks = artifacts["verify-checks"]
    assert checks.type == "table"
    rows = json.loads(checks.data) if isinstance(checks.data, str) else checks.data
    by_check = {r["check"]: r for r in rows}
    assert by_check[ROWS]["result"] == "FAIL" and rel in by_check[ROWS]["failing"]
    assert by_check[SHARD_SET]["result"] == "PASS"
    stats = artifacts["verify-statistics"]
    assert stats.type == "markdown"
    assert "**FAIL**: row counts, base columns" in stats.data
    assert "### ernie_image_aes.score" in stats.data and "| dqm_d1_v6_1 | dqm_score_v1 |" in stats.data


def test_s3_pass_then_stray_fails(s3_root, tmp_path, cli, prefect_api):
    pipeline, out = build_merged(s3_root, tmp_path / "cfg")
    code, stdout, stderr = cli("verify", pipeline, "--output-prefix", out, "--samples", "2",
                               "--json", s3_root + "reports/verify.json")
    assert code == 0, stdout + stderr
    fs, path = storage.filesystem(s3_root + "reports/verify.json")
    assert json.loads(fs.cat_file(path))["ok"] is True
    fs.pipe_file(storage.filesystem(out + "2024/.sidecar-ops-tmp-feed")[1], b"partial")
    report = run_verify(pipeline, out, samples=1)
    assert set(failing(report)) == {STRAYS}
    assert [f.path for f in failing(report)[STRAYS]] == ["2024/.sidecar-ops-tmp-feed"]
