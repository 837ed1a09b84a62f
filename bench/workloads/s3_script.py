"""The W8 floor: a minimal pyarrow script that merges every shard on S3, each input opened once and each output
written once. Plain pyarrow (its own S3 filesystem), nothing of this project; run as a fresh process:

    python bench/workloads/s3_script.py SPEC.json REPORT.json

SPEC: {"bucket", "base", "sources": [[prefix, key column, score column], ...], "output", "relpaths",
"threads"} (prefixes are keys inside the bucket, ending in '/'). Per shard: read the base, read each source's
key and score columns, check the keys equal the base's, append the score column, write zstd parquet with the
base's row groups. `threads` > 1 merges that many shards at once. The endpoint is AWS_ENDPOINT_URL.

With "verify": true in SPEC, the guide's validation of the merged output under "output" instead (W8's floor for
`sidecar-ops verify --all`): list the four prefixes (base, each source, output) and check every base shard has
its sources and its output; per shard, `threads` at once, read the base, each source's key and score columns
and the output once each, whole (opened from the listing's sizes: no HEAD), and compare the keys, the base
columns and the merged columns.
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

T0 = time.time()

import pyarrow.dataset as pads  # noqa: E402
import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

PARQUET = pads.ParquetFileFormat()


def s3() -> pafs.S3FileSystem:
    url = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    return pafs.S3FileSystem(endpoint_override=url.netloc, scheme=url.scheme or "http",
                             region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                             allow_delayed_open=True)  # a small output is one PUT at close, not a multipart upload


def merge(fs: pafs.S3FileSystem, spec: dict, rel: str) -> int:
    bucket = spec["bucket"]
    with fs.open_input_file(f"{bucket}/{spec['base']}{rel}") as f:
        pf = pq.ParquetFile(f, pre_buffer=True)
        table = pf.read()
        groups = max(pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups))
    for prefix, key, column in spec["sources"]:
        with fs.open_input_file(f"{bucket}/{prefix}{rel}") as f:
            src = pq.ParquetFile(f, pre_buffer=True).read(columns=[key, column])
        if not src.column(key).equals(table.column(key)):
            raise ValueError(f"{rel}: {prefix} {key} differs from the base's")
        table = table.append_column(src.schema.field(column), src.column(column))
    with fs.open_output_stream(f"{bucket}/{spec['output']}{rel}") as out:
        pq.write_table(table, out, compression="zstd", row_group_size=groups)
    return table.num_rows


def read(fs: pafs.S3FileSystem, info: pafs.FileInfo, columns: list[str] | None = None):
    """A file read whole, its size taken from the listing (no HEAD request)."""
    fragment = PARQUET.make_fragment(info.path, filesystem=fs, file_size=info.size)
    return fragment.to_table(columns=columns)


def listed(fs: pafs.S3FileSystem, bucket: str, prefix: str) -> dict[str, pafs.FileInfo]:
    """relpath -> FileInfo of the parquet files under a prefix (one listing)."""
    infos = fs.get_file_info(pafs.FileSelector(f"{bucket}/{prefix}", recursive=True))
    start = len(f"{bucket}/{prefix}")
    return {i.path[start:]: i for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")}


def listings(fs: pafs.S3FileSystem, spec: dict) -> list[tuple[str, dict]]:
    """Per base relpath, the FileInfo of its base, output and sources (by prefix), once all four are listed
    and every base shard has its output and its sources."""
    bucket = spec["bucket"]
    prefixes = [spec["base"], spec["output"], *(prefix for prefix, _, _ in spec["sources"])]
    found = {prefix: listed(fs, bucket, prefix) for prefix in prefixes}
    base = found[spec["base"]]
    if set(found[spec["output"]]) != set(base):
        raise ValueError(f"{spec['output']}: the output's shards are not the base's")
    for prefix in prefixes:
        if not set(base) <= set(found[prefix]):
            raise ValueError(f"{prefix}: a shard is missing")
    return [(rel, {prefix: found[prefix][rel] for prefix in prefixes}) for rel in sorted(base)]


def check(fs: pafs.S3FileSystem, spec: dict, shard: tuple[str, dict]) -> int:
    rel, info = shard
    base = read(fs, info[spec["base"]])
    merged = read(fs, info[spec["output"]])
    for name in base.column_names:
        if not merged.column(name).equals(base.column(name)):
            raise ValueError(f"{rel}: the output's {name} differs from the base's")
    for prefix, key, column in spec["sources"]:
        src = read(fs, info[prefix], columns=[key, column])
        if not src.column(key).equals(merged.column(key)):
            raise ValueError(f"{rel}: {prefix} {key} differs from the output's")
        if not src.column(column).equals(merged.column(column)):
            raise ValueError(f"{rel}: the output's {column} differs from {prefix}")
    return merged.num_rows


def main(spec_path: str, report_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    fs = s3()
    t = time.time()
    work, shards = (check, listings(fs, spec)) if spec.get("verify") else (merge, spec["relpaths"])
    if spec.get("threads", 1) > 1:
        with ThreadPoolExecutor(spec["threads"]) as pool:
            rows = sum(pool.map(lambda shard: work(fs, spec, shard), shards))
    else:
        rows = sum(work(fs, spec, shard) for shard in shards)
    with open(report_path, "w") as f:
        json.dump({"t0": T0, "t_work": t, "t_done": time.time(), "rows": rows, "maxrss_mb": maxrss_mb()}, f)


def maxrss_mb() -> float:
    """Peak RSS of this process (VmHWM), as bench/workloads/common.py reads it (this script imports nothing of ours)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
