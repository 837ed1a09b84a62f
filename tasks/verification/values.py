"""Data checks on one shard: the output re-read and compared with base and siblings, value for value, a window of
rows at a time.

`check_shard` is the unit of work a Runner schedules (locally, on Prefect or Ray). It opens the output, the base
and each sibling once and reads them in lockstep windows of as many rows as fit in the budget (job.window_bytes,
tasks.windows.WINDOW_BYTES by default; tasks.windows.RowWindows: whatever their row groups); it runs every registered data check on each window's
`ShardValues` and folds score statistics window by window. Comparisons and flagged rows tally across windows
(`Tally`, `Flagged`: `ShardValues.compare`, `.flag`), so the lines of the last window are the shard's. Memory holds a window of each file, never a whole table. Data problems
become failures, never exceptions.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property

import pyarrow as pa
import pyarrow.parquet as pq

from tasks import storage
from tasks.errors import ShardError
from tasks.kernel import Job, input_reads
from tasks.ops.base import Findings
from tasks.ops.lineage import History, Layout, Status, StepRecord, replay
from tasks.scorestats import ColumnPartial, StatSpec, column_partial
from tasks.verification.checks import BASE
from tasks.verification.compare import Flagged, Tally, one_line
from tasks.verification.registry import of_stage
from tasks.windows import PROBE_ROWS, RowWindows, parquet_file, window_rows

DEEP_THREADS = 8


@dataclass(frozen=True)
class ShardTask:
    relpath: str
    deep: bool
    stats: bool
    records: tuple[StepRecord, ...] | None
    ranges: dict
    listed: dict = field(default_factory=dict)  # uri -> identity from the plan's listings (storage.listed)


@dataclass
class ShardResult:
    relpath: str
    rows: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    stats: dict[str, ColumnPartial] = field(default_factory=dict)


def derived_records(job: Job, base: pa.Schema, relpath: str) -> tuple[StepRecord, ...]:
    """Without provenance: what each operation would have done, from the sources' footers (as the merge decides)."""
    history, current, ds = History(), base, job.pipeline.dataset
    for op in job.pipeline.operations:
        try:
            current, step = op.plan(current, ds, relpath, history)
        except FileNotFoundError:
            source = op.input(ds)
            optional = source is not None and not source.required
            step = StepRecord(Status.SKIPPED if optional else Status.FAILED, detail="sibling shard missing")
        except Exception as exc:
            step = StepRecord(Status.FAILED, detail=one_line(exc))
        history = history.then(op, step)
    return history.records


class Streams:
    """What the windows of one shard share: its files, each opened once (closed with `stack`), their readers
    advanced in lockstep, and the tally of every comparison. A read that fails after the first window leaves
    the shard `broken`: the checks stop there, with what they found so far."""

    def __init__(self, rows: int, stack: ExitStack, window_rows: int = 0):
        self.rows, self.stack, self.window_rows = rows, stack, window_rows  # 0: the whole shard at once
        self.files: dict[str, pq.ParquetFile] = {}
        self.readers: dict[tuple, RowWindows | BaseException] = {}
        self.taken: dict[tuple, int] = {}
        self.tallies: dict[tuple[str, int], Tally] = {}
        self.flagged: dict[tuple[str, str], Flagged] = {}
        self.broken = False

    def open(self, uri: str) -> pq.ParquetFile:
        if uri not in self.files:
            self.files[uri] = parquet_file(self.stack.enter_context(storage.open_parquet(uri)))
        return self.files[uri]

    def take(self, uri: str, columns: list[str], offset: int, n: int) -> pa.Table:
        """Rows offset..offset+n of the file's columns (a reader per (uri, columns), kept in step)."""
        key = (uri, tuple(columns))
        try:
            reader = self.readers.get(key) or self._reader(uri, columns)
            if isinstance(reader, BaseException):
                raise reader
            self._skip(key, reader, offset)
            window = reader.take(n)
            self.taken[key] = offset + n
            return window
        except BaseException as exc:
            self.readers[key] = exc
            self.broken = self.broken or offset > 0
            raise

    def _skip(self, key: tuple, reader: RowWindows, offset: int) -> None:
        """A reader first asked for after the first window starts at its rows too."""
        while self.taken.get(key, 0) < offset:
            skipped = reader.take(min(offset - self.taken.get(key, 0), self.window_rows or offset)).num_rows
            if not skipped:
                break
            self.taken[key] = self.taken.get(key, 0) + skipped

    def _reader(self, uri: str, columns: list[str]) -> RowWindows:
        pf = self.open(uri)
        if pf.metadata.num_rows != self.rows:
            raise ShardError(f"source shard has {pf.metadata.num_rows} rows, the output has {self.rows}")
        reader = self.readers[(uri, tuple(columns))] = RowWindows(pf, list(columns), self.window_rows or PROBE_ROWS)
        return reader


@dataclass
class ShardValues:
    """One window of a sampled shard as the data checks (and Operation.compare_values) see it: `out` and `base`
    are the window's rows (from row `offset` of the shard), `read(uri, columns)` the same rows of another file,
    `compare(name, got, want, cast)` a line counting the differences of every window so far."""

    job: Job
    relpath: str
    out: pa.Table
    base: pa.Table
    records: tuple[StepRecord, ...]
    offset: int = 0
    streams: Streams | None = None

    def __post_init__(self):
        if self.streams is None:  # one window: the whole of these tables
            self.streams = Streams(self.out.num_rows, ExitStack())
        self._seen: Counter = Counter()

    @property
    def dataset(self):
        return self.job.pipeline.dataset

    def read(self, uri: str, columns: list[str]) -> pa.Table:
        return self.streams.take(uri, columns, self.offset, self.out.num_rows)

    def compare(self, name: str, got: pa.ChunkedArray, want: pa.ChunkedArray, cast: bool = False) -> str | None:
        """The n-th comparison of `name` in a window continues the n-th of the windows before."""
        self._seen[name] += 1
        key = (name, self._seen[name])
        tally = self.streams.tallies.setdefault(key, Tally(name, self.streams.rows))
        tally.add(got, want, self.offset, cast)
        return tally.line()

    def flag(self, name: str, bad: pa.ChunkedArray, values: pa.ChunkedArray, what: str) -> str | None:
        """The rows of column `name` (`values`, this window's) that `bad` flags as `what`, added to the windows
        before: a line counting them over the shard and naming the first, or None while none is flagged."""
        flagged = self.streams.flagged.setdefault((name, what), Flagged(name, what, self.streams.rows))
        flagged.add(bad, values, self.offset)
        return flagged.line()

    def one_line(self, exc: BaseException) -> str:
        return one_line(exc)

    @cached_property
    def layout(self) -> Layout:
        """The expected output columns, each with its origin (a base column, or operations[i]'s sibling column),
        replayed from the records over the base."""
        return replay(self.base.column_names, self.records)

    def before(self, index: int, name: str) -> pa.ChunkedArray | None:
        """Column `name`'s values in this window as they were before operations[index] (replayed from the
        records before it): the base's, or an earlier step's sibling's; None when an earlier step transformed it
        (what it made is not reproduced here) or the column was not there."""
        origin = replay(self.base.column_names, self.records[:index]).origin.get(name)
        if origin is None or origin.transformed:
            return None
        if origin.step is None:
            return self.base[origin.column]
        source = self.job.pipeline.operations[origin.step].input(self.dataset)
        return self.read(source.uri(self.relpath), [origin.column])[origin.column]

    @cached_property
    def findings(self) -> list[Findings]:
        """Each operation's own value checks, run once and shared by the checks reporting them."""
        return [op.compare_values(self, i, rec) if rec.applied else Findings()
                for i, (op, rec) in enumerate(zip(self.job.pipeline.operations, self.records))]


def data_lines(shard: ShardValues) -> dict[str, str]:
    """Every data check on one window: check name -> its lines joined (checks that found nothing left out)."""
    found = {check.name: check.run(shard) for check in of_stage("data")}
    return {name: "; ".join(lines) for name, lines in found.items() if lines}


def deep_failures(job: Job, relpath: str, out: pa.Table, records: tuple[StepRecord, ...] | None) -> dict[str, str]:
    """The data checks of a shard whose output is at hand whole (one window)."""
    with ExitStack() as stack:
        try:
            base_pf = pq.ParquetFile(stack.enter_context(storage.open_parquet(job.base_uri(relpath))))
            base = base_pf.read(columns=base_columns(job, base_pf), use_threads=True)
        except Exception as exc:
            return {BASE: f"base shard unreadable: {one_line(exc)}"}
        if base.num_rows != out.num_rows:
            return {BASE: f"output has {out.num_rows} rows, base has {base.num_rows}; values not compared"}
        records = records or derived_records(job, base.schema, relpath)
        return data_lines(ShardValues(job, relpath, out, base, records, 0, Streams(out.num_rows, stack)))


def base_columns(job: Job, pf: pq.ParquetFile) -> list[str]:
    return [n for n in pf.schema_arrow.names if n != job.pipeline.dataset.image_column]


class Deep:
    """A sampled shard's deep checks fed window by window; `failures` holds the lines of the last window fed."""

    def __init__(self, job: Job, relpath: str, records, streams: Streams, base: pq.ParquetFile):
        self.job, self.relpath, self.streams = job, relpath, streams
        self.base_uri, self.base_names = job.base_uri(relpath), base_columns(job, base)
        schema = pa.schema([base.schema_arrow.field(n) for n in self.base_names])  # as the merge reads the base
        self.records = records or derived_records(job, schema, relpath)
        self.failures: dict[str, str] = {}

    def window(self, out: pa.Table, offset: int) -> None:
        try:
            base = self.streams.take(self.base_uri, self.base_names, offset, out.num_rows)
        except Exception as exc:
            self.failures = {BASE: f"base shard unreadable: {one_line(exc)}"}
            return
        self.failures = data_lines(ShardValues(self.job, self.relpath, out, base, self.records, offset,
                                               self.streams))


def open_deep(job: Job, relpath: str, records, streams: Streams) -> Deep | str:
    """The shard's deep checks with its base opened, or why they cannot run (a failure of the first data check)."""
    try:
        base = streams.open(job.base_uri(relpath))
    except Exception as exc:
        return f"base shard unreadable: {one_line(exc)}"
    if base.metadata.num_rows != streams.rows:
        return f"output has {streams.rows} rows, base has {base.metadata.num_rows}; values not compared"
    return Deep(job, relpath, records, streams, base)


def prefetch(job: Job, task: ShardTask, columns: list[str] | None) -> list[str]:
    """Start fetching the shard's objects at once where that saves round trips (S3, listed identities); the
    URIs asked for, to release what the check does not take."""
    out = job.output_uri(task.relpath)
    reads = [(out, (lambda c: True) if columns is None else columns.__contains__)]
    if task.deep:
        reads += input_reads(job, task.relpath)
    for uri, wanted in reads:
        storage.fetch_ahead(uri, wanted)
    return [uri for uri, _ in reads]


def check_shard(job: Job, task: ShardTask, specs: tuple[StatSpec, ...], window: int = 0) -> ShardResult:
    """Deep checks and/or statistics for one shard, `window` rows of each file at a time (0: as many as fit in
    job.window_bytes); data problems become failures, never exceptions."""
    columns = None if task.deep else [s.column for s in specs]
    with storage.listed(task.listed), ExitStack() as stack:
        stack.callback(storage.forget_ahead, prefetch(job, task, columns))
        return _check(job, task, specs, columns, Streams(0, stack, window))


def _check(job: Job, task: ShardTask, specs, columns: list[str] | None, streams: Streams) -> ShardResult:
    result, uri = ShardResult(task.relpath), job.output_uri(task.relpath)
    try:
        out = streams.open(uri)
    except Exception as exc:
        result.failures[BASE] = f"output shard unreadable: {one_line(exc)}"
        return result
    streams.rows = result.rows = out.metadata.num_rows
    names = [c for c in out.schema_arrow.names if columns is None or c in columns]
    deep = open_deep(job, task.relpath, task.records, streams) if task.deep else None
    if isinstance(deep, str):
        result.failures[BASE], deep = deep, None
    offset, size = 0, streams.window_rows or PROBE_ROWS
    while True:  # an empty shard is one empty window
        n = min(size, streams.rows - offset)
        try:
            window = streams.take(uri, names, offset, n)
        except Exception as exc:
            return ShardResult(task.relpath, streams.rows, {BASE: f"output shard unreadable: {one_line(exc)}"})
        if deep is not None:
            deep.window(window, offset)
        if task.stats:
            fold_stats(result.stats, window, specs, task.ranges)
        if not streams.window_rows:  # the first rows measured: as many as fit in the budget from now on
            size = streams.window_rows = window_rows(0, 2 * window.nbytes / max(n, 1), job.window_bytes)
        offset += n
        if offset >= streams.rows or streams.broken:
            break
    result.failures.update(deep.failures if deep is not None else {})
    return result


def fold_stats(stats: dict[str, ColumnPartial], window: pa.Table, specs, ranges: dict) -> None:
    """Add one window's statistics to the shard's (which counts as one shard, however many windows)."""
    for spec in specs:
        part = column_partial(window, spec, ranges)
        if part is None:
            continue
        if spec.column in stats:
            part.shards = 0
            stats[spec.column].add(part)
        else:
            stats[spec.column] = part


def check_locally(job: Job, specs: tuple[StatSpec, ...], tasks: list[ShardTask]) -> Iterator[ShardResult]:
    """The default runner: a small thread pool (each check holds a window of each file it reads)."""
    with ThreadPoolExecutor(DEEP_THREADS) as pool:
        futures = [pool.submit(check_shard, job, t, specs) for t in tasks]
        for future in as_completed(futures):
            yield future.result()


Runner = Callable[[Job, tuple, list], Iterable[ShardResult]]
