"""What a merge asks of S3, counted at a proxy in front of moto (issue 19, deliverable 2), and the proofs that
let it ask less: no HEAD for an input the plan listed (its reads pinned to the listed ETag), no read-back of the
output (S3's CRC32 of each upload compared with ours, then the footer and keys checked from the bytes sent),
and the base's keys kept from the read, not read again.

The proxy (tests/faultproxy.py) forwards every request and logs it; `corrupt` changes a byte of a write's body
on the way, as a faulty path to the store would.
"""
from __future__ import annotations

import base64
import hashlib
import os
import zlib
from collections import Counter

import pyarrow as pa
import pytest
import test_streaming
from core_fixtures import build, objects, read_table
from faultproxy import CORRUPT, FaultProxy, proxied  # noqa: F401 (a fixture)
from reliability_fixtures import allow_small_parts, pending_uploads
from test_flow_local import summary_counts

from tasks import kernel, storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.errors import ShardError
from tasks.kernel import Job, apply_operation, merge_shard, read_base, write_output
from tasks.ops.merge_from_sidecar import MergeFromSidecar
from tasks.storage import s3 as s3_backend

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

SHARDS = 3
REL = relpaths(SHARDS)
SCORE = "dqm_d1_v6_1"  # a score column of the DQM sidecar


def per_object(proxy: FaultProxy, prefix: str) -> Counter:
    """(operation, object kind) -> count, for requests on objects under the bucket of `prefix`."""
    bucket = prefix[len("s3://"):].split("/")[0]
    out: Counter = Counter()
    for op, path, _, _ in proxy.log:
        parts = path.strip("/").split("/")
        if parts[0] == bucket and len(parts) > 2 and parts[-1].endswith(".parquet"):
            out[(op, parts[2] if parts[1] == "in" else parts[1])] += 1
    return out


def test_a_run_reads_each_input_as_listed_and_never_reads_its_output_back(tmp_path, s3_root, proxied, run, cli):
    """Per shard: no HEAD of any object (the plan's listing gave every input's size and ETag), one GET per
    input (each is smaller than ahead.TAIL, so the first GET of its fetch ahead holds all of it), one PUT, and
    nothing of the output read back: the post-write check reads the bytes S3 confirmed it stored. The output
    still verifies."""
    setup = build(tmp_path, s3_root, shards=SHARDS)
    proxy = proxied()
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    assert summary_counts(out) == (SHARDS, SHARDS, 0, 0)
    counts = per_object(proxy, s3_root)
    assert not [k for k in counts if k[0] == "HeadObject"], counts
    assert counts[("PutObject", "out")] == SHARDS
    assert counts[("GetObject", "out")] == 0, counts
    for name in ("base", "dqm", "aes"):
        assert counts[("GetObject", name)] == SHARDS, (name, counts)
    # the watermark sidecar lacks one shard (an optional operation): known absent from the listing, not asked
    assert counts[("GetObject", "watermark")] == SHARDS - 1, counts
    code, out, err = cli("verify", setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err




def test_an_input_replaced_after_the_plan_is_read_again_by_the_retry(tmp_path, s3_root, proxied, run, monkeypatch):
    """The first attempt reads as listed, pinned to the listed ETag: an object replaced since the listing
    fails that read (412), never mixes versions. The retry is not given the listing: it reads the new version
    and records its identity, so the output is current for the next run (which skips every shard)."""
    import flows.merge

    setup = build(tmp_path, s3_root, shards=SHARDS)
    sibling = setup.prefixes["dqm"] + REL[0]
    real_plan = flows.merge.make_plan

    def plan_then_replace(job, **kw):
        plan = real_plan(job, **kw)
        table = read_table(sibling)
        reordered = table[SCORE].take(list(range(table.num_rows - 1, -1, -1)))  # other values, same keys
        storage.write_atomic(table.set_column(table.schema.get_field_index(SCORE), SCORE, reordered), sibling)
        return plan

    monkeypatch.setattr(flows.merge, "make_plan", plan_then_replace)
    proxy = proxied()
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--retries", "1")
    assert code == 0, out + err
    assert summary_counts(out) == (SHARDS, SHARDS, 0, 0)
    refused = [path for op, path, _, _ in proxy.log if op == "GetObject" and path.endswith("dqm/" + REL[0])]
    assert refused, "the replaced sibling was never read"
    assert read_table(setup.output + REL[0])[SCORE].equals(read_table(sibling)[SCORE])  # the new version
    monkeypatch.setattr(flows.merge, "make_plan", real_plan)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0 and summary_counts(out) == (SHARDS, 0, SHARDS, 0), out + err


@pytest.mark.parametrize("size", ["one-put", "multipart"])
def test_an_upload_corrupted_on_the_way_is_never_taken_for_written(tmp_path, s3_root, proxied, monkeypatch, size):
    """The store holds other bytes than were sent (a byte changed on the way): the CRC32 S3 reports for what
    it received differs from ours, and the write fails (a transient error: the retry uploads again), for a
    single PUT and for a part of a multipart upload alike."""
    if size == "multipart":
        allow_small_parts(monkeypatch)
        monkeypatch.setattr(s3_backend, "MULTIPART_THRESHOLD", 16 * 1024)
        monkeypatch.setattr(s3_backend, "PART_SIZE", 8 * 1024)
    table = pa.table({"k": [f"key-{i}" for i in range(4000)],  # ~80 KB of parquet: 10 parts of 8 KB
                      "blob": pa.array([os.urandom(16) for _ in range(4000)], pa.binary())})
    corrupted = "UploadPart" if size == "multipart" else "PutObject"
    proxy = proxied(rate=1.0, faults=(CORRUPT,), applies=lambda op: op == corrupted)
    with pytest.raises(OSError, match="S3 stored other bytes than were sent"):
        storage.write_atomic(table, s3_root + "out/part-0.parquet")
    assert proxy.faults_injected(corrupted) == 1  # the first one fails the write
    assert not objects(s3_root + "out/")  # and nothing is left: no object (a part failed), no pending upload
    failure = kernel._fail("x", "writing", s3_backend.UploadCorrupted("S3 stored other bytes than were sent"))
    assert failure.transient and "not a readable parquet" not in str(failure)


def test_the_upload_of_a_lost_create_reply_is_left_to_the_age_based_sweep(s3_root, proxied, moto_endpoint,
                                                                         monkeypatch):
    """S3 starts a multipart upload but the connection drops before its reply: botocore's retry starts a
    second one, and the first one's id is never heard of. The write completes; the orphan is not aborted by
    key and time (that would kill other writers' uploads, tests/test_s3_uploads.py): it stays pending until it
    is older than the sweep's threshold by the store's own clock (and the bucket's lifecycle rule)."""
    allow_small_parts(monkeypatch)
    monkeypatch.setattr(s3_backend, "MULTIPART_THRESHOLD", 16 * 1024)
    monkeypatch.setattr(s3_backend, "PART_SIZE", 8 * 1024)
    table = pa.table({"k": [f"key-{i}" for i in range(4000)],
                      "blob": pa.array([os.urandom(16) for _ in range(4000)], pa.binary())})
    first = iter([True])
    proxy = proxied(rate=1.0, faults=("reset_after",),
                    applies=lambda op: op == "CreateMultipartUpload" and next(first, False))
    uri = s3_root + "out/part-0.parquet"
    storage.write_atomic(table, uri)
    assert proxy.stats[("reset_after", "CreateMultipartUpload")] == 1
    assert proxy.stats[("ok", "CreateMultipartUpload")] == 1  # botocore's retry
    assert read_table(uri).equals(table)
    orphan, = proxy.unheard
    assert [u["UploadId"] for u in pending_uploads(moto_endpoint, s3_root)] == [orphan]
    assert storage.sweep_stale(s3_root) == 0  # young: it could be a live writer's
    proxy.age(orphan, 6 * 3600 + 60)
    assert storage.sweep_stale(s3_root) == 1
    assert pending_uploads(moto_endpoint, s3_root) == []


CRC = base64.b64encode(zlib.crc32(b"payload").to_bytes(4, "big")).decode()
MD5 = hashlib.md5(b"payload").hexdigest()
OTHER = "4f1b2d8c0a9e6b7d3c5a1f0e2d4b6a8c"
KMS = {"ServerSideEncryption": "aws:kms"}


@pytest.mark.parametrize("reply, proven", [
    ({"ETag": f'"{MD5}"', "ChecksumCRC32": CRC}, True),
    ({"ETag": f'"{MD5}"', "ServerSideEncryption": "AES256"}, True),  # SSE-S3: still the MD5
    ({"ETag": f'"{OTHER}"', "ChecksumCRC32": CRC, **KMS}, True),     # SSE-KMS: the CRC32 S3 checked
    ({"ETag": f'"{OTHER}"', "SSECustomerAlgorithm": "AES256", "ChecksumCRC32": CRC}, True),
    ({"ETag": f'"{OTHER}"', **KMS}, False),                          # nothing proves it: read back
    ({}, False),
    ({"ETag": f'"{OTHER}"'}, "ETag"),                                # unencrypted, another MD5: corrupted
    ({"ETag": f'"{OTHER}"', "ChecksumCRC32": "AAAAAA==", **KMS}, "CRC32"),
], ids=["md5+crc", "sse-s3", "kms+crc", "sse-c+crc", "kms", "nothing", "other-md5", "other-crc"])
def test_what_an_upload_reply_proves(reply, proven):
    if isinstance(proven, str):
        with pytest.raises(OSError, match=f"S3 stored other bytes than were sent \\({proven} "):
            s3_backend.stored_exactly(reply, b"payload")
    else:
        assert s3_backend.stored_exactly(reply, b"payload") is proven


def test_an_upload_reply_is_checked_on_a_fips_host(monkeypatch):
    """On a FIPS-mode OpenSSL, MD5 is refused unless the caller declares it is not used for security (Python's
    `usedforsecurity=False`, read by its truth value). The ETag check declares it, so it works there too."""
    md5 = hashlib.md5

    def fips_md5(data=b"", *, usedforsecurity=True):
        if usedforsecurity:
            raise ValueError("[digital envelope routines] unsupported: MD5 is disabled for security in FIPS mode")
        return md5(data, usedforsecurity=False)

    monkeypatch.setattr(hashlib, "md5", fips_md5)
    assert s3_backend.stored_exactly({"ETag": f'"{MD5}"'}, b"payload") is True


def test_an_unproven_upload_is_read_back_by_the_check(tmp_path, s3_root, proxied, monkeypatch):
    """Where S3's reply proves nothing (SSE-KMS ETags, no checksum), the post-write check reads the output back
    (footer and key column), as it did before the payload was kept: opened with the size it wrote, no HEAD."""
    setup = build(tmp_path, s3_root, shards=1)
    monkeypatch.setattr(s3_backend, "stored_exactly", lambda reply, body: False)
    proxy = proxied()
    merge_shard(Job(load_pipeline(setup.pipeline), setup.output), REL[0])
    counts = per_object(proxy, s3_root)
    assert counts[("GetObject", "out")] == 2  # footer, key column
    assert counts[("HeadObject", "out")] == 0  # opened with the size written: no HEAD


@pytest.mark.parametrize("layout", ["streamed", "chain"])
def test_the_check_compares_with_the_base_keys_as_read_not_the_tables(tmp_path, monkeypatch, layout):
    """An operation that reorders rows (keys and values together) keeps the table self-consistent; the
    post-write check still fails it: the written keys are compared with the base's as read. Streamed (one
    call, merge_shard, by the decode path: the copy path never calls `apply`, it copies the sibling's rows
    in the order its keys were proven, test_chunkcopy's misaligned sibling) and chained (read_base,
    apply_operation, write_output: the task per operation)."""
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=1)
    job = Job(load_pipeline(setup.pipeline), setup.output, recompress="zstd")
    last = len(job.pipeline.operations) - 1
    real_stream = MergeFromSidecar.stream

    def reversed_rows(self, *args, **kwargs):  # the last operation only: earlier ones' alignment would see it
        stream = real_stream(self, *args, **kwargs)
        if self == job.pipeline.operations[last]:
            apply = stream.apply
            stream.apply = lambda window, offset: apply(window, offset).take(list(range(window.num_rows - 1, -1, -1)))
        return stream

    monkeypatch.setattr(MergeFromSidecar, "stream", reversed_rows)
    with pytest.raises(ShardError, match="verifying .*key column 'image_key' of the output differs from the base"):
        if layout == "streamed":
            merge_shard(job, REL[0])
        else:
            state = read_base(job, REL[0])
            for index in range(last + 1):
                state = apply_operation(job, REL[0], index, state)
            write_output(job, REL[0], state)
    assert objects(setup.output) != []  # written, then failed by its check: the run names the shard failed


def test_write_output_checks_the_bytes_s3_confirmed_not_the_stored_object(s3_root, monkeypatch):
    """write_output (the task per operation's last step) on S3 opens nothing: the check reads the payload S3's
    checksums proved stored, not the object, and compares with the base's keys as read, not the base."""
    rel = test_streaming.REL
    job = test_streaming.job_for(s3_root, "out")
    table = pa.table({"key": ["a", "b", "c"], "path": ["p", "q", "r"]})
    opened = []
    real_open = storage.open_parquet
    monkeypatch.setattr(storage, "open_parquet", lambda uri, *a, **kw: opened.append(uri) or real_open(uri, *a, **kw))
    stats = write_output(job, rel, kernel.ShardState(table, 3, base_keys=table["key"]))
    assert opened == [] and stats.rows == 3
    assert read_table(job.output_uri(rel)).equals(table)


def test_the_streamed_merge_checks_the_bytes_s3_confirmed_not_the_stored_object(s3_root, monkeypatch):
    """merge_shard (the fused task) on S3 opens its inputs only: the check reads the payload S3's checksums
    proved stored, never the output."""
    from test_kernel import inputs

    inputs(s3_root)
    job = test_streaming.job_for(s3_root, "out")
    opened = []
    real_open = storage.open_parquet
    monkeypatch.setattr(storage, "open_parquet", lambda uri, *a, **kw: opened.append(uri) or real_open(uri, *a, **kw))
    assert merge_shard(job, test_streaming.REL).rows == 12
    assert job.output_uri(test_streaming.REL) not in opened and job.base_uri(test_streaming.REL) in opened
