"""`sidecar-ops` on a real multi-host Ray cluster: hosts are network namespaces joined by a bridge (see
netns_cluster.py), the Ray head (0 CPUs) on the head host with token authentication on, two worker hosts
with their own AWS credentials, a third host for a Ray client, and S3 on a moto server bound to the head's
cluster address. No PREFECT_API_URL unless a test says so: the run brings its own Prefect server.
"""
from __future__ import annotations

import base64
import errno
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from core_fixtures import build, read_table
from faultproxy import FaultProxy, Hold
from netns_cluster import BIN, can_build, network, ray_cluster
from ray_fixtures import TAG, kill_tagged, new_tag, tagged

from flows.server import free_port
from tasks import storage
from tasks.demo import relpaths

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]

REPO = Path(__file__).resolve().parents[1]
SHARDS, ROWS = 16, 2000
SHARD_TASKS = ("merge-shard",)  # one task a shard (the default layout)
DRIVER_SECRETS = {"AWS_ACCESS_KEY_ID": "driver-key-id-7f3a", "AWS_SECRET_ACCESS_KEY": "driver-secret-9c2e",
                  "AWS_SESSION_TOKEN": "driver-session-token-51d0"}
RUN_TIMEOUT = 300
# The head's RAY_JOB_STOP_WAIT_TIME_S: how long `ray job stop` lets the entrypoint end after SIGTERM before its
# SIGKILL (Ray's default 3 s). Well above the job test's --grace-seconds, so the summary is always printed.
JOB_STOP_WAIT = 60


# ----------------------------------------------------------------- the hosts, the cluster, S3 and the data

@pytest.fixture(scope="module")
def net():
    with network(3) as n:
        yield n


@pytest.fixture(scope="module")
def cluster(net, tmp_path_factory):
    with ray_cluster(net, net.hosts[:2], tmp_path_factory.mktemp("cluster"),
                     head_env={"RAY_JOB_STOP_WAIT_TIME_S": str(JOB_STOP_WAIT)}) as c:
        yield c


@pytest.fixture(scope="module")
def s3(net):
    """moto on the head's cluster address; this process's storage helpers point at it for the module."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port(net.head.ip)
    server = ThreadedMotoServer(ip_address=net.head.ip, port=port, verbose=False)
    server.start()
    endpoint = f"http://{net.head.ip}:{port}"
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    storage._s3.cache_clear()
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="cluster-data")
    try:
        yield endpoint
    finally:
        server.stop()
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved
        storage._s3.cache_clear()


@pytest.fixture(scope="module")
def data(s3, tmp_path_factory):
    return build(tmp_path_factory.mktemp("data"), "s3://cluster-data/", shards=SHARDS, rows=ROWS)


def driver_env(s3: str, home: Path, tag: str, cluster=None, **extra: str) -> dict[str, str]:
    """A driver on some host: the test's environment minus any Prefect API or Ray address, the S3 endpoint,
    the driver's own credentials, a fresh PREFECT_HOME, Prefect's default log level, the cluster token."""
    env = {k: v for k, v in os.environ.items() if k not in (
        "PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_LOGGING_LEVEL", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH")}
    env.update(DRIVER_SECRETS)
    env.update({TAG: tag, "PREFECT_HOME": str(home), "AWS_ENDPOINT_URL": s3,
                "HOME": str(home.parent)})  # no ~/.ray/auth_token unless a test puts one
    if cluster is not None:
        env.update(cluster.auth_env())
    env.update(extra)
    return env


def sidecar_ops(argv: list, env: dict, host=None, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "sidecar-ops"), *map(str, argv)]
    return subprocess.run(host.argv(cmd) if host else cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def tables(prefix: str) -> dict[str, object]:
    return {rel: read_table(prefix + rel).replace_schema_metadata(None) for rel in relpaths(SHARDS)}


def quiet(out: subprocess.CompletedProcess) -> None:
    text = out.stdout + out.stderr
    for bad in ("Traceback", "ERROR", "Error logging to API", "Failed to reach API"):
        assert bad not in text, f"{bad!r} in the run's output:\n{text[-4000:]}"


def counts(stdout: str) -> tuple[int, ...]:
    m = re.search(r"shards: (\d+) total, (\d+) merged, (\d+) skipped \(already complete\), (\d+) failed", stdout)
    assert m, stdout
    return tuple(int(x) for x in m.groups())


@pytest.fixture(scope="module")
def reference(data, s3, tmp_path_factory):
    """The thread runner's output on the same data: what every cluster run must equal."""
    home = tmp_path_factory.mktemp("ref") / "prefect-home"
    out = sidecar_ops(["run", data.pipeline, "--output-prefix", "s3://cluster-data/thread/"],
                      driver_env(s3, home, new_tag()))
    assert out.returncode == 0, out.stderr
    return tables("s3://cluster-data/thread/")


def verify_passes(data, prefix: str, s3: str, home: Path) -> None:
    out = sidecar_ops(["verify", data.pipeline, "--output-prefix", prefix, "--samples", SHARDS],
                      driver_env(s3, home, new_tag()))
    assert out.returncode == 0 and "verify: PASS" in out.stdout, out.stdout + out.stderr


def worker_ips_of(cluster, records: dict) -> set[str]:
    ips = {n["node_id"]: n["ip"] for n in records["nodes"]}
    return {ips[t["node_id"]] for t in records["tasks"] if t["node_id"]}


# ----------------------------------------------------------------- watching a run from outside

class ServerWatch(threading.Thread):
    """While a run lasts: find the Prefect server it started (a tagged process), note its credential and
    address, prove it refuses requests without the credential, and record the merge-progress artifact."""

    def __init__(self, tag: str):
        super().__init__(daemon=True)
        self.tag, self.stop = tag, threading.Event()
        self.auth = self.url = None
        self.unauthenticated_status = None
        self.progress: list[float] = []

    def request(self, path: str, body: dict, auth: str | None) -> tuple[int, object]:
        req = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if auth:
            req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None

    def run(self) -> None:
        while not self.stop.is_set():
            if self.url is None:
                for proc in tagged(self.tag):
                    if "PREFECT_SERVER_API_AUTH_STRING" in proc.env and {"--host", "--port"} <= set(proc.cmdline):
                        argv = list(proc.cmdline)
                        host, port = argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]
                        self.auth = proc.env["PREFECT_SERVER_API_AUTH_STRING"]
                        self.url = f"http://{host}:{port}/api"
            else:
                try:
                    if self.unauthenticated_status is None:
                        self.unauthenticated_status = self.request("/artifacts/filter", {}, None)[0]
                    status, found = self.request("/artifacts/filter", {"artifacts": {"key": {"any_": [
                        "merge-progress"]}}}, self.auth)
                    if status == 200:
                        self.progress += [a["data"] for a in found if a.get("type") == "progress"]
                except OSError:
                    pass
            self.stop.wait(0.25)


# ----------------------------------------------------------------- the tests

def test_two_host_run_without_prefect_api_url_equals_the_thread_runner(cluster, data, reference, s3, tmp_path):
    """(a) The run's own Prefect server listens on the head's cluster address behind a per-run credential;
    shard tasks run only on the worker hosts; output equals the thread runner's; logs reach the API; the
    progress artifact moves; no secret reaches Ray's records, the output or Prefect's records."""
    tag, home, out_prefix = new_tag(), tmp_path / "prefect-home", "s3://cluster-data/two-host/"
    watch = ServerWatch(tag)
    watch.start()
    proc = subprocess.Popen([str(BIN / "sidecar-ops"), "run", str(data.pipeline), "--output-prefix", out_prefix,
                             "--use-ray", "--ray-address", cluster.address, "--task-cpus", "1",
                             "--max-inflight", "4", "--keep-run-history"], cwd=REPO, env=driver_env(s3, home, tag, cluster),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        watch.stop.set()
        watch.join()
        kill_tagged(tag)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert run.returncode == 0, stderr
    quiet(run)
    assert counts(stdout) == (SHARDS, SHARDS, 0, 0)
    assert tables(out_prefix) == reference

    # The server: on the head's cluster address, refusing requests without the run's credential.
    assert watch.url is not None and watch.url.startswith(f"http://{cluster.net.head.ip}:"), watch.url
    assert f"Prefect API {watch.url}" in stderr
    assert watch.unauthenticated_status == 401
    # The progress artifact moved during the run and ended at 100%.
    assert any(0 < p < 100 for p in watch.progress), watch.progress  # its end (100%) is checked in the DB below

    # Ray's records: every shard task ran on a worker host, none on the head; no secret in any runtime env.
    records = cluster.records("nodes", "jobs", "tasks", driver_pid=proc.pid, names=list(SHARD_TASKS))
    assert len(records["tasks"]) >= SHARDS  # one task a shard (retries may add some)
    assert {t["state"] for t in records["tasks"]} == {"FINISHED"}
    assert worker_ips_of(cluster, records) == {h.ip for h in cluster.workers}
    ray_text = json.dumps(records)
    assert "AWS_ENDPOINT_URL" in ray_text and "PREFECT_API_URL" in ray_text  # non-secret settings travel
    for secret in [*DRIVER_SECRETS.values(), watch.auth]:
        assert secret not in ray_text
        assert secret not in stdout + stderr
    assert "PREFECT_API_AUTH_STRING" not in ray_text

    # Prefect's records (the run server's SQLite database and its log) hold the run's logs, not its secrets.
    db = home / "prefect.db"
    import sqlite3

    with sqlite3.connect(db) as con:
        messages = [m for (m,) in con.execute("select message from log")]
        finished = con.execute("select count(distinct task_run_id) from log where task_run_id is not null"
                               " and message = 'Finished in state Completed()'").fetchone()[0]
        artifacts = {k: t for k, t in con.execute("select key, type from artifact")}
        (final_progress,) = con.execute("select data from artifact where key = 'merge-progress'").fetchone()
    assert any(re.match(r"\d+ shards: 0 complete, \d+ to merge", m) for m in messages), messages[:20]
    assert sum(bool(re.match(r"shard \S+ merged: \d+ rows", m)) for m in messages) == SHARDS
    # Every task run's logs reached the API, those of the shard tasks on the worker hosts over the cluster network
    # (a Ray task posts them before its result returns: tests/test_cluster_logs.py holds it run after run).
    assert finished == SHARDS + len(data.prefixes) + 2  # the shards, the listings (base, sidecars, output), the check
    assert artifacts.get("merge-summary-table") == "table" and artifacts.get("merge-progress") == "progress"
    final = json.loads(final_progress) if isinstance(final_progress, (str, bytes)) else final_progress
    assert float(final) == 100.0
    stored = b"".join(p.read_bytes() for p in home.glob("*") if p.is_file())
    for secret in [*DRIVER_SECRETS.values(), watch.auth]:
        assert secret.encode() not in stored
    out_bytes = b"".join(storage.filesystem(out_prefix + rel)[0].cat_file(
        storage.filesystem(out_prefix + rel)[1]) for rel in relpaths(SHARDS))
    assert watch.auth.encode() not in out_bytes and DRIVER_SECRETS["AWS_SECRET_ACCESS_KEY"].encode() not in out_bytes


# The run's warning when Ray's proxy failed to start the run's server and the run connected again (flows/runners.py).
CONNECTED_AGAIN = "could not start this client's server (ray-project/ray#63202): connecting again"


def test_ray_client_mode_from_a_third_host(cluster, data, reference, s3, tmp_path, net):
    """(b) `--ray-address ray://HEAD:PORT` from a host outside the cluster: the run's server listens on that
    host's address, which the worker hosts reach; output equals the thread runner's."""
    client_host = net.hosts[2]
    earlier_jobs = [j["job_id"] for j in cluster.records("jobs")["jobs"]]
    out_prefix = "s3://cluster-data/client-mode/"
    tag = new_tag()
    try:
        run = sidecar_ops(["run", data.pipeline, "--output-prefix", out_prefix, "--use-ray", "--ray-address",
                           cluster.client_address, "--task-cpus", "1", "--max-inflight", "4"],
                          driver_env(s3, tmp_path / "prefect-home", tag, cluster), host=client_host)
    finally:
        kill_tagged(tag)
    client_logs = cluster.head_logs("ray_client_*") if run.returncode or CONNECTED_AGAIN in run.stderr else ""
    assert run.returncode == 0, f"{run.stderr}\nthe head's Ray Client logs:\n{client_logs}"
    if CONNECTED_AGAIN in run.stderr:  # Ray's own failure, survived: what Ray logged of it may say ERROR
        print(f"the run connected again; the head's Ray Client logs:\n{client_logs}")
    else:
        quiet(run)
    assert f"(Prefect API http://{client_host.ip}:" in run.stderr
    assert counts(run.stdout) == (SHARDS, SHARDS, 0, 0)
    assert tables(out_prefix) == reference
    records = cluster.records("nodes", "jobs", "tasks", not_jobs=earlier_jobs, names=list(SHARD_TASKS))
    assert records["tasks"], f"no shard task of the client-mode run in Ray's records: {records['jobs']}"
    assert worker_ips_of(cluster, records) <= {h.ip for h in cluster.workers}


def test_bad_token_or_unreachable_api_stops_before_any_write_with_one_line(cluster, data, s3, tmp_path,
                                                                          prefect_api):
    """Token missing or wrong: one line naming the fix, exit 2. A Prefect API the worker hosts cannot reach
    (a user's server on the head's loopback): one line saying to set PREFECT_API_URL, exit 2. Nothing written."""
    out_prefix = "s3://cluster-data/refused/"
    argv = ["run", data.pipeline, "--output-prefix", out_prefix, "--use-ray", "--ray-address", cluster.address]
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 64)
    cases = [({}, "requires token authentication and no token was found"),
             ({"RAY_AUTH_TOKEN_PATH": str(wrong)}, f"rejected the authentication token from {wrong}"),
             ({**cluster.auth_env(), "PREFECT_API_URL": prefect_api},
              f"cannot reach the Prefect API at {prefect_api}")]
    for extra, expected in cases:
        tag = new_tag()
        try:
            run = sidecar_ops(argv, driver_env(s3, tmp_path / "prefect-home", tag, **extra), timeout=180)
        finally:
            kill_tagged(tag)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert lines[-1].startswith("error: ") and expected in lines[-1], run.stderr
        assert [line for line in lines if line.startswith("error")] == [lines[-1]]
        if "PREFECT_API_URL" in extra:
            assert "set PREFECT_API_URL" in lines[-1]
    assert storage.list_prefix(out_prefix).shards == {}


def test_prefect_deployment_run_with_its_worker_on_the_head(cluster, data, reference, s3, tmp_path, net):
    """(d) An operator's Prefect server on the head's cluster address (with an API credential), a process
    worker on the head host, `prefect deployment run` of the merge with use_ray on the cluster."""
    from test_deploy_e2e import POOL, healthy, start, stop

    api_url = f"http://{net.head.ip}:{free_port(net.head.ip)}/api"
    auth = "operator:" + os.urandom(8).hex()
    tag = new_tag()
    env = {**driver_env(s3, tmp_path / "prefect-home", tag, cluster), "PREFECT_API_URL": api_url,
           "PREFECT_API_AUTH_STRING": auth, "PREFECT_CLI_PROMPT": "false", "PREFECT_WORKER_QUERY_SECONDS": "2",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    server_env = {**{k: v for k, v in env.items() if k != "PREFECT_API_URL"},
                  "PREFECT_SERVER_API_AUTH_STRING": auth}
    logs = tmp_path / "logs"
    logs.mkdir()
    port = api_url.rsplit(":", 1)[1].split("/")[0]
    procs = []

    def prefect(*args: str, timeout: float = 180) -> str:
        out = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"prefect {args}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}\n" + "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs.glob("*.log"))
        return out.stdout

    jobs_before = [j["job_id"] for j in cluster.records("jobs")["jobs"]]
    try:
        procs.append(start([str(BIN / "prefect"), "server", "start", "--host", net.head.ip, "--port", port,
                            "--no-ui"], server_env, logs / "server.log"))
        deadline = time.monotonic() + 180
        while not healthy(api_url):
            assert procs[0].poll() is None and time.monotonic() < deadline, (logs / "server.log").read_text()
            time.sleep(0.5)
        prefect("work-pool", "create", POOL, "--type", "process")
        prefect("deploy", "--prefect-file", "deploy/prefect.yaml", "--all")
        procs.insert(0, start([str(BIN / "prefect"), "worker", "start", "--pool", POOL], env, logs / "worker.log"))
        out = prefect("deployment", "run", "sidecar-merge/local", "--watch", "--watch-timeout", str(RUN_TIMEOUT), "-p", f"pipeline={data.pipeline}",
                      "-p", "output_prefix=s3://cluster-data/deployment/", "-p", "use_ray=true",
                      "-p", f"ray_address={cluster.address}", "-p", "task_memory_gb=0.25",
                      "-p", "max_inflight=4", timeout=RUN_TIMEOUT + 60)
    finally:
        for proc in procs:
            stop(proc)
        kill_tagged(tag)
    assert "Flow run finished successfully in 'Completed'" in out, out
    assert tables("s3://cluster-data/deployment/") == reference
    # Not just `use_ray=true` echoed back: the flow run's shard tasks ran on the cluster, on the worker hosts.
    records = cluster.records("nodes", "tasks", not_jobs=jobs_before, names=list(SHARD_TASKS))
    assert len(records["tasks"]) >= SHARDS, len(records["tasks"])  # one task a shard
    assert {t["state"] for t in records["tasks"]} == {"FINISHED"}
    assert worker_ips_of(cluster, records) == {h.ip for h in cluster.workers}


def test_losing_a_worker_host_mid_run_retries_its_task_and_completes(cluster, data, reference, s3, tmp_path):
    """(c) One worker host dies mid-run (every process in its namespace SIGKILLed), the other stays. The host
    is lost while it provably has a shard task in flight: the S3 proxy holds that host's first base-shard read
    until the host is gone. Ray runs the lost task again on the other host: the run completes, every shard
    verifies and equals the thread runner's, Ray's records show the lost attempt and the ones that finished,
    and no reader ever saw a partial shard. The host comes back afterwards."""
    lost = cluster.workers[0]
    out_prefix = "s3://cluster-data/host-lost/"
    hold = Hold(lambda op, path, client: op == "GetObject" and "/base/" in path and client == lost.ip)
    partial, seen = [], set()
    done = threading.Event()

    def watch() -> None:
        base_rows = {rel: pq.ParquetFile(storage.open_parquet(data.prefixes["base"] + rel)).metadata.num_rows
                     for rel in relpaths(SHARDS)}
        while not done.is_set():
            for rel in storage.list_prefix(out_prefix).shards:
                try:
                    rows = read_table(out_prefix + rel).num_rows
                except OSError as exc:
                    if exc.errno == errno.EBUSY:  # replaced by a newer whole object while read (s3fs checks
                        continue                  # the ETag): read the new one on the next round
                    partial.append(f"{rel}: {exc}")
                    continue
                except Exception as exc:  # a visible object that does not read whole is a partial shard
                    partial.append(f"{rel}: {exc}")
                    continue
                if rows != base_rows[rel]:
                    partial.append(f"{rel}: {rows} rows")
                seen.add(rel)
            done.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    tag = new_tag()
    try:
        with FaultProxy(s3, rate=0.0, host=cluster.net.head.ip, hold=hold) as proxy:
            argv = [str(BIN / "sidecar-ops"), "run", str(data.pipeline), "--output-prefix", out_prefix, "--use-ray",
                    "--ray-address", cluster.address, "--task-cpus", "1", "--max-inflight", "4"]
            proc = subprocess.Popen(argv, cwd=REPO, env=driver_env(proxy.url, tmp_path / "home1", tag, cluster),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            while not hold.arrived.wait(1):
                assert proc.poll() is None, "the run ended before the lost host read a shard:\n" + proc.stderr.read()
            killed = cluster.lose_host(lost)  # with a task of this run in flight on it
            hold.release.set()
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
        records = cluster.records("nodes", "tasks", driver_pid=proc.pid, names=list(SHARD_TASKS))
    finally:
        kill_tagged(tag)
        done.set()
        watcher.join()
    assert killed > 0
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stdout + stderr
    assert counts(stdout) == (SHARDS, SHARDS, 0, 0)
    lost_node = {n["node_id"] for n in records["nodes"] if n["ip"] == lost.ip}
    on_lost = [t for t in records["tasks"] if t["node_id"] in lost_node]
    assert any(t["state"] != "FINISHED" for t in on_lost), f"no lost attempt on {lost.ip}: {on_lost}"
    finished = [t for t in records["tasks"] if t["state"] == "FINISHED"]
    assert len(finished) == SHARDS, "every shard task finished once, the lost one on the other host"
    assert partial == [], partial
    assert tables(out_prefix) == reference
    verify_passes(data, out_prefix, s3, tmp_path / "home3")
    cluster.start_worker(lost)  # the host comes back for whatever runs next
    cluster.wait_for_nodes(3)


# ----------------------------------------------------------------- ray job submit, ray job stop, resubmit

def ray_job(cluster, *args: str, timeout: float = 180) -> str:
    """`ray job ARGS --address DASHBOARD` as an operator runs it on any host: the cluster token, no RAY_ADDRESS."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update({"RAY_AUTH_MODE": "token", **cluster.auth_env()})
    sub, *rest = args
    out = subprocess.run([str(BIN / "ray"), "job", sub, "--address", cluster.dashboard_url, *rest], env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"ray job {' '.join(args)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout + out.stderr


def job_status(cluster, job_id: str) -> str:
    """The job's status from the job server's REST API (what `ray job status` asks), with the cluster token."""
    req = urllib.request.Request(f"{cluster.dashboard_url}/api/jobs/{job_id}",
                                 headers={"Authorization": "Bearer " + cluster.token_path.read_text().strip()})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["status"]


def wait_for_job(cluster, job_id: str, until, timeout: float = RUN_TIMEOUT) -> str:
    """Poll the job's status until `until(status)` holds (deadline: `timeout`); returns the status."""
    deadline = time.monotonic() + timeout
    while not until(status := job_status(cluster, job_id)):
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {status} after {timeout:.0f}s:\n"
                                 + ray_job(cluster, "logs", job_id)[-4000:])
        time.sleep(1)
    return status


def job_story(cluster, job_id: str, *files: Path) -> str:
    """For a failure message: the job's logs, the head's lines about the job (its supervisor says whether the
    entrypoint ended after the stop signal or was SIGKILLed), and the tails of `files`."""
    lines = []
    for log in sorted((cluster.temp_dir / "session_latest" / "logs").rglob("*")):
        if log.is_file() and log.suffix in (".log", ".out", ".err"):
            lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                      if job_id in line or "terminate" in line]
    tails = [f"--- {f}\n{f.read_text(errors='replace')[-3000:]}" for f in files if f.is_file()]
    return "\n".join([ray_job(cluster, "logs", job_id)[-4000:], "--- head", *lines[-40:], *tails])


def object_versions(client, bucket: str, prefix: str) -> dict[str, list[tuple[str, str]]]:
    """Every object version under `prefix`: key -> [(version id, ETag)], newest first."""
    found: dict[str, list[tuple[str, str]]] = {}
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for v in page.get("Versions", []):
            found.setdefault(v["Key"], []).append((v["VersionId"], v["ETag"]))
        assert not page.get("DeleteMarkers"), page["DeleteMarkers"]
    return found


# The second submission's extra arguments. `("--overwrite",)` is the mutant the test must catch, a resume that
# recomputes everything: set it by hand and the S3 versions check fails (then the summary counts would).
RESUBMIT_EXTRA: tuple[str, ...] = ()


def test_ray_job_submit_stop_then_the_same_submission_recomputes_only_the_missing_shards(
        cluster, data, reference, s3, tmp_path):
    """The guide's job on the cluster: `ray job submit` of `sidecar-ops run --use-ray` to the head's job server,
    `ray job stop` while one shard is provably in flight (its base shard's GET from a worker host is held by
    a proxy in front of S3), then the same submission again. The first job ends STOPPED with some shards
    written, each whole, and none of the held one; the second SUCCEEDS merging exactly the missing shards
    and skipping the others, whose objects it leaves untouched (same S3 version); the output verifies."""
    import boto3

    bucket = "cluster-jobs"  # versioned: any rewrite of a shard would add a version
    client = boto3.client("s3", endpoint_url=s3)
    client.create_bucket(Bucket=bucket)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    out_key = "all_in_one/"
    out_prefix = f"s3://{bucket}/{out_key}"
    held = sorted(relpaths(SHARDS))[SHARDS // 2]
    held_path = "/" + (data.prefixes["base"] + held).removeprefix("s3://")
    workers = {h.ip for h in cluster.workers}
    hold = Hold(lambda op, path, client_ip: op == "GetObject" and path == held_path and client_ip in workers)
    tag = new_tag()
    home = tmp_path / "prefect-home"  # the driver runs on the head: its PREFECT_HOME, not the head's ~/.prefect
    entrypoint = [f"{TAG}={tag}", f"PREFECT_HOME={home}",  # test plumbing: cleanup by tag, a fresh home
                  "sidecar-ops", "run", str(data.pipeline), "--output-prefix", out_prefix, "--use-ray",
                  "--task-cpus", "1", "--max-inflight", "2", "--grace-seconds", "2"]
    with FaultProxy(s3, rate=0.0, host=cluster.net.head.ip, hold=hold) as proxy:
        runtime_env = json.dumps({"env_vars": {"AWS_ENDPOINT_URL": proxy.url}})

        def submit(job_id: str, *extra: str) -> None:
            ray_job(cluster, "submit", "--no-wait", "--submission-id", job_id, "--runtime-env-json", runtime_env,
                    "--", *entrypoint, *extra)

        first, second = f"sidecar-ops-{tag[:8]}-1", f"sidecar-ops-{tag[:8]}-2"
        try:
            submit(first)
            deadline = time.monotonic() + RUN_TIMEOUT
            while not hold.arrived.wait(1):  # the held shard is in flight: the run is provably mid-run
                status = job_status(cluster, first)
                assert status in ("PENDING", "RUNNING") and time.monotonic() < deadline, \
                    f"job {status}, hold never reached:\n" + ray_job(cluster, "logs", first)[-4000:]
            ray_job(cluster, "stop", first)  # SIGTERM to the entrypoint; waits for a terminal status
            assert wait_for_job(cluster, first, lambda s: s not in ("PENDING", "RUNNING")) == "STOPPED"
        finally:
            hold.release.set()
            kill_tagged(tag)
        first_logs = ray_job(cluster, "logs", first)
        assert "interrupted by SIGTERM" in first_logs, job_story(cluster, first, home / "sidecar-ops-server.log")
        assert "Traceback" not in first_logs, first_logs[-4000:]

        # After the stop: some shards written, not the held one; every visible object is a whole shard.
        before = object_versions(client, bucket, out_key)
        written = {key.removeprefix(out_key) for key in before}
        assert held not in written and 0 < len(written) < SHARDS, (held, sorted(written))
        assert all(len(v) == 1 for v in before.values()), before
        assert written <= set(relpaths(SHARDS)), sorted(written)  # only complete *.parquet, nothing else
        for rel in written:
            assert read_table(out_prefix + rel).replace_schema_metadata(None) == reference[rel], rel
        # ...and the first job's summary says so: what it merged, and that the rest was not started or abandoned.
        assert counts(first_logs)[:2] == (SHARDS, len(written)), first_logs[-4000:]
        stopped = re.search(r"interrupted by SIGTERM: (\d+) shards not started, (\d+) abandoned in flight",
                            first_logs)
        assert stopped and sum(map(int, stopped.groups())) == SHARDS - len(written), first_logs[-4000:]

        # The same submission again (the hold released): only the missing shards are merged.
        try:
            submit(second, *RESUBMIT_EXTRA)
            status = wait_for_job(cluster, second, lambda s: s not in ("PENDING", "RUNNING"))
        finally:
            kill_tagged(tag)
        second_logs = ray_job(cluster, "logs", second)
        assert status == "SUCCEEDED", second_logs[-4000:]
    after = object_versions(client, bucket, out_key)
    assert {k: after[k] for k in before} == before  # the first job's shards: not rewritten (same version)
    assert "Traceback" not in second_logs and "ERROR" not in second_logs, second_logs[-4000:]
    assert counts(second_logs) == (SHARDS, SHARDS - len(written), len(written), 0), second_logs[-4000:]
    assert set(after) == {out_key + rel for rel in relpaths(SHARDS)}
    assert all(len(v) == 1 for v in after.values()), after
    assert tables(out_prefix) == reference
    verify_passes(data, out_prefix, s3, tmp_path / "verify-home")
