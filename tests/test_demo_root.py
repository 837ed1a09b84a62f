"""`sidecar-ops demo --root` (issue 18, seen case 3 and deliverable 8).

The demo writes its data and its pipeline + dataset YAMLs under --root (default ./demo-data), works from any
working directory, and never deletes what it did not make: a root holding anything a demo would not have
written is refused (one line, exit 2) and left as it was.

Fast tests run the demo in-process with its merge and verify recorded instead of run (each would start a
Prefect server); its dry run, which checks the YAMLs it wrote against the data, runs for real.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import flows.cli

SHARDS, ROWS = 3, 20


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[str, str, str]]:
    """The demo's `run` and `verify` steps as (command, pipeline, output prefix); dry runs run."""
    calls, real_run = [], flows.cli.cmd_run

    def run(args):
        if args.dry_run:
            return real_run(args)
        calls.append(("run", args.pipeline, args.output_prefix))
        return 0

    def verify(args):
        calls.append(("verify", args.pipeline, args.output_prefix))
        return 0

    monkeypatch.setattr(flows.cli, "cmd_run", run)
    monkeypatch.setattr(flows.cli, "cmd_verify", verify)
    return calls


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """A working directory that is not the repository."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def shards(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.parquet"))


def test_root_is_honoured_from_any_working_directory(tmp_path, elsewhere, cli, recorded):
    root = tmp_path / "my demo"
    code, out, err = cli("demo", "--root", root, "--shards", SHARDS, "--rows", ROWS)
    assert code == 0, out + err
    assert len(shards(root / "base")) == SHARDS and len(shards(root / "watermark")) == SHARDS - 1
    assert not (elsewhere / "demo-data").exists() and list(elsewhere.iterdir()) == []
    pipeline = root / "pipelines" / "demo_merge_filters_dqm_ernie_image_aes.yaml"
    output = f"{root}/all_in_one/"
    assert recorded == [("run", str(pipeline), output), ("verify", str(pipeline), output)]
    assert f"{root}/base/" in out  # the dry run read the YAMLs the demo wrote: prefixes under the root


def test_default_root_is_demo_data_in_the_working_directory(elsewhere, cli, recorded):
    code, out, err = cli("demo", "--shards", SHARDS, "--rows", ROWS)
    assert code == 0, out + err
    assert len(shards(elsewhere / "demo-data" / "base")) == SHARDS
    pipeline = "demo-data/pipelines/demo_merge_filters_dqm_ernie_image_aes.yaml"  # as the user would type them
    assert recorded == [("run", pipeline, "demo-data/all_in_one/"), ("verify", pipeline, "demo-data/all_in_one/")]
    assert f"{elsewhere}/demo-data/base/" in (elsewhere / pipeline).parent.parent.joinpath(
        "datasets", "demo_filters_dqm_ernie_image_aes.yaml").read_text()  # absolute: usable from anywhere


@pytest.mark.parametrize("given", [False, True], ids=["default root", "--root"])
def test_a_root_with_a_users_file_is_refused_and_left_alone(tmp_path, elsewhere, cli, recorded, given):
    root = tmp_path / "mine" if given else elsewhere / "demo-data"
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    code, out, err = cli("demo", *(["--root", root] if given else []), "--shards", SHARDS, "--rows", ROWS)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "notes.txt" in lines[0] and "--root" in lines[0], err
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"] and (root / "notes.txt").read_text() == "mine"
    assert not (elsewhere / "demo-data" / "base").exists() and recorded == []


def test_rerun_replaces_its_own_data_but_never_a_users_file(tmp_path, elsewhere, cli, recorded):
    root = tmp_path / "demo"
    assert cli("demo", "--root", root, "--shards", 4, "--rows", ROWS)[0] == 0
    (root / "all_in_one" / "2023").mkdir(parents=True)
    (root / "all_in_one" / "2023" / "part-00000.parquet").write_bytes(b"an output of the last demo run")
    code, out, err = cli("demo", "--root", root, "--shards", 2, "--rows", ROWS)
    assert code == 0, out + err
    assert len(shards(root / "base")) == 2 and not (root / "all_in_one").exists()  # nothing left of the last run

    for mine in (root / "notes.txt", root / "base" / "2023" / "notes.txt"):
        mine.write_text("mine")
        code, out, err = cli("demo", "--root", root, "--shards", 2, "--rows", ROWS)
        assert code == 2 and str(mine.relative_to(root)) in err, out + err
        assert mine.read_text() == "mine" and len(shards(root / "base")) == 2
        mine.unlink()


def test_a_root_that_is_a_file_or_on_s3_is_refused(tmp_path, elsewhere, cli, recorded):
    (tmp_path / "file").write_text("mine")
    for root in (tmp_path / "file", "s3://bucket/demo/"):
        code, out, err = cli("demo", "--root", root)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "--root" in err, out + err
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_end_to_end_under_root_from_another_directory(tmp_path, elsewhere, cli, prefect_api):
    root = tmp_path / "demo"
    code, out, err = cli("demo", "--root", root, "--shards", SHARDS, "--rows", ROWS)
    assert code == 0, out + err
    assert shards(root / "all_in_one") == shards(root / "base")
    assert "verify: PASS (all" in out + err, out + err
    assert list(elsewhere.iterdir()) == []
