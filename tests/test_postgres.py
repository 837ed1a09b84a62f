"""PostgreSQL, the production database: a real PostgreSQL server, a real Prefect server on it, and a 1,000-shard
`sidecar-ops run` through that server on the thread runner, and a 300-shard one with `--use-ray` (local Ray; 1,000
would take two more minutes on a loaded 2-core machine). Everything the runs recorded is read back from
PostgreSQL itself; each output is checked with `sidecar-ops verify`.

The binaries come from Debian's `postgresql` package (.ci/run installs it); elsewhere the module is skipped.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from datetime import timedelta

import pytest
from pydantic import TypeAdapter

from core_fixtures import build, merge_dag
from postgres_fixtures import BIN, pg_bindir, postgres, prefect_server
from ray_fixtures import driver_env, kill_tagged, new_tag, no_errors, run
from test_deploy_e2e import ROOT
from tasks.demo import relpaths

pytestmark = pytest.mark.postgres

SHARDS, ROWS = 1000, 20
RAY_SHARDS = 300              # --use-ray: local Ray's start plus ~30 ms per task run on a loaded 2-core box
STEPS = 1                     # one task run a shard for its three operations (the default layout)
RECORD_TIMEOUT = 120          # task runs reach the database through the server's event pipeline

if pg_bindir() is None and not os.environ.get("CI"):
    pytest.skip("PostgreSQL server binaries not installed (apt-get install -y postgresql)", allow_module_level=True)


@pytest.fixture(scope="module")
def pg():
    with postgres() as server:
        yield server


def operator_env() -> dict[str, str]:
    """The settings deploy/postgres/prefect-server.env.example gives a shared server (its database URL aside)."""
    lines = (ROOT / "deploy/postgres/prefect-server.env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def api(pg, tmp_path_factory):
    """A Prefect server configured as deploy/postgres/ tells an operator to, on the test's PostgreSQL."""
    work = tmp_path_factory.mktemp("pg-server")
    with prefect_server(work / "home", work / "server.log", pg.url, **operator_env()) as (url, _proc):
        yield url, work


def dataset(tmp_path_factory, shards: int):
    work = tmp_path_factory.mktemp(f"pg-data-{shards}")
    return build(work, str(work / "data"), shards=shards, rows=ROWS)


def recorded(pg, output: str, expected: int) -> dict[str, int]:
    """State type -> number of task runs of the flow run that wrote `output`, once every one of them is final."""
    sql = ("select t.state_type, count(*), count(distinct t.name) from task_run t join flow_run f "
           f"on f.id = t.flow_run_id where f.parameters->>'output_prefix' = '{output}' group by 1")
    deadline = time.monotonic() + RECORD_TIMEOUT
    while True:
        rows = [line.split("|") for line in pg.psql(sql).splitlines()]
        counts = {state: int(n) for state, n, _ in rows}
        if (sum(counts.values()) >= expected and set(counts) <= {"COMPLETED", "FAILED", "CRASHED"}) \
                or time.monotonic() > deadline:
            distinct = sum(int(d) for *_, d in rows)
            assert distinct == sum(counts.values()), f"task runs recorded twice under one name: {rows}"
            return counts


def merge_through(pg, api, data, shards: int, name: str, *flags: str) -> None:
    url, work = api
    output = f"{data.root}{name}/"
    tag = new_tag()
    home = work / f"driver-home-{name}"
    try:
        code, out, err = run([data.pipeline, "--output-prefix", output, *flags], driver_env(tag, home, url),
                             work / f"logs-{name}")
    finally:
        kill_tagged(tag)
    assert code == 0, out + err
    no_errors(out, err)
    assert f"shards: {shards} total, {shards} merged, 0 skipped (already complete), 0 failed" in out + err, out + err
    assert f"rows merged: {shards * ROWS:,}" in out + err
    # the run used the given server: it started none of its own (that one would log into the driver's home)
    assert not (home / "sidecar-ops-server.log").exists()

    dag = merge_dag(output, relpaths(shards))  # the listings, one task a shard (STEPS), the run's check
    assert len(dag) == shards * STEPS + 6
    assert recorded(pg, output, len(dag)) == {"COMPLETED": len(dag)}
    flow_state = pg.psql(f"select state_type from flow_run where parameters->>'output_prefix' = '{output}'")
    assert flow_state == "COMPLETED"
    names = pg.psql("select t.name from task_run t join flow_run f on f.id = t.flow_run_id "
                    f"where f.parameters->>'output_prefix' = '{output}'").splitlines()
    assert sorted(names) == sorted(dag)

    check = subprocess.run([str(BIN / "sidecar-ops"), "verify", str(data.pipeline), "--output-prefix", output,
                            "--samples", "20"], env=driver_env(tag, home, url), capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "verify: PASS" in check.stdout


def test_thread_runner_merges_1000_shards_through_a_server_on_postgres(pg, api, tmp_path_factory):
    merge_through(pg, api, dataset(tmp_path_factory, SHARDS), SHARDS, "out-thread")


@pytest.mark.ray
def test_ray_merges_through_a_server_on_postgres(pg, api, tmp_path_factory):
    merge_through(pg, api, dataset(tmp_path_factory, RAY_SHARDS), RAY_SHARDS, "out-ray", "--use-ray")


def test_the_server_kept_everything_in_postgres_and_nothing_in_sqlite(pg, api):
    _url, work = api
    assert not list((work / "home").glob("*.db*")), list((work / "home").iterdir())
    assert pg.psql("select count(*) from alembic_version") == "1"  # Prefect's migrations ran here


def test_the_server_runs_with_the_operator_settings_of_deploy_postgres(api):
    url, _work = api
    with urllib.request.urlopen(f"{url}/admin/settings", timeout=10) as resp:
        server = json.loads(resp.read())["server"]
    duration = TypeAdapter(timedelta).validate_python
    vacuum = server["services"]["db_vacuum"]
    assert set(vacuum["enabled"]) == {"events", "flow_runs"}
    assert duration(vacuum["retention_period"]) == timedelta(days=30) and vacuum["loop_seconds"] == 3600
    assert duration(server["events"]["retention_period"]) == timedelta(days=7)
    assert server["services"]["task_run_recorder"]["batch_size"] == 100
    assert server["database"]["sqlalchemy"]["pool_size"] == 5 and server["database"]["timeout"] == 30
