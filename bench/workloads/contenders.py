"""The W1 contenders: each merges every shard of a case (DQM + AES into the base) into an output folder.

floor    minimal pyarrow: read base, read only the two score columns, append, write (zstd, same row groups)
kernel   tasks.kernel.merge_shard (read, align-check, write atomically, the post-write check), shard after shard:
         the copy path (the base's column chunks copied as bytes, tasks/chunkcopy.py)
kernel_decode   the same with `--recompress zstd`: the decode path (every column decoded and encoded as zstd)
kernel_noverify   the same chain without the post-write check (store_output: the like-for-like comparison with the floor)
pandas   pd.read_parquet (pyarrow dtypes) + merge on the keys + to_parquet (zstd, same row groups)
duckdb   COPY (base POSITIONAL JOIN dqm POSITIONAL JOIN aes) TO parquet (zstd, same row groups)

Also run alone in a fresh interpreter (bench/workloads/probe.py `contender`), not in W1:
floor_keys   the floor that also reads each source's key column and checks it equals the base's (W7, W9 (a))
floor_keys_same_codec   the same, writing the base's codec rather than zstd (W7, against the copy path)
verify_whole the guide's validation of a merged output, whole tables (W9 (e)): read the output, the base and
             each source's key and score columns whole; compare the keys, the base columns, the merged columns
ray_kernel   plain Ray: one ray.remote merge_shard per shard, a bounded window of refs in flight (W6)
"""
from __future__ import annotations

import os

import pyarrow.parquet as pq

from bench.workloads.data import Case


def _row_group(path: str) -> int:
    md = pq.ParquetFile(path).metadata
    return max(md.row_group(i).num_rows for i in range(md.num_row_groups))


def _dest(out: str, rel: str) -> str:
    path = out + rel
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


SOURCES = (("dqm", "image_key", "dqm_d1_v6_1"), ("aes", "s3_image_path", "ernie_image_aes"))  # as in bench.yaml


def floor(case: Case, out: str, check_keys: bool = False, codec: str | None = "zstd") -> None:
    """`codec` None: the base's own (as its first column chunk names it)."""
    for rel in case.relpaths:
        pf = pq.ParquetFile(case.path("base", rel))
        table = pf.read(use_threads=True)
        groups = max(pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups))
        for sidecar, key, column in SOURCES:
            src = pq.ParquetFile(case.path(sidecar, rel)).read(columns=[key, column] if check_keys else [column],
                                                               use_threads=True)
            if check_keys and not src.column(key).equals(table.column(key)):
                raise ValueError(f"{rel}: {sidecar} {key} differs from the base's")
            table = table.append_column(src.schema.field(column), src.column(column))
        compression = codec or pf.metadata.row_group(0).column(0).compression.lower()
        pq.write_table(table, _dest(out, rel), compression=compression, row_group_size=groups)


def floor_keys(case: Case, out: str) -> None:
    floor(case, out, check_keys=True)


def floor_keys_same_codec(case: Case, out: str) -> None:
    floor(case, out, check_keys=True, codec=None)


def verify_whole(case: Case, out: str) -> None:
    """`out` is a merged output of `case` (an output folder of floor or sidecar-ops run), checked shard by shard."""
    for rel in case.relpaths:
        merged = pq.read_table(out + rel)
        base = pq.read_table(case.path("base", rel))
        for name in base.column_names:
            if not merged.column(name).equals(base.column(name)):
                raise ValueError(f"{rel}: the output's {name} differs from the base's")
        for sidecar, key, column in SOURCES:
            src = pq.read_table(case.path(sidecar, rel), columns=[key, column])
            if not src.column(key).equals(merged.column(key)):
                raise ValueError(f"{rel}: {sidecar} {key} differs from the output's")
            if not src.column(column).equals(merged.column(column)):
                raise ValueError(f"{rel}: the output's {column} differs from {sidecar}'s")


def _job(case: Case, out: str, recompress: str = ""):
    from tasks.config import load_pipeline
    from tasks.kernel import Job

    return Job(load_pipeline(case.pipeline), out, recompress=recompress)


def kernel(case: Case, out: str, recompress: str = "") -> None:
    from tasks.kernel import merge_shard

    job = _job(case, out, recompress)
    for rel in case.relpaths:
        merge_shard(job, rel)


def kernel_decode(case: Case, out: str) -> None:
    kernel(case, out, recompress="zstd")


def kernel_noverify(case: Case, out: str) -> None:
    from tasks.kernel import apply_operation, read_base, store_output

    job = _job(case, out)
    for rel in case.relpaths:
        state = read_base(job, rel)
        for index in range(len(job.pipeline.operations)):
            state = apply_operation(job, rel, index, state)
        store_output(job, rel, state)


def ray_kernel(case: Case, out: str, window: int = 32) -> None:
    """merge_shard as plain Ray tasks on a local Ray started here; no Prefect. `window` = --max-inflight."""
    import logging

    import ray

    from tasks.kernel import merge_shard

    ray.init(address="local", log_to_driver=False, logging_level=logging.WARNING)
    try:
        remote, job, pending, done = ray.remote(merge_shard), ray.put(_job(case, out)), [], 0
        for rel in case.relpaths:
            if len(pending) >= window:
                ready, pending = ray.wait(pending, num_returns=1)
                done += len(ray.get(ready))
            pending.append(remote.remote(job, rel))
        done += len(ray.get(pending))
        assert done == len(case.relpaths), (done, len(case.relpaths))
    finally:
        ray.shutdown()


def pandas(case: Case, out: str) -> None:
    import pandas as pd

    for rel in case.relpaths:
        base = pd.read_parquet(case.path("base", rel), dtype_backend="pyarrow")
        dqm = pd.read_parquet(case.path("dqm", rel), columns=["image_key", "dqm_d1_v6_1"], dtype_backend="pyarrow")
        aes = pd.read_parquet(case.path("aes", rel), columns=["s3_image_path", "ernie_image_aes"],
                              dtype_backend="pyarrow")
        merged = base.merge(dqm, on="image_key", how="left").merge(aes, on="s3_image_path", how="left")
        merged.to_parquet(_dest(out, rel), compression="zstd", row_group_size=_row_group(case.path("base", rel)),
                          index=False)


def duckdb(case: Case, out: str) -> None:
    import duckdb as ddb

    con = ddb.connect()
    try:
        for rel in case.relpaths:
            b, d, a = (case.path(s, rel).replace("'", "''") for s in ("base", "dqm", "aes"))
            dest = _dest(out, rel).replace("'", "''")
            con.execute(
                f"COPY (SELECT * FROM read_parquet('{b}') "
                f"POSITIONAL JOIN (SELECT dqm_d1_v6_1 FROM read_parquet('{d}')) "
                f"POSITIONAL JOIN (SELECT ernie_image_aes FROM read_parquet('{a}'))) "
                f"TO '{dest}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {_row_group(case.path('base', rel))})")
    finally:
        con.close()


CONTENDERS = {"floor": floor, "kernel": kernel, "kernel_decode": kernel_decode, "kernel_noverify": kernel_noverify,
              "pandas": pandas, "duckdb": duckdb}
ALONE = {**CONTENDERS, "floor_keys": floor_keys, "floor_keys_same_codec": floor_keys_same_codec, "ray_kernel": ray_kernel, "verify_whole": verify_whole}
