"""Property: for random schemas, row counts, shard layouts and key perturbations, the merge kernel either
produces exactly base + source columns with every row aligned, or fails with an alignment ShardError.
It never succeeds with misaligned rows.
"""
from __future__ import annotations

import tempfile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks import storage
from tasks.config import Dataset, Pipeline
from tasks.errors import ShardError
from tasks.kernel import Job, merge_shard
from tasks.ops.alignment import check_aligned
from tasks.ops.merge_from_sidecar import MergeFromSidecar

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

VALUE_TYPES = {"int32": pa.int32(), "float64": pa.float64(), "string": pa.string(),
               "struct": pa.struct([("raw_score", pa.float32()), ("error", pa.string())])}
PERTURBATIONS = ("none", "none", "swap", "drop", "add", "null", "change", "reverse", "duplicate", "rotate")


def values(draw, type_name: str, n: int) -> pa.Array:
    typ = VALUE_TYPES[type_name]
    if type_name == "int32":
        ints = st.integers(-2**31, 2**31 - 1) | st.none()
        return pa.array(draw(st.lists(ints, min_size=n, max_size=n)), typ)
    if type_name == "float64":
        return pa.array(draw(st.lists(st.floats(allow_nan=False) | st.none(), min_size=n, max_size=n)), typ)
    if type_name == "string":
        return pa.array(draw(st.lists(st.text(max_size=5) | st.none(), min_size=n, max_size=n)), typ)
    raw = draw(st.lists(st.floats(width=32, allow_nan=False) | st.none(), min_size=n, max_size=n))
    return pa.array([{"raw_score": r, "error": None if r is not None else "failed"} for r in raw], typ)


def perturb(draw, keys: list, kind: str) -> list:
    keys = list(keys)
    n = len(keys)
    if kind == "swap" and n >= 2:
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        keys[i], keys[j] = keys[j], keys[i]
    elif kind == "drop" and n:
        del keys[draw(st.integers(0, n - 1))]
    elif kind == "add":
        keys.insert(draw(st.integers(0, n)), keys[0] if n and draw(st.booleans()) else "extra-key")
    elif kind == "null" and n:
        keys[draw(st.integers(0, n - 1))] = None
    elif kind == "change" and n:
        keys[draw(st.integers(0, n - 1))] = draw(st.sampled_from(["k0", "k1", "zz", ""]))
    elif kind == "reverse":
        keys.reverse()
    elif kind == "duplicate" and n >= 2:
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        keys[i] = keys[j]
    elif kind == "rotate" and n:
        shift = draw(st.integers(1, max(1, n - 1)))
        keys = keys[shift:] + keys[:shift]
    return keys


@st.composite
def scenarios(draw):
    base_cols = draw(st.lists(st.sampled_from(sorted(VALUE_TYPES)), max_size=3))
    score_cols = draw(st.lists(st.sampled_from(sorted(VALUE_TYPES)), min_size=1, max_size=3))
    with_image = draw(st.booleans())
    by_path = draw(st.booleans())  # source keyed by another base column (target/source_key_column)
    # The source may also carry base column b0, which prefer_sidecar then takes.
    overlap = bool(base_cols) and draw(st.booleans())
    layout = draw(st.lists(st.sampled_from(["a", "b", "c/d", "2024", "x y", "ü"]), min_size=1, max_size=3,
                           unique=True))
    shards = []
    for i, folder in enumerate(layout):
        n = draw(st.integers(1, 25))  # empty shards: see test_empty_shard_merges_and_verifies
        # Keys from a small alphabet: duplicates happen, so a swap can legitimately change nothing.
        keys = [f"k{draw(st.integers(0, max(1, n // 2)))}" for _ in range(n)]
        base = {"key": pa.array(keys, pa.string()), "path": pa.array([f"s3://img/{k}-{r}" for r, k in
                                                                       enumerate(keys)])}
        for c, t in enumerate(base_cols):
            base[f"b{c}"] = values(draw, t, n)
        if with_image:
            base["image"] = pa.array([b"\x89PNG"] * n, pa.binary())
        align = "path" if by_path else "key"
        kind = draw(st.sampled_from(PERTURBATIONS))
        skeys = perturb(draw, base[align].to_pylist(), kind)
        source = {align: pa.array(skeys, pa.string())}
        for c, t in enumerate(score_cols):
            source[f"s{c}"] = values(draw, t, len(skeys))
        if overlap:
            source["b0"] = values(draw, base_cols[0], len(skeys))
        shards.append((f"{folder}/part-{i:03d}.parquet", pa.table(base), pa.table(source), kind))
    return by_path, shards


def job_for(root: str, by_path: bool) -> Job:
    dataset = Dataset(name="prop", path="prop.yaml", main_prefix=f"{root}base/",
                      sidecar_prefix=f"{root}side/", key_column="key", image_column="image")
    keys = ("path", "path") if by_path else (None, None)
    op = MergeFromSidecar(f"{root}src/", None, "prefer_sidecar", *keys)
    return Job(Pipeline("prop-pipeline.yaml", dataset, (op,)), f"{root}out/")


def aligned(base: pa.Table, source: pa.Table, key: str) -> bool:
    if base.num_rows != source.num_rows:
        return False
    if base.num_rows == 0:
        return True
    return bool(pc.all(pc.fill_null(pc.equal(base[key], source[key]), False)).as_py())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_merge_is_aligned_or_fails_with_alignment_error(scenario):
    by_path, shards = scenario
    key = "path" if by_path else "key"
    with tempfile.TemporaryDirectory() as tmp:
        root = storage.normalize_prefix(tmp)
        job = job_for(root, by_path)
        for rel, base, source, _ in shards:
            storage.write_atomic(base, job.base_uri(rel))
            storage.write_atomic(source, f"{root}src/{rel}")
        for rel, base, source, kind in shards:
            should_align = aligned(base, source, key)
            try:
                stats = merge_shard(job, rel)
            except ShardError as exc:
                assert not should_align, f"aligned shard failed ({kind}): {exc}"
                assert ("row count mismatch" in str(exc) or "key mismatch" in str(exc)), str(exc)
                assert rel in str(exc)
                written = storage.list_prefix(job.output_prefix).shards
                assert rel not in written, "a failed shard was written"
                continue
            assert should_align, f"misaligned shard ({kind}) merged without error"
            assert stats.rows == base.num_rows
            with open(job.output_uri(rel), "rb") as f:
                out = pq.read_table(f)
            base_cols = [c for c in base.column_names if c != "image"]
            new_cols = [c for c in source.column_names if c != key and c not in base_cols]
            assert out.column_names == base_cols + new_cols
            for c in base_cols:
                expected = source[c] if c in source.column_names and c != key else base[c]
                assert out[c].equals(expected.cast(out[c].type)), c
            for c in new_cols:
                assert out[c].equals(source[c]), c


def test_empty_shard_merges_and_verifies(tmp_path):
    root = storage.normalize_prefix(str(tmp_path))
    job = job_for(root, by_path=False)
    storage.write_atomic(pa.table({"key": pa.array([], pa.string())}), job.base_uri("e/part-0.parquet"))
    storage.write_atomic(pa.table({"key": pa.array([], pa.string()), "s0": pa.array([], pa.float32())}),
                         f"{root}src/e/part-0.parquet")
    assert merge_shard(job, "e/part-0.parquet").rows == 0


# ----------------------------------------------------------------- keys of mixed types (issue 11, seen case 5)

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
STRING_TYPES = [pa.string(), pa.large_string(), pa.string_view(), pa.dictionary(pa.int32(), pa.string())]
BINARY_TYPES = [pa.binary(), pa.large_binary(), pa.binary_view(), pa.binary(3)]
KEY_TYPES = INT_TYPES + STRING_TYPES + BINARY_TYPES + [pa.float64()]


def family(t: pa.DataType) -> str:
    return ("int" if t in INT_TYPES else "str" if t in STRING_TYPES else "bin" if t in BINARY_TYPES
            else str(t))


def encode(ints: list, t: pa.DataType) -> pa.Array:
    """Integer key values in type t: as numbers, as decimal text, or as 3-byte text."""
    if t in INT_TYPES or t == pa.float64():
        return pa.array(ints, t)
    text = [None if v is None else f"{v:03d}" for v in ints]
    if t in BINARY_TYPES:
        return pa.array([None if v is None else v.encode() for v in text], t)
    if pa.types.is_dictionary(t):
        return pa.array(text, pa.string()).dictionary_encode()
    return pa.array(text, t)


@st.composite
def mixed_keys(draw):
    left_t, right_t = draw(st.sampled_from(KEY_TYPES)), draw(st.sampled_from(KEY_TYPES))
    n = draw(st.integers(1, 20))
    keys = draw(st.lists(st.integers(0, 127), min_size=n, max_size=n))  # fits every integer type
    right = perturb(draw, keys, draw(st.sampled_from(PERTURBATIONS)))
    right = [v if isinstance(v, int) or v is None else 999 for v in right]  # "change"/"add" give text
    right = [v if v is None or v <= 127 else 126 for v in right]
    return left_t, right_t, keys, right


@settings(max_examples=300, deadline=None)
@given(mixed_keys())
def test_keys_align_within_a_type_family_and_never_across(case):
    left_t, right_t, left, right = case
    table = pa.table({"key": encode(left, left_t)})
    source = pa.table({"key": encode(right, right_t)})
    same_family = family(left_t) == family(right_t)
    expect = same_family and len(left) == len(right) and all(a == b and a is not None for a, b in zip(left, right))
    try:
        check_aligned(table, "key", source, "key")
    except ShardError as exc:
        assert not expect, f"{left_t} vs {right_t}: {exc}"
        if not same_family and len(left) == len(right):
            assert f"key types differ: key is {left_t}, source key is {right_t}" in str(exc)
        return
    assert expect, f"{left_t} {left} vs {right_t} {right} aligned"


def test_integer_keys_beyond_int64_never_match_signed_ones():
    big = 2**64 - 1
    with pytest.raises(ShardError, match="key mismatch in 1 of 2 rows; first at row 1: key=-1 vs source key="
                                          f"{big}"):
        check_aligned(pa.table({"key": pa.array([1, -1], pa.int64())}), "key",
                      pa.table({"key": pa.array([1, big], pa.uint64())}), "key")


def test_zero_padded_text_never_aligns_with_a_number(tmp_path):
    """Through parquet and the kernel: "007" vs 7 is refused; int32 vs uint64 with equal values aligns."""
    root = storage.normalize_prefix(str(tmp_path))
    job = job_for(root, by_path=False)
    rel = "a/part-0.parquet"
    storage.write_atomic(pa.table({"key": pa.array([7, 8], pa.int32())}), job.base_uri(rel))
    storage.write_atomic(pa.table({"key": pa.array(["007", "008"]), "s0": [1.0, 2.0]}), f"{root}src/{rel}")
    with pytest.raises(ShardError, match=r"key types differ: key is int32, source key is (large_)?string"):
        merge_shard(job, rel)
    storage.write_atomic(pa.table({"key": pa.array([7, 8], pa.uint64()), "s0": [1.0, 2.0]}), f"{root}src/{rel}")
    assert merge_shard(job, rel).rows == 2
