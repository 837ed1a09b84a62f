"""The S3 backend's own rules, pinned exactly (tasks/storage/s3.py): which lifecycle rule covers an output prefix,
how an abort is retried, how pending uploads are listed (every page) and which of them the sweep aborts. Against
moto through tests/faultproxy.py, which fails chosen requests and plays the S3 behaviour moto lacks (an upload's
real `Initiated`, pages of uploads)."""
from __future__ import annotations

import logging
import time
import types
from datetime import UTC, datetime

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
