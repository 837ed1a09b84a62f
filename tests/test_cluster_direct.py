"""flows/cluster.py driven directly, without a Ray instance: `--ray-address` resolution, the route to the
head, the cluster token's source and Ray's token notice, the pre-flight call to the head (a gRPC server on
loopback in this process, or a closed port), and the probe of the Prefect API from every node (its HTTP side
against a server on loopback in this process; Ray's scheduling replaced by calls here that record what Ray was
asked).
"""
from __future__ import annotations

import logging
import re
import socket
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from flows import cluster, compat
from flows.cluster import (RayTarget, api_health, check_api_reachable, check_cluster, driver_host,
                           enable_token_auth, prepare, ray_target, token_source)
from tasks.errors import ConfigError


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------- ray_target

@pytest.fixture
def no_ray_env(monkeypatch, tmp_path):
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.setenv(name, "")  # restored (or removed again) after the test, whatever it sets
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("given, env, expected", [
    (None, None, RayTarget(None)),
    ("local", None, RayTarget(None)),
    (None, "local", RayTarget(None)),
    (None, "10.0.0.9:6379", RayTarget("10.0.0.9:6379", "10.0.0.9:6379")),
    ("head:6380", "10.0.0.9:6379", RayTarget("head:6380", "head:6380")),
    ("[fd00::1]:6379", None, RayTarget("[fd00::1]:6379", "[fd00::1]:6379")),
    ("ray://head:10002/", None, RayTarget("ray://head:10002/", "head:10002")),
    ("ray://head", None, RayTarget("ray://head", "head:10001")),
    ("ray://head/", None, RayTarget("ray://head/", "head:10001")),
    ("ray://headX/", None, RayTarget("ray://headX/", "headX:10001")),
])
def test_ray_address_forms(no_ray_env, monkeypatch, given, env, expected):
    if env:
        monkeypatch.setenv("RAY_ADDRESS", env)
    target = ray_target(given)
    assert target == expected
    assert target.joins_cluster == (expected.bootstrap is not None)
    assert target.client_mode == (given or "").startswith("ray://")


@pytest.mark.parametrize("given", ["head", "head:port", "LOCAL", "AUTO", "10.0.0.1:6379:x"])
def test_a_bad_ray_address_is_one_line(no_ray_env, given):
    with pytest.raises(ConfigError) as raised:
        ray_target(given)
    assert str(raised.value) == f"--ray-address {given!r}: expected HOST:PORT, auto, or ray://HOST:PORT"


def test_auto_finds_the_cluster_started_on_this_host(no_ray_env, monkeypatch):
    monkeypatch.setattr(compat, "find_local_ray_cluster", lambda: "10.1.2.3:6379")
    assert ray_target("auto") == RayTarget("auto", "10.1.2.3:6379")
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert ray_target(None) == RayTarget("auto", "10.1.2.3:6379")


def test_auto_without_a_cluster_on_this_host_is_one_line(no_ray_env, monkeypatch):
    monkeypatch.setattr(compat, "find_local_ray_cluster", lambda: None)
    with pytest.raises(ConfigError) as raised:
        ray_target("auto")
    assert str(raised.value) == ("--ray-address auto: no running Ray cluster found on this host (start one "
                                 "with `ray start --head`, or give --ray-address HEAD:PORT)")

    def unreadable():
        raise ConnectionError("Could not read the address of the running Ray instance")

    monkeypatch.setattr(compat, "find_local_ray_cluster", unreadable)
    with pytest.raises(ConfigError) as raised:
        ray_target("auto")
    assert str(raised.value) == "--ray-address auto: Could not read the address of the running Ray instance"


# ------------------------------------------------------------------------------------------------ driver_host

def test_the_driver_is_known_by_the_source_address_of_its_route_to_the_head():
    assert driver_host(RayTarget("127.0.0.1:6379", "127.0.0.1:6379")) == "127.0.0.1"


def test_no_route_to_the_head_is_one_line():
    target = ray_target("[::1]:6379")  # an IPv4 route to an IPv6 head: none
    with pytest.raises(ConfigError) as raised:
        driver_host(target)
    assert re.fullmatch(
        r"no network route from this host to the Ray head ::1 \(.+\), so Ray workers could not reach this "
        r"run's Prefect server; set PREFECT_API_URL to a Prefect server every Ray node can reach",
        str(raised.value))


# ---------------------------------------------------------------------------------- token_source, token auth

def test_the_token_is_found_in_rays_documented_order(no_ray_env, monkeypatch, tmp_path):
    assert token_source() is None
    default = no_ray_env / ".ray" / "auth_token"
    default.parent.mkdir(parents=True)
    default.write_text("t0")
    assert token_source() == str(default)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    assert token_source() is None  # a path given but no file there: not the default file either
    token = no_ray_env / "token"
    token.write_text("t1")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "~/token")
    assert token_source() == "~/token"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t2")
    assert token_source() == "RAY_AUTH_TOKEN"


def test_token_auth_is_enabled_without_rays_notice(monkeypatch, caplog):
    """Ray's own step (compat.enable_ray_token_auth, tests/test_compat.py) warns on a logger of its own, here
    stood in for: it changes Ray's process-wide config, which would outlive this test."""
    notice = logging.getLogger(compat.RAY_TOKEN_NOTICE_LOGGER)
    monkeypatch.setattr(notice, "level", logging.INFO)
    levels = []

    def enable():
        levels.append(notice.level)
        notice.warning("Token authentication is enabled for this Ray cluster.")

    monkeypatch.setattr(compat, "enable_ray_token_auth", enable)
    caplog.set_level(logging.INFO)
    enable_token_auth()
    assert levels == [logging.ERROR]
    assert [r for r in caplog.records if r.name == compat.RAY_TOKEN_NOTICE_LOGGER] == []
    assert notice.level == logging.INFO


# ------------------------------------------------------------------------ check_cluster: the pre-flight call

@pytest.fixture
def grpc_head():
    """A gRPC server on loopback that answers every call with `head.code` ('head.details')."""
    import grpc

    head = SimpleNamespace(code=grpc.StatusCode.UNAUTHENTICATED, details="bad token")

    def answer(request, context):
        context.abort(head.code, head.details)

    class Everything(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((Everything(),))
    head.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    yield head
    server.stop(None)


def test_a_head_that_wants_a_token_and_none_is_found(no_ray_env, grpc_head):
    with pytest.raises(ConfigError) as raised:
        check_cluster(ray_target(grpc_head.address))
    assert str(raised.value) == (
        f"the Ray cluster at {grpc_head.address} requires token authentication and no token was found: put "
        "the cluster's token (`ray get-auth-token` on the head) in ~/.ray/auth_token, or set "
        "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")


def test_a_head_that_rejects_the_token_names_where_it_came_from(no_ray_env, grpc_head):
    default = no_ray_env / ".ray" / "auth_token"
    default.parent.mkdir(parents=True)
    default.write_text("wrong")
    with pytest.raises(ConfigError) as raised:
        check_cluster(ray_target(grpc_head.address))
    assert str(raised.value) == (
        f"the Ray cluster at {grpc_head.address} rejected the authentication token from {default}; use the "
        "cluster's token (`ray get-auth-token` on the head)")


def test_other_answers_of_the_head_name_the_grpc_status(no_ray_env, grpc_head):
    import grpc

    grpc_head.code, grpc_head.details = grpc.StatusCode.PERMISSION_DENIED, "not yours"
    with pytest.raises(ConfigError) as raised:
        check_cluster(ray_target(grpc_head.address))
    assert str(raised.value) == (f"cannot reach the Ray cluster at {grpc_head.address} (permission_denied: "
                                 "not yours); check --ray-address and that the head is running")


def test_an_unreachable_head_is_one_line_before_joining(no_ray_env, monkeypatch):
    real, calls = compat.ray_cluster_id, []

    def ray_cluster_id(bootstrap, timeout):
        calls.append((bootstrap, timeout))
        return real(bootstrap, timeout=timeout)

    monkeypatch.setattr(compat, "ray_cluster_id", ray_cluster_id)
    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(ConfigError, match=rf"^cannot reach the Ray cluster at {address} \(unavailable: .+\); "
                                          r"check --ray-address and that the head is running$"):
        prepare(ray_target(address))
    assert calls == [(address, cluster.CHECK_TIMEOUT)]  # a head that never answers is given up on


def test_no_pre_flight_call_for_a_local_instance_or_the_ray_client(no_ray_env):
    port = closed_port()
    for target in (ray_target(None), ray_target(f"ray://127.0.0.1:{port}")):
        check_cluster(target)
        prepare(target)


# ------------------------------------------------------------------------------------------ runners.connect
# Ray's two messages when its proxy's server for a client died at its start (ray-project/ray#63202), as our
# multi-host client-mode test received them from Ray 2.60 (tests/test_multihost.py).
DIED_AT_START = [("Initialization failure from server:\nRuntimeError: Starting Ray client server failed. "
                  "See ray_client_server_23000.err for detailed logs."),
                 ("Initialization failure from server:\npsutil.ZombieProcess: PID still exists but it's a zombie "
                  "(pid=26696)")]


def failing_init(monkeypatch, errors: list[Exception]) -> list[str]:
    """ray.init replaced: raises `errors` in turn, then connects; returns the addresses it was called with."""
    from flows import runners

    calls = []

    def init(address, **kwargs):
        calls.append(address)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "connected"

    monkeypatch.setattr(runners.ray, "init", init)
    return calls


@pytest.mark.parametrize("message", DIED_AT_START, ids=["server failed", "zombie"])
def test_a_client_whose_server_died_at_its_start_connects_again(monkeypatch, caplog, message):
    from flows.runners import CLIENT_CONNECT_ATTEMPTS, connect

    address = "ray://10.0.0.1:10001"
    calls = failing_init(monkeypatch, [ConnectionAbortedError(message)] * (CLIENT_CONNECT_ATTEMPTS - 1))
    with caplog.at_level(logging.WARNING):
        assert connect(ray_target(address), {}, logging.getLogger("test")) == "connected"
    assert calls == [address] * CLIENT_CONNECT_ATTEMPTS
    assert [r.getMessage() for r in caplog.records] == [
        f"Ray's proxy at {address} could not start this client's server (ray-project/ray#63202): connecting "
        f"again (attempt {n} of {CLIENT_CONNECT_ATTEMPTS})" for n in range(2, CLIENT_CONNECT_ATTEMPTS + 1)]


@pytest.mark.parametrize("address, error, calls", [
    ("ray://10.0.0.1:10001", ConnectionAbortedError(DIED_AT_START[0]), 3),  # every attempt spent
    ("ray://10.0.0.1:10001", ConnectionAbortedError("Initialization failure from server:\nsomething else"), 1),
    ("ray://10.0.0.1:10001", ConnectionError("ray client connection timeout"), 1),
    ("10.0.0.1:6379", ConnectionAbortedError(DIED_AT_START[0]), 1),  # not through Ray Client
], ids=["attempts-spent", "other-server-failure", "other-error", "not-client-mode"])
def test_any_other_connect_failure_is_raised_at_once(monkeypatch, address, error, calls):
    from flows.runners import CLIENT_CONNECT_ATTEMPTS, connect

    assert CLIENT_CONNECT_ATTEMPTS == 3
    made = failing_init(monkeypatch, [error] * calls)
    with pytest.raises(type(error), match=re.escape(str(error))):
        connect(ray_target(address), {}, logging.getLogger("test"))
    assert made == [address] * calls


# --------------------------------------------------------------------- api_health, check_api_reachable

class Api(BaseHTTPRequestHandler):
    """/api/health: 200, /empty/health: 204, /down/health: 503, /gone/health: closed without an answer."""

    def do_GET(self):
        if self.path.startswith("/gone/"):
            self.close_connection = True
            return
        status = {"/api/health": 200, "/empty/health": 204, "/down/health": 503}.get(self.path, 404)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def api_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def node_ip(monkeypatch):
    import ray.util

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.7")
    return "10.0.0.7"


def test_api_health_from_a_node(api_server, node_ip, monkeypatch):
    import urllib.request

    real, timeouts = urllib.request.urlopen, []

    def urlopen(url, *args, **kwargs):
        timeouts.append(kwargs.get("timeout"))
        return real(url, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    assert api_health(f"{api_server}/api") == ("10.0.0.7", None)
    assert timeouts == [10]  # an API that accepts and never answers is given up on
    assert api_health(f"{api_server}/empty") == ("10.0.0.7", "HTTP 204")
    assert api_health(f"{api_server}/down") == ("10.0.0.7", "Service Unavailable")
    assert api_health(f"{api_server}/gone") == ("10.0.0.7", "Remote end closed connection without response")
    node, why = api_health(f"http://127.0.0.1:{closed_port()}/api")
    assert node == "10.0.0.7" and "Connection refused" in why


class RayCalls:
    """Ray's `nodes`, `remote` and `get` replaced by calls in this process: each probe runs here, on the node
    the test pretends it is on; what the probes asked Ray for is recorded."""

    def __init__(self, monkeypatch, nodes, timeout=False):
        import ray
        import ray.util

        self.nodes, self.timeout, self.options, self.here = nodes, timeout, [], None
        self.remote_options = None
        monkeypatch.setattr(ray, "nodes", lambda: self.nodes)
        monkeypatch.setattr(ray, "remote", self.remote)
        monkeypatch.setattr(ray, "get", self.get)
        monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: self.here)

    def remote(self, **options):
        self.remote_options = options

        def wrap(fn):
            return SimpleNamespace(options=lambda **o: self.bind(fn, o))

        return wrap

    def bind(self, fn, options):
        self.options.append(options)
        return SimpleNamespace(remote=lambda *args: (fn, options, args))

    def get(self, refs, timeout=None):
        import ray

        self.get_timeout = timeout
        if self.timeout:
            raise ray.exceptions.GetTimeoutError("timed out")
        results = []
        for fn, options, args in refs:
            self.here = NODE_IPS[options["scheduling_strategy"].node_id]
            results.append(fn(*args))
        return results


def node_id(n: int) -> str:
    return f"{n:02x}" * 28


NODE_IPS = {node_id(n): f"10.0.0.{n}" for n in range(1, 6)}
NODES = [
    {"NodeID": node_id(1), "Alive": True, "Resources": {"CPU": 4.0}},
    {"NodeID": node_id(2), "Alive": False, "Resources": {"CPU": 4.0}},   # dead
    {"NodeID": node_id(3), "Alive": True, "Resources": {"CPU": 0.0}},    # a head that runs no tasks
    {"NodeID": node_id(4), "Alive": True, "Resources": {"memory": 1}},   # no CPU at all
    {"NodeID": node_id(5), "Alive": True, "Resources": {"CPU": 0.5}},
    {"NodeID": node_id(6), "Alive": True},                               # resources unknown
]


def test_every_node_that_can_run_shards_is_probed_once(monkeypatch, api_server):
    ray = RayCalls(monkeypatch, NODES)
    check_api_reachable(f"{api_server}/api")
    assert ray.remote_options == {"num_cpus": 0, "max_retries": 0}  # a probe takes no CPU from a busy node
    asked = [(o["name"], o["scheduling_strategy"].node_id, o["scheduling_strategy"].soft)
             for o in ray.options]
    assert asked == [("api-probe", node_id(1), False), ("api-probe", node_id(5), False)]
    assert ray.get_timeout == cluster.PROBE_TIMEOUT


def test_the_first_node_that_cannot_reach_the_api_is_named(monkeypatch, api_server):
    RayCalls(monkeypatch, NODES)
    url = f"{api_server}/down"
    with pytest.raises(ConfigError) as raised:
        check_api_reachable(url)
    assert str(raised.value) == (
        f"Ray node 10.0.0.1 cannot reach the Prefect API at {url} (Service Unavailable); set PREFECT_API_URL "
        "to a Prefect server every Ray node can reach")


def test_nodes_that_do_not_answer_the_probe(monkeypatch, api_server):
    RayCalls(monkeypatch, NODES, timeout=True)
    with pytest.raises(ConfigError) as raised:
        check_api_reachable(f"{api_server}/api")
    assert str(raised.value) == ("Ray nodes did not answer a probe of the Prefect API within 120s; check the "
                                 "cluster's health (`ray status`)")
