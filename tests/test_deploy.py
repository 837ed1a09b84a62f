"""Static checks of deploy/: what can be proven without Docker, Kubernetes or AWS.

The Prefect deployments (and the commented Kubernetes examples) load, import and accept their parameters;
the Ray cluster config passes Ray's own validation and matches the guide's compute config; the Dockerfile
copies only what exists and its entrypoint runs the guide's job command; every `sidecar-ops` command in the
operating guide (docs/operating-guide.md), the README and the other docs parses.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
GUIDE = ROOT / "docs" / "operating-guide.md"
# Every document that shows commands: the README's quickstart and command list, the guide, the Ray, cluster and
# storage notes.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
K8S_MARK = "# Kubernetes (uncomment to use)"
# The guide's job command, with the image's /app paths (deploy/Dockerfile puts pipelines/ at /app/pipelines).
JOB_COMMAND = ("sidecar-ops run /app/pipelines/example_merge_filters_dqm_ernie_image_aes.yaml --use-ray "
               "--skip-existing --debug "
               "--output-prefix s3://core-cn-oss.canva.com/dataset/sidecar_parquet_all_in_one_0529/example/ "
               "--max-inflight 128 --task-cpus 1 --task-memory-gb 4")


def prefect_yaml_text(with_k8s: bool) -> str:
    text = (DEPLOY / "prefect.yaml").read_text()
    if not with_k8s:
        return text
    head, _, tail = text.partition(K8S_MARK)
    examples = tail[tail.index("\n#  - "):]  # the commented deployments follow the prose
    uncommented = [line[1:] for line in examples.splitlines() if line.startswith("#  ")]
    return head + "\n".join(uncommented) + "\n"


def deployments(with_k8s: bool = False) -> list[dict]:
    from flows.compat import validate_prefect_yaml

    raw = yaml.safe_load(prefect_yaml_text(with_k8s))
    validate_prefect_yaml(raw)  # the schema `prefect deploy` applies
    return raw["deployments"]


def test_prefect_yaml_declares_a_merge_and_a_verify_deployment_on_the_local_process_pool():
    found = {(d["entrypoint"], d["name"]): d for d in deployments()}
    assert set(found) == {("flows.merge:merge_flow", "local"), ("flows.verify:verify_flow", "local")}
    for d in found.values():
        assert d["work_pool"]["name"] == "sidecar-ops-local"
        # no pull step: `prefect deploy` records the clone's absolute path as the working directory
        assert "pull" not in d
    merge = found[("flows.merge:merge_flow", "local")]["parameters"]
    assert {k: merge[k] for k in ("overwrite", "max_inflight", "task_cpus", "task_memory_gb", "use_ray")} == \
        {"overwrite": False, "max_inflight": 128, "task_cpus": 1, "task_memory_gb": 4, "use_ray": False}


@pytest.mark.parametrize("with_k8s", [False, True], ids=["process", "with-kubernetes-examples"])
def test_every_entrypoint_imports_a_flow_that_accepts_its_parameters(with_k8s):
    from prefect import Flow
    from prefect.utilities.importtools import import_object

    entries = deployments(with_k8s)
    assert len(entries) == (4 if with_k8s else 2)
    for d in entries:
        flow = import_object(d["entrypoint"])
        assert isinstance(flow, Flow), d["entrypoint"]
        assert set(d["parameters"]) <= set(flow.parameters.properties), d["parameters"]
        flow.validate_parameters(d["parameters"])  # types, and every required parameter is present


def test_kubernetes_examples_run_from_the_image():
    k8s = [d for d in deployments(with_k8s=True) if d["name"] == "k8s"]
    assert len(k8s) == 2
    for d in k8s:
        assert d["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "/app"}}]
        assert d["work_pool"]["job_variables"]["image"]
        assert d["parameters"]["pipeline"].startswith("/app/pipelines/")
        assert (ROOT / d["parameters"]["pipeline"].removeprefix("/app/")).is_file()


def test_ray_cluster_config_passes_ray_validation_and_matches_the_guide():
    from flows.compat import validate_ray_cluster_config

    config = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    validate_ray_cluster_config(config)
    assert config["provider"]["type"] == "aws"
    nodes = config["available_node_types"]
    assert nodes[config["head_node_type"]]["node_config"]["InstanceType"] == "r5.4xlarge"
    workers = [n for name, n in nodes.items() if name != config["head_node_type"]]
    assert [(n["node_config"]["InstanceType"], n["min_workers"], n["max_workers"]) for n in workers] == \
        [("m5.4xlarge", 4, 4)]
    assert config["max_workers"] == 4
    for node in nodes.values():
        assert "InstanceMarketOptions" not in node["node_config"]  # on-demand, never spot
        assert not node.get("resources", {}).get("GPU")
    assert any(re.search(r"pip install .*/app\b", cmd) for cmd in config["setup_commands"])
    assert config["file_mounts"]["/app"] == "."


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_copies_existing_sources_and_places_the_yamls_under_app():
    steps = dockerfile_instructions()
    assert steps[0] == ("FROM", "python:3.11-slim")
    assert ("WORKDIR", "/app") in steps
    copies = {}
    for op, args in steps:
        if op == "COPY":
            *sources, dest = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY source {src} missing (build context: the project root)"
                copies[src.rstrip("/")] = dest
    assert copies["pipelines"] == "/app/pipelines/" and copies["datasets"] == "/app/datasets/"
    assert any(op == "RUN" and re.search(r"pip install /app\b", args) for op, args in steps)
    assert ("ENTRYPOINT", '["/app/deploy/entrypoint.sh"]') in steps
    assert copies["deploy/entrypoint.sh"] == "/app/deploy/entrypoint.sh"


def test_job_command_parses_and_its_pipeline_is_in_the_image():
    from flows.cli import parser
    from tasks.config import load_pipeline

    argv = shlex.split(JOB_COMMAND)
    assert argv[0] == "sidecar-ops"
    args = parser().parse_args(argv[1:])
    assert (args.command, args.use_ray, args.overwrite, args.max_inflight, args.task_cpus, args.task_memory_gb,
            args.fuse_operations) == ("run", True, False, 128, 1.0, 4.0, True)  # one streamed task a shard
    pipeline = load_pipeline(str(ROOT / args.pipeline.removeprefix("/app/")))  # as the image lays it out
    assert pipeline.operations


def entrypoint(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_image_entrypoint_hands_sidecar_ops_arguments_and_other_commands_on():
    bare = entrypoint("run", "--help")
    assert bare.returncode == 0 and "usage: sidecar-ops run" in bare.stdout
    full = entrypoint(*shlex.split(JOB_COMMAND)[:2], "--help")
    assert full.returncode == 0 and "usage: sidecar-ops run" in full.stdout
    other = entrypoint(sys.executable, "-c", "print('not sidecar-ops')")  # e.g. `prefect flow-run execute`
    assert other.returncode == 0 and other.stdout.strip() == "not sidecar-ops"
    bad = entrypoint("run", "/missing/pipeline.yaml", "--dry-run", "--output-prefix", "/tmp/nowhere/")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:")


def guide_commands(document: Path = GUIDE) -> list[str]:
    shell, language = [], None
    for line in document.read_text().splitlines():
        if line.startswith("```"):
            language = line[3:].strip() if language is None else None
        elif language == "bash":
            shell.append(line)
    lines = "\n".join(shell).replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip().startswith("sidecar-ops ")]


def test_the_operating_guide_shows_run_verify_and_the_job_command_unchanged():
    commands = guide_commands()
    assert {shlex.split(c)[1] for c in commands} >= {"run", "verify"}
    assert JOB_COMMAND in {" ".join(c.split()) for c in commands}  # step 3: the image runs the old job command


def test_the_readme_shows_every_command():
    commands = guide_commands(ROOT / "README.md")
    assert {shlex.split(c)[1] for c in commands} == {"run", "verify", "demo"}
    assert any("--dry-run" in c for c in commands)
    text = (ROOT / "README.md").read_text()
    assert "prefect deployment run 'sidecar-merge/" in text and "prefect deployment run 'sidecar-verify/" in text


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sidecar_ops_command_in_the_docs_parses(document):
    from flows.cli import parser

    for command in guide_commands(document):
        argv = shlex.split(command.split(" #")[0])[1:]
        try:
            parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"does not parse ({exc.code}): {command}")


def test_deployment_names_in_the_docs_exist():
    from prefect.utilities.importtools import import_object

    declared = {f"{import_object(d['entrypoint']).name}/{d['name']}" for d in deployments()}
    pattern = r"prefect deployment run '([\w-]+/[\w-]+)'"
    assert set(re.findall(pattern, GUIDE.read_text())) == declared  # the guide runs both deployments
    for document in DOCUMENTS:
        named = set(re.findall(pattern, document.read_text()))
        assert named <= declared, (document.name, named, declared)
