"""Real hosts on one machine: Linux network namespaces joined by veth pairs to a bridge, and a Ray cluster
across them with token authentication, as an operator would run it.

The head host is this (root) namespace, at the bridge's address .1 of a private /24: the Ray head (no CPUs:
it schedules, it does not work), the moto S3 server, drivers and Prefect servers run here. Each other host is
a namespace of its own with one address on the /24 and its own loopback, so nothing bound to 127.0.0.1 on the
head is reachable from it. Worker nodes start with their own AWS credentials and none of the driver's
settings (no S3 endpoint, no Prefect API): whatever they need must travel with the run.

Every process started here carries a tag in its environment, so cleanup finds all of them (Ray's agents
included) and nothing else on the machine.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ray_fixtures import TAG, kill_tagged, tagged

BIN = Path(sys.executable).parent
READY_TIMEOUT = 120


def can_build() -> str | None:
    """None when this machine can build namespaced hosts, else why not (for a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def free_ports(host: str, n: int) -> list[int]:
    """n distinct free ports: each socket is held until all are picked (picked one at a time, the kernel may hand
    the same port out twice, and Ray refuses a port given to two of its components)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


def _free_subnet() -> str:
    """A 10.x.y.0/24 no interface or route of this machine uses."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for _ in range(100):
        net = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"
        if f"{net}." not in routes:
            return net
    raise RuntimeError("no free 10.x.y.0/24 found")


@dataclass
class Host:
    name: str              # namespace name; "" for the head (this namespace)
    ip: str

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv] if self.name else list(argv)

    def pids(self) -> list[int]:
        if not self.name:
            return []
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


@dataclass
class Network:
    """A bridge with the head's address, and `count` namespaced hosts on it."""

    id: str
    net: str
    head: Host
    hosts: list[Host] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"scb{self.id}"


@contextlib.contextmanager
def network(count: int):
    ident = uuid.uuid4().hex[:5]
    net = Network(ident, _free_subnet(), Host("", ""))
    net.head = Host("", f"{net.net}.1")
    try:
        sh("ip", "link", "add", net.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{net.head.ip}/24", "dev", net.bridge)
        sh("ip", "link", "set", net.bridge, "up")
        for n in range(count):
            host = Host(f"sco{ident}h{n + 2}", f"{net.net}.{n + 2}")
            sh("ip", "netns", "add", host.name)
            net.hosts.append(host)
            leg = f"scv{ident}h{n + 2}"
            sh("ip", "link", "add", leg, "type", "veth", "peer", "name", "eth0", "netns", host.name)
            sh("ip", "link", "set", leg, "master", net.bridge, "up")
            sh("ip", "-n", host.name, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            sh("ip", "-n", host.name, "link", "set", "eth0", "up")
            sh("ip", "-n", host.name, "link", "set", "lo", "up")
        yield net
    finally:
        for host in net.hosts:
            for pid in host.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        subprocess.run(["ip", "link", "del", net.bridge], capture_output=True)


@dataclass
class RayCluster:
    net: Network
    tag: str
    token_path: Path
    temp_dir: Path
    port: int
    client_port: int
    workers: list[Host]
    logs: Path
    head_env: dict[str, str] = field(default_factory=dict)
    dashboard_port: int | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.net.head.ip}:{self.port}"

    @property
    def client_address(self) -> str:
        return f"ray://{self.net.head.ip}:{self.client_port}"

    @property
    def dashboard_url(self) -> str:
        """The dashboard and its job server (`ray job submit --address`), on the head's cluster address."""
        return f"http://{self.net.head.ip}:{self.dashboard_port}"

    def auth_env(self) -> dict[str, str]:
        """What a driver on any host needs to join: the token, found the way Ray documents."""
        return {"RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def node_env(self, host: Host) -> dict[str, str]:
        """A node's own environment: Ray's settings and this node's credentials, nothing of the driver's."""
        return {"PATH": f"{BIN}{os.pathsep}/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", "/root"),
                "LANG": "C.UTF-8", TAG: self.tag, "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(self.token_path), "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_raylet_start_wait_time_s": "60",
                # the head's Ray Client proxy waits this long for the server it starts per client (a fresh Python
                # importing Ray); its 30 s default ran out once on a loaded CI machine
                "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "180",
                "AWS_ACCESS_KEY_ID": f"node-{host.ip}-key-id", "AWS_SECRET_ACCESS_KEY": f"node-{host.ip}-secret",
                "AWS_DEFAULT_REGION": "us-east-1",
                # the code this test imports (a checkout on PYTHONPATH wins over the venv's editable install)
                **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}

    def _start(self, name: str, host: Host, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.log", "ab")
        env = {**self.node_env(host), **(self.head_env if host is self.net.head else {})}
        self.procs[name] = subprocess.Popen(host.argv(argv), env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start_head(self) -> None:
        ip = self.net.head.ip
        opts = ("--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                "--runtime-env-agent-port", "--metrics-export-port", "--node-manager-port", "--object-manager-port")
        taken = {self.port, self.client_port}
        picked = [p for p in free_ports(ip, len(opts) + len(taken)) if p not in taken][:len(opts)]
        ports = {opt: str(p) for opt, p in zip(opts, picked)}
        self.dashboard_port = int(ports["--dashboard-port"])
        self._start("head", self.net.head, [
            str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", ip, "--port", str(self.port),
            "--ray-client-server-port", str(self.client_port), "--num-cpus", "0", "--temp-dir", str(self.temp_dir),
            "--disable-usage-stats", "--include-dashboard", "true", "--dashboard-host", ip,  # the job server
            *[x for kv in ports.items() for x in kv]])

    def start_worker(self, host: Host, cpus: int = 1) -> None:
        name = f"worker-{host.ip}"
        (self.logs / f"{name}.log").unlink(missing_ok=True)
        self._start(name, host, [
            str(BIN / "ray"), "start", "--block", "--address", self.address, "--node-ip-address", host.ip,
            "--num-cpus", str(cpus), "--disable-usage-stats"])
        self.wait_for_log(name, "will now block forever")

    def head_logs(self, pattern: str, tail: int = 3000) -> str:
        """The end of each of the head's Ray logs named like `pattern` (e.g. the Ray Client's servers'), for a
        failure's message: they are gone with the cluster's temp dir."""
        found = sorted(self.temp_dir.glob(f"session_*/logs/{pattern}"))
        return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-tail:]}" for p in found) or (
            f"(no {pattern} under {self.temp_dir})")

    def lose_host(self, host: Host) -> int:
        """The host goes away: every process in its namespace is SIGKILLed. Returns how many."""
        pids = host.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def records(self, *what: str, **kw) -> dict:
        """Ray's own records (state API), read by a separate driver process that joins with the token."""
        env = {**os.environ, **self.auth_env(), "RAY_AUTH_MODE": "token", TAG: self.tag}
        env.pop("RAY_ADDRESS", None)
        out = subprocess.run([sys.executable, str(Path(__file__).with_name("ray_records.py")), self.address,
                              json.dumps({"what": list(what), **kw})],
                             env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def wait_for_log(self, name: str, text: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        log = self.logs / f"{name}.log"
        while text not in log.read_text(errors="replace"):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)

    def wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                alive = [n for n in self.records("nodes")["nodes"] if n["state"] == "ALIVE"]
                if len(alive) >= count:
                    return
            except (AssertionError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                                 for p in self.logs.glob("*.log"))
                raise AssertionError(f"Ray cluster did not reach {count} alive nodes\n{logs}")
            time.sleep(2)


@contextlib.contextmanager
def ray_cluster(net: Network, workers: list[Host], work: Path, head_env: dict[str, str] | None = None):
    """A Ray head on the head host (0 CPUs) with its dashboard and job server on the cluster address, and a
    1-CPU worker node on each of `workers`, token auth on. `head_env`: more of the head's environment (what
    the job supervisor reads, such as RAY_JOB_STOP_WAIT_TIME_S)."""
    token = work / "ray-token"
    token.write_text(secrets.token_hex(32))
    logs = work / "cluster-logs"
    logs.mkdir(parents=True, exist_ok=True)
    temp_dir = Path(f"/tmp/sco-{net.id}")  # short: Ray's unix socket paths must fit 107 bytes
    gcs_port, client_port = free_ports(net.head.ip, 2)
    cluster = RayCluster(net, uuid.uuid4().hex, token, temp_dir, gcs_port, client_port, workers, logs,
                         dict(head_env or {}))
    try:
        cluster.start_head()
        cluster.wait_for_log("head", "will now block forever")  # workers that join too early time out
        for host in workers:  # one at a time: on a busy machine, nodes registering together time out
            cluster.start_worker(host)
        cluster.wait_for_nodes(1 + len(workers))
        yield cluster
    finally:
        for host in workers:
            cluster.lose_host(host)
        kill_tagged(cluster.tag)
        for kept in temp_dir.glob("session_*/logs/ray_client_server*"):  # kept for a failure seen later
            shutil.copy(kept, logs / kept.name)
        shutil.rmtree(temp_dir, ignore_errors=True)


def tagged_env(tag: str, var: str) -> str | None:
    """The value of `var` in the environment of a live process carrying `tag`, if any."""
    for proc in tagged(tag):
        if var in proc.env:
            return proc.env[var]
    return None
