"""W5 S3: the W1 kernel at reduced size through moto (server mode, loopback) vs local disk, with every
S3 request counted by a proxy in front of moto: per shard of the kernel, per run of the flow, per resume.
"""
from __future__ import annotations

from pathlib import Path

from bench.workloads.common import Row, median, timed
from bench.workloads.contenders import kernel
from bench.workloads.counting import bench_s3
from bench.workloads.data import Case, make_case, write_yamls
from bench.workloads.flowrun import run_flow

BUCKET = "bench"
KINDS = ("LIST", "HEAD", "GET range", "GET whole", "PUT", "PUT part", "multipart")


def _fmt(counts, n: int) -> str:
    return ", ".join(f"{k} {counts[k] / n:.1f}" for k in KINDS if counts.get(k)) or "none"


def run(data: Path, size: dict) -> list[Row]:
    local = make_case(data / "w5", size["w5_shards"], size["w5_rows"])
    n = len(local.relpaths)
    with bench_s3() as (url, log):
        return _measure(data, size, local, n, url, log)


def _measure(data: Path, size: dict, local: Case, n: int, url: str, log) -> list[Row]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=url)
    s3.create_bucket(Bucket=BUCKET)
    for sidecar in ("base", "dqm", "aes"):
        for rel in local.relpaths:
            s3.upload_file(local.path(sidecar, rel), BUCKET, f"w5/{sidecar}/{rel}")
    yaml_root = data / "w5-s3"
    write_yamls(yaml_root, source_root=f"s3://{BUCKET}/w5")
    remote = Case(yaml_root, local.relpaths, local.rows)
    s3_out = f"s3://{BUCKET}/w5-out/"

    samples = {"local": [], "s3": []}
    for rep in range(size["repeats"] + 1):
        t_local, _ = timed(kernel, local, local.output("kernel"))
        log.clear()
        t_s3, _ = timed(kernel, remote, s3_out + f"kernel-{rep}/")
        per_shard = log.counts()
        got_bytes = log.bytes_by_kind()
        if rep:
            samples["local"].append(t_local)
            samples["s3"].append(t_s3)
    base_bytes = local.bytes_on_disk("base") + local.bytes_on_disk("dqm") + local.bytes_on_disk("aes")

    log.clear()
    t_flow, summary = run_flow(remote.pipeline, s3_out + "flow/")
    assert summary["merged"] == n, summary
    flow_counts = log.counts()
    log.clear()
    t_resume, summary = run_flow(remote.pipeline, s3_out + "flow/")
    assert summary["skipped"] == n, summary
    resume_counts, resume_bytes = log.counts(), log.bytes_by_kind()

    storms = per_shard.get("LIST", 0) + per_shard.get("HEAD", 0)
    return [
        Row("W5", "kernel on local disk", median(samples["local"]), samples=samples["local"],
            note=f"{n} shards x {local.rows[0]:,} rows"),
        Row("W5", "kernel on S3 (moto, loopback)", median(samples["s3"]), samples=samples["s3"],
            ref="kernel on local disk"),
        Row("W5", "kernel: S3 requests per shard", sum(per_shard.values()) / n, unit="req",
            note=_fmt(per_shard, n)),
        Row("W5", "kernel: bytes fetched / bytes of inputs", sum(got_bytes.values()) / base_bytes, unit="x",
            note=f"{sum(got_bytes.values()):,} of {base_bytes:,} bytes (GETs incl. verify re-reads)"),
        Row("W5", "kernel: LIST+HEAD per shard", storms / n, unit="req",
            note="HEADs come from s3fs open() (size lookup)"),
        Row("W5", "flow: LIST requests per run", flow_counts.get("LIST", 0), unit="req",
            note=f"4 prefixes (base, dqm, aes, output); per shard: {_fmt(flow_counts, n)}"),
        Row("W5", "S3 flow, first run", t_flow, samples=[t_flow], note="timed once"),
        Row("W5", "S3 flow, resume rerun on complete output", t_resume, samples=[t_resume],
            ref="S3 flow, first run", note="timed once"),
        Row("W5", "resume: S3 requests per shard", sum(resume_counts.values()) / n, unit="req",
            note=f"{_fmt(resume_counts, n)}; {sum(resume_bytes.values()) / n:,.0f} bytes/shard"),
    ]
