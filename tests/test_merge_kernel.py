"""The pure-pyarrow kernel (tasks/kernel.py, tasks/ops) driven directly, on local disk and S3 (moto server)."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from core_fixtures import (aes_op, build, dqm_op, expected_output, objects, read_meta, read_table, watermark_op,
                           write_table)

from tasks import storage
from tasks.config import load_pipeline
from tasks.errors import ShardError
from tasks.kernel import (PROVENANCE_KEY, Job, apply_operation, merge_shard, read_base, read_provenance, tool_version,
                         write_output)
from tasks.demo import relpaths

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REL = relpaths(3)


def job_for(setup) -> Job:
    return Job(load_pipeline(setup.pipeline), setup.output)


def rewrite(uri: str, fn) -> None:
    write_table(fn(read_table(uri).replace_schema_metadata(None)), uri)


def with_image(table: pa.Table) -> pa.Table:
    """A base shard that (wrongly) carries image bytes in the dataset's image column, mid-schema."""
    images = pa.array([f"JPEG{i}".encode() for i in range(table.num_rows)], pa.binary())
    return table.add_column(2, "image", images)


def provenance_of(uri: str) -> dict:
    return read_provenance(read_meta(uri))


# ----------------------------------------------------------------- the merge itself

def test_three_operations_equal_base_plus_sources(tmp_path, root):
    setup = build(tmp_path, root, watermark_gap=False)
    for rel in REL:
        rewrite(setup.prefixes["base"] + rel, with_image)
    job = job_for(setup)
    for rel in REL:
        stats = merge_shard(job, rel)
        assert stats.rows == 40 and stats.bytes > 0 and stats.skipped_ops == 0
    assert objects(setup.output) == REL, "the output holds exactly the merged shards"
    for rel in REL:
        got = read_table(setup.output + rel)
        want = expected_output(setup, rel, [("dqm", "dqm_d1_v6_1"), ("aes", "ernie_image_aes"),
                                            ("watermark", "watermark")])
        assert "image" not in got.column_names
        assert got.schema.equals(want.schema, check_metadata=False), "names, order and types (no widening)"
        assert got.schema.field("ernie_image_aes").type.field("raw_score").type == pa.float32()
        assert got.replace_schema_metadata(None).equals(want), f"{rel}: values differ"
        assert got.to_pylist() == want.to_pylist()


def test_outputs_are_zstd_with_provenance(tmp_path, root):
    setup = build(tmp_path, root)
    job = job_for(setup)
    merge_shard(job, REL[0])
    meta = read_meta(setup.output + REL[0])
    codecs = {meta.row_group(g).column(c).compression for g in range(meta.num_row_groups)
              for c in range(meta.num_columns)}
    assert codecs == {"ZSTD"}
    prov = json.loads(meta.metadata[PROVENANCE_KEY])
    assert prov["fingerprint"] == job.fingerprint
    assert prov["dataset"] == "core_test"
    assert prov["tool"] == "sidecar-ops" and prov["tool_version"] == tool_version()
    assert prov["written_at"].endswith("+00:00") and prov["written_at"][:2] == "20"
    assert prov["main_prefix"] == setup.prefixes["base"]
    assert prov["source_inference"] == {"default": "test"}
    assert [op["source_prefix"] for op in prov["operations"]] == [setup.prefixes[s] for s in ("dqm", "aes", "watermark")]
    assert [op["status"] for op in prov["operations"]] == ["merged"] * 3
    assert prov["operations"][1]["target_key_column"] == "s3_image_path"
    assert prov["operations"][0]["appended"] == ["dqm_d1_v6_1"]
    assert b"testing-secret-key" not in json.dumps(prov).encode()


def test_optional_operation_with_missing_sibling_is_a_recorded_no_op(tmp_path, root):
    setup = build(tmp_path, root)  # the watermark sidecar lacks the last shard
    job = job_for(setup)
    stats = merge_shard(job, REL[-1])
    assert stats.skipped_ops == 1
    out = read_table(setup.output + REL[-1])
    assert "watermark" not in out.column_names and "ernie_image_aes" in out.column_names
    ops = provenance_of(setup.output + REL[-1])["operations"]
    assert ops[2]["status"] == "skipped_missing_sibling" and ops[2]["source_prefix"] == setup.prefixes["watermark"]
    assert ops[2]["required"] is False
    assert merge_shard(job, REL[0]).skipped_ops == 0


def test_required_operation_with_missing_sibling_fails(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p), watermark_op(p, required=True)])
    with pytest.raises(ShardError) as info:
        merge_shard(job_for(setup), REL[-1])
    message = str(info.value)
    assert message.startswith(f"shard {REL[-1]}: operations[1] (merge_from_sidecar from {setup.prefixes['watermark']})")
    assert "sibling shard missing" in message and "required: false" in message
    assert objects(setup.output) == []


# ----------------------------------------------------------------- modes

def overlap_source(setup, rel: str) -> str:
    """A sidecar holding the key, a column the base already has (`width`, other values and type), the image
    column, and a new column `extra`; written next to the other inputs."""
    base = read_table(setup.prefixes["base"] + rel)
    prefix = setup.root + "in/overlap/"
    table = pa.table({"image_key": base["image_key"].cast(pa.large_string()),
                      "width": pc.add(base["width"].cast(pa.int64()), 1),
                      "image": pa.array([b"x"] * base.num_rows),
                      "extra": pa.array(range(base.num_rows), pa.int16())})
    write_table(table, prefix + rel)
    return prefix


@pytest.mark.parametrize("mode", ["fill_missing", "prefer_sidecar"])
def test_modes_on_overlap(tmp_path, root, mode):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p)])
    prefix = overlap_source(setup, REL[0])
    setup = build(tmp_path, root, ops=lambda p: [{"type": "merge_from_sidecar", "source_prefix": prefix,
                                                   "columns": ["image_key", "width", "image", "extra"],
                                                   "mode": mode}],
                  extensions=[])
    rewrite(setup.prefixes["base"] + REL[0], with_image)
    merge_shard(job_for(setup), REL[0])
    base = read_table(setup.prefixes["base"] + REL[0])
    src = read_table(prefix + REL[0])
    out = read_table(setup.output + REL[0])
    assert out.column_names == [c for c in base.column_names if c != "image"] + ["extra"]
    assert out["image_key"].type == pa.string() and out["image_key"].equals(base["image_key"]), "key stays from main"
    assert out["extra"].equals(src["extra"])
    if mode == "fill_missing":
        assert out.schema.field("width").type == pa.int32() and out["width"].equals(base["width"])
    else:  # replaced in place, keeping the sidecar's type
        assert out.schema.field("width").type == pa.int64() and out["width"].equals(src["width"])
    record = provenance_of(setup.output + REL[0])["operations"][0]
    assert record["protected"] == ["image_key", "image"]
    assert record["appended"] == ["extra"]
    assert record["replaced"] == (["width"] if mode == "prefer_sidecar" else [])
    assert record["kept_from_main"] == (["width"] if mode == "fill_missing" else [])


def test_mode_error_fails_on_overlap(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p)])
    prefix = overlap_source(setup, REL[0])
    setup = build(tmp_path, root, ops=lambda p: [{"type": "merge_from_sidecar", "source_prefix": prefix,
                                                   "columns": ["width", "extra"], "mode": "error"}], extensions=[])
    with pytest.raises(ShardError, match=r"column\(s\) width already exist in the table and mode is 'error'"):
        merge_shard(job_for(setup), REL[0])
    assert objects(setup.output) == []


def test_columns_omitted_takes_every_non_key_source_column(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p)])
    prefix = overlap_source(setup, REL[0])
    setup = build(tmp_path, root, ops=lambda p: [{"type": "merge_from_sidecar", "source_prefix": prefix}],
                  extensions=[])
    merge_shard(job_for(setup), REL[0])
    out = read_table(setup.output + REL[0])
    base = read_table(setup.prefixes["base"] + REL[0])
    # fill_missing by default: width stays from main, image never comes from a sidecar, extra is appended
    assert out.column_names == base.column_names + ["extra"]
    assert out["width"].equals(base["width"])


# ----------------------------------------------------------------- alignment

def break_source(setup, sidecar: str, rel: str, fn) -> None:
    rewrite(setup.prefixes[sidecar] + rel, fn)


def swap_rows(i: int, j: int):
    def fn(t: pa.Table) -> pa.Table:
        order = list(range(t.num_rows))
        order[i], order[j] = order[j], order[i]
        return t.take(order)
    return fn


def null_key(column: str, row: int):
    def fn(t: pa.Table) -> pa.Table:
        values = t[column].to_pylist()
        values[row] = None
        return t.set_column(t.schema.get_field_index(column), column, pa.array(values, t[column].type))
    return fn


@pytest.mark.parametrize("sidecar,index,fn,expected", [
    ("dqm", 0, lambda t: t.slice(0, 39), "row count mismatch: table has 40 rows, source shard has 39"),
    ("dqm", 0, swap_rows(3, 4), "key mismatch in 2 of 40 rows; first at row 3: image_key='img-00001-0000003' "
                                "vs source image_key='img-00001-0000004'"),
    ("aes", 1, null_key("s3_image_path", 7), "key mismatch in 1 of 40 rows; first at row 7: s3_image_path="
                                             "'s3://images-bucket/raw/00001/img-00001-0000007.jpg' vs source "
                                             "s3_image_path=None"),
    ("aes", 1, swap_rows(0, 39), "key mismatch in 2 of 40 rows; first at row 0"),
])
def test_alignment_errors_name_shard_operation_and_rows(tmp_path, root, sidecar, index, fn, expected):
    setup = build(tmp_path, root)
    rel = REL[1]
    break_source(setup, sidecar, rel, fn)
    before = {name: objects(p) for name, p in setup.prefixes.items()}
    job = job_for(setup)
    with pytest.raises(ShardError) as info:
        merge_shard(job, rel)
    message = str(info.value)
    assert message.startswith(f"shard {rel}: operations[{index}] (merge_from_sidecar from "
                              f"{setup.prefixes[sidecar]}): "), message
    assert expected in message
    assert not info.value.transient, "misalignment is never retried"
    assert objects(setup.output) == []
    assert {name: objects(p) for name, p in setup.prefixes.items()} == before
    merge_shard(job, REL[0])  # other shards are unaffected
    assert objects(setup.output) == [REL[0]]


def test_null_key_on_both_sides_is_a_mismatch(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p)])
    rewrite(setup.prefixes["base"] + REL[0], null_key("image_key", 5))
    rewrite(setup.prefixes["dqm"] + REL[0], null_key("image_key", 5))
    with pytest.raises(ShardError, match="key mismatch in 1 of 40 rows; first at row 5: image_key=None vs source "
                                         "image_key=None"):
        merge_shard(job_for(setup), REL[0])


def test_target_key_missing_in_base_says_inspect_upstream(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [aes_op(p)])
    rewrite(setup.prefixes["base"] + REL[0], lambda t: t.drop_columns(["s3_image_path"]))
    with pytest.raises(ShardError) as info:
        merge_shard(job_for(setup), REL[0])
    message = str(info.value)
    assert "key column 's3_image_path' is not in the table being merged" in message
    assert "inspect the upstream base sidecar" in message and "no fallback to filename or basename" in message


def test_requested_column_missing_in_source(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p, columns=["dqm_d1_v6_1", "dqm_v7"])])
    with pytest.raises(ShardError, match=r"column\(s\) dqm_v7 not in the source shard .*check `columns`"):
        merge_shard(job_for(setup), REL[0])


@pytest.mark.parametrize("new_type,expected", [
    (pa.float32(), "column 'dqm_d1_v6_1': expected struct<raw_score: floating, error: string, ...> (dqm_score_v1), "
                   "found float"),
    (pa.struct([("score", pa.float32()), ("error", pa.string())]), "no field 'raw_score'"),
    (pa.struct([("raw_score", pa.string()), ("error", pa.string())]), "field 'raw_score' must be floating"),
])
def test_declared_extension_with_wrong_type(tmp_path, root, new_type, expected):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p)])

    def retype(t: pa.Table) -> pa.Table:
        if pa.types.is_struct(new_type):
            col = pa.array([{f.name: None for f in new_type}] * t.num_rows, new_type)
        else:
            col = pa.array([0.5] * t.num_rows, new_type)
        return t.set_column(1, "dqm_d1_v6_1", col)

    rewrite(setup.prefixes["dqm"] + REL[0], retype)
    with pytest.raises(ShardError) as info:
        merge_shard(job_for(setup), REL[0])
    assert str(info.value).startswith(f"shard {REL[0]}: ") and expected in str(info.value)
    assert objects(setup.output) == []


def test_corrupt_base_shard_names_it(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p)])
    from core_fixtures import put_bytes

    put_bytes(setup.prefixes["base"] + REL[0], b"PAR1 this is not parquet PAR1")
    with pytest.raises(ShardError, match=f"shard {REL[0]}: reading base shard {setup.prefixes['base']}{REL[0]}: "
                                         "not a readable parquet file") as info:
        merge_shard(job_for(setup), REL[0])
    assert not info.value.transient, "a corrupt shard fails the same way on every retry"


def test_corrupt_source_shard_names_it(tmp_path, root):
    setup = build(tmp_path, root, ops=lambda p: [dqm_op(p)])
    from core_fixtures import get_bytes, put_bytes

    whole = get_bytes(setup.prefixes["dqm"] + REL[0])
    put_bytes(setup.prefixes["dqm"] + REL[0], whole[: len(whole) // 2])  # truncated upload
    with pytest.raises(ShardError) as info:
        merge_shard(job_for(setup), REL[0])
    assert f"source shard {setup.prefixes['dqm']}{REL[0]} is not a readable parquet file" in str(info.value)
    assert not info.value.transient


# ----------------------------------------------------------------- atomic writes

def chain(job: Job, relpath: str):
    """The --task-per-operation layout's kernel calls, in one process: the whole table from step to step."""
    state = read_base(job, relpath)
    for index in range(len(job.pipeline.operations)):
        state = apply_operation(job, relpath, index, state)
    return write_output(job, relpath, state)


@pytest.mark.parametrize("merge", [merge_shard, chain], ids=["streamed", "chain"])
def test_failed_local_write_leaves_no_temp_file(tmp_path, merge):
    # a pipeline whose output passes its own checks, so the write itself is reached (a DQM-only pipeline
    # declaring every extension failed before writing: this test then held nothing)
    setup = build(tmp_path, str(tmp_path / "data") + "/")
    target = setup.output + REL[0]
    os.makedirs(target)  # the final name is taken by a directory: the rename must fail
    with pytest.raises(ShardError, match=f"shard {REL[0]}: writing {target}: IsADirectoryError"):
        merge(job_for(setup), REL[0])
    leftovers = [p for p in objects(setup.output)]
    assert leftovers == [], leftovers
    assert not any(storage.TEMP_MARK in name for name in os.listdir(os.path.dirname(target)))


def test_successful_writes_leave_only_final_names(tmp_path, root):
    setup = build(tmp_path, root)
    job = job_for(setup)
    for rel in REL:
        merge_shard(job, rel)
    names = objects(setup.output)
    assert names == REL and not any(storage.TEMP_MARK in n for n in names)
