"""One pipeline, two engines: `sidecar-ops run` on Prefect's thread pool and with `--use-ray` (a local Ray
started by the run) write the same output; and a `--use-ray` run with no PREFECT_API_URL starts exactly one
Prefect server, which every Ray worker reports to.

Both runs are real driver processes. While the Ray run works, a watcher reads /proc for every process carrying
the run's tag (the driver and all it started). The run's server stops with the run; afterwards a server on the
run's PREFECT_HOME shows, through the API, what the workers reported.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from core_fixtures import build, merge_dag
from ray_fixtures import driver_env, finish, kill_tagged, new_tag, no_errors, start_run, tagged

from flows.server import free_port, healthy, stop
from tasks.demo import relpaths
from tasks.kernel import PER_RUN_FIELDS, PROVENANCE_KEY

pytestmark = pytest.mark.ray

SHARDS = 6
API_LINE = re.compile(r"\(Prefect API (http://[^)]+)\)")


class Watch(threading.Thread):
    """What a tagged run's processes look like while it runs: the Prefect servers among them, and the
    PREFECT_API_URL of each Ray worker seen running a shard task."""

    def __init__(self, tag: str):
        super().__init__(daemon=True)
        self.tag = tag
        self.servers: dict[int, str] = {}
        self.workers: dict[int, str | None] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for proc in tagged(self.tag):
                title = proc.title
                if "flows.apiserver" in title or "prefect" in title and (
                        "server start" in title or "prefect.server.api.server" in title):
                    self.servers[proc.pid] = title
                elif title.split()[:1] in (["ray::merge-shard"], ["ray::merge"]):  # either layout
                    self.workers[proc.pid] = proc.env.get("PREFECT_API_URL")
            time.sleep(0.2)


@contextlib.contextmanager
def prefect_server_on(home: Path):
    """A Prefect server on an existing PREFECT_HOME (its SQLite database); yields a client of its API."""
    from prefect.client.orchestration import SyncPrefectClient

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port), "--no-ui"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, "Prefect server on the run's home did not start"
            time.sleep(0.3)
        with SyncPrefectClient(url) as client:
            yield client
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    return build(root, str(root / "data") + "/", shards=SHARDS, rows=250)


@pytest.fixture(scope="module")
def thread_run(setup, prefect_api, tmp_path_factory):
    """The reference: the thread pool, on the session's Prefect API (PREFECT_API_URL set: the run uses it)."""
    work = tmp_path_factory.mktemp("thread-run")
    out = setup.root + "out-threads/"
    tag = new_tag()
    try:
        code, stdout, stderr = finish(*start_run([setup.pipeline, "--output-prefix", out],
                                                 driver_env(tag, work / "prefect-home", prefect_api), work))
    finally:
        kill_tagged(tag)
    assert code == 0, stderr
    no_errors(stdout, stderr)
    assert f"(Prefect API {prefect_api})" in stderr
    return out


@pytest.fixture(scope="module")
def ray_run(setup, tmp_path_factory):
    """`--use-ray` with no PREFECT_API_URL and a fresh PREFECT_HOME, watched while it runs."""
    work = tmp_path_factory.mktemp("ray-run")
    out = setup.root + "out-ray/"
    home = work / "prefect-home"
    tag = new_tag()
    proc, stdout_path, stderr_path = start_run([setup.pipeline, "--output-prefix", out, "--use-ray",
                                                "--keep-run-history"],
                                               driver_env(tag, home, None), work)
    watch = Watch(tag)
    watch.start()
    try:
        code, stdout, stderr = finish(proc, stdout_path, stderr_path)
        deadline = time.monotonic() + 20  # Ray's agents take a moment to notice their raylet is gone
        while tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.5)
        watch.done.set()
        watch.join()
        leftovers = [p.title[:100] for p in tagged(tag)]
    finally:
        watch.done.set()
        kill_tagged(tag)
    return {"out": out, "home": home, "code": code, "stdout": stdout, "stderr": stderr, "watch": watch,
            "leftovers": leftovers}


def expected_task_runs(out: str) -> set[str]:
    return merge_dag(out, relpaths(SHARDS))  # the listings, one task a shard (the default layout), the check


# ----------------------------------------------------------------- item 3: one Prefect API for the run

def test_ray_run_starts_one_prefect_server_that_every_worker_reports_to(ray_run):
    run, watch = ray_run, ray_run["watch"]
    assert run["code"] == 0, run["stderr"]
    no_errors(run["stdout"], run["stderr"])
    api_url = API_LINE.search(run["stderr"]).group(1)
    assert api_url.startswith("http://127.0.0.1:"), api_url
    assert len(watch.servers) == 1, f"expected one Prefect server, saw {watch.servers}"
    (server,) = watch.servers.values()
    assert f"--port {api_url.rsplit(':', 1)[1].split('/')[0]} " in server + " "
    assert watch.workers, "never saw a Ray worker running a shard task"
    assert set(watch.workers.values()) == {api_url}, watch.workers
    assert run["leftovers"] == [], "processes left running after the run ended"

    # The run's server is gone; one on the same PREFECT_HOME shows what every worker reported to it.
    with prefect_server_on(run["home"]) as client:
        (flow_run,) = client.read_flow_runs()
        task_runs = client.read_task_runs(limit=200)
    assert flow_run.state.is_completed()
    assert sorted(t.name for t in task_runs) == sorted(expected_task_runs(run["out"]))
    assert {t.flow_run_id for t in task_runs} == {flow_run.id}
    assert all(t.state.is_completed() for t in task_runs), [(t.name, t.state) for t in task_runs]


# ----------------------------------------------------------------- item 6: same output on both engines

def footer(uri: str) -> tuple:
    meta = pq.ParquetFile(uri).metadata
    schema = meta.schema.to_arrow_schema()
    kv = dict(schema.metadata or {})
    prov = json.loads(kv.pop(PROVENANCE_KEY))
    assert all([prov.pop(name) for name in PER_RUN_FIELDS])  # per run; everything else must be equal
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return schema.remove_metadata(), kv, prov, groups


def test_thread_pool_and_ray_write_identical_output(thread_run, ray_run):
    assert ray_run["code"] == 0, ray_run["stderr"]
    threads, ray = Path(thread_run), Path(ray_run["out"])
    names = sorted(str(p.relative_to(threads)) for p in threads.rglob("*") if p.is_file())
    assert names == sorted(relpaths(SHARDS))
    assert sorted(str(p.relative_to(ray)) for p in ray.rglob("*") if p.is_file()) == names
    for rel in names:
        a, b = str(threads / rel), str(ray / rel)
        schema_a, meta_a, prov_a, groups_a = footer(a)
        schema_b, meta_b, prov_b, groups_b = footer(b)
        assert schema_a.equals(schema_b), rel
        assert meta_a == meta_b, rel
        assert prov_a == prov_b, rel
        assert groups_a == groups_b, rel
        assert pq.read_table(a).equals(pq.read_table(b)), rel
