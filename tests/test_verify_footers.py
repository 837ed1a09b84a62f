"""Verify's footer facts (tasks/verification/footers.py): both footers of a shard read once, the footer checks run on
them, and each operation's recorded step read back from provenance."""
from __future__ import annotations

import re

import pytest
from core_fixtures import build, read_table, remove, three_ops, write_table

from tasks import storage
from tasks.config import load_pipeline
from tasks.demo import relpaths
from tasks.kernel import Job, merge_shard, read_provenance
from tasks.ops.lineage import StepRecord
from tasks.plan import make_plan
from tasks.scorestats import footer_ranges, stat_specs
from tasks.verification.checks import INPUTS, ROWS
from tasks.verification.footers import FooterFacts, op_records, read_footers
from test_verify_values import with_image

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

FIRST, LAST = relpaths(2)
UNREADABLE = "the check unreadable footers count under"


def merged(tmp_path, root):
    setup = build(tmp_path, root, shards=2, ops=three_ops)
    job = Job(load_pipeline(setup.pipeline), setup.output)
    for rel in (FIRST, LAST):
        with_image(setup.prefixes["base"] + rel)
        merge_shard(job, rel)
    return setup, job


def test_a_good_shard_has_its_rows_records_and_ranges_and_no_problem(tmp_path, root):
    """The base's image column is not expected in the output; the last shard skipped its optional watermark."""
    setup, job = merged(tmp_path, root)
    specs = stat_specs(job.pipeline.dataset)
    for rel in (FIRST, LAST):
        out_meta = storage.read_footer(job.output_uri(rel))
        records = op_records(read_provenance(out_meta), 3)
        assert [r.status.value for r in records] == ["merged", "merged",
                                                      "merged" if rel == FIRST else "skipped_missing_sibling"]
        facts = read_footers(job, rel, specs, True, UNREADABLE)
        assert facts == FooterFacts(rel, 40, 40, (), records, footer_ranges(out_meta, specs))
        assert facts.ranges and read_footers(job, rel, specs, False, UNREADABLE).ranges == {}


def test_footer_problems_are_named_by_their_check(tmp_path):
    setup, job = merged(tmp_path, str(tmp_path / "data"))
    out = read_table(job.output_uri(FIRST))
    write_table(out.slice(1), job.output_uri(FIRST))  # provenance kept, one row short
    facts = read_footers(job, FIRST, (), False, UNREADABLE)
    assert (facts.base_rows, facts.out_rows, facts.problems) == (40, 39, ((ROWS, "output has 39 rows, base has 40"),))


@pytest.mark.parametrize("which", ["base", "output"])
def test_an_unreadable_footer_is_one_problem_of_the_check_asked_for(tmp_path, which):
    setup, job = merged(tmp_path, str(tmp_path / "data"))
    remove(job.base_uri(FIRST) if which == "base" else job.output_uri(FIRST))
    facts = read_footers(job, FIRST, (), True, UNREADABLE)
    assert (facts.relpath, facts.base_rows, facts.out_rows, facts.records, facts.ranges) == (
        FIRST, None if which == "base" else 40, None, None, {})
    [(check, detail)] = facts.problems
    assert check == UNREADABLE
    folder = "base" if which == "base" else "out"
    assert re.fullmatch(rf"{which} footer unreadable: FileNotFoundError: .*/{folder}/{re.escape(FIRST)}.*", detail), \
        detail


RECORD = {"type": "drop_columns", "columns": ["w"], "status": "dropped",
          "lineage": [{"column": "w", "change": "remove"}], "input": "none"}


@pytest.mark.parametrize("prov, n_ops, expected", [
    ({"operations": [RECORD, RECORD]}, 2, (StepRecord.from_dict(RECORD), StepRecord.from_dict(RECORD))),
    ({"operations": [RECORD]}, 2, None),                   # not one record per operation
    ({"operations": [RECORD, RECORD]}, 1, None),
    ({"operations": {"0": RECORD}}, 1, None),              # not a list
    ({"operations": [RECORD, "dropped"]}, 2, None),        # a record that is not an object
    ({"operations": [{**RECORD, "lineage": [{"column": "w", "change": "melt"}]}]}, 1, None),  # lineage unparsed
    ({}, 0, None),
    (None, 0, None),
])
def test_op_records_only_from_one_record_per_operation(prov, n_ops, expected):
    assert op_records(prov, n_ops) == expected


def test_an_output_made_from_other_inputs_than_listed_now_is_stale(tmp_path):
    setup, job = merged(tmp_path, str(tmp_path / "data"))
    assert read_footers(job, FIRST, (), False, UNREADABLE, make_plan(job).inputs(FIRST)).problems == ()
    dqm = setup.prefixes["dqm"] + FIRST
    write_table(read_table(dqm).replace_schema_metadata(None), dqm)  # the same rows, written again
    [(check, detail)] = read_footers(job, FIRST, (), False, UNREADABLE, make_plan(job).inputs(FIRST)).problems
    assert check == INPUTS
    assert re.fullmatch(r"stale: .*operations\[0\].* since it was written \(the same comparison a run's plan "
                        r"makes\); rerun the merge to recompute it", detail), detail
