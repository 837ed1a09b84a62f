"""The verify check registry: every check the report can hold, in report order, with what it reads.

A check is registered once (tasks/verification/checks.py) with its name, stage and the function that judges it; the
driver creates the report entries from here, the renderer takes the unit it counts from here, and
docs/verify-report.schema.json lists the names from here (tasks/verification/schema_doc.py).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

STAGES = {"listing": "listings (every shard), after the footers were read",
          "footer": "footers of every present shard",
          "data": "the data of sampled shards"}


@dataclass(frozen=True)
class Failure:
    path: str    # shard relpath, or object path relative to its prefix
    detail: str


@dataclass
class Check:
    """One check's entry in the report."""

    name: str
    stage: str          # listing | footer | data
    checked: int        # shards (or objects) examined
    failures: list[Failure] = field(default_factory=list)
    note: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail(self, path: str, detail: str) -> None:
        self.failures.append(Failure(path, detail))

    def to_dict(self) -> dict:
        return {"name": self.name, "stage": self.stage, "passed": self.passed, "checked": self.checked,
                "failed": len(self.failures), "note": self.note,
                "failures": [{"path": f.path, "detail": f.detail} for f in self.failures]}


@dataclass(frozen=True)
class CheckDef:
    """A registered check. `run` by stage:
      listing  run(ctx, check) fills the Check from the plan and footer facts (ctx: tasks.verification.driver.Context)
               per-operation checks: run(ctx, check, index)
      footer   run(job, footers) -> problem lines for one shard (footers: tasks.verification.footers.Footers)
      data     run(shard) -> problem lines for one sampled shard (shard: tasks.verification.values.ShardValues),
               called once per window: lines that count over the shard come from shard.compare or shard.flag;
               a check of single values is a RowRule
    Per-operation checks have `{index}` in their name and appear once per operation that lists their `key` in
    Operation.verify_checks()."""

    name: str
    stage: str
    unit: str           # what `checked` counts: shards | objects | sampled
    about: str          # one sentence for the JSON schema and the operator guide's list
    run: Callable
    key: str = ""       # per-operation checks only: the name operations contribute it by
    note: Callable | None = None  # footer checks: note(ctx) -> str

    @property
    def per_operation(self) -> bool:
        return "{index}" in self.name

    def pattern(self) -> str:
        return "^" + re.escape(self.name).replace(r"\{index\}", "[0-9]+").replace("\\ ", " ") + "$"


@dataclass(frozen=True)
class RowRule:
    """A data check that flags single values, registered as it is (`register(name, "data", "sampled",
    about)(RowRule(...))`): `columns(shard)` yields (name, values) of one window of a sampled shard
    (tasks.verification.values.ShardValues), `bad(values)` a boolean per row (null: not flagged). The flagged
    rows are counted over the shard's windows and the first named (`ShardValues.flag`): nothing else to write."""

    what: str           # what a flagged value is, for the line: "NaN"
    columns: Callable
    bad: Callable

    def __call__(self, shard) -> list[str]:
        return [line for name, values in self.columns(shard)
                if (line := shard.flag(name, self.bad(values), values, self.what))]


REGISTRY: list[CheckDef] = []


def register(name: str, stage: str, unit: str, about: str, key: str = "", note: Callable | None = None):
    """Decorator: register the function as the check `name` (registration order is report order)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (known: {', '.join(STAGES)})")

    def add(run: Callable) -> Callable:
        REGISTRY.append(CheckDef(name, stage, unit, about, run, key, note))
        return run
    return add


def of_stage(stage: str) -> list[CheckDef]:
    return [c for c in REGISTRY if c.stage == stage and not c.per_operation]


def report_order(operations, dataset) -> list[tuple[str, CheckDef, int | None]]:
    """(report name, definition, operation index or None) for every check of this pipeline, in report order."""
    order = []
    for check in REGISTRY:
        if not check.per_operation:
            order.append((check.name, check, None))
            continue
        for index, op in enumerate(operations):
            if check.key in op.verify_checks(dataset):
                order.append((check.name.format(index=index), check, index))
    return order


def definition(name: str) -> CheckDef | None:
    """The registered check behind a report name (a per-operation name matches its pattern)."""
    return next((c for c in REGISTRY if re.match(c.pattern(), name)), None)
