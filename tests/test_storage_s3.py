"""The S3 backend's own rules, pinned exactly (tasks/storage/s3.py): which lifecycle rule covers an output prefix,
how an abort is retried, how pending uploads are listed (every page) and which of them the sweep aborts. Against
moto through tests/faultproxy.py, which fails chosen requests and plays the S3 behaviour moto lacks (an upload's
real `Initiated`, pages of uploads)."""
from __future__ import annotations

import logging
import time
import types

import pytest
from faultproxy import DENIED, proxied  # noqa: F401 (a fixture)
from reliability_fixtures import pending_uploads

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
