"""The check that ends a merge run: the operator guide's "Validate" (count the shards under each prefix, compare
the output with the base), done by the run itself from what it already holds.

It reads no footer: every output was checked once in this run already, a merged one by its post-write check
(provenance, row count, key column against the base), a kept one by the plan (provenance, recorded row count,
input identities). What is left to prove is that the output prefix holds exactly those outputs, as they were
checked. One fresh listing of the output prefix is compared with the base's listing, the size each shard task
wrote, the identity of each output the plan kept, and the input key each output recorded.

Another run may write the same prefix at the same time (a supported case: writes are atomic, the last one
stays). Its temp files are counted, not failed (the next run's sweep takes a killed writer's), and an output it
replaced after this run checked it is judged from its footer, as a resumed run would judge it: current (this
pipeline, made from the inputs listed) passes, anything else fails.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tasks import storage
from tasks.kernel import ShardStats, shard_key
from tasks.plan import Plan, output_status

EXAMPLES = 3  # relpaths named in a problem's line


@dataclass
class RunCheck:
    output_prefix: str
    table: list[dict[str, str]] = field(default_factory=list)  # check, expected, found, result: the artifact
    problems: list[str] = field(default_factory=list)          # one line each; none when the run passes
    rows: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.problems:
            return "run check FAILED: " + "; ".join(self.problems)
        return (f"run check passed: one output per base shard under {self.output_prefix}, nothing else, each as "
                f"checked ({self.rows:,} rows)")

    def add(self, check: str, expected, found, problem: str = "", info: bool = False) -> None:
        result = "info" if info else "FAILED" if problem else "ok"
        self.table.append({"check": check, "expected": _count(expected), "found": _count(found), "result": result})
        if problem:
            self.problems.append(problem)


class RunCheckFailed(RuntimeError):
    """The output prefix does not hold what the run made: the check's problems, one line each."""

    def __init__(self, check: RunCheck):
        super().__init__(check.line())
        self.check = check

    def __reduce__(self):
        return (type(self), (self.check,))


def check_run(plan: Plan, merged: dict[str, ShardStats], fresh: storage.Listing) -> RunCheck:
    """The run's outputs, as `fresh` lists them now, against the base's listing, the shard tasks' stats
    (`merged`, by relpath) and the outputs the plan kept as complete."""
    check = RunCheck(plan.job.output_prefix)
    base = plan.base.shards
    missing = [rel for rel in base if rel not in fresh.shards]
    check.add("one output per base shard", len(base), len(base) - len(missing),
              _problem(missing, "base shard(s) have no output"))
    others = [obj for obj in fresh.others if storage.TEMP_MARK not in obj]
    extra = sorted([rel for rel in fresh.shards if rel not in base] + others)
    check.add(f"nothing else under {plan.job.output_prefix}", 0, len(extra),
              _problem(extra, "object(s) under the output prefix are not outputs of base shards"))
    check.add("temp files of writes in flight in another run (or killed: the next run's sweep takes them)", 0,
              len(fresh.others) - len(others), info=True)
    changed, unknown = [], []
    for rel in base:
        if rel not in fresh.shards:
            continue
        if rel in merged:
            if fresh.shards[rel] != merged[rel].bytes:
                changed.append(rel)
        elif rel in plan.rows:
            if fresh.ids.get(rel) != plan.output.ids.get(rel):
                changed.append(rel)
        else:
            unknown.append(rel)
    rewritten = [rel for rel in changed if current(plan, rel, fresh)]
    changed = [rel for rel in changed if rel not in rewritten]
    present = len(base) - len(missing)
    check.add("outputs as checked (merged: size written; kept: identity listed)", present,
              present - len(changed) - len(unknown) - len(rewritten),
              _problem(changed, "output(s) changed after this run checked them and not current (another writer?)")
              or _problem(unknown, "output(s) neither written nor kept by this run"))
    check.add("outputs another run rewrote since, current (judged from their footers)", 0, len(rewritten), info=True)
    check.rows = sum(stats.rows for stats in merged.values()) + sum(plan.rows.values())
    check.add("rows in the outputs (each counted by its check)", "", check.rows, info=True)
    replaced = [rel for rel, stats in merged.items()
                if stats.input_key and stats.input_key != shard_key(plan.job.fingerprint, rel, plan.inputs(rel))]
    check.add("outputs made from inputs replaced during the run (a retry read the new version)", 0,
              len(replaced), info=True)
    for index in range(len(plan.job.pipeline.operations)):
        listing = plan.siblings(index)
        if listing is not None:
            check.add(f"operations[{index}] sibling shards for the base's", len(base),
                      len(base) - len(plan.missing_siblings(index)), info=True)
    return check


def current(plan: Plan, rel: str, fresh: storage.Listing) -> bool:
    """Whether the output another writer put in place of the one this run checked is current: this pipeline's,
    made from the inputs listed (the footer read once, as a resumed run's plan reads it)."""
    return output_status(plan.job, rel, plan.inputs(rel), fresh.shards[rel])[0] == "complete"


def _problem(relpaths: list[str], what: str) -> str:
    if not relpaths:
        return ""
    return f"{len(relpaths)} {what}, e.g. {', '.join(relpaths[:EXAMPLES])}"


def _count(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)
