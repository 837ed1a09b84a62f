"""A writer that dies after its shard landed: the retry finds the complete output and shows as Cached."""
from __future__ import annotations

import shutil
from pathlib import Path

from tasks import merge
from tasks.demo import make_dataset

REPO = Path(__file__).resolve().parents[1]


def test_retry_after_write_is_cached(tmp_path, monkeypatch, prefect_api, cli):
    shutil.copytree(REPO / "datasets", tmp_path / "datasets")
    shutil.copytree(REPO / "pipelines", tmp_path / "pipelines")
    monkeypatch.chdir(tmp_path)
    make_dataset("demo-data", shards=3, rows=50)
    real_write = merge.write_output
    crashed = []

    def write_then_die(job, relpath, state):
        stats = real_write(job, relpath, state)
        if not crashed:
            crashed.append(relpath)
            raise OSError("worker lost after the upload completed")
        return stats

    monkeypatch.setattr(merge, "write_output", write_then_die)
    code, out, err = cli("run", "pipelines/demo_merge_filters_dqm_ernie_image_aes.yaml",
                         "--output-prefix", "out/", "--retries", "1")
    assert code == 0, err
    assert "3 merged" in out and "0 failed" in out

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(
            name=TaskRunFilterName(like_=f"merge[2] {crashed[0]}")))
    names = {run.state.name for run in runs}
    assert "Cached" in names, names
