"""The copy path (tasks/chunkcopy.py) makes the same output as the decode path, on the layouts users have.

Each layout is a base and its siblings written as real writers write them (pyarrow's default row groups, one
row group a file, groups cut by size as Spark cuts them, small groups, nested structs, dictionary-encoded
strings, nulls everywhere, an empty shard, siblings cut otherwise than the base). Every shard is merged both
ways; the outputs must read back equal, value for value and type for type, in pyarrow, DuckDB and Polars, and
the copy must have taken the path the layout allows, with the base's row groups.
"""
from __future__ import annotations

import dataclasses
import pathlib

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from core_fixtures import write_configs
from tasks import chunkcopy
from tasks.config import load_pipeline
from tasks.kernel import PER_RUN_FIELDS, Job, merge_shard, read_provenance
from tasks.plan import make_plan
from tasks.verification.driver import verify

REL = "2024/part-00000.parquet"


def base_table(n: int, nulls: bool = False, nested: bool = False, dictionary: bool = False) -> pa.Table:
    rng = np.random.default_rng(n)
    keys = [f"img-{i:08d}" for i in range(n)]
    paths = [f"s3://images/{i % 97}/{i:08d}.jpg" for i in range(n)]
    mask = (rng.random(n) < 0.3) if nulls else None
    cols = {"image_key": pa.array(keys), "s3_image_path": pa.array(paths),
            "width": pa.array(rng.integers(64, 4096, n), mask=mask),
            "rotation": pa.array(rng.integers(0, 4, n).astype(np.int16)),  # an INTEGER(16) logical type
            "flags": pa.array(rng.integers(0, 255, n).astype(np.uint8), mask=mask),
            "filter_clarity": pa.array(rng.random(n).astype(np.float32), mask=mask),
            "caption": pa.array([f"caption {i % 13}" for i in range(n)], mask=mask),
            "image": pa.array([b"\xff\xd8" * 4] * n)}
    if nested:
        cols["meta"] = pa.array([{"source": f"s{i % 5}", "tags": [i % 3, i % 7], "area": float(i)} if
                                 not (nulls and i % 4 == 0) else None for i in range(n)])
    if dictionary:
        cols["caption"] = cols["caption"].dictionary_encode()
    return pa.table(cols)


def scores(table: pa.Table, key: str, column: str, nulls: bool = False, dtype=np.float32,
           shaped: bool = False) -> pa.Table:
    """A score sidecar: `column` a float, or (`shaped`) a struct of a float score, an error string and a model
    name, as DQM and AES sidecars hold them (some structs null, some errors set)."""
    n = table.num_rows
    values = np.random.default_rng(n + len(column)).random(n).astype(dtype)
    mask = (np.arange(n) % 5 == 1) if nulls else None
    if shaped:
        score = pa.array(values, mask=mask)
        errors = pa.array([None if i % 7 else f"timeout {i % 3}" for i in range(n)])
        models = pa.array([f"model-v{i % 2}" for i in range(n)])
        struct_mask = pa.array(np.arange(n) % 11 == 3) if nulls else None
        return pa.table({key: table[key], column: pa.StructArray.from_arrays(
            [score, errors, models], names=["raw_score", "error", "model"], mask=struct_mask)})
    return pa.table({key: table[key], column: pa.array(values, mask=mask)})


def write(table: pa.Table, path, groups: list[int] | None = None, **kw) -> None:
    """`groups`: the row groups' row counts (None: pyarrow's default, 1,048,576 rows a group)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, table.schema, **kw) as writer:
        if groups is None:
            writer.write_table(table)
        else:
            start = 0
            for rows in groups:
                writer.write_table(table.slice(start, rows), row_group_size=max(rows, 1))
                start += rows


def spark_like(table: pa.Table, target_bytes: int) -> list[int]:
    """Row groups cut when their encoded size would pass `target_bytes`, as Spark's parquet-mr cuts at ~128 MiB
    (here a few KiB, so a test shard has several)."""
    per_row = max(1, table.nbytes // max(table.num_rows, 1))
    rows = max(1, target_bytes // per_row)
    full, rest = divmod(table.num_rows, rows)
    return [rows] * full + ([rest] if rest else [])


LAYOUTS = {
    # name: (rows, base groups, sibling groups, table options, writer options, copied score columns)
    "pyarrow-default": (3000, None, None, {}, {}, True),
    "one-group": (2500, [2500], [2500], {}, {"compression": "snappy"}, True),
    "spark-sized": (4000, "spark", "spark", {}, {"compression": "snappy"}, True),
    "small-groups": (1000, [100] * 10, [100] * 10, {}, {}, True),
    "nested": (1200, [500, 500, 200], [500, 500, 200], {"nested": True}, {}, True),
    "dictionary-strings": (1500, [1000, 500], [1000, 500], {"dictionary": True}, {"use_dictionary": True}, True),
    "nulls-everywhere": (1300, [650, 650], [650, 650], {"nulls": True, "nested": True}, {}, True),
    "siblings-cut-otherwise": (2000, [1500, 500], [700, 700, 600], {}, {}, False),
    "plain-uncompressed": (800, [800], [800], {}, {"compression": "none", "use_dictionary": False}, True),
}


def make(tmp_path, layout: str, ops_extra: list[dict] | None = None):
    rows, base_groups, sibling_groups, table_kw, writer_kw, _ = LAYOUTS[layout]
    root = tmp_path / "data"
    nulls = table_kw.get("nulls", False)
    shaped = table_kw.get("shaped", False)
    base_kw = {k: v for k, v in table_kw.items() if k != "shaped"}
    base = base_table(rows, **base_kw)
    groups = spark_like(base, 16 << 10) if base_groups == "spark" else base_groups
    sgroups = groups if sibling_groups == "spark" else sibling_groups
    write(base, root / "base" / REL, groups, **writer_kw)
    write(scores(base, "image_key", "dqm_d1_v6_1", nulls, shaped=shaped), root / "dqm" / REL, sgroups, **writer_kw)
    write(scores(base, "s3_image_path", "ernie_image_aes", nulls, np.float64), root / "aes" / REL, sgroups,
          **writer_kw)
    prefixes = {name: f"{root}/{name}/" for name in ("base", "dqm", "aes")}
    ops = [{"type": "merge_from_sidecar", "source_prefix": prefixes["dqm"], "columns": ["dqm_d1_v6_1"],
            "mode": "prefer_sidecar"},
           {"type": "merge_from_sidecar", "source_prefix": prefixes["aes"], "columns": ["ernie_image_aes"],
            "target_key_column": "s3_image_path", "source_key_column": "s3_image_path", "mode": "prefer_sidecar"},
           *(ops_extra or [])]
    pipeline, _ = write_configs(tmp_path, prefixes, ops=ops, extensions=[])
    return Job(load_pipeline(pipeline), f"{root}/copy/"), base, groups


def both(job: Job):
    decode = dataclasses.replace(job, output_prefix=job.output_prefix.replace("/copy/", "/decode/"),
                                 recompress="zstd")
    return merge_shard(job, REL), merge_shard(decode, REL), job.output_uri(REL), decode.output_uri(REL)


def assert_same_output(copy_uri: str, decode_uri: str) -> None:
    a, b = pq.read_table(copy_uri), pq.read_table(decode_uri)
    assert a.schema.remove_metadata() == b.schema.remove_metadata()
    assert a.equals(b)
    pa_, pb = (read_provenance(pq.read_metadata(u)) for u in (copy_uri, decode_uri))
    assert {k: v for k, v in pa_.items() if k not in PER_RUN_FIELDS} == \
        {k: v for k, v in pb.items() if k not in PER_RUN_FIELDS}
    da = duckdb.sql(f"select * from read_parquet('{copy_uri}')").fetch_arrow_table()
    db = duckdb.sql(f"select * from read_parquet('{decode_uri}')").fetch_arrow_table()
    assert da.schema == db.schema and da.equals(db)
    assert pl.read_parquet(copy_uri).equals(pl.read_parquet(decode_uri))
    assert pl.read_parquet(copy_uri).schema == pl.read_parquet(decode_uri).schema


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_copy_reads_back_as_the_decode_paths_output(tmp_path, layout):
    job, base, groups = make(tmp_path, layout)
    copied, decoded, copy_uri, decode_uri = both(job)
    assert (copied.path, decoded.path) == ("copy", "decode")
    assert_same_output(copy_uri, decode_uri)
    out = pq.ParquetFile(copy_uri).metadata
    assert [out.row_group(g).num_rows for g in range(out.num_row_groups)] == \
        (groups or [base.num_rows])  # the base's row groups
    codec = {"none": "UNCOMPRESSED"}.get(*[LAYOUTS[layout][4].get("compression", "snappy")] * 2).upper()
    names = pq.ParquetFile(copy_uri).schema_arrow.names
    score = out.row_group(0).column(names.index("dqm_d1_v6_1")).compression
    # a copied score column keeps its sibling's codec; one cut otherwise was encoded, as the decode path does
    assert score == (codec if LAYOUTS[layout][5] else "ZSTD")
    assert out.row_group(0).column(0).compression == codec  # the base's column, copied


def test_the_copy_leaves_out_the_image_column_and_keeps_the_bases_bytes(tmp_path):
    job, base, _ = make(tmp_path, "one-group")
    copied, _, copy_uri, _ = both(job)
    assert "image" not in pq.read_schema(copy_uri).names
    src, out = pq.ParquetFile(job.base_uri(REL)), pq.ParquetFile(copy_uri)
    with open(job.base_uri(REL), "rb") as f_src, open(copy_uri, "rb") as f_out:
        for name in ("image_key", "width", "caption"):
            i, j = src.schema_arrow.names.index(name), out.schema_arrow.names.index(name)
            a, b = src.metadata.row_group(0).column(i), out.metadata.row_group(0).column(j)
            f_src.seek(a.dictionary_page_offset or a.data_page_offset)
            f_out.seek(b.dictionary_page_offset or b.data_page_offset)
            assert f_src.read(a.total_compressed_size) == f_out.read(b.total_compressed_size)
            assert a.statistics == b.statistics


def test_an_empty_shard_takes_the_decode_path_and_is_still_equal(tmp_path):
    LAYOUTS["empty"] = (0, None, None, {}, {}, False)
    try:
        job, _, _ = make(tmp_path, "empty")
        copied, decoded, copy_uri, decode_uri = both(job)
    finally:
        del LAYOUTS["empty"]
    assert copied.path == "decode" and copied.rows == 0
    assert pq.read_table(copy_uri).equals(pq.read_table(decode_uri))


@pytest.mark.parametrize("extra", [
    [{"type": "cast_columns", "columns": {"width": "float64"}}],
    [{"type": "rename_columns", "columns": {"caption": "text"}}, {"type": "drop_columns", "columns": ["width"]}],
    [{"type": "cast_columns", "columns": {"dqm_d1_v6_1": "float64", "filter_clarity": "float64"}}],
], ids=["cast-a-base-column", "rename-and-drop", "cast-a-score-and-a-base-column"])
def test_operations_that_change_columns_copy_the_rest(tmp_path, extra):
    job, _, _ = make(tmp_path, "nested", extra)
    copied, decoded, copy_uri, decode_uri = both(job)
    assert copied.path == "copy"
    assert_same_output(copy_uri, decode_uri)


def test_a_copied_shard_passes_verify_and_resume_keeps_it(tmp_path):
    job, _, _ = make(tmp_path, "small-groups")
    copied, _, _, _ = both(job)
    report = verify(job, samples=1, all_shards=True)
    assert report.ok, report
    assert make_plan(job).complete == [REL]  # resume keeps it, as it keeps a decoded one


def test_the_post_write_check_fails_a_wrong_copy(tmp_path, monkeypatch):
    """A copy that placed the wrong chunks as the key (the plan's bug) is caught before the shard counts: the
    keys as written differ from the base's. (Chunks of another physical type are refused at the plan.)"""
    job, _, _ = make(tmp_path, "one-group")
    real = chunkcopy.walk

    def walk(base, streams):
        columns, keys = real(base, streams)
        wrong = chunkcopy.Values(0, "s3_image_path")
        return [(name, wrong if name == "image_key" else values) for name, values in columns], keys

    monkeypatch.setattr(chunkcopy, "walk", walk)
    with pytest.raises(Exception, match="verifying .*key column 'image_key' of the output differs from the base"):
        merge_shard(job, REL)


@pytest.mark.parametrize("group", [0, -1], ids=["first-row-group", "last-row-group"])
def test_the_check_compares_copied_key_chunks_byte_for_byte(tmp_path, group):
    """The post-write check of a copied key column compares its chunks' bytes with the base's (their footers
    alike): the output's bytes as stored pass; one byte changed inside the key chunk of the first or the last
    row group (its footer untouched) fails the check, naming the key column."""
    from tasks import kernel, storage

    job, _, _ = make(tmp_path, "small-groups")
    stats = merge_shard(job, REL)
    assert stats.path == "copy"
    out = job.output_uri(REL)
    data = bytearray(open(out, "rb").read())
    chunk = pq.read_metadata(out).row_group(group % 10).column(0)
    assert chunk.path_in_schema == "image_key"
    with storage.open_parquet(job.base_uri(REL)) as f:
        base = (f, pq.ParquetFile(f))
        assert kernel.check_written(job, REL, stats, pa.py_buffer(bytes(data)), base=base).rows == stats.rows
        start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
        data[start + chunk.total_compressed_size // 2] ^= 0x01
        with pytest.raises(Exception, match="verifying .*key column 'image_key' of the output differs from the base"):
            kernel.check_written(job, REL, stats, pa.py_buffer(bytes(data)), base=base)


@pytest.mark.parametrize("where", ["dqm", "aes"])
def test_a_misaligned_sibling_fails_the_copy_before_anything_is_written(tmp_path, where):
    job, base, groups = make(tmp_path, "pyarrow-default")
    path = tmp_path / "data" / where / REL
    table = pq.read_table(path)
    key = table.column_names[0]
    swapped = table[key].to_pylist()
    swapped[10], swapped[2000] = swapped[2000], swapped[10]
    write(table.set_column(0, key, pa.array(swapped)), path)
    with pytest.raises(Exception, match=r"operations\[\d\].*key mismatch in 2 of 3000 rows; first at row 10"):
        merge_shard(job, REL)
    assert not (tmp_path / "data" / "copy").exists() or not any((tmp_path / "data" / "copy").rglob("*.parquet"))


def decoded_keys(monkeypatch) -> list[str]:
    """The columns the copy path's key check decodes (chunkcopy.batches), as the merge asks for them."""
    seen: list[str] = []
    real = chunkcopy.batches

    def spy(pf, columns, *a, **k):
        seen.extend(c for c in columns if c in ("image_key", "s3_image_path"))
        return real(pf, columns, *a, **k)

    monkeypatch.setattr(chunkcopy, "batches", spy)
    return seen


@pytest.mark.parametrize("layout, sibling_kw, decoded", [
    ("one-group", {}, []),
    ("spark-sized", {}, []),
    ("small-groups", {}, []),
    ("siblings-cut-otherwise", {}, ["image_key"] * 2 + ["s3_image_path"] * 2),
    ("one-group", {"compression": "zstd"}, ["image_key"] * 2 + ["s3_image_path"] * 2),
    ("one-group", {"data_page_size": 1024}, ["image_key"] * 2 + ["s3_image_path"] * 2),
    ("one-group", {"key_type": pa.large_string()}, ["image_key"] * 2 + ["s3_image_path"] * 2),
], ids=["one-group", "spark-sized", "small-groups", "cut-otherwise", "another-codec", "other-pages",
        "another-arrow-type"])
def test_keys_stored_as_the_same_bytes_are_proven_without_decoding_them(tmp_path, monkeypatch, layout, sibling_kw,
                                                                        decoded):
    """A sibling whose key chunks are the base's byte for byte (same row groups, codec, encodings and pages, as
    a scoring job that wrote the keys it read with the same writer makes them) aligns without decoding either
    side; one written otherwise (cut otherwise, another codec, other page sizes, its keys another Arrow type of
    the same bytes) is decoded and compared, and both merge as the decode path does."""
    job, base, groups = make(tmp_path, layout)
    if sibling_kw:
        key_type = sibling_kw.pop("key_type", None)
        for name in ("dqm", "aes"):
            path = tmp_path / "data" / name / REL
            table = pq.read_table(path)
            if key_type is not None:
                table = table.set_column(0, table.field(0).name, table.column(0).cast(key_type))
            write(table, path, groups, **{**LAYOUTS[layout][4], **sibling_kw})
    seen = decoded_keys(monkeypatch)
    copied, _, copy_uri, decode_uri = both(job)
    assert copied.path == "copy"
    assert seen == decoded
    assert_same_output(copy_uri, decode_uri)


@pytest.mark.parametrize("statistics", [True, False], ids=["null-counted", "no-statistics"])
def test_a_null_key_stored_alike_in_base_and_sibling_is_still_a_mismatch(tmp_path, statistics):
    """Equal bytes decode to equal values, but a null key is never equal: a key chunk whose statistics count a
    null (or that has none) is decoded and compared, and the shard fails as on the decode path, nothing written."""
    job, base, groups = make(tmp_path, "one-group")
    keys = base["image_key"].to_pylist()
    keys[7] = None
    table = base.set_column(0, "image_key", pa.array(keys))
    write(table, tmp_path / "data" / "base" / REL, groups, compression="snappy", write_statistics=statistics)
    write(scores(table, "image_key", "dqm_d1_v6_1"), tmp_path / "data" / "dqm" / REL, groups,
          compression="snappy", write_statistics=statistics)
    with pytest.raises(Exception, match=r"operations\[0\].*key mismatch in 1 of 2500 rows; first at row 7"):
        merge_shard(job, REL)
    assert not any((tmp_path / "data").rglob("copy/**/*.parquet"))


@pytest.mark.parametrize("shaped", [False, True], ids=["float-scores", "struct-scores"])
@pytest.mark.parametrize("sibling_groups", [[2000], [700, 700, 600]], ids=["one-group", "cut-otherwise"])
def test_scores_of_a_row_group_larger_than_a_piece_are_encoded_in_pieces_into_one_chunk(tmp_path, monkeypatch,
                                                                                      sibling_groups, shaped):
    """Spark's layout: base row groups of ~128 MiB, score sidecars of one row group. A score column whose sibling
    is cut otherwise than the base is encoded PIECE_ROWS rows at a time (never a whole row group), its pieces'
    pages written one after another as one column chunk: the output reads back as the decode path's, in the
    base's row groups, and each stitched chunk's statistics (min, max, null count) and value count are those of
    its row group's values. A struct of scores (a float, an error string, a model name) is encoded leaf by leaf,
    each leaf a chunk of its own pieces."""
    monkeypatch.setattr(chunkcopy, "PIECE_ROWS", 300)
    LAYOUTS["large-groups"] = (2000, [1500, 500], sibling_groups, {"nulls": True, "shaped": shaped}, {}, False)
    try:
        job, _, _ = make(tmp_path, "large-groups")
    finally:
        del LAYOUTS["large-groups"]
    encoded, real = [], chunkcopy.one_group
    monkeypatch.setattr(chunkcopy, "one_group", lambda table, plain: (encoded.append(table.num_rows),
                                                                      real(table, plain))[1])
    copied, decoded, copy_uri, decode_uri = both(job)
    assert copied.path == "copy"
    assert encoded and max(encoded) <= 300, encoded
    assert_same_output(copy_uri, decode_uri)
    meta, table = pq.read_metadata(copy_uri), pq.read_table(copy_uri)
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [1500, 500]
    start = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for name in ("dqm_d1_v6_1", "ernie_image_aes"):
            leaf = f"{name}.raw_score" if shaped and name == "dqm_d1_v6_1" else name
            chunk = group.column([meta.schema.column(i).path for i in range(meta.num_columns)].index(leaf))
            values = table[name].slice(start, group.num_rows)
            if leaf != name:  # the leaf's values: null where the struct is
                values = pc.struct_field(values, "raw_score")
            low, high = pc.min_max(values).values()
            stats = chunk.statistics
            assert (stats.min, stats.max, stats.null_count) == (low.as_py(), high.as_py(), values.null_count)
            assert chunk.num_values == group.num_rows and not chunk.has_dictionary_page
        start += group.num_rows


@pytest.mark.slow
def test_the_copy_holds_a_fixed_buffer_whatever_the_rows_the_row_groups_and_the_budget(tmp_path):
    """Peak arrow memory of the copy path (the allocator's high-water mark, a fresh process each,
    test_streaming's shard): 250,000 and 1,000,000 rows in one row group a file, and the larger at budgets of 4
    and 32 MiB, all within 10% of each other (8.9 MiB measured: the 8 MiB of bytes in flight and a batch of
    keys), and under a tenth of the whole-table merge's at 1,000,000 rows."""
    import test_streaming as shard

    from tasks import storage

    peaks = {}
    for n in (250_000, 1_000_000):
        root = storage.normalize_prefix(str(tmp_path / str(n)))
        keys = [f"image-{i:09d}" for i in range(n)]
        paths = [f"s3://bucket/images/{k}.jpg" for k in keys]
        shard.write(pa.table({"key": keys, "path": paths, "size": list(range(n)), "w": [0.5] * n}),
                    f"{root}base/{shard.REL}", n)
        shard.write(pa.table({"key": keys, "dqm": [float(i) for i in range(n)]}), f"{root}dqm/{shard.REL}", n)
        shard.write(pa.table({"path": paths, "aes": list(range(n))}), f"{root}aes/{shard.REL}", n)
        peaks[n, 4] = shard.peak_of("copy", root, 4 << 20)
        if n == 1_000_000:
            peaks[n, 32] = shard.peak_of("copy", root, 32 << 20)
            whole = shard.peak_of("whole", root)
    mib = {k: round(v["peak"] / 2**20, 1) for k, v in peaks.items()}
    assert max(mib.values()) <= 1.1 * min(mib.values()), mib
    assert peaks[1_000_000, 4]["peak"] < 0.1 * whole["peak"], (mib, whole)


@pytest.mark.slow
def test_scores_encoded_into_larger_row_groups_hold_a_piece_not_the_row_group(tmp_path):
    """Spark's layout (W9: the base in row groups of ~128 MiB, each score sidecar one row group, so the scores are
    encoded into the base's row groups; DQM's a struct of a score, an error and a model name, as W9's): peak
    arrow memory of the copy path (a fresh process each) at 250,000
    and 1,000,000 rows, the base's first row group 85% of the shard, within 25% of each other: a piece of
    PIECE_ROWS rows of each score's leaf at a time (measured 8.9 -> 8.9 MiB); a whole row group of them at a
    time grew 3x (16.1 -> 47.8 MiB), and 2.0x from 1M to 4M rows in W9."""
    import test_streaming as shard

    from tasks import storage

    peaks = {}
    for n in (250_000, 1_000_000):
        root = storage.normalize_prefix(str(tmp_path / str(n)))
        keys = [f"image-{i:09d}" for i in range(n)]
        paths = [f"s3://bucket/images/{k}.jpg" for k in keys]
        base = f"{root}base/{shard.REL}"
        write(pa.table({"key": keys, "path": paths, "size": list(range(n)), "w": [0.5] * n}),
              pathlib.Path(base), [n * 85 // 100, n - n * 85 // 100])
        dqm = pa.StructArray.from_arrays([pa.array([i / n for i in range(n)]), pa.array([None] * n, pa.string()),
                                          pa.array(["model-v1"] * n)], names=["raw_score", "error", "model"])
        shard.write(pa.table({"key": keys, "dqm": dqm}), f"{root}dqm/{shard.REL}", n)
        shard.write(pa.table({"path": paths, "aes": [1 - i / n for i in range(n)]}), f"{root}aes/{shard.REL}", n)
        peaks[n] = shard.peak_of("copy", root, 32 << 20)
        assert peaks[n]["rows"] == n
    mib = {n: round(v["peak"] / 2**20, 1) for n, v in peaks.items()}
    print(f"peak arrow memory, 250,000 -> 1,000,000 rows: {mib[250_000]} -> {mib[1_000_000]} MiB")
    assert mib[1_000_000] <= 1.25 * mib[250_000], mib


def test_a_footer_field_the_writer_would_not_write_back_is_found_at_any_depth():
    """footer.lossless: a field numbered past what the Thrift writer writes (13), in a struct or in a list of
    structs at any depth, makes a chunk not copyable; the droppable ones are allowed at the top only."""
    from tasks.footer import lossless

    assert lossless({1: 2, 3: {4: 5}, 6: [{7: 8}], b"marker": 9})
    assert not lossless({14: 1})
    assert not lossless({1: {2: {20: 1}}})
    assert not lossless({1: [{2: 3}, {15: 1}]})
    assert lossless({15: 1}, {15})
    assert not lossless({1: {15: 1}}, {15})
