"""Column lineage as data: what each step did to each column, and the one replay of it.

Every step's record (`StepRecord`) carries its `status` and its `lineage`: one `ColumnChange` per column the step
affects, saying where the column came from (the sibling's column `sibling`, the table's column `was` under a
new name, or the column's own values before the step, transformed by it) or that it was removed. The kernel writes it into provenance (`StepRecord.to_dict`), `StepRecord.from_dict`
reads it back (and converts the `appended`/`replaced`/`removed` lists that outputs of earlier versions
recorded), and `replay` turns the base schema plus the records into the expected output layout and each output
column's origin. Verify replays only here and never asks an operation what it did.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum


class Status(str, Enum):
    """What a step did on one shard. The values are what provenance has always recorded."""

    PLANNED = "planned"                    # derived from footers (dry run, verify without provenance)
    MERGED = "merged"                      # merge_from_sidecar copied its columns
    DROPPED = "dropped"                    # drop_columns removed its columns
    APPLIED = "applied"                    # any other operation did its step
    SKIPPED = "skipped_missing_sibling"    # an optional sibling was missing: the step did nothing
    FAILED = "failed"                      # verify only: what the step would do could not be derived

    @classmethod
    def of(cls, value) -> Status:
        """The status a record names; an unknown one (a later version's) counts as a step that was applied."""
        try:
            return cls(value)
        except ValueError:
            return cls.APPLIED

    @property
    def applied(self) -> bool:
        return self not in (Status.SKIPPED, Status.FAILED)


class Change(str, Enum):
    APPEND = "append"    # a new last column, from the sibling's column `sibling`
    REPLACE = "replace"  # an existing column's values, in place, from the sibling's column `sibling`
    RENAME = "rename"    # the table's column `was`, in place, now called `column`
    REMOVE = "remove"    # `column` taken out of the table
    TRANSFORM = "transform"  # `column`'s values, in place, made by the step from the column's own values before it
    ABSENT = "absent"    # `column` would be the table's `was`, but `was` is absent: a skipped step did not supply it


@dataclass(frozen=True)
class ColumnChange:
    column: str              # the column's name after the step (REMOVE: the name it had)
    change: Change
    sibling: str | None = None   # APPEND / REPLACE: the sibling shard's column its values are
    was: str | None = None       # RENAME / ABSENT: the column's name before the step

    def to_dict(self) -> dict:
        out = {"column": self.column, "change": self.change.value}
        if self.sibling is not None:
            out["sibling"] = self.sibling
        if self.was is not None:
            out["was"] = self.was
        return out

    @classmethod
    def from_dict(cls, d: dict) -> ColumnChange:
        return cls(str(d.get("column")), Change(d.get("change")), d.get("sibling"), d.get("was"))


def appended(column: str, sibling: str | None = None) -> ColumnChange:
    return ColumnChange(column, Change.APPEND, sibling=sibling or column)


def replaced(column: str, sibling: str | None = None) -> ColumnChange:
    return ColumnChange(column, Change.REPLACE, sibling=sibling or column)


def renamed(was: str, column: str) -> ColumnChange:
    return ColumnChange(column, Change.RENAME, was=was)


def removed(column: str) -> ColumnChange:
    return ColumnChange(column, Change.REMOVE)


def transformed(column: str) -> ColumnChange:
    return ColumnChange(column, Change.TRANSFORM)


def absent(was: str, column: str) -> ColumnChange:
    return ColumnChange(column, Change.ABSENT, was=was)


LEGACY = {"appended": Change.APPEND, "replaced": Change.REPLACE, "removed": Change.REMOVE}


def legacy_lists(lineage: Iterable[ColumnChange], *names: str) -> dict[str, list[str]]:
    """The column lists earlier versions recorded (`appended`, `replaced`, `removed`), derived from lineage, for
    the operations whose records always carried them (readers of earlier versions still understand them)."""
    lineage = tuple(lineage)
    return {name: [c.column for c in lineage if c.change is LEGACY[name]] for name in names}


def from_legacy(record: dict) -> tuple[ColumnChange, ...]:
    """The lineage of a record written before lineage was recorded: its removed, replaced and appended lists."""
    return (*(removed(c) for c in record.get("removed") or ()),
            *(replaced(c) for c in record.get("replaced") or ()),
            *(appended(c) for c in record.get("appended") or ()))


@dataclass(frozen=True)
class StepRecord:
    """One step's record on one shard: provenance keeps `to_dict()` beside the operation's own `to_dict()`."""

    status: Status
    lineage: tuple[ColumnChange, ...] = ()
    input: str | None = None     # the sibling's identity, ABSENT or NO_INPUT (none for a planned step)
    notes: dict = field(default_factory=dict)  # the operation's own facts, recorded as they are
    detail: str = ""             # verify only: why a derived step failed

    @property
    def applied(self) -> bool:
        return self.status.applied

    def to_dict(self) -> dict:
        out = {**self.notes, "status": self.status.value, "lineage": [c.to_dict() for c in self.lineage]}
        if self.input is not None:
            out["input"] = self.input
        return out

    @classmethod
    def from_dict(cls, record: dict) -> StepRecord:
        """A recorded step; one without `lineage` (written by an earlier version) through `from_legacy`."""
        raw = record.get("lineage")
        lineage = (tuple(ColumnChange.from_dict(c) for c in raw) if isinstance(raw, list)
                   else from_legacy(record))
        return cls(Status.of(record.get("status")), lineage, record.get("input"))


@dataclass(frozen=True)
class Origin:
    """Where an output column's values come from: the base's column, the sibling column of operations[step], or
    (`transformed`) operations[step] itself, from the column `column`'s values before that step."""

    column: str
    step: int | None = None
    transformed: bool = False


@dataclass(frozen=True)
class Layout:
    """The output a shard's records lead to: every column in order with its origin."""

    columns: tuple[tuple[str, Origin], ...]
    kept: int                        # the first `kept` columns stand where base columns stood; the rest were added
    explained: frozenset[str] = frozenset()  # columns whose absence a step recorded (an ABSENT change)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.columns]

    @property
    def base_part(self) -> list[str]:
        return self.names[:self.kept]

    @property
    def added(self) -> list[str]:
        return self.names[self.kept:]

    @property
    def origin(self) -> dict[str, Origin]:
        return dict(self.columns)

    def from_step(self, index: int) -> list[tuple[str, str]]:
        """(output column, sibling column) for every output column operations[index]'s sibling supplied."""
        return [(name, o.column) for name, o in self.columns if o.step == index and not o.transformed]


def replay(base: Sequence[str], records: Sequence[StepRecord] | None) -> Layout:
    """The expected output of a shard: the base columns, then each applied step's lineage in order.

    Lenient with records that contradict the table (a hand-edited provenance): a change naming a column that is
    not there adds it (REPLACE) or is ignored (REMOVE, RENAME), an APPEND of a present column replaces it; the
    schema and value checks then report the difference."""
    slots: list[list] = [[name, Origin(name), True] for name in base]  # [name, origin, stands at a base slot]
    explained: set[str] = set()

    def find(name: str) -> list | None:
        return next((s for s in slots if s[0] == name), None)

    for index, record in enumerate(records or ()):
        if not record.applied:
            continue
        for c in record.lineage:
            slot = find(c.was if c.change is Change.RENAME else c.column)
            if c.change is Change.REMOVE:
                if slot:
                    slots.remove(slot)
            elif c.change is Change.RENAME:
                if slot:
                    slot[0] = c.column
            elif c.change is Change.ABSENT:
                explained.add(c.column)
            elif c.change is Change.TRANSFORM:
                if slot:
                    slot[1] = Origin(c.column, index, transformed=True)
            elif slot:  # APPEND or REPLACE of a present column
                slot[1] = Origin(c.sibling or c.column, index)
            else:
                slots.append([c.column, Origin(c.sibling or c.column, index), False])
    kept = sum(1 for s in slots if s[2])
    ordered = [s for s in slots if s[2]] + [s for s in slots if not s[2]]
    return Layout(tuple((s[0], s[1]) for s in ordered), kept, frozenset(explained))


@dataclass(frozen=True)
class History:
    """What the steps before this one did on this shard: each earlier operation with its record, in order.
    `apply` and `plan` receive it, so a step can tell a column absent because an optional step was skipped
    from one absent because the pipeline is misconfigured."""

    steps: tuple[tuple[object, StepRecord], ...] = ()

    @classmethod
    def of(cls, operations: Sequence, records: Sequence[dict | StepRecord]) -> History:
        return cls(tuple((op, r if isinstance(r, StepRecord) else StepRecord.from_dict(r))
                         for op, r in zip(operations, records)))

    def then(self, operation, record: StepRecord) -> History:
        return History((*self.steps, (operation, record)))

    @property
    def records(self) -> tuple[StepRecord, ...]:
        return tuple(r for _, r in self.steps)

    def skipped_supplier(self, column: str) -> int | None:
        """The index of an earlier step that was skipped and may have supplied `column` (or that recorded it
        absent for that reason), or None."""
        for index, (op, record) in enumerate(self.steps):
            if record.status is Status.SKIPPED and op.supplies(column):
                return index
            if record.applied and any(c.change is Change.ABSENT and c.column == column for c in record.lineage):
                return index
        return None
