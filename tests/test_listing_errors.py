"""Errors at the listing (tasks/plan.py, list_or_refuse): an error of the store's families (OSError and what
fsspec turns into it, fsspec's timeout, botocore's, aiohttp's) is one line naming the prefix, exit 2; any other
error is a bug of ours and surfaces as one ("unexpected TypeError: ...", exit 1), never as a refusal. A store
that does not answer (a closed port on 127.0.0.1, through s3fs) ends the run within a minute, naming the store.
"""
from __future__ import annotations

import socket

import aiohttp
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from fsspec.exceptions import FSTimeoutError

from core_fixtures import build
from tasks import storage
from tasks.errors import ConfigError
from tasks.plan import list_or_refuse
from tasks.storage import s3

PREFIX = "s3://bucket/base/"
STORE_ERRORS = {
    "oserror": (OSError(5, "Input/output error"), "[Errno 5] Input/output error"),
    "fsspec-timeout": (FSTimeoutError(), ""),
    "botocore-connect": (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
                         'EndpointConnectionError: Could not connect to the endpoint URL: "http://127.0.0.1:9"'),
    "botocore-reply": (ClientError({"Error": {"Code": "NoSuchBucket", "Message": "gone"}}, "ListObjectsV2"),
                       "ClientError: An error occurred (NoSuchBucket) when calling the ListObjectsV2 operation: gone"),
    "aiohttp": (aiohttp.ServerDisconnectedError(), "ServerDisconnectedError: Server disconnected"),
}


def raising(exc: BaseException):
    def listing():
        raise exc
    return listing


@pytest.mark.parametrize("name", list(STORE_ERRORS))
def test_an_error_of_the_stores_families_is_one_line_naming_the_prefix(name):
    exc, detail = STORE_ERRORS[name]
    with pytest.raises(ConfigError) as refused:
        list_or_refuse(PREFIX, "main_prefix", raising(exc))
    assert str(refused.value) == f"cannot list main_prefix {PREFIX}: {detail}"
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("exc", [TypeError("unsupported operand"), KeyError("Contents"),
                                 AttributeError("'NoneType' object has no attribute 'shards'")],
                         ids=lambda e: type(e).__name__)
def test_a_bug_of_ours_in_the_listing_is_not_a_refusal(exc):
    with pytest.raises(type(exc)) as raised:
        list_or_refuse(PREFIX, "main_prefix", raising(exc))
    assert raised.value is exc


def test_a_bug_in_the_listing_task_ends_the_run_as_unexpected_not_as_a_refusal(tmp_path, run, monkeypatch):
    setup = build(tmp_path, str(tmp_path / "data"), shards=2)
    real = storage.list_prefix

    def buggy(prefix):
        if prefix.startswith(setup.prefixes["base"]):
            raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")
        return real(prefix)

    monkeypatch.setattr(storage, "list_prefix", buggy)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 1, out + err
    assert "unexpected TypeError: unsupported operand type(s) for +: 'int' and 'NoneType'" in err, err
    assert "cannot list" not in err and "Traceback" not in err


@pytest.fixture
def closed_port(monkeypatch):
    """`closed_port()`: from now on AWS_ENDPOINT_URL is a port of 127.0.0.1 bound by this test and never listened
    on (every connection refused); returns it. s3fs is made afresh for it, and again after the test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"

        def switch() -> str:
            monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
            storage._s3.cache_clear()
            return endpoint

        yield switch
        monkeypatch.undo()
        storage._s3.cache_clear()


def test_a_listing_of_a_store_that_does_not_answer_fails_after_every_attempt_with_short_waits(closed_port,
                                                                                               monkeypatch):
    """One listing through s3fs with the shipped retry settings: every attempt botocore makes (its max_attempts
    retries after the first) is refused and each is followed by the next after at most CONNECT_RETRY_DELAY, as
    our needs-retry handler answers (recorded as it answers botocore); the last is botocore's to end, with no
    backoff of its own in between (its backoff reached 20 s a wait). So the listing's time is bounded by the
    handler's waits and the connect timeouts, whatever the machine's speed."""
    answers: list = []
    shipped = s3.connect_retry

    def recording(max_attempts: int):
        handler = shipped(max_attempts)

        def delay(attempts: int, caught_exception=None, **kw):
            answers.append((attempts, type(caught_exception).__name__, handler(attempts, caught_exception, **kw)))
            return answers[-1][2]
        return delay

    monkeypatch.setattr(s3, "connect_retry", recording)
    endpoint = closed_port()
    with pytest.raises(ConfigError) as refused:
        list_or_refuse(PREFIX, "main_prefix")
    assert str(refused.value).startswith(f'cannot list main_prefix {PREFIX}: EndpointConnectionError: Could not '
                                         f'connect to the endpoint URL: "{endpoint}/')
    retries = s3.DEFAULT_MAX_ATTEMPTS
    assert [a for a, _, _ in answers] == list(range(1, retries + 2)), answers  # one listing request, every attempt
    assert {kind for _, kind, _ in answers} == {"EndpointConnectionError"}, answers
    waits = [wait for _, _, wait in answers]
    assert waits[-1] is None and all(w is not None and 0 < w <= s3.CONNECT_RETRY_DELAY for w in waits[:-1]), waits
    bound = sum(waits[:-1]) + (retries + 1) * s3.CONNECT_TIMEOUT
    assert bound < 60, f"a store that does not answer at all would take up to {bound:.1f} s"


@pytest.mark.slow  # a whole run's listings against the closed port: ~10-25 s on 2 cores
def test_a_store_that_does_not_answer_ends_the_run_naming_it(tmp_path, s3_root, run, closed_port):
    """The run's listing tasks meet the closed port: one line naming the endpoint, exit 2, no traceback (the
    bound on its time is the listing's, above: the same handler, in the run's process)."""
    setup = build(tmp_path, s3_root, shards=2)  # on moto; the run then sees only the closed port
    endpoint = closed_port()
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: cannot list "), err
    assert f'Could not connect to the endpoint URL: "{endpoint}/' in errors[0], errors
    assert "Traceback" not in err
