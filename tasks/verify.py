"""`sidecar-ops verify`: prove an all-in-one sidecar is complete, aligned and sane. Pure pyarrow.

Cheap checks cover every shard from one listing per prefix plus the base and output footers.
Deep checks re-read N sampled shards (seeded) from base, output and every source, value for value.
Score statistics cover the sampled shards, or every output shard with `all_shards`.
The driver holds listings, small per-shard facts and statistics partials; tables live only inside a shard check.
"""
from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from tasks import storage
from tasks.errors import ConfigError, ShardError
from tasks.merge import Job, read_provenance
from tasks.plan import FOOTER_THREADS, make_plan
from tasks.progress import Progress
from tasks.scorestats import ColumnPartial, StatSpec, column_partial, footer_ranges, merge_ranges, stat_specs

SHARD_SET, STRAYS, ROWS, SCHEMA, PROVENANCE = (
    "output shard set", "stray objects", "row counts", "schema", "provenance")
BASE, KEYS, MERGED = "base columns", "key columns", "merged columns"
DEEP_THREADS = 4
SLICE = 4096


def siblings_check(index: int) -> str:
    return f"operations[{index}] siblings"


@dataclass(frozen=True)
class Failure:
    path: str    # shard relpath, or object path relative to its prefix
    detail: str


@dataclass
class Check:
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
class OpRecord:
    """What one operation did to a shard, as recorded in (or, lacking provenance, re-derived for) the output."""

    status: str                 # merged | skipped_missing_sibling | (derived only) failed
    appended: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class FooterFacts:
    relpath: str
    base_rows: int | None
    out_rows: int | None
    problems: tuple[tuple[str, str], ...]          # (check name, detail)
    records: tuple[OpRecord, ...] | None
    ranges: dict = field(default_factory=dict)     # 'col.field' -> (min, max) | None, scope shards only


@dataclass(frozen=True)
class ShardTask:
    relpath: str
    deep: bool
    stats: bool
    records: tuple[OpRecord, ...] | None
    ranges: dict


@dataclass
class ShardResult:
    relpath: str
    rows: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    stats: dict[str, ColumnPartial] = field(default_factory=dict)


@dataclass
class Report:
    pipeline: str
    dataset: str
    fingerprint: str
    main_prefix: str
    output_prefix: str
    shards: int
    sampled: list[str]
    seed: int
    stats_scope: str            # sample | all
    stats_shards: int
    checks: list[Check]
    statistics: list[dict]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict:
        return {"schema_version": 1, "ok": self.ok, "pipeline": self.pipeline, "dataset": self.dataset,
                "fingerprint": self.fingerprint, "main_prefix": self.main_prefix,
                "output_prefix": self.output_prefix, "shards": self.shards, "sampled": list(self.sampled),
                "seed": self.seed, "stats_scope": self.stats_scope, "stats_shards": self.stats_shards,
                "seconds": round(self.seconds, 3), "checks": [c.to_dict() for c in self.checks],
                "statistics": self.statistics}


# ---------------------------------------------------------------- footers (every shard)

def _records(prov: dict | None, n_ops: int) -> tuple[OpRecord, ...] | None:
    ops = (prov or {}).get("operations")
    if not isinstance(ops, list) or len(ops) != n_ops:
        return None
    return tuple(OpRecord(str(r.get("status")), tuple(r.get("appended") or ()), tuple(r.get("replaced") or ()))
                 for r in ops)


def schema_problems(job: Job, base: pa.Schema, out: pa.Schema, records: tuple[OpRecord, ...] | None) -> list[str]:
    """Base columns unchanged and in order, then the appended columns, then declared extensions conform."""
    problems = []
    replaced = {c for r in records or () if r.status == "merged" for c in r.replaced}
    names = base.names
    if out.names[:len(names)] != names:
        problems.append(f"base columns not first and in order: output starts {out.names[:len(names)]}, "
                        f"base has {names}")
    else:
        for name in names:
            if name not in replaced and not out.field(name).type.equals(base.field(name).type):
                problems.append(f"base column {name!r} is {out.field(name).type}, base has {base.field(name).type}")
    if records is not None:
        appended = [c for r in records if r.status == "merged" for c in r.appended]
        if out.names[len(names):] != appended:
            problems.append(f"columns after the base ones are {out.names[len(names):]}, provenance says {appended}")
    skipped_ops = [op for op, r in zip(job.pipeline.operations, records or ()) if r.status != "merged"]
    for ext in job.pipeline.dataset.schema_extensions:
        if ext.name not in out.names:
            if not any(op.columns is None or ext.name in op.columns for op in skipped_ops):
                problems.append(f"declared extension column {ext.name!r} ({ext.type.name}) is missing")
            continue
        problem = ext.type.problem(out.field(ext.name).type)
        if problem:
            problems.append(f"column {ext.name!r}: {problem}")
    return problems


def read_footers(job: Job, relpath: str, specs: tuple[StatSpec, ...], want_ranges: bool) -> FooterFacts:
    image = job.pipeline.dataset.image_column
    problems: list[tuple[str, str]] = []
    try:
        base_meta = storage.read_footer(job.base_uri(relpath))
        base_schema = base_meta.schema.to_arrow_schema()
        if image in base_schema.names:
            base_schema = base_schema.remove(base_schema.get_field_index(image))
    except Exception as exc:
        return FooterFacts(relpath, None, None, ((ROWS, f"base footer unreadable: {_one_line(exc)}"),), None)
    try:
        out_meta = storage.read_footer(job.output_uri(relpath))
        out_schema = out_meta.schema.to_arrow_schema()
    except Exception as exc:
        return FooterFacts(relpath, base_meta.num_rows, None,
                           ((ROWS, f"output footer unreadable: {_one_line(exc)}"),), None)
    if out_meta.num_rows != base_meta.num_rows:
        problems.append((ROWS, f"output has {out_meta.num_rows} rows, base has {base_meta.num_rows}"))
    prov = read_provenance(out_meta)
    records = _records(prov, len(job.pipeline.operations))
    if prov is None:
        problems.append((PROVENANCE, "no sidecar_ops provenance in the footer"))
    elif prov.get("fingerprint") != job.fingerprint:
        problems.append((PROVENANCE, f"stale: written by pipeline fingerprint {prov.get('fingerprint')}, "
                                     f"this pipeline is {job.fingerprint}"))
    elif records is None:
        problems.append((PROVENANCE, "provenance does not record one entry per operation"))
    for problem in schema_problems(job, base_schema, out_schema, records):
        problems.append((SCHEMA, problem))
    ranges = footer_ranges(out_meta, specs) if want_ranges else {}
    return FooterFacts(relpath, base_meta.num_rows, out_meta.num_rows, tuple(problems), records, ranges)


# ---------------------------------------------------------------- values (sampled shards)

def _same(a, b) -> bool:
    """Python values equal, NaN equal to NaN (recursively through structs and lists)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def compare(name: str, got: pa.ChunkedArray, want: pa.ChunkedArray, cast: bool = False) -> str | None:
    """None when equal value for value, else one line: how many rows differ and the first one."""
    if not got.type.equals(want.type):
        if not cast:
            return f"column {name!r} is {got.type}, expected {want.type}"
        try:
            want = want.cast(got.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return f"column {name!r} is {got.type}, expected {want.type}"
    if len(got) != len(want):
        return f"column {name!r} has {len(got)} rows, expected {len(want)}"
    if got.equals(want):
        return None
    bad, first = 0, None
    for offset in range(0, len(got), SLICE):
        g, w = got.slice(offset, SLICE), want.slice(offset, SLICE)
        if g.equals(w):
            continue
        for i, (x, y) in enumerate(zip(g.to_pylist(), w.to_pylist())):
            if not _same(x, y):
                bad += 1
                if first is None:
                    first = (offset + i, x, y)
    if not bad:
        return None  # only NaNs differed
    row, x, y = first
    return f"column {name!r}: {bad} of {len(got)} rows differ, first at row {row}: {_short(x)} vs {_short(y)}"


def _read(uri: str, columns: list[str] | None = None, drop: str | None = None) -> pa.Table:
    with storage.open_parquet(uri) as f:
        pf = pq.ParquetFile(f)
        if columns is None and drop is not None:
            columns = [n for n in pf.schema_arrow.names if n != drop]
        return pf.read(columns=columns, use_threads=True)


def derived_records(job: Job, base: pa.Schema, relpath: str) -> tuple[OpRecord, ...]:
    """Without provenance: what each operation would have done, from the sources' footers (as the merge decides)."""
    records, current = [], base
    for op in job.pipeline.operations:
        try:
            current, rec = op.plan(current, job.pipeline.dataset, relpath)
            records.append(OpRecord("merged", tuple(rec["appended"]), tuple(rec["replaced"])))
        except FileNotFoundError:
            records.append(OpRecord("skipped_missing_sibling" if not op.required else "failed",
                                    detail="sibling shard missing"))
        except Exception as exc:
            records.append(OpRecord("failed", detail=_one_line(exc)))
    return tuple(records)


def deep_failures(job: Job, relpath: str, out: pa.Table, records: tuple[OpRecord, ...] | None) -> dict[str, str]:
    ds = job.pipeline.dataset
    found: dict[str, list[str]] = {}
    say = lambda check, line: found.setdefault(check, []).append(line)  # noqa: E731
    try:
        base = _read(job.base_uri(relpath), drop=ds.image_column)
    except Exception as exc:
        return {BASE: f"base shard unreadable: {_one_line(exc)}"}
    if base.num_rows != out.num_rows:
        return {BASE: f"output has {out.num_rows} rows, base has {base.num_rows}; values not compared"}
    records = records or derived_records(job, base.schema, relpath)
    origin: dict[str, int | None] = {name: None for name in base.column_names}
    for i, rec in enumerate(records):
        if rec.status == "merged":
            origin.update({c: i for c in (*rec.appended, *rec.replaced)})
    for name, src in origin.items():
        if src is None:
            if name not in out.column_names:
                say(BASE, f"base column {name!r} missing from the output")
            else:
                line = compare(name, out[name], base[name])
                line and say(BASE, line)
    for key in [ds.key_column]:
        if key in out.column_names:
            line = compare(key, out[key], base[key])
            line and say(KEYS, f"{line} (dataset key vs base)")
    for i, (op, rec) in enumerate(zip(job.pipeline.operations, records)):
        if rec.status == "failed":
            say(MERGED, f"operations[{i}]: {rec.detail}")
            continue
        if rec.status != "merged":
            continue
        target_key, source_key = op.keys(ds)
        cols = [c for c, src in origin.items() if src == i]
        try:
            source = _read(op.source_prefix + relpath, list(dict.fromkeys([source_key, *cols])))
        except Exception as exc:
            say(MERGED, f"operations[{i}]: source shard unreadable: {_one_line(exc)}")
            continue
        if target_key not in out.column_names:
            say(KEYS, f"operations[{i}]: key column {target_key!r} missing from the output")
        else:
            line = compare(target_key, out[target_key], source[source_key], cast=True)
            line and say(KEYS, f"operations[{i}] {target_key} vs source {source_key}: {line}")
        for name in cols:
            if name not in out.column_names:
                say(MERGED, f"operations[{i}]: column {name!r} missing from the output")
            else:
                line = compare(name, out[name], source[name])
                line and say(MERGED, f"operations[{i}]: {line}")
    return {check: "; ".join(lines) for check, lines in found.items()}


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
        result.failures[BASE] = f"output shard unreadable: {_one_line(exc)}"
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


# ---------------------------------------------------------------- the driver

def choose_sample(shards: list[str], n: int, seed: int) -> list[str]:
    """A seeded random sample of at most n shards, sorted (all of them when n >= the count)."""
    if n >= len(shards):
        return list(shards)
    return sorted(random.Random(seed).sample(sorted(shards), n))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(exc, ShardError) else f"{type(exc).__name__}: {first}"


def verify(job: Job, samples: int = 50, seed: int = 0, all_shards: bool = False, run: Runner | None = None,
           stream=None) -> Report:
    if samples < 0:
        raise ConfigError(f"--samples must be 0 or more, got {samples}")
    start = time.monotonic()
    pipe = job.pipeline
    plan = make_plan(job, overwrite=True)  # listings only: base (refused when empty), sources, output
    base, output = plan.base.shards, plan.output.shards
    present = [rel for rel in base if rel in output]
    checks: dict[str, Check] = {}

    shard_set = checks[SHARD_SET] = Check(SHARD_SET, "listing", len(base))
    for rel in base:
        if rel not in output:
            shard_set.fail(rel, "output shard missing")
    for rel in output:
        if rel not in base:
            shard_set.fail(rel, "output shard not in the base (extra)")
    shard_set.note = f"{len(present)} of {len(base)} present"
    strays = checks[STRAYS] = Check(STRAYS, "listing", len(output) + len(plan.output.others))
    for obj in plan.output.others:
        what = "temporary file of an interrupted write" if storage.TEMP_MARK in obj else "not a non-empty *.parquet"
        strays.fail(obj, what)
    strays.note = f"{len(plan.output.others)} stray of {strays.checked} objects"
    for i, op in enumerate(pipe.operations):
        check = checks[siblings_check(i)] = Check(siblings_check(i), "listing", len(base))
        missing = plan.missing_siblings(i)
        if op.required:
            for rel in missing:
                check.fail(rel, f"sibling shard missing: {op.source_prefix}{rel}")
        check.note = (f"{len(missing)} missing, skipped (required: false)" if missing and not op.required
                      else f"{len(base) - len(missing)} of {len(base)} present")

    sample = choose_sample(present, samples, seed)
    scope = present if all_shards else sample
    scope_set = set(scope)
    specs = stat_specs(pipe.dataset)
    facts: dict[str, FooterFacts] = {}
    progress = Progress("verify footers", len(present), stream=stream)
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        futures = [pool.submit(read_footers, job, rel, specs, rel in scope_set) for rel in present]
        for future in as_completed(futures):
            fact = future.result()
            facts[fact.relpath] = fact
            progress.update(done=1, rows=fact.out_rows or 0)
    progress.close()
    for name in (ROWS, SCHEMA, PROVENANCE):
        checks[name] = Check(name, "footer", len(present))
    for rel in present:
        for name, detail in facts[rel].problems:
            checks[name].fail(rel, detail)
        for i, rec in enumerate(facts[rel].records or ()):
            have = rel in plan.sources[i].shards
            if rec.status == "skipped_missing_sibling" and have:
                checks[siblings_check(i)].fail(rel, "sibling exists now but the output skipped it; delete the "
                                                    "output shard and rerun to merge it")
            elif rec.status == "merged" and not have:
                checks[siblings_check(i)].fail(rel, "sibling merged into the output has since vanished")
    checks[ROWS].note = f"{sum(f.out_rows or 0 for f in facts.values()):,} rows"
    checks[PROVENANCE].note = f"fingerprint {job.fingerprint}"

    ranges: dict = {}
    for rel in scope:
        merge_ranges(ranges, facts[rel].ranges)
    sample_set = set(sample)
    tasks = [ShardTask(rel, rel in sample_set, rel in scope_set, facts[rel].records, ranges)
             for rel in sorted(sample_set | scope_set)]
    results, stats = _run(job, specs, tasks, run or check_locally, stream)
    for name in (BASE, KEYS, MERGED):
        checks[name] = Check(name, "data", len(sample), note=f"{len(sample)} sampled shard(s), seed {seed}")
    for result in sorted(results, key=lambda r: r.relpath):
        for name, detail in result.failures.items():
            checks[name].fail(result.relpath, detail)

    redo = [s for s in stats.values() if not all(f.histogram_ok() for f in s.fields.values())]
    if redo:  # footers lacked statistics or disagreed with the data: bin again with the exact ranges
        exact = {f"{s.column}.{n}": (f.min, f.max) for s in stats.values() for n, f in s.fields.items() if f.count}
        again = [ShardTask(rel, False, True, None, exact) for rel in scope]
        _, stats = _run(job, specs, again, run or check_locally, stream)

    statistics = []
    for spec in specs:
        part = stats.get(spec.column, ColumnPartial(spec.column))
        ext_type = next(e.type.name for e in pipe.dataset.schema_extensions if e.name == spec.column)
        statistics.append({**part.to_dict(), "type": ext_type})
    order = [SHARD_SET, STRAYS, *[siblings_check(i) for i in range(len(pipe.operations))],
             ROWS, SCHEMA, PROVENANCE, BASE, KEYS, MERGED]
    return Report(pipeline=pipe.path, dataset=pipe.dataset.name, fingerprint=job.fingerprint,
                  main_prefix=pipe.dataset.main_prefix, output_prefix=job.output_prefix, shards=len(base),
                  sampled=sample, seed=seed, stats_scope="all" if all_shards else "sample",
                  stats_shards=len(scope), checks=[checks[n] for n in order], statistics=statistics,
                  seconds=time.monotonic() - start)


def _run(job: Job, specs, tasks: list[ShardTask], run: Runner, stream) -> tuple[list[ShardResult], dict]:
    """Run shard checks, folding statistics as results arrive (results keep only their failures)."""
    progress = Progress("verify shards", len(tasks), stream=stream)
    results, stats = [], {}
    for result in run(job, specs, tasks):
        for column, part in result.stats.items():
            stats.setdefault(column, ColumnPartial(column)).add(part)
        results.append(ShardResult(result.relpath, result.rows, result.failures))
        progress.update(done=0 if result.failures else 1, failed=1 if result.failures else 0, rows=result.rows)
    progress.close()
    return results, stats
