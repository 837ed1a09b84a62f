"""A small, realistic demo dataset: a filters base sidecar plus DQM, AES and watermark score sidecars.

Layout under ROOT (a local path or s3:// prefix):
  base/       image_key, s3_image_path, width, height, six filter_* structs   (nested year folders)
  dqm/        image_key, dqm_d1_v6_1 {raw_score, error, model}                keyed by image_key
  aes/        s3_image_path, ernie_image_aes {raw_score, score, error}        keyed by s3_image_path
  watermark/  image_key, watermark {score, error}                             one shard deliberately absent
A few rows carry score errors and null raw scores, as real GPU sidecars do.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks import storage

FILTERS = ["clarity", "texture", "saturation", "luma", "color_entropy", "edge_density"]
DEMO_PIPELINE = "pipelines/demo_merge_filters_dqm_ernie_image_aes.yaml"
DEMO_ROOT = "demo-data"


def relpaths(shards: int) -> list[str]:
    return [f"{2023 + i % 3}/part-{i:05d}.parquet" for i in range(shards)]


def _struct(fields: dict[str, pa.Array]) -> pa.StructArray:
    return pa.StructArray.from_arrays(list(fields.values()), names=list(fields))


def _errors(rng, n: int, rate: float, message: str) -> pa.Array:
    flags = rng.random(n) < rate
    return pa.array([message if f else None for f in flags], pa.string())


def _scores(rng, n: int, null_rate: float, low=0.0, high=1.0) -> pa.Array:
    values = rng.uniform(low, high, n).astype(np.float32)
    return pa.array(values, pa.float32(), mask=rng.random(n) < null_rate)


def shard_tables(index: int, rows: int, seed: int = 0) -> dict[str, pa.Table]:
    rng = np.random.default_rng(seed * 100_003 + index)
    keys = [f"img-{index:05d}-{r:07d}" for r in range(rows)]
    paths = [f"s3://images-bucket/raw/{index:05d}/{k}.jpg" for k in keys]
    base = {"image_key": pa.array(keys), "s3_image_path": pa.array(paths),
            "width": pa.array(rng.integers(256, 4096, rows), pa.int32()),
            "height": pa.array(rng.integers(256, 4096, rows), pa.int32())}
    for name in FILTERS:
        base[f"filter_{name}"] = _struct({"score": _scores(rng, rows, 0.0),
                                          "error": _errors(rng, rows, 0.002, "decode failed")})
    dqm = {"image_key": pa.array(keys),
           "dqm_d1_v6_1": _struct({"raw_score": _scores(rng, rows, 0.01, -3, 3),
                                   "error": _errors(rng, rows, 0.01, "image too small"),
                                   "model": pa.array(["dqm-d1-v6.1"] * rows)})}
    aes = {"s3_image_path": pa.array(paths),
           "ernie_image_aes": _struct({"raw_score": _scores(rng, rows, 0.01, 0, 10),
                                       "score": _scores(rng, rows, 0.01),
                                       "error": _errors(rng, rows, 0.005, "timeout")})}
    watermark = {"image_key": pa.array(keys),
                 "watermark": _struct({"score": _scores(rng, rows, 0.0), "error": _errors(rng, rows, 0.0, "")})}
    return {name: pa.table(cols) for name, cols in
            {"base": base, "dqm": dqm, "aes": aes, "watermark": watermark}.items()}


def make_dataset(root: str, shards: int = 12, rows: int = 2000, seed: int = 0,
                 watermark_gap: bool = True) -> dict[str, str]:
    """Write the four sidecars under `root`; returns {name: prefix}."""
    root = storage.normalize_prefix(root)
    prefixes = {name: f"{root}{name}/" for name in ("base", "dqm", "aes", "watermark")}
    for i, rel in enumerate(relpaths(shards)):
        for name, table in shard_tables(i, rows, seed).items():
            if name == "watermark" and watermark_gap and i == shards - 1:
                continue  # the watermark job never covered this shard
            storage.write_atomic(table, prefixes[name] + rel)
    return prefixes
