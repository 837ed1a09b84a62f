"""Where a run's shard tasks execute, and what that asks of the Prefect API they report to.

A run on threads, or on a Ray instance it starts itself, stays on this host: its Prefect server listens on
loopback. A run that joins an existing cluster (`--ray-address HOST:PORT`, `auto`, `ray://HOST:PORT`) hands
its server's URL to workers on other hosts, so the server listens on the address the cluster knows this host
by (the source address of the route to the head) and is protected by a per-run credential.

Ray token authentication (`RAY_AUTH_MODE=token`, the default of new clusters in Ray 2.60) is found the way
Ray documents it: `RAY_AUTH_TOKEN`, the file at `RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`. Before joining,
the driver asks the head for its cluster id over gRPC, so a missing or wrong token, or an unreachable head,
is one line instead of a minute of retries and a traceback.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flows import compat
from tasks.errors import ConfigError

CHECK_TIMEOUT = 15.0      # seconds for the head to answer the pre-flight call
PROBE_TIMEOUT = 120.0     # seconds for every node's API probe (a node may first have to start a worker)
TOKEN_NOTICES = (compat.RAY_TOKEN_NOTICE_LOGGER,)
SET_API_URL = "set PREFECT_API_URL to a Prefect server every Ray node can reach"


@dataclass(frozen=True)
class RayTarget:
    """The Ray a run uses: `address` as given (None: a local instance for this run), `bootstrap` the head's
    host:port (GCS, or the Ray client server for ray://)."""

    address: str | None
    bootstrap: str | None = None

    @property
    def joins_cluster(self) -> bool:
        return self.bootstrap is not None

    @property
    def client_mode(self) -> bool:
        return bool(self.address) and self.address.startswith("ray://")

    @property
    def head_host(self) -> str:
        return self.bootstrap.rsplit(":", 1)[0].strip("[]")

    @property
    def all_on_this_host(self) -> bool:
        """A cluster whose head listens on loopback has every node on this host."""
        if not self.joins_cluster:
            return True
        try:
            return ipaddress.ip_address(socket.gethostbyname(self.head_host)).is_loopback
        except (OSError, ValueError):
            return False


def ray_target(address: str | None) -> RayTarget:
    """Resolve `--ray-address` (else $RAY_ADDRESS): None/'local' starts a local instance; 'auto' finds the
    cluster started on this host with `ray start`; 'HOST:PORT' and 'ray://HOST:PORT' join that cluster."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address in (None, "local"):
        return RayTarget(None)
    if address.startswith("ray://"):
        hostport = address[len("ray://"):].rstrip("/")
        if ":" not in hostport:
            hostport += ":10001"
        return RayTarget(address, hostport)
    if address == "auto":
        try:
            found = compat.find_local_ray_cluster()
        except (ConnectionError, ValueError) as exc:
            raise ConfigError(f"--ray-address auto: {exc}") from None
        if found is None:
            raise ConfigError("--ray-address auto: no running Ray cluster found on this host (start one with "
                              "`ray start --head`, or give --ray-address HEAD:PORT)")
        return RayTarget(address, found)
    if ":" not in address or not address.rsplit(":", 1)[1].isdigit():
        raise ConfigError(f"--ray-address {address!r}: expected HOST:PORT, auto, or ray://HOST:PORT")
    return RayTarget(address, address)


def driver_host(target: RayTarget) -> str:
    """The address the cluster knows this host by: the source address of the route to the head."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target.head_host, 1))  # UDP: picks a route, sends nothing
            return s.getsockname()[0]
    except OSError as exc:
        raise ConfigError(f"no network route from this host to the Ray head {target.head_host} ({exc}), so "
                          f"Ray workers could not reach this run's Prefect server; {SET_API_URL}") from None


def token_source() -> str | None:
    """Where Ray would read the cluster token from, or None (Ray's documented order)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return path if Path(path).expanduser().is_file() else None
    default = Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def enable_token_auth() -> None:
    """Use the cluster token when one is available and RAY_AUTH_MODE is unset, as `ray start` does."""
    notices = [logging.getLogger(name) for name in TOKEN_NOTICES]
    levels = [log.level for log in notices]
    for log in notices:
        log.setLevel(logging.ERROR)
    try:
        compat.enable_ray_token_auth()
    finally:
        for log, level in zip(notices, levels):
            log.setLevel(level)


def check_cluster(target: RayTarget) -> None:
    """Ask the head for its cluster id: one clear line for an unreachable head or a missing/wrong token."""
    if not target.joins_cluster or target.client_mode:
        return  # a local instance is ours; the Ray client server reports its own errors at connect time
    import grpc

    try:
        compat.ray_cluster_id(target.bootstrap, timeout=CHECK_TIMEOUT)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            source = token_source()
            if source is None:
                raise ConfigError(
                    f"the Ray cluster at {target.bootstrap} requires token authentication and no token was found: "
                    "put the cluster's token (`ray get-auth-token` on the head) in ~/.ray/auth_token, or set "
                    "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH") from None
            raise ConfigError(f"the Ray cluster at {target.bootstrap} rejected the authentication token from "
                              f"{source}; use the cluster's token (`ray get-auth-token` on the head)") from None
        raise ConfigError(f"cannot reach the Ray cluster at {target.bootstrap} ({code.name.lower()}: "
                          f"{exc.details()}); check --ray-address and that the head is running") from None


def prepare(target: RayTarget) -> None:
    """Before `ray.init`: token auth as Ray documents it, and the pre-flight call to the head."""
    if target.joins_cluster:
        enable_token_auth()
        check_cluster(target)


def api_health(api_url: str) -> tuple[str, str | None]:
    """On a Ray node: (this node's address, None if the Prefect API answers else why not)."""
    import ray

    node = ray.util.get_node_ip_address()
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=10) as resp:
            return node, None if resp.status == 200 else f"HTTP {resp.status}"
    except OSError as exc:
        return node, str(getattr(exc, "reason", exc))


def check_api_reachable(api_url: str) -> None:
    """Every alive node that can run shard tasks reaches the Prefect API; else stop before any write."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    probe = ray.remote(num_cpus=0, max_retries=0)(api_health)
    refs = [probe.options(name="api-probe", scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(api_url) for n in nodes]
    try:
        results = ray.get(refs, timeout=PROBE_TIMEOUT)
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(f"Ray nodes did not answer a probe of the Prefect API within {PROBE_TIMEOUT:.0f}s; "
                          "check the cluster's health (`ray status`)") from None
    failed = [(node, why) for node, why in results if why]
    if failed:
        node, why = failed[0]
        raise ConfigError(f"Ray node {node} cannot reach the Prefect API at {api_url} ({why}); "
                          f"{SET_API_URL}") from None
