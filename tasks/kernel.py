"""The per-shard merge kernel: pure pyarrow, no Prefect, no Ray.

A shard goes read_base -> apply_operation(0) -> apply_operation(1) ... -> write_output, which ends with the post-write
check (check_written) of what it stored: the task per operation, a `ShardState` (the table, the base's keys as
read, provenance entries) handed from step to step. A shard in one call (merge_shard, the fused task) streams
instead: open_shard checks and records every step from footers, stream_output takes a window of rows (as many
as the job's window budget holds, tasks/windows.py) at a time through every step into the output's writer, then
runs the same check.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import cache
from importlib.metadata import PackageNotFoundError, version

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks import chunkcopy, storage
from tasks.config import Pipeline
from tasks.errors import ShardError
from tasks.ops import History, Status, provenance_record
from tasks.ops.base import StepStream
from tasks.parquet_errors import unreadable_parquet
from tasks.windows import (PROBE_ROWS, WINDOW_BYTES, RowWindows, batches, parquet_file, use_returning_memory_pool,
                           window_rows)

log = logging.getLogger(__name__)

PROVENANCE_KEY = b"sidecar_ops"
# Bump whenever the kernel's output for the same inputs and pipeline would change (column order, types, encoding
# of values, provenance needed for resume): every output written before then becomes stale and is recomputed.
MERGE_SEMANTICS_VERSION = 2
# Provenance fields that differ between two runs writing the same shard from the same inputs; the rest is equal.
PER_RUN_FIELDS = ("run_id", "run_started", "written_at")


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


@cache  # the code this process runs: read once (importlib.metadata walks sys.path, ~1 ms a call)
def tool_version() -> str:
    try:
        return version("sidecar-ops")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class Job:
    """Everything a shard task needs, as small plain values."""

    pipeline: Pipeline
    output_prefix: str
    run_id: str = ""         # recorded in provenance: tells this run's outputs from earlier runs' ones
    overwrite: bool = False  # this run replaces existing outputs, but those of the overwrite it belongs to
    started: str = ""        # when this run started (UTC ISO, the driver's clock), recorded in provenance
    overwrite_id: str = ""   # with overwrite: recorded in provenance; the id of the first run of this overwrite
    continues: bool = False  # with overwrite: it continues an interrupted one (--continue-overwrite ID)
    overwrite_before: str = ""  # with overwrite, by hand: outputs of runs started at or after it are kept too
    fetch_ahead: bool = True  # the shard's first step fetches every input at once (its later steps run in the
                              # same process: one thread pool, or one fused task)
    window_bytes: int = WINDOW_BYTES  # the streaming merge's budget: decoded bytes of a window of merged rows
    recompress: str = ""  # "zstd": every column decoded and encoded again (the decode path); "": chunks copied
                          # as bytes where the shard allows it (tasks/chunkcopy.py), the base's codec kept

    def kept_by_overwrite(self, prov: dict) -> bool:
        """Whether an existing output (its provenance) counts as done in an overwrite run: written by this
        overwrite (its id: this run, an interrupted run it continues, or an earlier attempt of either), or, with
        --overwrite-before TIME, by a run that recorded a start at or after TIME (two clocks compared: a
        start without a zone is not trusted)."""
        if self.overwrite_id and prov.get("overwrite_id") == self.overwrite_id:
            return True
        started = parse_time(prov.get("run_started") or "")
        before = parse_time(self.overwrite_before)
        return bool(started and before and started.tzinfo and started >= before)

    @property
    def fingerprint(self) -> str:
        return self.pipeline.fingerprint

    @property
    def key_columns(self) -> set[str]:
        """The dataset key and every operation's key columns: unique per row."""
        ds = self.pipeline.dataset
        return {ds.key_column}.union(*(op.key_columns(ds) for op in self.pipeline.operations))

    def base_uri(self, relpath: str) -> str:
        return storage.join(self.pipeline.dataset.main_prefix, relpath)

    def output_uri(self, relpath: str) -> str:
        return storage.join(self.output_prefix, relpath)


@dataclass
class ShardState:
    table: pa.Table
    row_group_size: int | None
    provenance_ops: list[dict] = field(default_factory=list)  # each step's provenance entry (provenance_record)
    base_input: str = ""  # identity of the base shard as read (storage.file_identity)
    base_keys: pa.ChunkedArray | None = None  # the base's key column as read: what the written keys must equal

    def inputs(self) -> dict:
        """What this shard was made from: the base's identity and each operation's sibling's (or 'absent')."""
        return shard_inputs(self.base_input, [r.get("input") for r in self.provenance_ops])

    def key_batches(self) -> list[pa.Array] | None:
        """The base's keys as read, in batches: what check_written compares the written keys with."""
        return self.base_keys.chunks if self.base_keys is not None else None


def shard_inputs(base: str, siblings: list[str | None]) -> dict:
    return {"base": base, "operations": list(siblings)}


def shard_key(fingerprint: str, relpath: str, inputs: dict) -> str:
    """The identity of an output shard's content: pipeline, merge semantics, shard path and input identities.

    The one function behind resume: the planner computes it from listings, the shard task from what it read,
    and each output records the key it was made under; equal keys mean the output is current."""
    blob = json.dumps({"semantics": MERGE_SEMANTICS_VERSION, "fingerprint": fingerprint, "relpath": relpath,
                       "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ShardStats:
    relpath: str
    rows: int
    bytes: int
    skipped_ops: int = 0
    seconds: float = 0.0
    input_key: str = ""  # the key the stored output recorded (shard_key of the inputs it was made from)
    path: str = ""       # how it was made: "copy" (column chunks copied as bytes) or "decode"


# Failures that come back the same on every attempt: not worth a retry.
PERMANENT = (PermissionError, FileNotFoundError, pa.ArrowException,
             storage.WriteAbandoned)  # the process is stopping: a retry would be abandoned too


class Told(ShardError):
    """A ShardError that already names its shard and where it failed (from _fail): passed on as it is."""


def _fail(relpath: str, where: str, exc: BaseException) -> ShardError:
    if isinstance(exc, Told):
        return exc
    if isinstance(exc, ShardError):
        return Told(f"shard {relpath}: {where}: {exc}", exc.transient)
    if unreadable_parquet(exc):
        return Told(f"shard {relpath}: {where}: not a readable parquet file ({exc})")
    return Told(f"shard {relpath}: {where}: {type(exc).__name__}: {exc}",
                transient=not isinstance(exc, PERMANENT))


def input_reads(job: Job, relpath: str) -> list[tuple[str, Callable[[str], bool]]]:
    """(URI, which top-level columns a step reads) of the shard's base and every sibling: the base without the
    image column, a sibling's key and listed columns (or all but the image column)."""
    ds = job.pipeline.dataset
    not_image = lambda column: column != ds.image_column  # noqa: E731
    sources = [op.input(ds) for op in job.pipeline.operations]
    return [(job.base_uri(relpath), not_image), *((source.uri(relpath), source.columns.__contains__
                                                    if source.columns else not_image) for source in sources if source)]


def fetch_inputs_ahead(job: Job, relpath: str) -> None:
    """Start fetching the base and every sibling of the shard at once (storage.fetch_ahead: S3, listed inputs);
    the steps then read them from memory instead of one after another. Together they take at most the job's
    window budget: the siblings first (a step reads one's key and columns whole), the base with what is left."""
    room = job.window_bytes
    for uri, wanted in reversed(input_reads(job, relpath)):
        room -= storage.fetch_ahead(uri, wanted, room)


def forget_inputs_ahead(job: Job, relpath: str) -> None:
    """A shard that failed releases the inputs fetched for steps that will not run."""
    storage.forget_ahead(uri for uri, _ in input_reads(job, relpath))


def read_base(job: Job, relpath: str) -> ShardState:
    """The base shard without the image column (a sidecar never carries image bytes)."""
    uri = job.base_uri(relpath)
    image, key = job.pipeline.dataset.image_column, job.pipeline.dataset.key_column
    use_returning_memory_pool()
    if job.fetch_ahead:
        fetch_inputs_ahead(job, relpath)
    try:
        with storage.open_parquet(uri) as f:
            identity = storage.file_identity(uri, f)
            pf = pq.ParquetFile(f)
            names = [n for n in pf.schema_arrow.names if n != image]
            table = pf.read(columns=names, use_threads=True)
            groups = row_group_rows(pf)
    except Exception as exc:  # corrupt, vanished or unreadable: say which shard
        raise _fail(relpath, f"reading base shard {uri}", exc) from exc
    keys = table[key] if key in table.column_names else None
    return ShardState(table, groups or None, base_input=identity, base_keys=keys)


def row_group_rows(pf: pq.ParquetFile) -> int:
    """The largest row group of the base: the output's row group size (0 for an empty shard)."""
    return max((pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)), default=0)


def apply_operation(job: Job, relpath: str, index: int, state: ShardState) -> ShardState:
    ops = job.pipeline.operations
    op, history = ops[index], History.of(ops[:index], state.provenance_ops)
    try:
        table, record = op.apply(state.table, job.pipeline.dataset, relpath, history)
    except Exception as exc:
        raise _fail(relpath, f"operations[{index}] ({op.describe()})", exc) from exc
    provenance_ops = [*state.provenance_ops, provenance_record(op, record)]
    return ShardState(table, state.row_group_size, provenance_ops, state.base_input, state.base_keys)


def provenance(job: Job, relpath: str, provenance_ops: list[dict], inputs: dict, rows: int) -> dict:
    ds = job.pipeline.dataset
    return {"fingerprint": job.fingerprint, "dataset": ds.name, "main_prefix": ds.main_prefix,
            "source_inference": ds.source_inference, "operations": provenance_ops,
            "inputs": inputs, "input_key": shard_key(job.fingerprint, relpath, inputs),
            "rows": rows, "merge_semantics": MERGE_SEMANTICS_VERSION, "run_id": job.run_id,
            "run_started": job.started, **({"overwrite_id": job.overwrite_id} if job.overwrite else {}),
            "tool": "sidecar-ops", "tool_version": tool_version(),
            "written_at": now_utc()}


def check_extensions(job: Job, schema: pa.Schema, allow_missing: bool = False) -> None:
    for ext in job.pipeline.dataset.schema_extensions:
        if ext.name not in schema.names:
            if allow_missing:
                continue
            raise ShardError(f"declared extension column {ext.name!r} ({ext.type.name}) is missing from the output")
        problem = ext.type.problem(schema.field(ext.name).type)
        if problem:
            raise ShardError(f"column {ext.name!r}: {problem}")


def write_output(job: Job, relpath: str, state: ShardState) -> ShardStats:
    """Write the shard atomically, then check what was stored (check_written): from the payload itself where
    the backend proved the object holds exactly it (S3's checksums), else by reading the object back."""
    stats, written = store_output(job, relpath, state)
    return check_written(job, relpath, stats, written.payload, state.key_batches())


def store_output(job: Job, relpath: str, state: ShardState) -> tuple[ShardStats, storage.Written]:
    """Write the shard atomically, with its provenance; no check (write_output checks)."""
    skipped = skipped_steps(state.provenance_ops)
    table = state.table
    try:
        check_extensions(job, table.schema, allow_missing=skipped > 0)
        meta = output_metadata(table.schema, provenance(job, relpath, state.provenance_ops, state.inputs(), table.num_rows))
        written = storage.write_atomic(table.replace_schema_metadata(meta), job.output_uri(relpath),
                                       row_group_size=state.row_group_size, plain=job.key_columns)
    except Exception as exc:
        raise _fail(relpath, f"writing {job.output_uri(relpath)}", exc) from exc
    return ShardStats(relpath, table.num_rows, written.size, skipped, path="decode"), written


def skipped_steps(provenance_ops: list[dict]) -> int:
    return sum(r.get("status") == Status.SKIPPED.value for r in provenance_ops)


def output_metadata(schema: pa.Schema, prov: dict) -> dict:
    """The output's schema metadata: the base's (without pandas') and the provenance."""
    meta = {k: v for k, v in (schema.metadata or {}).items() if k != b"pandas"}
    meta[PROVENANCE_KEY] = json.dumps(prov, sort_keys=True).encode()
    return meta


def merge_shard(job: Job, relpath: str) -> ShardStats:
    """The whole chain for one shard in one call, streamed (the fused task, tests and benchmarks)."""
    start = time.perf_counter()
    with opened_shard(job, relpath) as shard:
        stats = stream_output(job, relpath, shard)
    return replace(stats, seconds=time.perf_counter() - start)


# ---------------------------------------------------------------- the streaming merge (a shard in one call)

@dataclass
class OpenShard:
    """A shard with its base and every step opened (footers read, columns planned, row counts and key types
    compared), no row decoded yet: stream_output reads, merges and writes it one window of rows at a time."""

    base: RowWindows
    file: object  # the base's open file (the copy path copies its chunks)
    base_input: str
    natural_rows: int  # the base's largest row group (0 when empty): windows follow it when it fits the budget
    streams: list[StepStream]  # each operation's step over the shard, opened
    provenance_ops: list[dict]  # each step's provenance entry (tasks.ops.provenance_record), in order

    @property
    def rows(self) -> int:
        return self.base.rows

    @property
    def schema(self) -> pa.Schema:
        """The output's Arrow schema (before its metadata is set)."""
        return self.streams[-1].schema if self.streams else self.base.schema

    def inputs(self) -> dict:
        return shard_inputs(self.base_input, [r.get("input") for r in self.provenance_ops])


@contextmanager
def opened_shard(job: Job, relpath: str) -> Iterator[OpenShard]:
    """The shard opened (open_shard); what it opened is closed at the end, and what was fetched ahead for it is
    released if it fails."""
    use_returning_memory_pool()
    with ExitStack() as stack:
        try:
            if job.fetch_ahead:
                fetch_inputs_ahead(job, relpath)
            yield open_shard(job, relpath, stack)
        except BaseException:
            forget_inputs_ahead(job, relpath)
            raise


def open_shard(job: Job, relpath: str, stack: ExitStack) -> OpenShard:
    uri = job.base_uri(relpath)
    image = job.pipeline.dataset.image_column
    try:
        f = stack.enter_context(storage.open_parquet(uri))
        identity = storage.file_identity(uri, f)
        pf = parquet_file(f)
        natural = row_group_rows(pf)
        window = natural or PROBE_ROWS  # sets the readers' batch size; stream_output sizes the windows
        base = RowWindows(pf, [n for n in pf.schema_arrow.names if n != image], window)
    except Exception as exc:  # corrupt, vanished or unreadable: say which shard
        raise _fail(relpath, f"reading base shard {uri}", exc) from exc
    ops, schema = job.pipeline.operations, base.schema
    streams: list[StepStream] = []
    provenance_ops: list[dict] = []
    for index, op in enumerate(ops):
        try:
            stream = op.stream(schema, job.pipeline.dataset, relpath, History.of(ops[:index], provenance_ops),
                               base.rows,
                             window)
        except Exception as exc:
            raise _fail(relpath, f"operations[{index}] ({op.describe()})", exc) from exc
        stack.callback(stream.close)
        streams.append(stream)
        provenance_ops.append(provenance_record(op, stream.record))
        schema = stream.schema
    return OpenShard(base, f, identity, natural, streams, provenance_ops)


def stream_output(job: Job, relpath: str, shard: OpenShard) -> ShardStats:
    """The opened shard merged and written: by copying column chunks where every step allows it (copy_output),
    else by decoding (decode_output); then checked (check_written) against the base's keys, read again from the
    same open base file (the same bytes, a batch at a time: nothing held for the whole shard)."""
    uri, key = job.output_uri(relpath), job.pipeline.dataset.key_column
    plan = None
    if not job.recompress:
        try:
            plan = chunkcopy.plan(shard.file, shard.base.file, shard.base.schema.names, shard.streams, shard.schema)
        except chunkcopy.NotCopyable as why:
            log.info("shard %s: decoding every column (%s)", relpath, why)
    stats, payload, schema = (decode_output(job, relpath, shard, uri) if plan is None
                              else copy_output(job, relpath, shard, plan, uri))
    keys = shard.base.reread(key) if key in shard.base.schema.names else None
    return check_written(job, relpath, stats, payload, keys, schema, (shard.file, shard.base.file))


def copy_output(job: Job, relpath: str, shard: OpenShard, plan: chunkcopy.Plan,
                uri: str) -> tuple[ShardStats, pa.Buffer | None, pa.Schema]:
    """The copy path: every step's keys compared, a batch at a time (nothing is written if one differs), then
    the output written of the inputs' chunks (tasks/chunkcopy.py)."""
    skipped = skipped_steps(shard.provenance_ops)

    def step_failed(index: int, exc: BaseException) -> ShardError:
        return _fail(relpath, f"operations[{index}] ({job.pipeline.operations[index].describe()})", exc)

    chunkcopy.check_steps(plan, step_failed)
    try:
        check_extensions(job, plan.schema, allow_missing=skipped > 0)
        prov = provenance(job, relpath, shard.provenance_ops, shard.inputs(), shard.rows)
        plan.schema = plan.schema.with_metadata(output_metadata(plan.schema, prov))
        written = storage.write_stream(lambda sink: chunkcopy.write(plan, sink, job.key_columns, step_failed), uri)
    except Exception as exc:
        raise _fail(relpath, "writing " + uri, exc) from exc
    return ShardStats(relpath, shard.rows, written.size, skipped, path="copy"), written.payload, plan.schema


def decode_output(job: Job, relpath: str, shard: OpenShard,
                  uri: str) -> tuple[ShardStats, pa.Buffer | None, pa.Schema | None]:
    """Read, merge and write the shard a window at a time, each window one row group of the output. The first
    PROBE_ROWS rows are merged first and measured: the window holds the base's row group if that fits in
    job.window_bytes, else as many rows as fit. The output is published only once every window has passed every
    step; after a failed window the rest are still read, so the error counts every bad row."""
    skipped = skipped_steps(shard.provenance_ops)
    schema = None  # the output's, as its first window has it

    def merged(rows: int, offset: int) -> pa.Table:
        """The base's next `rows` rows (from row `offset`) through every step."""
        try:
            read = shard.base.take(rows)
        except Exception as exc:
            raise _fail(relpath, f"reading base shard {job.base_uri(relpath)}", exc) from exc
        window = read
        for index, stream in enumerate(shard.streams):
            window = _step(job, relpath, index, lambda: stream.apply(window, offset))
        return window

    def windows() -> Iterator[pa.Table]:
        nonlocal schema
        window = merged(min(PROBE_ROWS, shard.natural_rows or PROBE_ROWS, shard.rows), 0)  # never over a window
        size = window_rows(shard.natural_rows, window.nbytes / max(window.num_rows, 1), job.window_bytes)
        end = min(size, shard.rows)
        if end > window.num_rows:  # the probe's rows begin the first window
            window = pa.concat_tables([window, merged(end - window.num_rows, window.num_rows)])
        starts = iter(range(end, shard.rows, size))
        meta = None
        while window is not None:
            if not any(stream.failed for stream in shard.streams):
                if meta is None:
                    check_extensions(job, window.schema, allow_missing=skipped > 0)
                    meta = output_metadata(window.schema, provenance(job, relpath, shard.provenance_ops, shard.inputs(),
                                                                     shard.rows))
                    schema = window.schema
                yield window.replace_schema_metadata(meta)
            start, window = next(starts, None), None  # one window held at a time: this one goes first
            if start is not None:
                window = merged(min(size, shard.rows - start), start)
        for index, stream in enumerate(shard.streams):
            _step(job, relpath, index, stream.finish)

    try:
        written = storage.write_windows(windows(), uri, None, job.key_columns)
    except Exception as exc:
        raise _fail(relpath, f"writing {uri}", exc) from exc
    return ShardStats(relpath, shard.rows, written.size, skipped, path="decode"), written.payload, schema


def _step(job: Job, relpath: str, index: int, call):
    try:
        return call()
    except Exception as exc:
        op = job.pipeline.operations[index]
        raise _fail(relpath, f"operations[{index}] ({op.describe()})", exc) from exc


def read_provenance(metadata: pq.FileMetaData) -> dict | None:
    """An output's provenance, None when it has none or none this tool could have written (provenance_of)."""
    return provenance_of(metadata)[0]


# Provenance fields and their JSON types: `fingerprint` must be there, the others may be absent (an older
# version did not record them) or null, but never of another type.
PROVENANCE_FIELDS = {"fingerprint": str, "input_key": str, "inputs": dict, "rows": int, "operations": list,
                     "merge_semantics": int, "run_id": str, "run_started": str, "overwrite_id": str}


def provenance_of(metadata: pq.FileMetaData) -> tuple[dict | None, str]:
    """(provenance, "") or (None, why an output has none this tool could have written): no `sidecar_ops`
    metadata, not a JSON object, or a field missing or of another type."""
    raw = (metadata.metadata or {}).get(PROVENANCE_KEY)
    if raw is None:
        return None, "no sidecar_ops provenance"
    try:
        prov = json.loads(raw)
    except ValueError:
        return None, "sidecar_ops provenance is not JSON"
    problem = provenance_problem(prov)
    return (None, f"sidecar_ops provenance malformed: {problem}") if problem else (prov, "")


def provenance_problem(prov) -> str:
    if not isinstance(prov, dict):
        return f"a JSON {type(prov).__name__}, not an object"
    if prov.get("fingerprint") is None:
        return "no fingerprint"
    for name, kind in PROVENANCE_FIELDS.items():
        value = prov.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"{name} is a JSON {type(value).__name__}, not a {kind.__name__}"
    inputs = prov.get("inputs") or {}
    if not isinstance(inputs.get("base", ""), str) or not isinstance(inputs.get("operations", []), list):
        return "inputs is not {base: str, operations: list}"
    if not all(isinstance(record, dict) for record in prov.get("operations") or []):
        return "operations holds a record that is not an object"
    if prov.get("run_started") and parse_time(prov["run_started"]) is None:
        return f"run_started {prov['run_started']!r} is not an ISO 8601 time"
    return ""


def parse_time(text: str) -> datetime | None:
    """An ISO 8601 time (with its zone, if it names one); None for anything else."""
    try:
        return datetime.fromisoformat(text) if isinstance(text, str) and text else None
    except ValueError:
        return None


def overwrite_fields(overwrite: bool, run_id: str, continue_overwrite: str | None = None,
                     overwrite_before: str | None = None) -> dict:
    """The Job fields of a run's overwrite: its id (this run's, or that of the overwrite it continues)."""
    if not overwrite:
        return {}
    return {"overwrite": True, "overwrite_id": continue_overwrite or run_id, "continues": bool(continue_overwrite),
            "overwrite_before": overwrite_before or ""}


def same_keys(base: Iterable[pa.Array], written: Iterable[pa.Array]) -> bool:
    """Whether the written keys equal the base's, both read a batch at a time (batches of any sizes): as many,
    each equal to the base's value at its row, a null only where the base's is null (a faithful copy)."""
    base = iter(base)
    pending = None  # base rows read and not yet compared
    for batch in written:
        while len(batch):
            if pending is None or not len(pending):
                pending = next(base, None)
                if pending is None:
                    return False  # more rows written than the base has
                continue
            n = min(len(batch), len(pending))
            if not same_values(pending.slice(0, n), batch.slice(0, n)):
                return False
            pending, batch = pending.slice(n), batch.slice(n)
    return (pending is None or not len(pending)) and not any(len(rest) for rest in base)


def same_values(a, b) -> bool:
    """Equal element by element, a null equal to a null only: pc.equal is null, and pc.all skips it, where
    either side is null."""
    equal = pc.fill_null(pc.equal(a, b), False)
    return pc.all(pc.or_(equal, pc.and_(pc.is_null(a), pc.is_null(b))), min_count=0).as_py()


def check_written(job: Job, relpath: str, stats: ShardStats, payload: pa.Buffer | None = None,
                  base_keys: Iterable[pa.Array] | None = None, schema: pa.Schema | None = None,
                  base: tuple | None = None) -> ShardStats:
    """The post-write check: the output's footer (provenance, row count, declared types; the Arrow schema as
    stored for `schema`, when given) and its key column as written, equal to the base's. Read from `payload`
    (the bytes the store proved it holds) when given, else from the stored object; the base's keys are
    `base_keys` (as the shard task read them, a batch at a time) when given, else read again. With `base`
    (the base's open file and ParquetFile, as the task read it), a key column whose footer says it holds the
    base's chunks (the copy path's) is compared byte for byte instead (chunkcopy.same_chunks: equal bytes under
    equal metadata decode to equal values), and decoded only where the footers differ."""
    uri = job.output_uri(relpath)
    key = job.pipeline.dataset.key_column
    try:
        stored = pa.BufferReader(payload) if payload is not None else storage.open_parquet(uri, stats.bytes or None)
        with stored as f, ExitStack() as stack:
            pf = parquet_file(f)
            prov = read_provenance(pf.metadata)
            if not prov or not job.pipeline.accepts(prov.get("fingerprint")):
                raise ShardError("provenance fingerprint missing or different from this pipeline's")
            if pf.metadata.num_rows != stats.rows:
                raise ShardError(f"output has {pf.metadata.num_rows} rows, expected {stats.rows}")
            check_extensions(job, pf.schema_arrow, allow_missing=stats.skipped_ops > 0)
            expected = None if schema is None else storage.as_stored(schema).remove_metadata()
            if expected is not None and not pf.schema_arrow.remove_metadata().equals(expected):
                raise ShardError(f"output schema ({pf.schema_arrow.remove_metadata()}) is not the merge's "
                                 f"({expected})".replace("\n", "; "))
            copied = None if base is None else chunkcopy.same_chunks(pf, f, base[1], base[0], key)
            if copied is None:
                if base_keys is None:
                    b = parquet_file(stack.enter_context(storage.open_parquet(job.base_uri(relpath))))
                    base_keys = (batch.column(0) for batch in batches(b, [key]))
                copied = same_keys(base_keys, (batch.column(0) for batch in batches(pf, [key])))
            if not copied:
                raise ShardError(f"key column {key!r} of the output differs from the base")
    except Exception as exc:
        raise _fail(relpath, f"verifying {uri}", exc) from exc
    return replace(stats, input_key=prov.get("input_key", ""))
