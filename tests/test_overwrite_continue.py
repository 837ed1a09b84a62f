"""Continuing an overwrite depends on no comparison of two machines' clocks (issue 26, case 5).

Each output of an --overwrite records the overwrite's id (its first run's id, carried by continuations); an
overwrite that does not finish prints `--continue-overwrite ID`, and a continuation keeps exactly the outputs
carrying that id and recomputes every other one. The old design kept outputs whose recorded run start was at
or after the overwrite's start: outputs of an earlier run on a host whose clock was 2 h ahead looked newer
than the overwrite and stayed in place. The skewed host is faked where the run takes its start
(flows.merge.now_utc); the overwrite is interrupted by a failing shard under --fail-fast.
"""
from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from core_fixtures import build, get_bytes, identities, objects, put_bytes, read_meta, swap_rows_fn
from test_flow_local import REL, SHARDS, assert_output_equals_inputs, summary_counts

import flows.merge
from flows.runconfig import RunConfig
from tasks.errors import ConfigError
from tasks.kernel import read_provenance

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

HINT = re.compile(r"rerun with --continue-overwrite (\S+) instead of --overwrite to continue")
FAILING = 1  # the overwrite (one shard at a time, --fail-fast) writes REL[0], fails REL[1], never starts the rest


def ahead(hours: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(hours=hours)).isoformat(timespec="microseconds")


def test_an_overwrite_continued_replaces_every_old_output_whatever_the_clocks(tmp_path, run, monkeypatch):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    with monkeypatch.context() as m:  # the first run, on a host whose clock is 2 h ahead
        m.setattr(flows.merge, "now_utc", lambda: ahead(2))
        assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    old = identities(setup.output)

    sibling = setup.prefixes["dqm"] + REL[FAILING]
    good = get_bytes(sibling)
    swap_rows_fn(sibling, 2, 9)  # misaligned: this shard fails, --fail-fast stops the overwrite there
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite", "--fail-fast",
                         "--max-inflight", "1")
    assert code == 1, out + err
    assert summary_counts(out + err) == (SHARDS, FAILING, 0, 1), out + err
    hint = HINT.search(out + err)
    assert hint, out + err
    overwrite_id = hint.group(1)
    assert str(uuid.UUID(overwrite_id)) == overwrite_id
    interrupted = identities(setup.output)
    assert [rel for rel in REL if interrupted[rel] != old[rel]] == REL[:FAILING]
    assert read_provenance(read_meta(setup.output + REL[0]))["overwrite_id"] == overwrite_id
    put_bytes(sibling, good)

    # continued from this host (clock right) with exactly the printed command
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--continue-overwrite", overwrite_id,
                         "--max-inflight", "1")
    assert code == 0, out + err
    assert summary_counts(out) == (SHARDS, SHARDS - FAILING, FAILING, 0), out + err
    final = identities(setup.output)
    assert all(final[rel] != old[rel] for rel in REL), "every output of the old run is replaced"
    assert all(final[rel] == interrupted[rel] for rel in REL[:FAILING]), "what the overwrite wrote is kept"
    assert {read_provenance(read_meta(setup.output + rel))["overwrite_id"] for rel in REL} == {overwrite_id}
    assert_output_equals_inputs(setup)
    assert objects(setup.output) == REL


def test_an_overwrite_whose_shard_fails_prints_how_to_continue(tmp_path, run):
    setup = build(tmp_path, str(tmp_path / "data"), shards=SHARDS)
    assert run(setup.pipeline, "--output-prefix", setup.output)[0] == 0
    swap_rows_fn(setup.prefixes["dqm"] + REL[2], 2, 9)
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite")
    assert code == 1 and summary_counts(out + err) == (SHARDS, SHARDS - 1, 0, 1), out + err
    assert re.search(r"the overwrite did not finish \(1 failed\): rerun with --continue-overwrite \S+ instead of "
                     r"--overwrite to continue", out + err), out + err


def test_continue_overwrite_takes_only_an_overwrite_id(tmp_path, cli, prefect_api):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1)
    code, _, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--continue-overwrite", "yesterday")
    assert code == 2
    assert err.strip().splitlines()[-1] == ("error: --continue-overwrite: 'yesterday' is not an overwrite id (the "
                                            "UUID an interrupted --overwrite's summary prints)")
    assert objects(setup.output) == []
    with pytest.raises(ConfigError, match="^--continue-overwrite and --overwrite-before: give one of them$"):
        RunConfig.load(str(setup.pipeline), setup.output, writes=True, continue_overwrite=str(uuid.uuid4()),
                       overwrite_before="2026-01-01T00:00:00Z")  # a flow run's parameters (argparse refuses both)
