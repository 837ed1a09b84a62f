"""`sidecar-ops run --use-ray --ray-address ADDR` on a real multi-node Ray cluster (a head and two worker
nodes on this machine), reading and writing S3 on a moto server that every node reaches.

The nodes are started without AWS_ENDPOINT_URL in their environment, as on a real cluster: the run itself must
hand the endpoint to its workers (runtime_env), and never its credentials (each node has its own chain).
"""
from __future__ import annotations

import json
import re

import pytest
from core_fixtures import build, expected_output, read_table
from ray_fixtures import (
    driver_env,
    driver_tasks,
    finish,
    kill_tagged,
    new_tag,
    no_errors,
    ray_cluster,
    start_run,
)

from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job
from tasks.verification import verify

pytestmark = pytest.mark.ray

SHARDS = 8
COLUMNS = [("dqm", "dqm_d1_v6_1"), ("aes", "ernie_image_aes"), ("watermark", "watermark")]


@pytest.fixture(scope="module")
def cluster(moto_endpoint):
    """Head without CPUs (it schedules, it does not work) and two 1-CPU worker nodes."""
    with ray_cluster(head={"num_cpus": 0}, workers=[{"num_cpus": 1}, {"num_cpus": 1}],
                     hide_env=("AWS_ENDPOINT_URL",)) as c:
        yield c


def summary_counts(out: str) -> tuple[int, ...]:
    m = re.search(r"shards: (\d+) total, (\d+) merged, (\d+) skipped \(already complete\), (\d+) failed", out)
    assert m, out
    return tuple(int(x) for x in m.groups())


def test_shard_tasks_run_on_both_worker_nodes_and_the_output_verifies(cluster, s3_root, prefect_api, tmp_path):
    setup = build(tmp_path, s3_root, shards=SHARDS, rows=300)
    tag = new_tag()
    env = driver_env(tag, tmp_path / "prefect-home", prefect_api)
    argv = [setup.pipeline, "--output-prefix", setup.output, "--use-ray", "--ray-address", cluster.address,
            "--task-cpus", "1", "--task-memory-gb", "0.125", "--max-inflight", "4"]
    try:
        proc, out, err = start_run(argv, env, tmp_path / "logs")
        code, stdout, stderr = finish(proc, out, err)
    finally:
        kill_tagged(tag)
    assert code == 0, stderr
    no_errors(stdout, stderr)
    assert summary_counts(stdout) == (SHARDS, SHARDS, 0, 0)

    tasks = driver_tasks(cluster.address, proc.pid)
    assert sorted(t.name for t in tasks) == ["merge-shard"] * SHARDS  # one task a shard (the default layout)
    assert {t.state for t in tasks} == {"FINISHED"}
    workers = {node.node_id for node in cluster.worker_nodes}
    used = {t.node_id for t in tasks}
    assert used == workers, f"shard tasks ran on {used}, worker nodes are {workers}"
    for t in tasks:  # --task-cpus / --task-memory-gb are each task's Ray resource request
        assert t.required_resources == {"CPU": 1.0, "memory": 0.125 * 2**30}, t.required_resources
        runtime_env = json.dumps(t.runtime_env_info)
        assert "AWS_ENDPOINT_URL" in runtime_env and "PREFECT_API_URL" in runtime_env
        assert "AWS_SECRET_ACCESS_KEY" not in runtime_env and "AWS_ACCESS_KEY_ID" not in runtime_env

    for rel in relpaths(SHARDS):
        cols = COLUMNS if rel != relpaths(SHARDS)[-1] else COLUMNS[:2]  # the watermark job skipped this one
        got = read_table(setup.output + rel).replace_schema_metadata(None)
        assert got.equals(expected_output(setup, rel, cols)), rel
    report = verify(Job(load_pipeline(str(setup.pipeline)), setup.output), samples=SHARDS, all_shards=True)
    assert report.ok, report.to_dict()
