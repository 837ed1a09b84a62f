"""Helpers shared by the merge-core tests: demo data under a root plus dataset/pipeline YAMLs pointing at it.

`build(tmp_path, root)` writes the demo sidecars (base, dqm, aes, watermark) under ROOT (local or s3://),
a dataset YAML under tmp_path/cfg/datasets/ and a pipeline YAML under tmp_path/cfg/pipelines/ that refers
to the dataset by name, and returns a `Setup` with every prefix and path a test needs.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tasks import storage
from tasks.demo import FILTERS, make_dataset

# moto's server runs in the test process; its per-request INFO lines would otherwise reach the console
# handlers Prefect installs during an in-process `sidecar-ops run` (and a closed capsys stream afterwards).
logging.getLogger("werkzeug").setLevel(logging.WARNING)

FILTER_EXTENSIONS = [{"name": f"filter_{f}", "type": f"filter_{f}_v1"} for f in FILTERS]
SCORE_EXTENSIONS = [{"name": "dqm_d1_v6_1", "type": "dqm_score_v1"},
                    {"name": "ernie_image_aes", "type": "ernie_image_aes_score_v1"}]
WATERMARK_TYPE = {"watermark_score_v1": {"kind": "struct", "fields": {"score": "floating", "error": "string"}}}


@dataclass
class Setup:
    root: str
    prefixes: dict[str, str]   # base, dqm, aes, watermark
    pipeline: Path
    dataset: Path
    output: str                # ROOT/out/

    def inputs(self) -> list[str]:
        return list(self.prefixes.values())


def dqm_op(p: dict, **kw) -> dict:
    return {"type": "merge_from_sidecar", "source_prefix": p["dqm"], "columns": ["dqm_d1_v6_1"],
            "mode": "prefer_sidecar", **kw}


def aes_op(p: dict, **kw) -> dict:
    return {"type": "merge_from_sidecar", "source_prefix": p["aes"], "columns": ["ernie_image_aes"],
            "target_key_column": "s3_image_path", "source_key_column": "s3_image_path",
            "mode": "prefer_sidecar", **kw}


def watermark_op(p: dict, **kw) -> dict:
    return {"type": "merge_from_sidecar", "source_prefix": p["watermark"], "columns": ["watermark"], **kw}


def three_ops(p: dict) -> list[dict]:
    return [dqm_op(p), aes_op(p), watermark_op(p, required=False)]


def write_configs(tmp_path: Path, prefixes: dict[str, str], ops: list[dict] | None = None,
                  extensions: list | None = None, schema_types: dict | None = None, name: str = "core_test",
                  **dataset_fields) -> tuple[Path, Path]:
    cfg = tmp_path / "cfg"
    (cfg / "datasets").mkdir(parents=True, exist_ok=True)
    (cfg / "pipelines").mkdir(parents=True, exist_ok=True)
    dataset = {"name": name, "browse": False, "main_prefix": prefixes["base"],
               "sidecar_prefix": prefixes.get("sidecar", prefixes["base"].rstrip("/") + "_all_in_one/"),
               "key_column": "image_key", "image_column": "image", "source_inference": {"default": "test"},
               "schema_types": schema_types if schema_types is not None else dict(WATERMARK_TYPE),
               "schema_extensions": (extensions if extensions is not None else
                                     FILTER_EXTENSIONS + SCORE_EXTENSIONS
                                     + [{"name": "watermark", "type": "watermark_score_v1"}])}
    dataset.update(dataset_fields)
    dataset = {k: v for k, v in dataset.items() if v is not None}
    ds_path = cfg / "datasets" / f"{name}.yaml"
    ds_path.write_text(yaml.safe_dump(dataset, sort_keys=False))
    pl_path = cfg / "pipelines" / "merge.yaml"
    pl_path.write_text(yaml.safe_dump({"dataset": name, "operations": ops if ops is not None else three_ops(prefixes)},
                                      sort_keys=False))
    return pl_path, ds_path


def build(tmp_path: Path, root: str, shards: int = 3, rows: int = 40, ops=None, watermark_gap: bool = True,
          **kw) -> Setup:
    root = storage.normalize_prefix(root)
    prefixes = make_dataset(root + "in/", shards=shards, rows=rows, watermark_gap=watermark_gap)
    if ops is not None and callable(ops):
        ops = ops(prefixes)
    pipeline, dataset = write_configs(tmp_path, prefixes, ops=ops, **kw)
    return Setup(root, prefixes, pipeline, dataset, root + "out/")


# ----------------------------------------------------------------- reading and rewriting objects

def read_table(uri: str) -> pa.Table:
    with storage.open_parquet(uri) as f:
        return pq.ParquetFile(f).read()


def read_meta(uri: str) -> pq.FileMetaData:
    return storage.read_footer(uri)


def write_table(table: pa.Table, uri: str) -> None:
    storage.write_atomic(table, uri)


def put_bytes(uri: str, data: bytes) -> None:
    fs, path = storage.filesystem(uri)
    if not storage.is_s3(uri):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    fs.pipe_file(path, data)


def get_bytes(uri: str) -> bytes:
    fs, path = storage.filesystem(uri)
    return fs.cat_file(path)


def remove(uri: str) -> None:
    fs, path = storage.filesystem(uri)
    fs.rm(path)


def objects(prefix: str) -> list[str]:
    """Every object (relpath) under a prefix, temp files included."""
    fs, path = storage.filesystem(prefix)
    try:
        found = fs.find(path)
    except FileNotFoundError:
        return []
    return sorted(p[len(path):].lstrip("/") for p in found)


def expected_output(setup: Setup, relpath: str, columns: list[tuple[str, str]]) -> pa.Table:
    """Base columns minus the image column, then each (sidecar, column) appended in order."""
    base = read_table(setup.prefixes["base"] + relpath)
    if "image" in base.column_names:
        base = base.drop_columns(["image"])
    for sidecar, col in columns:
        src = read_table(setup.prefixes[sidecar] + relpath)
        base = base.append_column(src.schema.field(col), src[col])
    return base.replace_schema_metadata(None)


def swap_rows_fn(uri: str, i: int, j: int) -> None:
    """Rewrite a shard in place with rows i and j swapped (a sidecar whose order drifted)."""
    table = read_table(uri).replace_schema_metadata(None)
    order = list(range(table.num_rows))
    order[i], order[j] = order[j], order[i]
    write_table(table.take(order), uri)


def identities(prefix: str) -> dict[str, object]:
    """Per output shard, something that changes whenever it is rewritten: (inode, mtime_ns) on disk, the list
    of object versions on S3 (the test buckets have versioning on)."""
    if prefix.startswith("s3://"):
        bucket, _, key = prefix[5:].partition("/")
        s3 = boto3.client("s3")
        found: dict[str, list] = {}
        pages = s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=key)
        for page in pages:
            for v in page.get("Versions", []) + page.get("DeleteMarkers", []):
                found.setdefault(v["Key"][len(key):], []).append(v["VersionId"])
        return {k: sorted(v) for k, v in found.items()}
    out = {}
    for rel in objects(prefix):
        st = os.stat(prefix + rel)
        out[rel] = (st.st_ino, st.st_mtime_ns)
    return out


def versioned(root: str) -> str:
    if root.startswith("s3://"):
        boto3.client("s3").put_bucket_versioning(Bucket=root[5:].rstrip("/"),
                                                 VersioningConfiguration={"Status": "Enabled"})
    return root


def release_console_handlers() -> None:
    """After an in-process `sidecar-ops run`, point Prefect's console handlers at the real stderr.

    They were created on the capsys stream of that run; Prefect's background threads may still log a line
    later (e.g. "Still processing items"), which would hit a closed stream in a later test."""
    import sys

    for logger in [logging.getLogger(), *[logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]]:
        for handler in getattr(logger, "handlers", []):
            console = getattr(handler, "console", None)
            if console is not None:
                console.file = sys.__stderr__
            elif isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                handler.stream = sys.__stderr__  # not setStream(): that flushes the closed stream first



def task_runs(flow_run_id, wanted: set[str]) -> list:
    """A flow run's task runs, once every name in `wanted` has one in a final state: task runs reach the API
    through events, after the run returned."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs: list = []
    with get_client(sync_client=True) as client:
        for _ in range(100):
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if wanted <= {r.name for r in runs if r.state and r.state.is_final()}:
                break
            time.sleep(0.2)
    return runs


def flow_run_named(name: str):
    """The one flow run of that name on the session's API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        [found] = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return found


def merge_dag(output: str, rels, operations: int = 3) -> set[str]:
    """The task runs of a default merge run into `output` (the normalized prefix): a listing a prefix (the base,
    each operation's sibling prefix, the output), a merge a shard, the run's check."""
    return {"list main_prefix", *(f"list operations[{i}].source_prefix" for i in range(operations)),
            "list output prefix", *(f"merge {rel}" for rel in rels), f"verify run {output}"}
