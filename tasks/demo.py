"""A small, realistic demo dataset: a filters base sidecar plus DQM, AES and watermark score sidecars.

Layout under ROOT (a local path or s3:// prefix):
  base/       image_key, s3_image_path, width, height, six filter_* structs   (nested year folders)
  dqm/        image_key, dqm_d1_v6_1 {raw_score, error, model}                keyed by image_key
  aes/        s3_image_path, ernie_image_aes {raw_score, score, error}        keyed by s3_image_path
  watermark/  image_key, watermark {score, error}                             one shard deliberately absent
A few rows carry score errors and null raw scores, as real GPU sidecars do.
"""
from __future__ import annotations

import shutil
from pathlib import Path, PurePath

import numpy as np
import pyarrow as pa

from tasks import storage
from tasks.errors import ConfigError
from tasks.storage.backend import TEMP_MARK

FILTERS = ["clarity", "texture", "saturation", "luma", "color_entropy", "edge_density"]
DEMO_PIPELINE = "pipelines/demo_merge_filters_dqm_ernie_image_aes.yaml"
DEMO_DATASET = "datasets/demo_filters_dqm_ernie_image_aes.yaml"
DEMO_ROOT = "demo-data"
REPO = Path(__file__).resolve().parents[1]  # the shipped demo YAMLs (editable install)
MARKER = ".sidecar-ops-demo"  # written at the root: this folder holds a demo
DATA = ("base", "dqm", "aes", "watermark", "all_in_one")  # folders of parquet shards the demo and its merge write


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


# ----------------------------------------------------------------- the demo's root


MANIFEST_HEAD = "Written by `sidecar-ops demo`: a later demo may replace the files listed below (and nothing else):"


def demo_paths(shards: int, watermark_gap: bool = True) -> list[str]:
    """Every file a demo of `shards` shards writes under its root (the merge's outputs included), relative."""
    rels = relpaths(shards)
    data = [f"{name}/{rel}" for name in ("base", "dqm", "aes", "all_in_one") for rel in rels]
    data += [f"watermark/{rel}" for rel in (rels[:-1] if watermark_gap else rels)]
    return [MARKER, DEMO_PIPELINE, DEMO_DATASET, *data]


def written_by_demo(root: Path) -> set[str]:
    """The files the marker says an earlier demo wrote (an older demo's marker lists none but itself and its
    YAMLs: its data is then refused, never guessed at)."""
    lines = (root / MARKER).read_text().splitlines()
    return {MARKER, DEMO_PIPELINE, DEMO_DATASET, *(line for line in lines[1:] if line)}


def made_by_demo(rel: PurePath, is_dir: bool, written: set[str]) -> bool:
    """Whether a path under the root is one a demo made: a file its marker lists, a folder holding one, or a
    temp file of an interrupted write in such a folder (the merge's)."""
    path = rel.as_posix()
    if is_dir:
        return any(w.startswith(path + "/") for w in written)
    if rel.name.startswith(TEMP_MARK):
        return made_by_demo(rel.parent, True, written)
    return path in written


def clear_root(root: Path) -> None:
    """Make `root` an empty folder for the demo, deleting only what an earlier demo wrote there.

    Refused (ConfigError) when root is not a folder, or holds anything without the marker an earlier demo
    leaves, or anything its marker does not list (a user's file, even a *.parquet in a demo folder): nothing is
    deleted then."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"demo --root {root}: not a folder; choose another --root")
    found = sorted(root.rglob("*")) if root.exists() else []
    if found and not (root / MARKER).is_file():
        raise ConfigError(f"demo --root {root}: not empty and without the {MARKER} marker a demo leaves (holds "
                          f"{found[0].relative_to(root)}); choose another --root, or delete the folder yourself "
                          "if an older demo made it")
    written = written_by_demo(root) if found else set()
    foreign = [p for p in found if p.is_symlink() or not made_by_demo(p.relative_to(root), p.is_dir(), written)]
    foreign.sort(key=lambda p: p.is_dir() and not p.is_symlink())  # name a file of the user's, not its folder
    if foreign:
        raise ConfigError(f"demo --root {root}: holds {foreign[0].relative_to(root)}, which the demo did not "
                          "write; move it away or choose another --root (nothing was deleted)")
    for path in found:
        if path.parent == root:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    root.mkdir(parents=True, exist_ok=True)


def write_marker(root: Path, paths: list[str]) -> None:
    """The marker, listing every file this demo is about to write: written first, so a demo stopped half-way
    still says what it may have left."""
    (root / MARKER).write_text("\n".join([MANIFEST_HEAD, *paths]) + "\n")


def write_yamls(root: Path) -> None:
    """The shipped demo pipeline and dataset YAMLs, their prefixes moved under `root` (absolute)."""
    prefix = storage.normalize_prefix(str(root))
    for rel in (DEMO_DATASET, DEMO_PIPELINE):
        source = REPO / rel
        text = "\n".join(line for line in source.read_text().splitlines() if "yaml-language-server" not in line)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# Written by `sidecar-ops demo` from {rel}, prefixes under {prefix}\n"
                                + text.replace(f"{DEMO_ROOT}/", prefix) + "\n")


def build_demo(root: str, shards: int, rows: int) -> tuple[Path, str]:
    """Clear the demo root (`clear_root`), write the demo data and YAMLs under it; returns the pipeline YAML
    and the output prefix, spelled from `root` as given. Local folders only: the YAMLs live beside the data,
    and their prefixes are absolute, so they work from any working directory."""
    if "://" in root:
        raise ConfigError(f"demo --root {root}: the demo writes a local folder; give a local path")
    folder = Path(root).absolute()
    clear_root(folder)
    write_marker(folder, demo_paths(shards))
    make_dataset(str(folder), shards=shards, rows=rows)
    write_yamls(folder)
    return Path(root) / DEMO_PIPELINE, f"{root.rstrip('/')}/all_in_one/"
