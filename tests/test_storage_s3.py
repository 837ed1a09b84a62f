"""The S3 backend's own rules, pinned exactly (tasks/storage/s3.py): which lifecycle rule covers an output prefix,
how an abort is retried, how pending uploads are listed (every page) and which of them the sweep aborts. Against
moto through tests/faultproxy.py, which fails chosen requests and plays the S3 behaviour moto lacks (an upload's
real `Initiated`, pages of uploads)."""
from __future__ import annotations

import base64
import gc
import hashlib
import logging
import os
import re
import sys
import threading
import time
import types
import zlib
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultproxy import DENIED, Hold, proxied  # noqa: F401 (a fixture)
from reliability_fixtures import allow_small_parts, pending_uploads

from tasks import storage
from tasks.storage import s3 as s3_backend

ABORT = {"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}
ON = {"Status": "Enabled", **ABORT}


@pytest.mark.parametrize("rule, covers", [
    (ON, True),                                                               # no filter: the whole bucket
    ({**ON, "Filter": {}}, True),
    ({**ON, "Filter": {"Prefix": ""}}, True),
    ({**ON, "Filter": {"Prefix": "out/"}}, True),
    ({**ON, "Filter": {"Prefix": "ou"}}, True),                               # a shorter prefix covers ours
    ({**ON, "Filter": {"Prefix": "out/part-0/"}}, False),                     # a narrower one does not
    ({**ON, "Filter": {"Prefix": "other/"}}, False),
    ({**ON, "Prefix": "out/"}, True),                                         # the legacy top-level prefix
    ({**ON, "Prefix": "other/"}, False),
    ({**ON, "Filter": {"And": {"Prefix": "out/"}}}, True),
    ({**ON, "Filter": {"And": {"Prefix": "other/"}}}, False),
    ({**ON, "Filter": {"And": {"ObjectSizeGreaterThan": 0}}, "Prefix": "other/"}, False),
    ({**ON, "Filter": {"Tag": {"Key": "k", "Value": "v"}}}, False),           # uploads carry no tags
    ({**ON, "Filter": {"And": {"Prefix": "out/", "Tags": [{"Key": "k", "Value": "v"}]}}}, False),
    ({**ON, "Filter": {"And": {"Prefix": "out/", "Tags": []}}}, True),
    ({"Status": "Disabled", **ABORT}, False),
    ({"Status": "Enabled", "Expiration": {"Days": 1}}, False),                # expires objects, aborts nothing
])
def test_which_lifecycle_rule_aborts_the_uploads_under_an_output_prefix(rule, covers):
    assert s3_backend.aborts_uploads_under(rule, "out/") is covers


@pytest.fixture
def no_sleep(monkeypatch) -> list[float]:
    """The delays s3.py sleeps, recorded instead of slept."""
    delays: list[float] = []
    monkeypatch.setattr(s3_backend, "time", types.SimpleNamespace(sleep=delays.append, time=time.time))
    return delays


def refused_aborts(proxied, n: int):  # noqa: F811
    """A proxy that refuses (403) the first `n` AbortMultipartUpload requests: botocore does not retry a refusal,
    so each reaches abort_upload's own loop."""
    refusals = iter(range(n))
    return proxied(rate=1.0, faults=(DENIED,),
                   applies=lambda op: op == "AbortMultipartUpload" and next(refusals, None) is not None)


def start_upload(s3_root: str, key: str = "out/part-0.parquet") -> tuple[str, str]:
    bucket = s3_root[len("s3://"):].rstrip("/")
    return bucket, storage._s3().call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]


@pytest.mark.parametrize("refusals", [1, s3_backend.ABORT_ATTEMPTS - 1])
def test_an_abort_is_retried_with_backoff_until_it_goes_through(s3_root, moto_endpoint, proxied, no_sleep,  # noqa: F811
                                                               refusals, caplog):
    proxy = refused_aborts(proxied, refusals)
    bucket, upload = start_upload(s3_root)
    with caplog.at_level(logging.WARNING, logger=s3_backend.__name__):
        s3_backend.abort_upload(storage._s3(), bucket, "out/part-0.parquet", upload)
    assert proxy.stats[(DENIED, "AbortMultipartUpload")] == refusals
    assert proxy.stats[("ok", "AbortMultipartUpload")] == 1
    assert pending_uploads(moto_endpoint, s3_root) == []
    assert no_sleep == [0.2, 0.4, 0.8, 1.6][:refusals]
    assert not caplog.records


def test_an_abort_refused_every_time_gives_up_with_one_warning(s3_root, moto_endpoint, proxied, no_sleep,  # noqa: F811
                                                              caplog):
    proxy = refused_aborts(proxied, 100)
    bucket, upload = start_upload(s3_root)
    with caplog.at_level(logging.WARNING, logger=s3_backend.__name__):
        s3_backend.abort_upload(storage._s3(), bucket, "out/part-0.parquet", upload)
    assert proxy.stats[(DENIED, "AbortMultipartUpload")] == s3_backend.ABORT_ATTEMPTS == 5
    assert no_sleep == [0.2, 0.4, 0.8, 1.6]  # none after the last attempt
    assert [u["UploadId"] for u in pending_uploads(moto_endpoint, s3_root)] == [upload]
    warning, = caplog.records
    assert warning.getMessage() == (f"could not abort multipart upload {upload} of s3://{bucket}/out/part-0.parquet: "
                                    "Access Denied")


def test_aborting_an_upload_already_gone_is_fine(s3_root, moto_endpoint, proxied, no_sleep, caplog):  # noqa: F811
    proxy = proxied()
    bucket, upload = start_upload(s3_root)
    s3_backend.abort_upload(storage._s3(), bucket, "out/part-0.parquet", upload)
    with caplog.at_level(logging.WARNING, logger=s3_backend.__name__):
        s3_backend.abort_upload(storage._s3(), bucket, "out/part-0.parquet", upload)
    assert proxy.stats[("ok", "AbortMultipartUpload")] == 2
    assert no_sleep == [] and not caplog.records


T = 1_700_000_000.0  # a whole second: the proxy reports it to the millisecond, exactly


def uploads_at(proxy, s3_root: str, ages: dict[str, float | None]) -> dict[str, str]:
    """key -> upload id of an upload started (by the store's clock, as the proxy reports it) `age` seconds before
    T, in this order; an age of None: listed without an Initiated."""
    ids = {}
    for key, age in ages.items():
        ids[key] = start_upload(s3_root, key)[1]
        if age is None:
            proxy.undated.add(ids[key])
        else:
            proxy.initiated[ids[key]] = T - age
    return ids


def stamp(age: float) -> str:
    return str(datetime.fromtimestamp(T - age, UTC))


def listing_budget(n: int):
    """An `applies` that refuses (403) every ListMultipartUploads after the first n: a listing that asks again and
    again for the same page fails instead of looping."""
    asked = iter(range(n))
    return lambda op: op == "ListMultipartUploads" and next(asked, None) is None


def test_pending_uploads_lists_every_page_under_the_prefix_only(s3_root, proxied):  # noqa: F811
    """Five uploads under out/, two pages of two and one of one (S3 pages past 1,000, moto never: the proxy
    does), each with its key, id and the store's `Initiated` ("" where the store gives none); the upload under
    other/ is not listed."""
    proxy = proxied(page_size=2, rate=1.0, faults=(DENIED,), applies=listing_budget(3))
    ages = {"out/a": None, "out/b": 1, "out/c": 2, "out/d": 3, "out/e": 4}
    ids = uploads_at(proxy, s3_root, {**ages, "other/f": 5})
    assert storage.pending_uploads(s3_root + "out/") == [
        (key, ids[key], "" if age is None else stamp(age)) for key, age in ages.items()]
    assert proxy.stats[("ok", "ListMultipartUploads")] == 3


def test_the_sweep_aborts_exactly_the_uploads_older_than_the_threshold(s3_root, moto_endpoint, proxied,  # noqa: F811
                                                                       monkeypatch):
    """By the store's `Initiated` against a clock an hour past T: an upload the store gives no time is kept (and
    does not stop the sweep), one exactly as old as the threshold is kept, older ones are aborted and counted;
    an upload outside the prefix is never looked at."""
    proxy = proxied()
    ids = uploads_at(proxy, s3_root, {"out/a": None, "out/b": 0, "out/c": 0.001, "out/d": 2, "other/e": 3})
    monkeypatch.setattr(s3_backend, "time", types.SimpleNamespace(time=lambda: T + 3600, sleep=time.sleep))
    assert storage.sweep_stale(s3_root + "out/", older_than_seconds=3600) == 2
    left = {u["UploadId"] for u in pending_uploads(moto_endpoint, s3_root)}
    assert left == {ids["out/a"], ids["out/b"], ids["other/e"]}


def crc32(body: bytes) -> str:
    return base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()


def without(name: str, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() != name]


def no_crc_echo(op: str, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A store that checks the CRC32 sent with a part but does not echo it."""
    return without("x-amz-checksum-crc32", headers) if op == "UploadPart" else headers


def kms_etags(op: str, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Also under SSE-KMS: a part's ETag is no MD5 (here the MD5 reversed, which kms_completion turns back)."""
    if op != "UploadPart":
        return headers
    etag = next(v for k, v in headers if k.lower() == "etag").strip('"')
    return [*without("etag", no_crc_echo(op, headers)), ("ETag", f'"{etag[::-1]}"'),
            ("x-amz-server-side-encryption", "aws:kms")]


def kms_completion(op: str, body: bytes) -> bytes:
    if op != "CompleteMultipartUpload":
        return body
    return re.sub(rb'<ETag>"(\w+)"</ETag>', lambda m: b'<ETag>"%s"</ETag>' % m.group(1)[::-1], body)


@pytest.fixture
def three_parts(monkeypatch) -> bytes:
    """A payload that goes up as a multipart upload of three parts (600, 600 and 300 bytes), botocore adding no
    checksum the code does not ask for."""
    allow_small_parts(monkeypatch)
    monkeypatch.setattr(s3_backend, "MULTIPART_THRESHOLD", 1000)
    monkeypatch.setattr(s3_backend, "PART_SIZE", 600)
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    return os.urandom(1500)


@pytest.mark.parametrize("store, proven", [("plain", True), ("no CRC32 echo", True), ("SSE-KMS", False)])
def test_a_multipart_upload_sends_a_crc32_with_every_part_and_names_them_in_the_completion(
        s3_root, proxied, three_parts, store, proven):  # noqa: F811
    """Every request of the upload carries a CRC32 the store checks the body against (CreateMultipartUpload
    declares it, each part sends its own), the completion names each part's ETag and the CRC32 the store echoed
    (none where it echoes none). The payload is handed back only where every part's reply proves the store holds
    exactly it: a part under SSE-KMS with no CRC32 echoed proves nothing (the caller reads the object back)."""
    data = three_parts
    edits = {"plain": {}, "no CRC32 echo": {"edit_reply": no_crc_echo},
             "SSE-KMS": {"edit_reply": kms_etags, "edit_request": kms_completion}}[store]
    proxy = proxied(**edits)
    uri = s3_root + "out/part-0.parquet"
    written = s3_backend.S3Backend().write_parquet(lambda sink: sink.write(data), uri)
    assert written.size == len(data)
    assert (written.payload.to_pybytes() if written.payload is not None else None) == (data if proven else None)
    assert storage._s3().cat_file(uri[len("s3://"):]) == data
    sent = {op: [h for o, h, _ in proxy.sent if o == op] for op in ("CreateMultipartUpload", "UploadPart")}
    assert [h.get("x-amz-checksum-algorithm") for h in sent["CreateMultipartUpload"]] == ["CRC32"]
    parts = [data[:600], data[600:1200], data[1200:]]
    assert [(h.get("x-amz-sdk-checksum-algorithm"), h.get("x-amz-checksum-crc32")) for h in sent["UploadPart"]] == [
        ("CRC32", crc32(part)) for part in parts]
    completion, = [body for op, _, body in proxy.sent if op == "CompleteMultipartUpload"]
    md5s = [hashlib.md5(part).hexdigest() for part in parts]
    echoed = store == "plain"
    assert completion.decode() == (
        '<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">' + "".join(
            f'<Part><PartNumber>{n}</PartNumber><ETag>"{md5 if store != "SSE-KMS" else md5[::-1]}"</ETag>'
            + (f"<ChecksumCRC32>{crc32(part)}</ChecksumCRC32>" if echoed else "") + "</Part>"
            for n, (md5, part) in enumerate(zip(md5s, parts, strict=True), 1)) + "</CompleteMultipartUpload>")


def test_a_multipart_upload_hands_back_its_payload_only_when_asked_to_keep_it(s3_root, three_parts):
    """Keeping every byte of a large object costs its size in memory: write_parquet keeps them only when asked
    (`keep`, its default), an Upload by default. Unkept, the payload is None and the check reads the object back."""
    data = three_parts
    for keep in (True, False):
        written = s3_backend.S3Backend().write_parquet(
            lambda sink: [sink.write(data[i:i + 400]) for i in range(0, len(data), 400)],
            f"{s3_root}out/{keep}.parquet", keep=keep)
        assert (written.size, written.payload is not None) == (len(data), keep)
        if keep:
            assert written.payload.to_pybytes() == data, "every write is kept, not only the last"


def test_write_atomic_hands_back_a_large_object_it_proved_and_write_windows_only_when_asked(s3_root, three_parts):
    """write_atomic (the whole table at once) keeps the payload of a multipart upload too: the check reads
    nothing back."""
    table = pa.table({"k": list(range(400))})
    written = storage.write_atomic(table, s3_root + "out/part-0.parquet")
    assert written.size > s3_backend.MULTIPART_THRESHOLD
    assert written.payload.to_pybytes() == storage._s3().cat_file(f"{s3_root[len('s3://'):]}out/part-0.parquet")
    streamed = storage.write_windows([table], s3_root + "out/part-1.parquet")  # the merge's writes: streamed,
    assert streamed.size == written.size and streamed.payload is None          # not held unless asked


def test_a_close_that_fails_after_a_failed_window_does_not_hide_the_first_error(s3_root, moto_endpoint, proxied,  # noqa: F811
                                                                                  three_parts, monkeypatch):
    """The next window fails; closing the writer on the way out then fails too (its footer starts the multipart
    upload here, and the store refuses the part). The error told is the window's, and no upload is left."""
    table = pa.table({"k": list(range(100))})
    sink = pa.BufferOutputStream()  # the bytes the writer hands over before its footer: the same writer's
    writer = pq.ParquetWriter(sink, table.schema, compression="zstd",
                              use_dictionary=storage.dictionary_columns(table.schema, ()))
    writer.write_table(table)
    monkeypatch.setattr(s3_backend, "MULTIPART_THRESHOLD", sink.tell() + 1)  # only the footer crosses it
    writer.close()
    proxied(rate=1.0, faults=(DENIED,), applies=lambda op: op == "UploadPart")

    def windows():
        yield table
        raise RuntimeError("the next window failed")

    with pytest.raises(RuntimeError, match="^the next window failed$"):
        storage.write_windows(windows(), s3_root + "out/part-0.parquet")
    assert pending_uploads(moto_endpoint, s3_root) == []


def test_a_window_that_fails_closes_the_writer_before_the_error_is_told(tmp_path, monkeypatch):
    """When reading the next window fails, the writer is closed there and then: no ParquetWriter is left for the
    garbage collector to close onto a sink already gone ("Exception ignored ... closed file" on stderr)."""
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: ignored.append(unraisable.exc_value))

    def windows():
        yield pa.table({"k": list(range(100))})
        raise RuntimeError("the next window failed")

    with pytest.raises(RuntimeError, match="the next window failed"):
        storage.write_windows(windows(), str(tmp_path / "part-0.parquet"))
    gc.collect()
    assert ignored == [] and list(tmp_path.iterdir()) == []


@pytest.mark.timeout(30)  # a loop that sends parts without end fails here, not at the suite's deadline
def test_an_upload_starts_at_the_threshold_and_each_part_leaves_as_it_fills(s3_root, three_parts):
    """One PUT while the bytes stay under MULTIPART_THRESHOLD (1,000 here); at the threshold the multipart upload
    starts, and every full part (600 here) leaves at once, so at most a part is held: the object is every byte."""
    data = three_parts
    bucket = s3_root[len("s3://"):].rstrip("/")
    upload = s3_backend.Upload(storage._s3(), bucket, "out/part-0.parquet")
    held = []
    for end in (999, 1000, 1200, 1500):
        upload.write(data[upload.size:end])
        held.append((upload.upload is not None, [p["PartNumber"] for p in upload.parts], len(upload.pending)))
    assert held == [(False, [], 999), (True, [1], 400), (True, [1, 2], 0), (True, [1, 2], 300)]
    assert upload.finish().payload.to_pybytes() == data  # an Upload keeps its bytes by default
    assert storage._s3().cat_file(f"{bucket}/out/part-0.parquet") == data


def test_a_single_put_sends_a_crc32_even_where_botocore_adds_none_of_its_own(s3_root, proxied, monkeypatch):  # noqa: F811
    """A payload under the multipart threshold goes up as one PutObject that carries the CRC32 of its body, which
    S3 checks, also where the user's configuration asks botocore for no checksum it is not required to send."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    proxy = proxied()
    data = os.urandom(300)
    uri = s3_root + "out/part-0.parquet"
    assert s3_backend.S3Backend().write_parquet(lambda sink: sink.write(data), uri).size == len(data)
    puts = [h for op, h, _ in proxy.sent if op == "PutObject"]
    assert [(h.get("x-amz-sdk-checksum-algorithm"), h.get("x-amz-checksum-crc32")) for h in puts] == [
        ("CRC32", crc32(data))]
    assert storage._s3().cat_file(uri[len("s3://"):]) == data


def test_a_write_abandoned_while_its_upload_is_being_created_sends_no_part(s3_root, moto_endpoint, proxied,  # noqa: F811
                                                                          three_parts):
    """abandon_writes() comes while CreateMultipartUpload is in flight (held at the proxy): there is no upload id
    to abort yet, so the writer aborts the upload as soon as the reply names it and fails (WriteAbandoned)
    without sending a part; nothing is left."""
    hold = Hold(lambda op, path, client: op == "CreateMultipartUpload")
    proxy = proxied(hold=hold)
    uri = s3_root + "out/part-0.parquet"
    failed: list[BaseException] = []

    def write() -> None:
        try:
            s3_backend.S3Backend().write_parquet(lambda sink: sink.write(three_parts), uri)
        except OSError as exc:
            failed.append(exc)

    writer = threading.Thread(target=write, name="abandoned-write")
    writer.start()
    try:
        assert hold.arrived.wait(60), "the upload was never created"
        assert storage.abandon_writes() == 1
    finally:
        hold.release.set()
        writer.join(60)
    error, = failed
    assert isinstance(error, storage.WriteAbandoned), repr(error)
    sent = [op for op, _, _ in proxy.sent]
    assert sent[:2] == ["CreateMultipartUpload", "AbortMultipartUpload"] and "UploadPart" not in sent, sent
    assert pending_uploads(moto_endpoint, s3_root) == []


@pytest.mark.parametrize("identity, parsed", [
    ("size=10;etag=abc", (10, "abc")),
    ("size=0;etag=abc", (0, "abc")),
    ("size=10;etag=a=b", (10, "a=b")),        # only the first "=" separates a field's name
    ("size=10;etag=", None),                   # no ETag: nothing to pin a read to
    ("size=ten;etag=abc", None),
    ("size=-1;etag=abc", None),
    ("size=10;etag=abc;extra=1", None),
    ("size=10;mtime_ns=5", None),              # another backend's identity
    ("size=10", None),
    ("", None),                                # an absent sibling
])
def test_an_s3_identity_is_parsed_back_to_its_size_and_etag_only(identity, parsed):
    assert s3_backend.parse_identity(identity) == parsed


def test_a_listed_object_is_opened_as_listed_with_no_head(s3_root, proxied):  # noqa: F811
    """Under `listed`, an object not fetched ahead is opened with the size and ETag its listing gave: no HEAD,
    and its identity is the listed one."""
    uri = s3_root + "in/part-0.parquet"
    storage.write_atomic(pa.table({"k": [1, 2]}), uri)
    identity = storage.list_prefix(s3_root + "in/").ids["part-0.parquet"]
    proxy = proxied()
    with storage.listed({uri: identity}), storage.open_parquet(uri) as f:
        assert pq.read_table(f).column("k").to_pylist() == [1, 2]
        assert storage.file_identity(uri, f) == identity
    assert [op for op, *_ in proxy.log if op == "HeadObject"] == []


def test_an_object_listed_with_no_s3_identity_is_opened_as_usual(s3_root):
    """open_listed with an identity that names no size and ETag (another backend's, or none) opens the object
    with a HEAD, as open_parquet does: the bytes read are the object's."""
    uri = s3_root + "in/part-0.parquet"
    storage._s3().pipe_file(uri[len("s3://"):], b"0123456789")
    with s3_backend.S3Backend().open_listed(uri, "mtime_ns=1;size=10") as f:
        assert f.read() == b"0123456789"


def test_an_aborted_upload_takes_no_more_bytes():
    """After abort (a failed write, or abandon from another thread), a late write fails at once: nothing is
    buffered or sent for an upload that has ended (no request: this one never reached the store)."""
    upload = s3_backend.Upload(None, "bucket", "out/part-0.parquet")
    assert upload.write(b"PAR1") == 4
    upload.abort()
    with pytest.raises(OSError, match=r"^upload of s3://bucket/out/part-0.parquet has ended$"):
        upload.write(b"more")
    assert (upload.size, bytes(upload.pending)) == (4, b"PAR1")


def test_a_finished_upload_takes_no_more_bytes(s3_root):
    """After finish, a late write (a footer written after the object was stored) fails at once instead of being
    buffered for an upload that will never send it: the object stays what finish stored."""
    bucket = s3_root[len("s3://"):].rstrip("/")
    upload = s3_backend.Upload(storage._s3(), bucket, "out/part-0.parquet")
    upload.write(b"PAR1")
    assert upload.finish().size == 4
    with pytest.raises(OSError, match=r"^upload of s3://.*/out/part-0.parquet has ended$"):
        upload.write(b"more")
    assert storage._s3().cat_file(f"{bucket}/out/part-0.parquet") == b"PAR1"


@pytest.mark.parametrize("info, identity", [
    ({"ETag": '"9b2cf535f27731c974343645a3985328"', "size": 5, "type": "file"},
     "size=5;etag=9b2cf535f27731c974343645a3985328"),
    ({"etag": "9b2cf535f27731c974343645a3985328-2", "size": 7}, "size=7;etag=9b2cf535f27731c974343645a3985328-2"),
    ({}, "size=0;etag="),
], ids=["head reply", "lowercase key, multipart", "nothing known"])
def test_an_s3_identity_is_the_size_and_the_unquoted_etag(info, identity):
    assert s3_backend.s3_identity(info) == identity
