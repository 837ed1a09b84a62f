"""The shard plan (tasks/plan.py) driven directly: the planner's refusals and their one line, what a shard
task's first attempt is told it reads, and the words a stale output is reported with (the CLI shows them; the
flow tests in test_bad_inputs.py and test_resume_inputs.py check them end to end)."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pyarrow as pa
import pytest
from core_fixtures import (
    FILTER_EXTENSIONS,
    build,
    dqm_op,
    put_bytes,
    read_table,
    remove,
    watermark_op,
    write_table,
)
from faultproxy import DENIED, UNSUPPORTED, proxied  # noqa: F401 (a fixture)
from test_streaming import job_for as streaming_job

from tasks import storage
from tasks.config import load_pipeline
from tasks.errors import ConfigError
from tasks.kernel import PROVENANCE_KEY, Job, merge_shard, overwrite_fields
from tasks.ops.rename_columns import RenameColumns
from tasks.plan import (
    changed_inputs,
    inspect_schemas,
    list_or_refuse,
    make_plan,
    output_status,
    refuse_foreign,
    refuse_unmatched,
)

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 2


def job_for(setup) -> Job:
    return Job(load_pipeline(setup.pipeline), setup.output)


def identity(uri: str) -> str:
    """The identity of an input as the store gives it now, or 'absent'."""
    fs, path = storage.filesystem(uri)
    return storage.file_identity(uri) if fs.exists(path) else storage.ABSENT


def test_listed_names_every_input_of_a_shard_with_its_listed_identity(tmp_path, root):
    """What a shard task's first attempt reads without asking the store again: the base and each sibling by
    URI, a sibling the listing did not have as 'absent' (the demo's watermark has a gap)."""
    setup = build(tmp_path, root, shards=SHARDS)
    plan = make_plan(job_for(setup))
    p = setup.prefixes
    absent = 0
    for rel in plan.shards:
        uris = [p["base"] + rel, p["dqm"] + rel, p["aes"] + rel, p["watermark"] + rel]
        expected = {uri: identity(uri) for uri in uris}
        assert plan.listed(rel) == expected
        assert expected[p["base"] + rel] != storage.ABSENT and expected[p["dqm"] + rel] != storage.ABSENT
        absent += expected[p["watermark"] + rel] == storage.ABSENT
    assert absent == 1, "the demo's watermark gap should leave exactly one shard without a sibling"


def test_an_optional_operation_matching_no_base_shard_is_refused_with_its_line(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS, ops=lambda p: [
        dqm_op(p), watermark_op({"watermark": p["watermark"][:-1] + "_typo/"}, required=False)])
    typo = setup.prefixes["watermark"][:-1] + "_typo/"
    with pytest.raises(ConfigError) as info:
        refuse_unmatched(make_plan(job_for(setup)))
    assert str(info.value) == (
        f"operations[1] (merge_from_sidecar from {typo}) has required: false, but its source_prefix "
        f"{typo} does not exist: it would be skipped for all {SHARDS} base shards; check source_prefix for a "
        "typo, or remove the operation")


def test_an_optional_operation_whose_prefix_holds_only_other_shards_is_refused_with_its_line(tmp_path):
    """Its prefix exists but holds none of the base's relpaths: one extra sibling, every base shard missing one.
    An operation reading no sibling has neither."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS, ops=lambda p: [
        dqm_op(p), watermark_op({"watermark": p["watermark"][:-1] + "_other/"}, required=False),
        {"type": "drop_columns", "columns": ["width"]}])
    other = setup.prefixes["watermark"][:-1] + "_other/"
    base = sorted(storage.list_prefix(setup.prefixes["base"]).shards)
    write_table(read_table(setup.prefixes["watermark"] + base[0]), other + "elsewhere/part-9.parquet")
    plan = make_plan(job_for(setup))
    assert (plan.extra_siblings(1), plan.missing_siblings(1)) == (["elsewhere/part-9.parquet"], base)
    assert (plan.extra_siblings(2), plan.missing_siblings(2)) == ([], [])
    with pytest.raises(ConfigError) as info:
        refuse_unmatched(plan)
    assert str(info.value) == (
        f"operations[1] (merge_from_sidecar from {other}) has required: false, but its source_prefix "
        f"{other} holds none of their relative paths: it would be skipped for all {SHARDS} base shards; check "
        "source_prefix for a typo, or remove the operation")


def test_base_keys_that_are_not_plain_relative_paths_are_refused_naming_one(tmp_path, s3_root):
    """S3 keys may hold empty, '.' or '..' segments, which no output path may: the plan refuses the base."""
    setup = build(tmp_path, s3_root, shards=SHARDS)
    base = setup.prefixes["base"]
    put_bytes(base + "2023//part-9.parquet", b"parquet or not")
    with pytest.raises(ConfigError) as info:
        make_plan(job_for(setup))
    assert str(info.value) == (
        f"main_prefix {base} holds 1 object key(s) that are not plain relative paths (an empty, '.' or '..' "
        "segment), e.g. '2023//part-9.parquet'; outputs keep the base's relative paths, so rename or remove these "
        "objects")


def with_provenance(table: pa.Table, prov: dict) -> pa.Table:
    return table.replace_schema_metadata({PROVENANCE_KEY: json.dumps(prov).encode()})


def test_outputs_of_another_pipeline_are_refused_naming_the_first(tmp_path, root):
    setup = build(tmp_path, root, shards=SHARDS)
    job = job_for(setup)
    first, second = sorted(storage.list_prefix(setup.prefixes["base"]).shards)
    base = read_table(setup.prefixes["base"] + first).replace_schema_metadata(None)
    write_table(base, setup.output + first)  # no provenance at all
    write_table(with_provenance(base, {"fingerprint": "0ther"}), setup.output + second)
    plan = make_plan(job)
    assert plan.foreign == [(first, "no sidecar_ops provenance"), (second, "fingerprint 0ther")]
    with pytest.raises(ConfigError) as info:
        refuse_foreign(plan)
    assert str(info.value) == (
        f"2 existing output shard(s) under {setup.output} were written by a different pipeline or carry no "
        f"valid provenance (no sidecar_ops provenance; this pipeline is {job.fingerprint}), e.g. {first}; "
        "use --overwrite to replace them or choose another --output-prefix")


def empty_base(setup, what: str) -> None:
    """Leave the base prefix with no shards: `missing` (nothing there), `junk` (one other object), `empty`
    (an empty folder; locally only: S3 has no folders)."""
    base = setup.prefixes["base"]
    fs, path = storage.filesystem(base)
    fs.rm(path, recursive=True)
    if what == "junk":
        put_bytes(base + "README.txt", b"not a shard")
    elif what == "empty":
        fs.makedirs(path, exist_ok=True)


@pytest.mark.parametrize("what, state", [
    ("missing", "does not exist"),
    ("junk", "holds no non-empty *.parquet shards (1 other objects)"),
])
def test_a_base_without_shards_is_refused_saying_whether_it_exists(tmp_path, root, what, state):
    setup = build(tmp_path, root, shards=SHARDS)
    empty_base(setup, what)
    base = setup.prefixes["base"]
    with pytest.raises(ConfigError) as info:
        make_plan(job_for(setup))
    assert str(info.value) == f"main_prefix {base} {state}; check the dataset's main_prefix"


def test_an_empty_local_base_folder_exists_but_holds_no_shards(tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    empty_base(setup, "empty")
    with pytest.raises(ConfigError) as info:
        make_plan(job_for(setup))
    assert str(info.value) == (f"main_prefix {setup.prefixes['base']} holds no non-empty *.parquet shards; "
                               "check the dataset's main_prefix")


def test_a_base_whose_existence_the_store_will_not_tell_is_not_called_missing(tmp_path, s3_root,
                                                                             proxied):  # noqa: F811
    """Listing the prefix finds nothing, and asking whether it exists is denied (403): the store cannot tell,
    so the line does not claim the prefix is missing. (s3fs's listing sends one HeadObject of the prefix, its
    exists() the next: every HeadObject after the first is denied.)"""
    setup = build(tmp_path, s3_root, shards=SHARDS)
    empty_base(setup, "missing")
    job = job_for(setup)
    heads = itertools.count()
    proxy = proxied(rate=1.0, faults=(DENIED,), applies=lambda op: op == "HeadObject" and next(heads) > 0)
    with pytest.raises(ConfigError) as info:
        make_plan(job)
    assert proxy.faults_injected("HeadObject") > 0
    assert str(info.value) == (f"main_prefix {setup.prefixes['base']} holds no non-empty *.parquet shards; "
                               "check the dataset's main_prefix")


def test_judging_existing_outputs_asks_s3_for_their_footers_only(tmp_path, s3_root, proxied):  # noqa: F811
    """A resumed plan reads each existing output's footer with the size its listing gave: no HEAD of any object,
    only ranged GETs of the outputs."""
    setup = build(tmp_path, s3_root, shards=SHARDS)
    job = job_for(setup)
    for rel in sorted(storage.list_prefix(setup.prefixes["base"]).shards):
        merge_shard(job, rel)
    proxy = proxied()
    plan = make_plan(job_for(setup))
    assert len(plan.complete) == SHARDS
    output_path = "/" + setup.output[len("s3://"):]
    output_reads = [(op, path) for op, path, _, _ in proxy.log if path.startswith(output_path)
                    and path.endswith(".parquet")]
    assert not [entry for entry in proxy.log if entry[0] == "HeadObject"], proxy.log
    assert output_reads and {op for op, _ in output_reads} == {"GetObject"}
    # One listing per prefix (base, three siblings, output); nothing asks whether the output's bucket exists.
    lists = [path for op, path, _, _ in proxy.log if op == "ListObjects"]
    assert len(lists) == 5 and {op for op, *_ in proxy.log} == {"ListObjects", "GetObject"}, proxy.log


def test_the_predicted_schema_and_every_problem_of_the_sampled_shards(tmp_path):
    """dqm (required), the watermark (optional), then a rename of a column of each, over seven shards (in
    listing order): an unreadable base; a missing dqm sibling (the rename then misses its column: a failed
    step explains nothing); a missing watermark sibling (skipped: the rename's column is explained, the shard's
    schema not compared); an unreadable dqm sibling; a base with the image column (never in the output) and
    metadata of its own; a plain one; one whose `width` has another type."""
    ops = lambda p: [dqm_op(p), watermark_op(p, required=False),
                     {"type": "rename_columns", "columns": {"watermark": "wm", "dqm_d1_v6_1": "dqm"}}]
    setup = build(tmp_path, str(tmp_path / "data"), shards=7, rows=4, ops=ops, watermark_gap=False,
                  extensions=FILTER_EXTENSIONS)
    base, dqm = setup.prefixes["base"], setup.prefixes["dqm"]
    unreadable, no_dqm, no_watermark, bad_dqm, first, _plain, other_type = sorted(
        storage.list_prefix(base).shards)
    put_bytes(base + unreadable, b"not parquet")
    remove(dqm + no_dqm)
    remove(setup.prefixes["watermark"] + no_watermark)
    put_bytes(dqm + bad_dqm, b"not parquet either")
    table = read_table(base + first)
    image = pa.array([b"jpeg"] * table.num_rows, pa.binary())
    write_table(table.append_column("image", image).replace_schema_metadata({"writer": "another"}), base + first)
    table = read_table(base + other_type)
    write_table(table.set_column(table.schema.get_field_index("width"), "width", table["width"].cast(pa.int64())),
                base + other_type)

    schema, problems = inspect_schemas(make_plan(job_for(setup)), 7)
    dqm_step, rename_step = f"operations[0] (merge_from_sidecar from {dqm})", "operations[2] (rename_columns"
    assert [line.split(": ")[0:2] for line in problems] == [
        [f"shard {unreadable}", "base footer unreadable"],
        [f"shard {no_dqm}", f"{dqm_step}"],
        [f"shard {no_dqm}", f"{rename_step} watermark -> wm, dqm_d1_v6_1 -> dqm)"],
        [f"shard {bad_dqm}", f"{dqm_step}"],
        [f"shard {other_type}", "output schema differs from the first sampled shard's"]]
    assert problems[0].startswith(f"shard {unreadable}: base footer unreadable: ArrowInvalid: ")
    assert problems[1] == f"shard {no_dqm}: {dqm_step}: sibling shard missing"
    assert "dqm_d1_v6_1" in problems[2] and "not in the table" in problems[2]
    assert problems[3].startswith(f"shard {bad_dqm}: {dqm_step}: ArrowInvalid: ")
    assert schema.names == [*table.schema.names, "dqm", "wm"]
    assert schema.field("width").type == pa.int32()


@pytest.mark.parametrize("listing, what", [(0, "main_prefix"), (1, "operations[0].source_prefix"),
                                           (4, "output prefix")])
@pytest.mark.parametrize("fault", [DENIED, UNSUPPORTED])
def test_a_listing_the_store_refuses_is_one_line_naming_the_prefix(tmp_path, s3_root, proxied,  # noqa: F811
                                                                   monkeypatch, listing, what, fault):
    """Every listing fails at its first request, with 403 (denied) or 501 (an error no retry mends): the plan
    stops at the one that failed, naming the field and the prefix."""
    setup = build(tmp_path, s3_root, shards=SHARDS)
    job = job_for(setup)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    lists = itertools.count()
    proxied(rate=1.0, faults=(fault,), applies=lambda op: op == "ListObjects" and next(lists) == listing)
    prefix = {0: setup.prefixes["base"], 1: setup.prefixes["dqm"], 4: setup.output}[listing]
    with pytest.raises(ConfigError) as info:
        make_plan(job)
    why = {DENIED: "access denied (Access Denied)",
           UNSUPPORTED: "[Errno 38] A header you provided implies functionality that is not implemented"}[fault]
    assert str(info.value) == f"cannot list {what} {prefix}: {why}"


CURRENT = {"base": "b2", "operations": ["s1", "absent"]}


@pytest.mark.parametrize("recorded, words", [
    (None, "written without input identities (an older version)"),
    ({}, "written without input identities (an older version)"),
    ({"base": "b1", "operations": ["s1", "absent"]}, "base shard changed"),
    ({"base": "b1", "operations": ["s0", "s9"]},
     "base shard, operations[0] sibling, operations[1] sibling changed"),
    ({"base": "b2", "operations": ["s1"]}, "operations[1] sibling changed"),
    ({"base": "b2", "operations": ["s1", "absent"]}, "merge semantics changed"),
])
def test_a_stale_output_names_the_inputs_that_changed(recorded, words):
    assert changed_inputs(recorded, CURRENT) == words


def test_existing_outputs_are_judged_complete_broken_or_replaced_with_why(tmp_path):
    """Outputs of overwrite run-a: one intact, one cut short by a row (its provenance kept), one not parquet,
    and one without provenance. Continuing run-a keeps the intact one and replaces the one without provenance;
    continuing another overwrite replaces both."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=4)
    pipeline = load_pipeline(setup.pipeline)
    first = Job(pipeline, setup.output, run_id="run-a", **overwrite_fields(True, "run-a"))
    intact, short, garbage, foreign = sorted(storage.list_prefix(setup.prefixes["base"]).shards)
    for rel in (intact, short, garbage):
        merge_shard(first, rel)
    table = read_table(setup.output + short)
    write_table(table.slice(0, table.num_rows - 1), setup.output + short)
    put_bytes(setup.output + garbage, b"not parquet")
    base = read_table(setup.prefixes["base"] + foreign)
    write_table(base.replace_schema_metadata(None), setup.output + foreign)

    continued = Job(pipeline, setup.output, run_id="run-b", **overwrite_fields(True, "run-b", "run-a"))
    plan = make_plan(continued, True)
    assert plan.complete == [intact] and plan.foreign == []
    assert plan.replaced == [(foreign, "not written by overwrite run-a")]
    assert plan.broken == [(short, f"{table.num_rows - 1} rows, {table.num_rows} recorded"),
                           (garbage, "unreadable: ArrowInvalid")]
    assert output_status(first, intact, plan.inputs(intact)) == ("complete", str(table.num_rows))

    other = Job(pipeline, setup.output, run_id="run-c", **overwrite_fields(True, "run-c", "run-z"))
    assert make_plan(other, True).replaced == [(intact, "not written by overwrite run-z"),
                                               (foreign, "not written by overwrite run-z")]
    new = make_plan(Job(pipeline, setup.output, run_id="run-d", **overwrite_fields(True, "run-d")), True)
    assert new.todo == [intact, short, garbage, foreign] and new.complete == []  # a new overwrite redoes all


def test_the_predicted_schema_names_the_types_parquet_will_store(tmp_path):
    """An operation that makes a type Parquet stores as another (timestamp[s] is read back as timestamp[ms]):
    the dry run's prediction is the written file's schema, not the operation's Arrow type."""
    import dataclasses

    from tasks.demo import relpaths
    from tasks.ops.base import NO_INPUT, Operation, TableStream
    from tasks.ops.lineage import Status, StepRecord, appended

    @dataclasses.dataclass(frozen=True)
    class Stamp(Operation):
        type = "stamp"

        def to_dict(self) -> dict:
            return {"type": self.type}

        def stream(self, schema, dataset, relpath, history, rows, window_rows):
            field = pa.field("seen_at", pa.timestamp("s"))
            return TableStream(StepRecord(Status.APPLIED, (appended("seen_at"),), NO_INPUT), schema.append(field),
                               lambda window, offset: window.append_column(field, pa.nulls(window.num_rows,
                                                                                           field.type)))

    setup = build(tmp_path, str(tmp_path / "data"), shards=2)  # the three score merges
    pipe = load_pipeline(setup.pipeline)
    job = Job(dataclasses.replace(pipe, operations=(*pipe.operations, Stamp())), setup.output)
    predicted, problems = inspect_schemas(make_plan(job), 2)
    assert problems == [] and predicted.field("seen_at").type == pa.timestamp("ms")
    merge_shard(job, sorted(relpaths(2))[0])
    written = storage.read_footer(setup.output + sorted(relpaths(2))[0]).schema.to_arrow_schema()
    assert predicted.remove_metadata().equals(written.remove_metadata())


def test_shards_whose_footers_differ_only_in_metadata_predict_one_schema(tmp_path):
    """A rename keeps the base's schema metadata: the prediction carries the first sampled shard's, and a
    shard with other metadata (another writer) is not reported as a different schema."""
    root = storage.normalize_prefix(str(tmp_path))
    base = pa.table({"key": ["a", "b"], "path": ["p", "q"]})
    write_table(base.replace_schema_metadata({"writer": "one"}), f"{root}base/a/part-0.parquet")
    write_table(base.replace_schema_metadata({"writer": "another"}), f"{root}base/a/part-1.parquet")
    job = streaming_job(root, "out")
    job = replace(job, pipeline=replace(job.pipeline, operations=(RenameColumns((("path", "uri"),)),)))
    predicted, problems = inspect_schemas(make_plan(job), 2)
    assert problems == []
    assert predicted.names == ["key", "uri"] and predicted.metadata == {b"writer": b"one"}


def test_a_listing_task_that_fails_is_one_line_naming_the_prefix(tmp_path):
    """The listing task's own failure of the store's families is the planner's one line (not the prefix listed
    again by the planner, which could succeed and hide it); tests/test_listing_errors.py has each family."""
    def failed():
        raise TimeoutError("the store did not answer")

    prefix = storage.normalize_prefix(str(tmp_path))
    with pytest.raises(ConfigError) as refused:
        list_or_refuse(prefix, "base prefix", failed)
    assert str(refused.value) == f"cannot list base prefix {prefix}: the store did not answer"
