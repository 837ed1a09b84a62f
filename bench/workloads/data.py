"""Benchmark datasets on local disk: the realistic schema of tasks.demo, scaled, plus YAMLs pointing at it.

A case is a folder with base/, dqm/, aes/ sidecars (relpaths as in the demo: year folders), a
datasets/bench.yaml and pipelines/bench.yaml with absolute prefixes, and room for outputs. Cases are
reused when their parameters match (bench/data/ is gitignored). `linked=True` writes one shard per
sidecar and hard-links it under every relpath: thousands of (identical, aligned) tiny shards in seconds.
tasks.demo is imported only to build a case, so a floor script that merely loads one stays plain pyarrow.

`layout` is how the row groups are cut, as the writers users have cut them (every sidecar of a case alike):
  small    50,000-row groups (what the workloads used before layouts; the default, so their data is reused)
  pyarrow  pq.write_table's default (1,048,576 rows a group)
  one      one row group a shard
  spark    ~128 MiB of compressed parquet a group (Spark's parquet.block.size), rows a group taken from a
           sample write of the same table; each file is cut by its own size, as Spark writes each dataset on
           its own (so the small score sidecars are one row group while a large base is several)
`codec` is the inputs' compression: zstd (the default), or snappy (Spark's and many real datasets'), which the
copy path keeps in the output while `--recompress zstd` and the zstd floor rewrite it. `sibling_codec`, when
given, compresses the score sidecars otherwise than the base (a scoring job whose writer is not the base's): their
key chunks are then other bytes than the base's, so the copy path decodes and compares the keys (with one writer
for all, equal bytes prove them equal undecoded).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SIDECARS = ("base", "dqm", "aes")
ROW_GROUP = 50_000
LAYOUTS = ("small", "pyarrow", "one", "spark")
SPARK_GROUP_BYTES = 128 * 2**20
SPARK_SAMPLE_ROWS = 100_000
LINKS_PER_INODE = 20_000  # ext4 allows 65,000 links per inode

DATASET_YAML = """name: bench
main_prefix: {root}/base/
sidecar_prefix: {root}/all_in_one/
key_column: image_key
image_column: image
source_inference: {{default: bench, dqm_d1_v6_1: DQM-d1-V6.1, ernie_image_aes: ERNIE-Image-Aes}}
schema_extensions:
{exts}
"""
PIPELINE_YAML = """dataset: bench
operations:
  - type: merge_from_sidecar
    source_prefix: {src}/dqm/
    columns: [dqm_d1_v6_1]
    mode: prefer_sidecar
  - type: merge_from_sidecar
    source_prefix: {src}/aes/
    columns: [ernie_image_aes]
    target_key_column: s3_image_path
    source_key_column: s3_image_path
    mode: prefer_sidecar
"""


@dataclass(frozen=True)
class Case:
    root: Path
    relpaths: tuple[str, ...]
    rows: tuple[int, ...]

    def path(self, sidecar: str, rel: str) -> str:
        return str(self.root / sidecar / rel)

    @property
    def pipeline(self) -> str:
        return str(self.root / "pipelines" / "bench.yaml")

    def output(self, name: str) -> str:
        """A fresh (emptied) output folder; returns its prefix with a trailing slash."""
        out = self.root / "out" / name
        shutil.rmtree(out, ignore_errors=True)
        return str(out) + "/"

    def bytes_on_disk(self, sidecar: str = "base") -> int:
        return sum(os.path.getsize(self.path(sidecar, r)) for r in self.relpaths)


def write_yamls(root: Path, source_root: str | None = None) -> None:
    """datasets/bench.yaml + pipelines/bench.yaml; `source_root` (e.g. s3://bucket/case) overrides the prefixes."""
    from tasks.demo import FILTERS

    src = source_root or str(root)
    exts = [f"filter_{f}" for f in FILTERS]
    lines = [f"  - {{name: {e}, type: {e}_v1}}" for e in exts]
    lines += ["  - {name: dqm_d1_v6_1, type: dqm_score_v1}", "  - {name: ernie_image_aes, type: ernie_image_aes_score_v1}"]
    (root / "datasets").mkdir(parents=True, exist_ok=True)
    (root / "pipelines").mkdir(parents=True, exist_ok=True)
    (root / "datasets" / "bench.yaml").write_text(DATASET_YAML.format(root=src, exts="\n".join(lines)))
    (root / "pipelines" / "bench.yaml").write_text(PIPELINE_YAML.format(src=src))


def layout_rows(table, layout: str) -> int | None:
    """Rows a row group for `layout` (None: pyarrow's default, which write_table applies when given none)."""
    if layout == "small":
        return ROW_GROUP
    if layout == "one":
        return max(table.num_rows, 1)
    if layout == "spark":
        sample = table.slice(0, SPARK_SAMPLE_ROWS)
        buf = pa.BufferOutputStream()
        pq.write_table(sample, buf, compression="zstd", row_group_size=max(sample.num_rows, 1))
        per_row = buf.getvalue().size / max(sample.num_rows, 1)
        return max(int(SPARK_GROUP_BYTES / per_row), 1)
    if layout == "pyarrow":
        return None
    raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")


def _write(table, path: str, layout: str, codec: str = "zstd") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path, compression=codec, row_group_size=layout_rows(table, layout))


def _same_case(marker: Path, params: dict) -> bool:
    """The marker names the same case; one written before layouts existed is the small layout."""
    if not marker.exists():
        return False
    old = json.loads(marker.read_text())
    old.setdefault("layout", "small")
    old.setdefault("codec", "zstd")
    return old == params


def make_case(root: Path, shards: int, rows: int | list[int], linked: bool = False,
              layout: str = "small", codec: str = "zstd", sibling_codec: str | None = None) -> Case:
    """Build (or reuse) a case; `rows` is per shard (an int for all shards); `layout` cuts the row groups;
    `codec` compresses every input, or the base only where `sibling_codec` compresses the score sidecars."""
    from tasks.demo import relpaths, shard_tables

    root = Path(root)
    per_shard = list(rows) if isinstance(rows, list) else [rows] * shards
    params = {"shards": shards, "rows": per_shard if len(set(per_shard)) > 1 else per_shard[0], "linked": linked,
              "row_group": ROW_GROUP, "version": 2, "layout": layout,
              "codec": codec, **({"sibling_codec": sibling_codec} if sibling_codec else {})}
    codecs = {name: sibling_codec or codec if name != "base" else codec for name in SIDECARS}
    rels = relpaths(shards)
    case = Case(root, tuple(rels), tuple(per_shard))
    marker = root / "ready.json"
    if _same_case(marker, params):
        marker.write_text(json.dumps(params))
        return case
    for name in (*SIDECARS, "out", "templates"):
        shutil.rmtree(root / name, ignore_errors=True)
    if linked:
        templates = {}
        for i, rel in enumerate(rels):
            chunk = i // LINKS_PER_INODE
            if chunk not in templates:
                templates[chunk] = {}
                for name, table in shard_tables(chunk, per_shard[0]).items():
                    if name in SIDECARS:
                        path = str(root / "templates" / f"{name}-{chunk}.parquet")
                        _write(table, path, layout, codecs[name])
                        templates[chunk][name] = path
            for name in SIDECARS:
                dest = case.path(name, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                os.link(templates[chunk][name], dest)
    else:
        for i, rel in enumerate(rels):
            for name, table in shard_tables(i, per_shard[i]).items():
                if name in SIDECARS:
                    _write(table, case.path(name, rel), layout, codecs[name])
    write_yamls(root)
    marker.write_text(json.dumps(params))
    return case


def load_case(root: Path) -> Case:
    """A case already built under `root` (by make_case), found by listing its base/ folder."""
    root = Path(root)
    params = json.loads((root / "ready.json").read_text())
    base = root / "base"
    rels = sorted(str(p.relative_to(base)) for p in base.rglob("*.parquet"))
    rows = params["rows"] if isinstance(params["rows"], list) else [params["rows"]] * len(rels)
    assert len(rels) == params["shards"], f"{root}: {len(rels)} base shards, expected {params['shards']}"
    return Case(root, tuple(rels), tuple(rows))


def check_rows(case: Case, out: str, name: str) -> None:
    """Every output shard of `case` exists under `out` with the base's row count (its footer)."""
    for rel, rows in zip(case.relpaths, case.rows):
        got = pq.ParquetFile(out + rel).metadata.num_rows
        assert got == rows, f"{name}: {rel} has {got} rows, expected {rows}"


def count_outputs(out: str) -> int:
    """Parquet files under an output prefix (how many shards a run wrote)."""
    return sum(name.endswith(".parquet") for _, _, names in os.walk(out) for name in names)
