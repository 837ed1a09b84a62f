"""Secrets: with AWS credentials in the environment, nothing we emit contains them.

Real `sidecar-ops` processes (dry run, merge on the thread pool and with --use-ray on a local Ray instance,
verify with a JSON report, and a failing run with --debug at Prefect's DEBUG log level) get distinctive fake
credentials; moto accepts any. Then every output is
searched: stdout/stderr, the JSON report, every key-value of every output parquet footer, and everything
the Prefect API holds for those runs (flow and task runs with parameters and states, logs, artifacts).
"""
from __future__ import annotations

import json
import uuid

import pytest
from ray_fixtures import TAG, kill_tagged, new_tag
from reliability_fixtures import cli_env, make_demo, run_cli
from tasks import storage

ACCESS_KEY_ID = "AKIAFAKESIDECAROPS7QX"
SECRET_KEY = "fAkeSidecarOpsSecret/9zQ2xVbN3mKp7+LwRt5YhUe1"
SESSION_TOKEN = "FakeSidecarOpsSessionToken//Zm9vYmFyYmF6cXV4" + "Q" * 40
SECRETS = (ACCESS_KEY_ID, SECRET_KEY, SESSION_TOKEN)


def leaks(text: str) -> list[str]:
    # Also the secret's halves, so a truncated or wrapped line still counts.
    needles = [*SECRETS, SECRET_KEY[:20], SECRET_KEY[-20:], SESSION_TOKEN[:30]]
    return [n for n in needles if n in text]


def footer_text(output: str) -> str:
    parts = []
    for rel in storage.list_prefix(output).shards:
        meta = storage.read_footer(output + rel)
        parts += [f"{k!r}={v!r}" for k, v in (meta.metadata or {}).items()]
        parts.append(str(meta.schema.to_arrow_schema()))
        parts += [f"{k!r}={v!r}" for k, v in (meta.schema.to_arrow_schema().metadata or {}).items()]
    return "\n".join(parts)


def prefect_text(pipelines: list[str]) -> tuple[str, int, int]:
    """Everything the API holds for this test's flow runs (merge and verify of these pipelines, selected by
    their run names, which carry the pipeline path under this test's tmp_path): runs, parameters, states,
    task runs, logs and artifacts of exactly those runs. Returns (text, flow runs, logs)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter,
                                                FlowRunFilterId, FlowRunFilterName, LogFilter, LogFilterFlowRunId)

    names = [f"{kind} {p}" for p in pipelines for kind in ("merge", "verify")]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)))
        assert runs, f"no flow run named {names} reached the API"
        ids = [r.id for r in runs]
        chunks = [r.model_dump_json() for r in runs]
        chunks += [t.model_dump_json() for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))]
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))
        chunks += [log.model_dump_json() for log in logs]
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
            any_=ids)))
        assert artifacts, "no artifact of these flow runs reached the API"
        chunks += [a.model_dump_json() for a in artifacts]
    return "\n".join(chunks), len(runs), len(logs)


def run_ray(pipeline: str, output: str, env: dict, tag: str):
    try:
        return run_cli("run", pipeline, "--output-prefix", output, "--use-ray", "--max-inflight", "2", env=env,
                       timeout=420)
    finally:
        kill_tagged(tag)


def test_in_process_run_leaves_no_credential_in_the_api(tmp_path, monkeypatch, run):
    """The fast tier's share: a merge in this process (session API) with distinctive credentials in the
    environment; its flow run, task runs, logs and artifacts (read back by its own flow run id, once its
    summary artifact is there) and its footers hold none of them."""
    from core_fixtures import build

    for name, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                        ("AWS_SESSION_TOKEN", SESSION_TOKEN)):
        monkeypatch.setenv(name, value)
    setup = build(tmp_path, str(tmp_path / "data") + "/", shards=2)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output)
    assert code == 0, out + err
    assert not leaks(out + err)
    assert footer_text(setup.output).count("b'sidecar_ops'=") >= 2 and not leaks(footer_text(setup.output))
    text, n_runs, _ = prefect_text([str(setup.pipeline)])
    assert n_runs == 1 and "merge-summary" in text
    assert not leaks(text), "the Prefect API holds a credential"


@pytest.mark.slow
@pytest.mark.ray  # its --use-ray run starts a local Ray instance
@pytest.mark.timeout(900)  # on the test: pytest-timeout reads marks of tests, not of helpers
def test_no_output_contains_the_credentials(tmp_path, s3_root, moto_endpoint, prefect_api):
    demo = make_demo(tmp_path, s3_root, shards=3, rows=100)
    # DQM taken from the AES sidecar: no image_key there, so every shard fails.
    broken = tmp_path / "pipelines" / "broken.yaml"
    broken.write_text(open(demo.pipeline).read().replace(f"{s3_root}dqm/", f"{s3_root}aes/", 1))
    env = cli_env(PREFECT_API_URL=prefect_api, AWS_ENDPOINT_URL=moto_endpoint,
                  AWS_ACCESS_KEY_ID=ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                  AWS_SESSION_TOKEN=SESSION_TOKEN)
    debug_env = {**env, "PREFECT_LOGGING_LEVEL": "DEBUG"}
    tag = new_tag()  # the --use-ray run's own Ray processes carry it: cleanup by tag, never by name
    ray_env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"} | {TAG: tag}
    report = tmp_path / f"verify-{uuid.uuid4().hex[:6]}.json"
    out = ["--output-prefix", demo.output]
    runs = {
        "dry run": run_cli("run", demo.pipeline, *out, "--dry-run", env=env),
        "merge": run_cli("run", demo.pipeline, *out, env=env),
        "merge --use-ray": run_ray(demo.pipeline, f"{s3_root}ray_out/", ray_env, tag),
        "verify": run_cli("verify", demo.pipeline, *out, "--json", report, env=env),
        "failing run --debug": run_cli("run", broken, "--output-prefix", f"{s3_root}broken_out/", "--debug",
                                       env=debug_env),
        "verify --debug": run_cli("verify", demo.pipeline, *out, "--debug", env=debug_env),
    }
    codes = {name: r.returncode for name, r in runs.items()}
    assert codes == {"dry run": 0, "merge": 0, "merge --use-ray": 0, "verify": 0, "failing run --debug": 1,
                     "verify --debug": 0}, (
        codes, {n: r.stderr[-2000:] for n, r in runs.items() if r.returncode})
    assert "Traceback" in runs["failing run --debug"].stderr  # --debug really was verbose
    for name, r in runs.items():
        assert not leaks(r.stdout) and not leaks(r.stderr), f"{name} printed a credential"
    report_text = report.read_text()
    assert json.loads(report_text) and not leaks(report_text)
    footers = footer_text(demo.output) + footer_text(f"{s3_root}ray_out/")
    assert footers.count("sidecar_ops") >= 6 and not leaks(footers)
    api_text, n_runs, n_logs = prefect_text([demo.pipeline, str(broken)])
    assert n_runs >= 4 and n_logs > 0, (n_runs, n_logs)
    assert not leaks(api_text), "the Prefect API holds a credential"
