"""Screenshots of real merge runs in the Prefect UI, for docs/architecture.md (not collected by pytest).

    .venv/bin/python tests/ui_screenshots.py docs/img

A Prefect server with its UI on a free loopback port, the demo dataset merged twice through `sidecar-ops run`
(the default layout, then `--task-per-operation`), and Debian's headless Chromium photographing each flow
run's page: the graph of its task runs (listings, merges, the run's check) above the list of task runs.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from test_deploy_e2e import BIN, healthy, start, stop
from test_ui import CHROMIUM, CHROMIUM_FLAGS, REPO, free_port

from tasks.demo import make_dataset

LAYOUTS = {"merge-run-default.png": [], "merge-run-chain.png": ["--task-per-operation"]}


def main(out_dir: str) -> None:
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ui-shots-"))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_UI_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    for rel in ("datasets", "pipelines"):
        shutil.copytree(REPO / rel, work / rel)
    make_dataset(str(work / "demo-data"), shards=4, rows=1000)
    server = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--ui"],
                   env, work / "server.log")
    try:
        deadline = time.monotonic() + 180
        while not healthy(api):
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit((work / "server.log").read_text())
            time.sleep(0.5)
        for name, flags in LAYOUTS.items():
            output = f"demo-data/out-{name.removesuffix('.png')}/"
            run = subprocess.run([str(BIN / "sidecar-ops"), "run", "pipelines/demo_merge_filters_dqm_ernie_image_aes.yaml",
                                  "--output-prefix", output, *flags], cwd=work, env={**env, "PREFECT_API_URL": api},
                                 capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                sys.exit(run.stderr)
            flow_run = latest_flow_run(api)
            subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'chromium'}",
                            "--window-size=1600,1100", "--virtual-time-budget=30000", "--hide-scrollbars",
                            f"--screenshot={out / name}", f"http://127.0.0.1:{port}/runs/flow-run/{flow_run}"],
                           capture_output=True, text=True, timeout=180, check=True)
            print(f"{out / name}: flow run {flow_run} ({' '.join(flags) or 'default layout'})")
    finally:
        stop(server)
        shutil.rmtree(work, ignore_errors=True)


def latest_flow_run(api: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        return str(client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=1)[0].id)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(REPO / "docs" / "img"))
