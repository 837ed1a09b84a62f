"""Data checks on one shard: the output re-read and compared with base and siblings, value for value.

`check_shard` is the unit of work a Runner schedules (locally, on Prefect or Ray); it runs every registered
data check on a `ShardValues` and folds score statistics. Data problems become failures, never exceptions.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import cached_property

import pyarrow as pa
import pyarrow.parquet as pq

from tasks import storage
from tasks.merge import Job
from tasks.ops.base import Findings
from tasks.ops.lineage import History, Layout, Status, Step, replay
from tasks.scorestats import ColumnPartial, StatSpec, column_partial
from tasks.verify.checks import BASE
from tasks.verify.compare import compare, one_line, read
from tasks.verify.registry import of_stage

DEEP_THREADS = 4


@dataclass(frozen=True)
class ShardTask:
    relpath: str
    deep: bool
    stats: bool
    records: tuple[Step, ...] | None
    ranges: dict


@dataclass
class ShardResult:
    relpath: str
    rows: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    stats: dict[str, ColumnPartial] = field(default_factory=dict)


def derived_records(job: Job, base: pa.Schema, relpath: str) -> tuple[Step, ...]:
    """Without provenance: what each operation would have done, from the sources' footers (as the merge decides)."""
    history, current, ds = History(), base, job.pipeline.dataset
    for op in job.pipeline.operations:
        try:
            current, step = op.plan(current, ds, relpath, history)
        except FileNotFoundError:
            source = op.input(ds)
            optional = source is not None and not source.required
            step = Step(Status.SKIPPED if optional else Status.FAILED, detail="sibling shard missing")
        except Exception as exc:
            step = Step(Status.FAILED, detail=one_line(exc))
        history = history.then(op, step)
    return history.records


@dataclass
class ShardValues:
    """One sampled shard as the data checks (and Operation.compare_values) see it."""

    job: Job
    relpath: str
    out: pa.Table
    base: pa.Table
    records: tuple[Step, ...]

    @property
    def dataset(self):
        return self.job.pipeline.dataset

    def read(self, uri: str, columns: list[str]) -> pa.Table:
        return read(uri, columns)

    def compare(self, name: str, got: pa.ChunkedArray, want: pa.ChunkedArray, cast: bool = False) -> str | None:
        return compare(name, got, want, cast)

    def one_line(self, exc: BaseException) -> str:
        return one_line(exc)

    @cached_property
    def layout(self) -> Layout:
        """The expected output columns, each with its origin (a base column, or operations[i]'s sibling column),
        replayed from the records over the base."""
        return replay(self.base.column_names, self.records)

    @cached_property
    def findings(self) -> list[Findings]:
        """Each operation's own value checks, run once and shared by the checks reporting them."""
        return [op.compare_values(self, i, rec) if rec.applied else Findings()
                for i, (op, rec) in enumerate(zip(self.job.pipeline.operations, self.records))]


def load_values(job: Job, relpath: str, out: pa.Table, records) -> ShardValues | str:
    """The shard's tables for the data checks, or why they cannot run (a failure of the first data check)."""
    try:
        base = read(job.base_uri(relpath), drop=job.pipeline.dataset.image_column)
    except Exception as exc:
        return f"base shard unreadable: {one_line(exc)}"
    if base.num_rows != out.num_rows:
        return f"output has {out.num_rows} rows, base has {base.num_rows}; values not compared"
    return ShardValues(job, relpath, out, base, records or derived_records(job, base.schema, relpath))


def deep_failures(job: Job, relpath: str, out: pa.Table, records: tuple[Step, ...] | None) -> dict[str, str]:
    shard = load_values(job, relpath, out, records)
    if isinstance(shard, str):
        return {BASE: shard}
    found = {check.name: check.run(shard) for check in of_stage("data")}
    return {name: "; ".join(lines) for name, lines in found.items() if lines}


def check_shard(job: Job, task: ShardTask, specs: tuple[StatSpec, ...]) -> ShardResult:
    """Deep checks and/or statistics for one shard; data problems become failures, never exceptions."""
    result = ShardResult(task.relpath)
    columns = None if task.deep else [s.column for s in specs]
    try:
        with storage.open_parquet(job.output_uri(task.relpath)) as f:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
            out = pf.read(columns=[c for c in names if columns is None or c in columns], use_threads=True)
    except Exception as exc:
        result.failures[BASE] = f"output shard unreadable: {one_line(exc)}"
        return result
    result.rows = out.num_rows
    if task.deep:
        result.failures.update(deep_failures(job, task.relpath, out, task.records))
    if task.stats:
        for spec in specs:
            part = column_partial(out, spec, task.ranges)
            if part is not None:
                result.stats[spec.column] = part
    return result


def check_locally(job: Job, specs: tuple[StatSpec, ...], tasks: list[ShardTask]) -> Iterator[ShardResult]:
    """The default runner: a small thread pool (each check holds a few tables)."""
    with ThreadPoolExecutor(DEEP_THREADS) as pool:
        futures = [pool.submit(check_shard, job, t, specs) for t in tasks]
        for future in as_completed(futures):
            yield future.result()


Runner = Callable[[Job, tuple, list], Iterable[ShardResult]]
