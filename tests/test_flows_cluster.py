"""flows/cluster.py without a cluster: which Ray a --ray-address names, where the cluster token is found, the
address this host has towards the head, and the one line for a head nobody answers at. Runs joining real
clusters: tests/test_ray_multinode.py, tests/test_multihost.py."""
from __future__ import annotations

import logging
import re
import socket

import pytest

from flows import cluster, compat
from flows.cluster import RayTarget, check_cluster, driver_host, prepare, ray_target, token_source
from tasks.errors import ConfigError

NOBODY = "127.0.0.1:1"  # loopback, a port nothing listens on: refused at once


@pytest.fixture(autouse=True)
def no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.parametrize("address, env, target", [
    (None, None, RayTarget(None)),
    ("local", None, RayTarget(None)),
    ("", "local", RayTarget(None)),
    (None, "10.0.0.5:6379", RayTarget("10.0.0.5:6379", "10.0.0.5:6379")),
    ("10.0.0.5:6379", "local", RayTarget("10.0.0.5:6379", "10.0.0.5:6379")),   # the option wins
    ("[::1]:6379", None, RayTarget("[::1]:6379", "[::1]:6379")),                  # IPv6: the port is last
    ("ray://head.example", None, RayTarget("ray://head.example", "head.example:10001")),
    ("ray://node-X", None, RayTarget("ray://node-X", "node-X:10001")),
    ("ray://head.example:10002/", None, RayTarget("ray://head.example:10002/", "head.example:10002")),
])
def test_the_ray_a_run_uses(monkeypatch, address, env, target):
    if env is not None:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert ray_target(address) == target


def test_what_a_target_says_about_itself():
    local, client = RayTarget(None), RayTarget("ray://head.example:10001", "head.example:10001")
    assert (local.joins_cluster, local.client_mode, local.all_on_this_host) == (False, False, True)
    assert (client.joins_cluster, client.client_mode, client.head_host) == (True, True, "head.example")
    gcs = RayTarget("10.0.0.5:6379", "10.0.0.5:6379")
    assert (gcs.joins_cluster, gcs.client_mode, gcs.head_host, gcs.all_on_this_host) == (True, False, "10.0.0.5",
                                                                                          False)
    assert RayTarget("[::1]:6379", "[::1]:6379").head_host == "::1"
    assert RayTarget("127.0.0.1:6379", "127.0.0.1:6379").all_on_this_host
    assert RayTarget("localhost:6379", "localhost:6379").all_on_this_host


@pytest.mark.parametrize("address", ["head.example", "head.example:", "head.example:port", "6379"])
def test_an_address_without_a_port_is_one_line(address):
    with pytest.raises(ConfigError) as refused:
        ray_target(address)
    assert str(refused.value) == f"--ray-address {address!r}: expected HOST:PORT, auto, or ray://HOST:PORT"


def test_auto_finds_the_cluster_started_on_this_host_or_says_why_not(monkeypatch):
    answers = iter(["10.0.0.5:6379", None, ConnectionError("Could not read 'ray_current_cluster'")])

    def found():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(compat, "find_local_ray_cluster", found)
    assert ray_target("auto") == RayTarget("auto", "10.0.0.5:6379")
    with pytest.raises(ConfigError) as none:
        ray_target("auto")
    assert str(none.value) == ("--ray-address auto: no running Ray cluster found on this host (start one with "
                               "`ray start --head`, or give --ray-address HEAD:PORT)")
    with pytest.raises(ConfigError) as broken:
        ray_target("auto")
    assert str(broken.value) == "--ray-address auto: Could not read 'ray_current_cluster'"


def test_where_the_cluster_token_is_found(tmp_path, monkeypatch):
    """Ray's order: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names (if there), else ~/.ray/auth_token."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert token_source() is None
    default = tmp_path / ".ray" / "auth_token"
    default.parent.mkdir()
    default.write_text("t0")
    assert token_source() == str(default)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "~/elsewhere")
    assert token_source() is None, "a named file that is not there: no token (not the default file)"
    (tmp_path / "elsewhere").write_text("t1")
    assert token_source() == "~/elsewhere"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t2")
    assert token_source() == "RAY_AUTH_TOKEN"


def test_ray_s_token_notices_are_quiet_while_token_auth_is_enabled_and_only_then(monkeypatch):
    notices = logging.getLogger(compat.RAY_TOKEN_NOTICE_LOGGER)
    monkeypatch.setattr(notices, "level", logging.INFO)
    during = []
    monkeypatch.setattr(compat, "enable_ray_token_auth", lambda: during.append(notices.level))
    cluster.enable_token_auth()
    assert (during, notices.level) == ([logging.ERROR], logging.INFO)


def test_this_hosts_address_towards_the_head():
    assert driver_host(RayTarget(NOBODY, NOBODY)) == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"^no network route from this host to the Ray head ::1 \(.+\), so Ray "
                                          r"workers could not reach this run's Prefect server; set PREFECT_API_URL "
                                          r"to a Prefect server every Ray node can reach$"):
        driver_host(RayTarget("[::1]:6379", "[::1]:6379"))  # an IPv6 head, asked over IPv4


def test_a_head_nobody_answers_at_is_one_line_before_ray_starts(monkeypatch):
    monkeypatch.setattr(compat, "enable_ray_token_auth", lambda: None)
    check_cluster(RayTarget(None))  # a local instance: nothing to ask
    check_cluster(RayTarget(f"ray://{NOBODY}", NOBODY))  # the Ray client server answers at connect time
    prepare(RayTarget(None))
    with pytest.raises(ConfigError) as refused:
        prepare(RayTarget(NOBODY, NOBODY))
    assert re.fullmatch(rf"cannot reach the Ray cluster at {NOBODY} \(unavailable: .+\); check --ray-address and "
                        r"that the head is running", str(refused.value)), str(refused.value)


def test_a_head_that_never_answers_is_one_line_after_the_check_timeout(monkeypatch):
    """A port that accepts connections and says nothing (a listening socket nobody serves): the call ends at
    CHECK_TIMEOUT (shortened here) with one line, never waits on."""
    monkeypatch.setattr(cluster, "CHECK_TIMEOUT", 0.2)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConfigError, match=rf"^cannot reach the Ray cluster at {address} \((deadline_exceeded|"
                                              r"unavailable): "):
            check_cluster(RayTarget(address, address))
