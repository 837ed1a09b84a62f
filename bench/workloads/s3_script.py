"""The W8 floor: a minimal pyarrow script that merges every shard on S3, each input opened once and each output
written once. Plain pyarrow (its own S3 filesystem), nothing of this project; run as a fresh process:

    python bench/workloads/s3_script.py SPEC.json REPORT.json

SPEC: {"bucket", "base", "sources": [[prefix, key column, score column], ...], "output", "relpaths",
"threads"} (prefixes are keys inside the bucket, ending in '/'). Per shard: read the base, read each source's
key and score columns, check the keys equal the base's, append the score column, write zstd parquet with the
base's row groups. `threads` > 1 merges that many shards at once. The endpoint is AWS_ENDPOINT_URL.
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

T0 = time.time()

import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


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


def main(spec_path: str, report_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    fs = s3()
    t = time.time()
    if spec.get("threads", 1) > 1:
        with ThreadPoolExecutor(spec["threads"]) as pool:
            rows = sum(pool.map(lambda rel: merge(fs, spec, rel), spec["relpaths"]))
    else:
        rows = sum(merge(fs, spec, rel) for rel in spec["relpaths"])
    with open(report_path, "w") as f:
        json.dump({"t0": T0, "t_work": t, "t_done": time.time(), "rows": rows}, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
