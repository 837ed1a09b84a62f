"""The Prefect UI, in a real headless browser, shows what a CLI run logged: the plan and one line per shard.

A user's Prefect server with its UI on a port other than 4200 (so PREFECT_UI_API_URL is set, as it must be),
`sidecar-ops run` with PREFECT_API_URL pointing at it, then Debian's Chromium renders the flow run's Logs tab
and the Artifacts page; the test reads the rendered DOM. `.ci/run` installs Chromium where it is missing.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_deploy_e2e import BIN, healthy, start, stop

from tasks.demo import make_dataset, relpaths

pytestmark = pytest.mark.ui

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
SHARDS = 4


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendered_text(url: str, profile: Path, expect: str, attempts: int = 5) -> str:
    """The page's text after its scripts ran (Chromium's virtual time lets the SPA fetch and render); the page
    is loaded again until `expect` (a regex) shows or the attempts run out, since the SPA's fetches may land
    after the snapshot."""
    for _ in range(attempts):
        out = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                              "--window-size=1600,8000", "--virtual-time-budget=20000", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120)
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", out.stdout))
        if re.search(expect, text):
            break
        time.sleep(2)
    return text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_ui_logs_tab_shows_the_plan_and_every_shard_of_a_cli_run(tmp_path):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_UI_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_LOGGING_LEVEL", None)  # Prefect's default (INFO), as a user has it
    for rel in ("datasets", "pipelines"):
        shutil.copytree(REPO / rel, tmp_path / rel)
    make_dataset(str(tmp_path / "demo-data"), shards=SHARDS, rows=100)
    server = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--ui"],
                   env, tmp_path / "server.log")
    try:
        deadline = time.monotonic() + 180
        while not healthy(api):
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.5)
        run = subprocess.run([str(BIN / "sidecar-ops"), "run", "pipelines/demo_merge_filters_dqm_ernie_image_aes.yaml",
                              "--output-prefix", "demo-data/all_in_one/"], cwd=tmp_path,
                             env={**env, "PREFECT_API_URL": api}, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert "INFO" not in run.stdout + run.stderr  # the console stays quiet
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            (flow_run,) = client.read_flow_runs()
            assert len(client.read_logs()) > 0, run.stderr
        base = f"http://127.0.0.1:{port}/runs/flow-run/{flow_run.id}"
        logs = rendered_text(f"{base}?tab=Logs", tmp_path / "chromium", rf"shard {re.escape(relpaths(SHARDS)[-1])}")
        assert "Something went wrong" not in logs and "didn't generate logs" not in logs, logs[:2000]
        assert re.search(rf"{SHARDS} shards: 0 complete, {SHARDS} to merge", logs), logs[:3000]
        assert re.search(r"operations\[2\] merge_from_sidecar from \S+: \d+ sibling shards found", logs), logs[:3000]
        for rel in relpaths(SHARDS):
            assert re.search(rf"shard {re.escape(rel)} merged: 100 rows", logs), (rel, logs[:3000])
        # the DAG the design card names: the listings, a merge a shard, the run's check (issue 28), as the Runs
        # page's task-run list shows them (the flow run page's own Task Runs tab ignores ?tab= while it loads)
        tasks = rendered_text(f"http://127.0.0.1:{port}/runs?tab=task-runs", tmp_path / "chromium", r"verify run ")
        dag = ["list main_prefix", *(f"list operations[{i}].source_prefix" for i in range(3)), "list output prefix",
               *(f"merge {rel}" for rel in relpaths(SHARDS)), f"verify run {tmp_path}/demo-data/all_in_one/"]
        assert f"{len(dag)} runs" in tasks, tasks[:3000]
        for name in dag:
            assert re.search(rf"{re.escape(name)} \+0 Completed", tasks), (name, tasks[:3000])
        artifacts = rendered_text(f"http://127.0.0.1:{port}/artifacts", tmp_path / "chromium", "merge-summary-table")
        # each key on its own: "merge-summary" must show apart from "merge-summary-table" (its prefix), which
        # the page was already waited for
        for key in ("merge-progress", "merge-summary", "merge-summary-table", "merge-run-check"):
            assert re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", artifacts), (key, artifacts[:3000])
    finally:
        stop(server)
