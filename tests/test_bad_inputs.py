"""The bad-input matrix (issues 2 and 7): every bad input gets its exit code and one clear line, writes nothing
under the output prefix, and leaves base and sources byte-identical.

Each case starts from a one-shard dataset (base + dqm + aes + watermark, 3 operations), breaks one thing and
runs `sidecar-ops run` in-process against the session's Prefect API. Data errors (exit 1) fail that single
shard, so "nothing written" means the output prefix is exactly as before.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import boto3
import pyarrow as pa
import pytest
from conftest import snapshot
from core_fixtures import (FILTER_EXTENSIONS, SCORE_EXTENSIONS, aes_op, build, dqm_op, put_bytes, read_meta,
                           read_table, release_console_handlers, remove, watermark_op, write_configs, write_table,
                           get_bytes)

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.ops import OPERATIONS

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

REL = relpaths(1)[0]
ROWS = 20


@dataclass
class Ctx:
    tmp: Path
    setup: object
    output: str
    argv: list[str] = field(default_factory=list)
    watch: list[str] = field(default_factory=list)    # read-only prefixes that must stay byte-identical
    late: list[Callable] = field(default_factory=list)     # run after the before-snapshot (e.g. deny access)
    cleanup: list[Callable] = field(default_factory=list)  # run before the after-snapshot (e.g. drop a policy)

    @property
    def p(self) -> dict[str, str]:
        return self.setup.prefixes

    @property
    def pipeline(self) -> Path:
        return self.setup.pipeline

    def fmt(self, text: str) -> str:
        return text.format(rel=REL, out=self.output, root=self.setup.root, **self.p)

    def reconfigure(self, ops=None, **kw) -> None:
        write_configs(self.tmp, self.p, ops=ops(self.p) if ops else None, **kw)

    def dqm_only(self, *more_ops, **op_fields) -> None:
        """A pipeline of the DQM merge (plus `more_ops`), declaring only the extensions it produces."""
        self.reconfigure(ops=lambda p: [dqm_op(p, **op_fields), *[m(p) for m in more_ops]],
                         extensions=FILTER_EXTENSIONS + SCORE_EXTENSIONS[:1])

    def rewrite(self, sidecar: str, fn, rel: str = REL) -> None:
        uri = self.p[sidecar] + rel
        write_table(fn(read_table(uri).replace_schema_metadata(None)), uri)


@dataclass
class Case:
    id: str
    arrange: Callable[[Ctx], None]
    code: int
    message: str                       # a regex, formatted with the prefixes ({dqm}, {aes}, {out}, {rel}, ...)
    storage: str = "local"
    dry_run: bool = False
    written: tuple[str, ...] = ()      # output relpaths expected afterwards (successful runs)
    check: Callable[[Ctx], None] | None = None


# ----------------------------------------------------------------- arrangements

def take(order):
    return lambda t: t.take(order)


def swap(i, j):
    order = list(range(ROWS))
    order[i], order[j] = order[j], order[i]
    return take(order)


def null_at(column, row):
    def fn(t):
        values = t[column].to_pylist()
        values[row] = None
        return t.set_column(t.schema.get_field_index(column), column, pa.array(values, t[column].type))
    return fn


def set_column(name, array_fn):
    def fn(t):
        return t.set_column(t.schema.get_field_index(name), name, array_fn(t.num_rows))
    return fn


def add_image(t):
    return t.append_column("image", pa.array([b"\xff\xd8jpeg"] * t.num_rows, pa.binary()))


def add_extra_sibling(c: Ctx) -> None:
    write_table(read_table(c.p["dqm"] + REL).replace_schema_metadata(None), c.p["dqm"] + "2099/part-99999.parquet")


def add_junk_to_base(c: Ctx) -> None:
    put_bytes(c.p["base"] + "_SUCCESS", b"")
    put_bytes(c.p["base"] + "notes.txt", b"not a shard")


def add_empty_base_shard(c: Ctx) -> None:
    add_junk_to_base(c)
    put_bytes(c.p["base"] + "2023/part-empty.parquet", b"")


def only_the_good_shard_written(c: Ctx) -> None:
    assert sorted(snapshot(c.output)) == [REL]


def typo_in_optional_source(c: Ctx) -> None:
    typo = {**c.p, "watermark": c.p["watermark"].rstrip("/") + "_typo/"}
    c.reconfigure(ops=lambda p: [dqm_op(p), aes_op(p), watermark_op(typo, required=False)])


def empty_base(c: Ctx) -> None:
    fs, path = storage.filesystem(c.p["base"])
    fs.rm(path, recursive=True)


def only_junk_base(c: Ctx) -> None:
    empty_base(c)
    put_bytes(c.p["base"] + "_SUCCESS", b"")


def append_blank_extension(c: Ctx) -> None:
    ds = c.setup.dataset
    text = ds.read_text()
    assert text.rstrip().endswith("type: watermark_score_v1"), "schema_extensions is the last key"
    ds.write_text(text + "- { name: ,   }\n")
    c.expected_line = len(text.splitlines()) + 1


def yaml_syntax_error(c: Ctx) -> None:
    c.pipeline.write_text(f"dataset: core_test\noperations:\n  - type: merge_from_sidecar\n"
                          f"    source_prefix: {c.p['dqm']}\n    columns: [dqm_d1_v6_1\n    mode: error\n")


def earlier_output_of_another_pipeline(c: Ctx) -> None:
    c.dqm_only()
    merge_shard(Job(load_pipeline(c.pipeline), c.output), REL)
    c.other_fingerprint = read_provenance(read_meta(c.output + REL))["fingerprint"]
    c.reconfigure()


def fingerprint_replaced(c: Ctx) -> None:
    assert read_provenance(read_meta(c.output + REL))["fingerprint"] == load_pipeline(c.pipeline).fingerprint
    assert read_provenance(read_meta(c.output + REL))["fingerprint"] != c.other_fingerprint


def missing_bucket(c: Ctx) -> None:
    c.p["base"] = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/base/"
    c.reconfigure()


def output_in_missing_bucket(c: Ctx) -> None:
    c.output = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/out/"


def deny(action: str, prefix_key: str):
    """A bucket policy denying `action` to everyone on the objects under one of our prefixes."""
    def arrange(c: Ctx) -> None:
        prefix = c.output if prefix_key == "out" else c.p[prefix_key]
        bucket, _, key = prefix[len("s3://"):].partition("/")
        s3 = boto3.client("s3")
        policy = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Principal": "*", "Action": action, "Resource": f"arn:aws:s3:::{bucket}/{key}*"}]}
        c.late.append(lambda: s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy)))
        c.cleanup.append(lambda: s3.delete_bucket_policy(Bucket=bucket))
    return arrange


def odd_names(c: Ctx) -> None:
    """Shards whose relative paths hold spaces and non-ASCII characters."""
    odd = "ünï cødé/part 0 — 日本.parquet"
    for name, prefix in c.p.items():
        data = get_bytes(prefix + REL)
        remove(prefix + REL)
        put_bytes(prefix + odd, data)
    c.odd = odd


def dotdot_key(c: Ctx) -> None:
    """An S3 key with a `..` segment under the base prefix: a relpath that would climb out of the output."""
    bucket, _, key = c.p["base"][len("s3://"):].partition("/")
    data = storage.filesystem(c.p["base"] + REL)[0].cat_file(c.p["base"][5:] + REL)
    boto3.client("s3").put_object(Bucket=bucket, Key=key + "sub/../../escape.parquet", Body=data)


def output_has_no_image(c: Ctx) -> None:
    out = read_table(c.output + REL)
    assert "image" not in out.column_names
    record = read_provenance(read_meta(c.output + REL))["operations"][0]
    assert "image" in record["protected"]


def key_kept_from_main(c: Ctx) -> None:
    out = read_table(c.output + REL)
    assert out["image_key"].equals(read_table(c.p["base"] + REL)["image_key"])
    assert read_provenance(read_meta(c.output + REL))["operations"][0]["protected"] == ["image_key"]


def odd_written(c: Ctx) -> None:
    assert sorted(snapshot(c.output)) == [c.odd]


CASES = [
    # --- alignment
    Case("row-count-mismatch", lambda c: c.rewrite("dqm", lambda t: t.slice(0, ROWS - 1)), 1,
         r"FAILED {rel}: shard {rel}: operations\[0\] \(merge_from_sidecar from {dqm}\): row count mismatch: "
         r"table has 20 rows, source shard has 19"),
    Case("one-swapped-key", lambda c: c.rewrite("aes", swap(4, 5)), 1,
         r"operations\[1\] \(merge_from_sidecar from {aes}\): key mismatch in 2 of 20 rows; first at row 4: "
         r"s3_image_path='s3://images-bucket/raw/00000/img-00000-0000004.jpg' vs source "
         r"s3_image_path='s3://images-bucket/raw/00000/img-00000-0000005.jpg'"),
    Case("null-key", lambda c: c.rewrite("dqm", null_at("image_key", 0)), 1,
         r"key mismatch in 1 of 20 rows; first at row 0: image_key='img-00000-0000000' vs source image_key=None"),
    Case("duplicate-keys-out-of-order", lambda c: c.rewrite("dqm", take([1, 0, 0, *range(3, ROWS)])), 1,
         r"key mismatch in 3 of 20 rows; first at row 0: image_key='img-00000-0000000' vs source "
         r"image_key='img-00000-0000001'"),
    Case("missing-sibling", lambda c: remove(c.p["dqm"] + REL), 1,
         r"operations\[0\] \(merge_from_sidecar from {dqm}\): sibling shard missing: {dqm}{rel}; inspect the score "
         r"sidecar"),
    Case("extra-sibling-reported-by-dry-run", add_extra_sibling, 0,
         r"siblings: 2 found, 0 missing, 1 extra \(extra ones are ignored\)", dry_run=True),
    Case("extra-sibling-does-not-fail-the-run", add_extra_sibling, 0, r"1 merged", written=(REL,)),
    # --- listing
    Case("empty-base-prefix", empty_base, 2, r"error: main_prefix {base} does not exist"),
    Case("empty-base-prefix-s3", empty_base, 2, r"error: main_prefix {base} does not exist", storage="s3"),
    Case("base-with-only-junk", only_junk_base, 2,
         r"error: main_prefix {base} holds no non-empty \*\.parquet shards \(1 other objects\)"),
    Case("non-parquet-objects-counted", add_junk_to_base, 0,
         r"shards:\s+1 \(\+2 other objects ignored: not \*\.parquet\)", dry_run=True),
    Case("non-parquet-objects-ignored", add_junk_to_base, 0, r"1 total, 1 merged", written=(REL,)),
    # issue 11, seen case 2: a 0-byte *.parquet base object is a failed shard, never an ignored object
    Case("zero-byte-base-shard-fails", add_empty_base_shard, 1,
         r"FAILED 2023/part-empty\.parquet: shard 2023/part-empty\.parquet: reading base shard "
         r"{base}2023/part-empty\.parquet: not a readable parquet file", written=None,
         check=only_the_good_shard_written),
    Case("zero-byte-base-shard-fails-s3", add_empty_base_shard, 1,
         r"2 total, 1 merged, 0 skipped \(already complete\), 1 failed", written=None,
         check=only_the_good_shard_written, storage="s3"),
    Case("zero-byte-base-shard-in-dry-run", add_empty_base_shard, 1,
         r"- 1 base shard\(s\) are empty \(0 bytes\), a run fails them: 2023/part-empty\.parquet", dry_run=True),
    Case("zero-byte-optional-sibling-fails", lambda c: put_bytes(c.p["watermark"] + REL, b""), 1,
         r"FAILED {rel}: shard {rel}: operations\[2\] \(merge_from_sidecar from {watermark}\): source shard "
         r"{watermark}{rel} is not a readable parquet file"),
    # issue 11, seen case 3: an optional operation whose source matches no base shard is a mistake
    Case("optional-source-matching-nothing", typo_in_optional_source, 2,
         r"error: operations\[2\] \(merge_from_sidecar from \S+_typo/\) has required: false, but its "
         r"source_prefix \S+_typo/ does not exist: it would be skipped for all 1 base shards"),
    Case("optional-source-matching-nothing-s3", typo_in_optional_source, 2,
         r"error: operations\[2\] .*has required: false, but its source_prefix \S+_typo/ ", storage="s3"),
    Case("optional-source-matching-nothing-in-dry-run", typo_in_optional_source, 1,
         r"- operations\[2\] \(merge_from_sidecar from \S+_typo/\) has required: false", dry_run=True),
    # --- unreadable shards and columns
    Case("corrupt-base-shard", lambda c: put_bytes(c.p["base"] + REL, b"PAR1" + b"\x00" * 100 + b"PAR1"), 1,
         r"FAILED {rel}: shard {rel}: reading base shard {base}{rel}: not a readable parquet file"),
    Case("corrupt-source-shard", lambda c: put_bytes(c.p["aes"] + REL, b"garbage, not parquet at all"), 1,
         r"shard {rel}: operations\[1\] \(merge_from_sidecar from {aes}\): source shard {aes}{rel} is not a readable "
         r"parquet file .*inspect the score sidecar"),
    Case("column-missing-in-source",
         lambda c: c.reconfigure(ops=lambda p: [dqm_op(p, columns=["dqm_d1_v6_1", "dqm_v7"])]), 1,
         r"column\(s\) dqm_v7 not in the source shard \(it has: image_key, dqm_d1_v6_1\); check `columns`"),
    Case("conflict-under-mode-error",
         lambda c: c.reconfigure(ops=lambda p: [dqm_op(p), dqm_op(p, mode="error")]), 1,
         r"operations\[1\] .*column\(s\) dqm_d1_v6_1 already exist in the table and mode is 'error'"),
    Case("prefer-sidecar-over-key-column",
         lambda c: c.dqm_only(columns=["image_key", "dqm_d1_v6_1"]), 0,
         r"1 total, 1 merged", written=(REL,), check=key_kept_from_main),
    Case("prefer-sidecar-over-key-column-reported",
         lambda c: c.dqm_only(columns=["image_key", "dqm_d1_v6_1"]), 0,
         r"operations\[0\]: image_key is the dataset's key column: kept from main, never taken from the sidecar",
         dry_run=True),
    Case("prefer-sidecar-over-image-column",
         lambda c: (c.rewrite("base", add_image), c.rewrite("dqm", add_image),
                    c.dqm_only(columns=["image", "dqm_d1_v6_1"])), 0,
         r"1 total, 1 merged", written=(REL,), check=output_has_no_image),
    # --- declared types
    Case("extension-float-instead-of-struct",
         lambda c: c.rewrite("dqm", set_column("dqm_d1_v6_1", lambda n: pa.array([0.5] * n))), 1,
         r"column 'dqm_d1_v6_1': expected struct<raw_score: floating, error: string, \.\.\.> \(dqm_score_v1\), "
         r"found double"),
    Case("extension-struct-missing-raw-score",
         lambda c: c.rewrite("dqm", set_column("dqm_d1_v6_1", lambda n: pa.array(
             [{"score": 0.5, "error": None}] * n, pa.struct([("score", pa.float32()), ("error", pa.string())])))), 1,
         r"column 'dqm_d1_v6_1': .*\(no field 'raw_score'\)"),
    # --- keys
    Case("target-key-missing-in-base", lambda c: c.rewrite("base", lambda t: t.drop_columns(["s3_image_path"])), 1,
         r"operations\[1\] .*key column 's3_image_path' is not in the table being merged .*inspect the upstream base "
         r"sidecar - there is no fallback to filename or basename matching"),
    Case("only-one-key-field",
         lambda c: c.reconfigure(ops=lambda p: [{k: v for k, v in aes_op(p).items() if k != "source_key_column"}]),
         2,
         r"error: .*pipelines/merge\.yaml:\d+: operations\[0\]\.target_key_column: set together with "
         r"source_key_column"),
    # --- configuration
    Case("unknown-operation-type",
         lambda c: c.reconfigure(ops=lambda p: [{**dqm_op(p), "type": "merge_from_sidecar_v2"}]), 2,
         r"operations\[0\]\.type: unknown operation type 'merge_from_sidecar_v2' \(known: "
         + re.escape(", ".join(sorted(OPERATIONS))) + r"\)"),
    Case("unknown-dataset", lambda c: c.pipeline.write_text(c.pipeline.read_text().replace(
        "dataset: core_test", "dataset: no_such_dataset")), 2,
         r"pipelines/merge\.yaml:1: dataset: unknown dataset 'no_such_dataset': no file .*datasets/no_such_dataset"),
    Case("blank-schema-extensions-entry", append_blank_extension, 2,
         r"datasets/core_test\.yaml:{line}: schema_extensions\[9\]\.name: must be a non-empty column name"),
    Case("yaml-syntax-error", yaml_syntax_error, 2, r"pipelines/merge\.yaml:6: YAML syntax error"),
    # --- output prefix guardrails
    Case("output-equals-base", lambda c: setattr(c, "output", c.p["base"]), 2,
         r"output prefix {base} equals main_prefix {base}; inputs are read-only"),
    Case("output-inside-base", lambda c: setattr(c, "output", c.p["base"] + "merged/"), 2,
         r"output prefix {base}merged/ is inside main_prefix {base}"),
    Case("output-above-base", lambda c: setattr(c, "output", c.setup.root + "in/"), 2,
         r"output prefix {root}in/ contains main_prefix {base}"),
    Case("output-equals-source", lambda c: setattr(c, "output", c.p["aes"]), 2,
         r"output prefix {aes} equals operations\[1\]\.source_prefix"),
    Case("output-inside-source", lambda c: setattr(c, "output", c.p["watermark"] + "x/"), 2,
         r"is inside operations\[2\]\.source_prefix {watermark}", storage="s3"),
    Case("existing-output-of-another-pipeline", earlier_output_of_another_pipeline, 2,
         r"1 existing output shard\(s\) under {out} were written by a different pipeline .*use --overwrite"),
    Case("existing-output-of-another-pipeline-overwrite",
         lambda c: (earlier_output_of_another_pipeline(c), c.argv.append("--overwrite")), 0,
         r"1 total, 1 merged", written=(REL,), check=fingerprint_replaced),
    # --- storage
    Case("nonexistent-bucket", missing_bucket, 2, r"error: main_prefix s3://no-such-bucket-\w+/base/ does not exist",
         storage="s3"),
    Case("output-in-nonexistent-bucket", output_in_missing_bucket, 2,
         r"error: .*output prefix s3://no-such-bucket-\w+/out/.*bucket.*does not exist", storage="s3"),
    Case("access-denied-reading-a-source", deny("s3:GetObject", "dqm"), 1,
         r"FAILED {rel}: shard {rel}: operations\[0\] \(merge_from_sidecar from {dqm}\): .*(Access Denied|Forbidden)",
         storage="s3"),
    Case("access-denied-writing-the-output", deny("s3:PutObject", "out"), 1,
         r"FAILED {rel}: shard {rel}: writing {out}{rel}: .*(Access Denied|Forbidden)", storage="s3"),
    Case("spaces-and-unicode-in-keys-local", odd_names, 0, r"1 total, 1 merged", check=odd_written, written=None),
    Case("spaces-and-unicode-in-keys-s3", odd_names, 0, r"1 total, 1 merged", check=odd_written, written=None,
         storage="s3"),
    Case("dotdot-in-a-key", dotdot_key, 2, r"error: main_prefix {base} holds 1 object key\(s\) that are not plain "
         r"relative paths .*sub/\.\./\.\./escape\.parquet", storage="s3"),
]


def test_matrix_is_big_enough():
    assert len(CASES) >= 25 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path, request, cli, prefect_api):
    root = request.getfixturevalue("s3_root") if case.storage == "s3" else str(tmp_path / "data") + "/"
    setup = build(tmp_path, root, shards=1, rows=ROWS, watermark_gap=False)
    ctx = Ctx(tmp_path, setup, setup.output)
    case.arrange(ctx)
    watched = {p: snapshot(p) for p in setup.inputs()}  # after arranging: the state the run must not change
    output_before = snapshot(ctx.output) if not ctx.output.startswith("s3://no-such") else {}
    for fn in ctx.late:
        fn()
    argv = ["run", ctx.pipeline, "--output-prefix", ctx.output, "--retries", "0", *ctx.argv]
    try:
        code, out, err = cli(*argv, *(["--dry-run"] if case.dry_run else []))
    finally:
        release_console_handlers()
    text = out + err
    expected = ctx.fmt(case.message.replace("{line}", str(getattr(ctx, "expected_line", 0))))
    assert code == case.code, text
    assert re.search(expected, text), f"{expected!r} not in:\n{text}"
    assert "Traceback" not in text
    for fn in ctx.cleanup:
        fn()
    after = snapshot(ctx.output) if not ctx.output.startswith("s3://no-such") else {}
    if case.written is None:
        pass  # the case's own check says what was written
    elif case.code or case.dry_run:
        assert after == output_before, "nothing may be written on failure or dry run"
    else:
        assert sorted(after) == sorted(set(output_before) | set(case.written))
    assert not any(storage.TEMP_MARK in rel for rel in after)
    assert {p: snapshot(p) for p in setup.inputs()} == watched, "base and sources are read-only"
    if case.check:
        case.check(ctx)
