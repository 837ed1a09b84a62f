"""`sidecar-ops demo --root` (issue 18, seen case 3 and deliverable 8).

The demo writes its data and its pipeline + dataset YAMLs under --root (default ./demo-data), works from any
working directory, and never deletes what it did not make: its marker lists every file it (and its merge)
writes, and a root holding anything else, even a *.parquet in a demo folder, is refused (one line, exit 2) and
left as it was.

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


@pytest.mark.parametrize("mine", ["base/my-project/results-2026.parquet", "all_in_one/mine.parquet",
                                  "all_in_one/2023/part-00000.parquet.bak", "base/2023/part-00003.parquet",
                                  "dqm/2025/part-00002.parquet"],
                         ids=["base-subfolder", "all-in-one", "beside-an-output", "a-shard-name-not-written",
                              "a-later-shard-of-a-smaller-demo"])
def test_a_users_parquet_among_the_demo_data_is_refused_and_left_alone(tmp_path, elsewhere, cli, recorded, mine):
    """Issue 26, case 7: a *.parquet a user put in a demo folder was deleted by the next demo. The marker lists
    what the demo wrote; anything else is refused, even under a name a bigger demo would have written."""
    root = tmp_path / "demo"
    assert cli("demo", "--root", root, "--shards", 2, "--rows", ROWS)[0] == 0
    (root / mine).parent.mkdir(parents=True, exist_ok=True)
    (root / mine).write_bytes(b"a user's results")
    before = shards(root)
    code, out, err = cli("demo", "--root", root, "--shards", 2, "--rows", ROWS)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, out + err
    assert lines[0] == (f"error: demo --root {root}: holds {mine}, which the demo did not write; move it away or "
                        "choose another --root (nothing was deleted)"), err
    assert (root / mine).read_bytes() == b"a user's results" and shards(root) == before


def test_the_marker_lists_every_file_the_demo_and_its_merge_write(tmp_path, elsewhere, cli, recorded):
    root = tmp_path / "demo"
    assert cli("demo", "--root", root, "--shards", 3, "--rows", ROWS)[0] == 0
    listed = (root / ".sidecar-ops-demo").read_text().splitlines()[1:]
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    outputs = [f"all_in_one/{rel}" for rel in shards(root / "base")]  # what its merge (recorded here) writes
    assert sorted(listed) == sorted(written + outputs)


def test_an_older_demos_marker_without_a_list_keeps_its_data(tmp_path, elsewhere, cli, recorded):
    root = tmp_path / "demo"
    assert cli("demo", "--root", root, "--shards", 2, "--rows", ROWS)[0] == 0
    (root / ".sidecar-ops-demo").write_text("Written by `sidecar-ops demo`: it may replace the demo data in this "
                                            "folder.\n")
    before = shards(root)
    code, out, err = cli("demo", "--root", root, "--shards", 2, "--rows", ROWS)
    assert code == 2 and "which the demo did not write" in err, out + err
    assert shards(root) == before
