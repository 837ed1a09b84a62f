"""Helpers shared by the reliability tests: a demo pipeline under any root, output checks, subprocess runs."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import make_dataset
from tasks.kernel import Job, ShardStats, check_written

REPO = Path(__file__).resolve().parent.parent
DEMO_DATASET = REPO / "datasets" / "demo_filters_dqm_ernie_image_aes.yaml"
DEMO_PIPELINE = REPO / "pipelines" / "demo_merge_filters_dqm_ernie_image_aes.yaml"


@dataclass
class Demo:
    pipeline: str          # path of the pipeline YAML
    prefixes: dict         # name -> prefix of base/dqm/aes/watermark
    output: str            # the output prefix the test uses

    def job(self, output: str | None = None) -> Job:
        return Job(load_pipeline(self.pipeline), output or self.output)


def make_demo(tmp_path: Path, root: str, shards: int, rows: int, output: str | None = None) -> Demo:
    """The demo sidecars under `root`, and a dataset + pipeline YAML pointing at them."""
    root = storage.normalize_prefix(root)
    prefixes = make_dataset(root, shards=shards, rows=rows)
    (tmp_path / "datasets").mkdir(exist_ok=True)
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    dataset = DEMO_DATASET.read_text().replace("demo-data/", root)
    (tmp_path / "datasets" / DEMO_DATASET.name).write_text(dataset)
    pipeline = tmp_path / "pipelines" / DEMO_PIPELINE.name
    pipeline.write_text(DEMO_PIPELINE.read_text().replace("demo-data/", root))
    return Demo(str(pipeline), prefixes, output or f"{root}all_in_one/")


def output_shards(output: str) -> storage.Listing:
    return storage.list_prefix(output)


def assert_no_partial_shard(demo: Demo, output: str | None = None) -> list[str]:
    """Every *.parquet under the output (any size) reads fully and has its base shard's row count."""
    output = output or demo.output
    fs, root = storage.filesystem(output)
    try:
        found = [p for p in fs.find(root) if p.endswith(".parquet")]
    except FileNotFoundError:
        return []
    rels = []
    for path in found:
        rel = path[len(root.rstrip("/")) + 1:] if not storage.is_s3(output) else path[len(root):]
        with storage.open_parquet(output + rel) as f:
            table = pq.ParquetFile(f).read()
        base_rows = storage.read_footer(demo.prefixes["base"] + rel).num_rows
        assert table.num_rows == base_rows, f"{rel}: {table.num_rows} rows, base has {base_rows}"
        rels.append(rel)
    return sorted(rels)


def assert_output_verifies(demo: Demo, output: str | None = None) -> None:
    """Exactly the base's shards are present, and each passes the kernel's own verifier."""
    job = demo.job(output)
    base = storage.list_prefix(demo.prefixes["base"]).shards
    out = storage.list_prefix(job.output_prefix)
    assert sorted(out.shards) == sorted(base), f"output shards differ from base: {sorted(out.shards)}"
    for rel in base:
        rows = storage.read_footer(job.base_uri(rel)).num_rows
        names = storage.read_footer(job.output_uri(rel)).schema.to_arrow_schema().names
        check_written(job, rel, ShardStats(rel, rows, 0, skipped_ops=0 if "watermark" in names else 1))


SMALL_PARTS = {"SIDECAR_OPS_MULTIPART_THRESHOLD": str(16 * 1024), "SIDECAR_OPS_PART_SIZE": str(8 * 1024)}


def allow_small_parts(monkeypatch) -> dict:
    """Let moto (in this process) accept parts of a few KB; returns the env that makes a child process write
    outputs above 16 KB as multipart uploads of 8 KB parts."""
    import moto.s3.models

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 256)
    return dict(SMALL_PARTS)


def pending_uploads(moto_endpoint: str, prefix: str) -> list:
    """Unfinished multipart uploads in the bucket of an s3:// prefix, asked of moto directly."""
    import boto3

    bucket = prefix[len("s3://"):].split("/", 1)[0]
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    return s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def cli_env(**extra: str) -> dict:
    """Environment of a `sidecar-ops` child process: this one's (AWS endpoint, Prefect API) plus `extra`."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", *map(str, args)]


def run_cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(*args), cwd=REPO, env=env or cli_env(), capture_output=True, text=True,
                          timeout=timeout)
