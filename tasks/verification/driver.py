"""The verify driver: listings once, footers of every present shard, data of sampled shards, then the report.

The driver holds the listings, what the report keeps of the footers (`Found`: counts, problems, the facts of the
statistics' scope) and statistics partials; each footer is folded into `Found` as it is read and then dropped, so
beyond the listings the driver grows with the problems and the scope, not the shards. A shard check holds a window
of rows of each file it reads, never a table.
Which checks exist, in which order, comes from the registry (tasks/verification/registry.py, checks.py).
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from tasks.errors import ConfigError
from tasks.kernel import Job
from tasks.plan import FOOTER_THREADS, Plan, make_plan
from tasks.progress import Progress
from tasks.scorestats import ColumnPartial, merge_ranges, stat_specs
from tasks.verification.checks import ROWS, sibling_problems
from tasks.verification.footers import FooterFacts, read_footers
from tasks.verification.registry import Check, report_order
from tasks.verification.values import Runner, ShardResult, ShardTask, check_locally
from tasks.windows import use_returning_memory_pool


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


@dataclass
class Found:
    """What the report keeps of the footers of every present shard, folded in as each shard's are read."""

    scope: set[str]
    facts: dict[str, FooterFacts] = field(default_factory=dict)  # the statistics' scope only
    problems: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # check -> (relpath, detail)
    siblings: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # operation -> (relpath, detail)
    rows: int = 0  # output rows of every present shard

    def add(self, plan: Plan, fact: FooterFacts) -> None:
        self.rows += fact.out_rows or 0
        for name, detail in fact.problems:
            self.problems.setdefault(name, []).append((fact.relpath, detail))
        for index, detail in sibling_problems(plan, fact.relpath, fact.records):
            self.siblings.setdefault(index, []).append((fact.relpath, detail))
        if fact.relpath in self.scope:
            self.facts[fact.relpath] = fact


@dataclass(frozen=True)
class Context:
    """What listing checks and footer-check notes see."""

    job: Job
    plan: Plan
    present: list[str]                 # base shards with an output shard, in base order
    found: Found


def choose_sample(shards: list[str], n: int, seed: int) -> list[str]:
    """A seeded random sample of at most n shards, sorted (all of them when n >= the count)."""
    if n >= len(shards):
        return list(shards)
    return sorted(random.Random(seed).sample(sorted(shards), n))


class FooterReads:
    """Both footers of each of `shards`, read by FOOTER_THREADS threads (sizes from the listings: no HEAD request
    on S3), each shard's folded into `found` at once: no future or fact per shard outlives its fold. `stop()`
    ends it before the next shard; `join()` waits and re-raises a thread's error (footer checks turn a store's
    errors into problems, so an error here is a bug)."""

    def __init__(self, plan: Plan, shards: list[str], specs, found: Found, progress: Progress):
        self.plan, self.specs, self.found, self.progress = plan, specs, found, progress
        self._next, self._lock, self._stopped, self._error = iter(shards), threading.Lock(), False, None
        self._threads = [threading.Thread(target=self._read, name=f"verify-footers-{i}", daemon=True)
                         for i in range(min(FOOTER_THREADS, len(shards)))]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        plan = self.plan
        while True:
            with self._lock:
                rel = None if self._stopped else next(self._next, None)
            if rel is None:
                return
            try:
                fact = read_footers(plan.job, rel, self.specs, rel in self.found.scope, ROWS, plan.inputs(rel),
                                    (plan.base.shards[rel], plan.output.shards[rel]))
                with self._lock:
                    self.found.add(plan, fact)
                    self.progress.update(done=1, rows=fact.out_rows or 0)
            except BaseException as exc:
                with self._lock:
                    self._error, self._stopped = self._error or exc, True
                return

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    def join(self) -> None:
        try:
            for thread in self._threads:
                thread.join()
        except BaseException:  # a signal while waiting: no further shard is read
            self.stop()
            raise
        if self._error is not None:
            raise self._error


def verify(job: Job, samples: int = 50, seed: int = 0, all_shards: bool = False, run: Runner | None = None,
           stream=None) -> Report:
    """Footers of the statistics' scope first (their ranges bin the histograms), then the shard checks of the
    sample and scope, bounded in flight, while the footers of every other shard are read beside them."""
    if samples < 0:
        raise ConfigError(f"--samples must be 0 or more, got {samples}")
    use_returning_memory_pool()
    start = time.monotonic()
    pipe = job.pipeline
    plan = make_plan(job, overwrite=True)  # listings only: base (refused when empty), sources, output
    present = [rel for rel in plan.base.shards if rel in plan.output.shards]
    sample = choose_sample(present, samples, seed)
    scope = present if all_shards else sample
    specs = stat_specs(pipe.dataset)
    sample_set, scope_set = set(sample), set(scope)
    progress = Progress("verify footers", len(present), stream=stream)
    found = Found(scope_set)
    FooterReads(plan, scope, specs, found, progress).join()
    rest = FooterReads(plan, [rel for rel in present if rel not in scope_set], specs, found, progress)
    try:
        ranges: dict = {}
        for rel in scope:
            merge_ranges(ranges, found.facts[rel].ranges)
        tasks = [ShardTask(rel, rel in sample_set, rel in scope_set, found.facts[rel].records, ranges,
                           listed(plan, rel)) for rel in sorted(sample_set | scope_set)]
        results, stats = _run(job, specs, tasks, run or check_locally, stream)
    except BaseException:
        rest.stop()  # interrupted: the footers not yet read are not read
        raise
    rest.join()
    progress.close()
    ctx = Context(job, plan, present, found)
    redo = [s for s in stats.values() if not all(f.histogram_ok() for f in s.fields.values())]
    if redo:  # footers lacked statistics or disagreed with the data: bin again with the exact ranges
        exact = {f"{s.column}.{n}": (f.min, f.max) for s in stats.values() for n, f in s.fields.items() if f.count}
        again = [ShardTask(rel, False, True, None, exact, listed(plan, rel)) for rel in scope]
        _, stats = _run(job, specs, again, run or check_locally, stream)

    checks = make_checks(ctx, results, len(sample), seed)
    statistics = []
    for spec in specs:
        part = stats.get(spec.column, ColumnPartial(spec.column))
        ext_type = next(e.type.name for e in pipe.dataset.schema_extensions if e.name == spec.column)
        statistics.append({**part.to_dict(), "type": ext_type})
    return Report(pipeline=pipe.path, dataset=pipe.dataset.name, fingerprint=job.fingerprint,
                  main_prefix=pipe.dataset.main_prefix, output_prefix=job.output_prefix, shards=len(plan.base.shards),
                  sampled=sample, seed=seed, stats_scope="all" if all_shards else "sample",
                  stats_shards=len(scope), checks=checks, statistics=statistics,
                  seconds=time.monotonic() - start)


def listed(plan: Plan, relpath: str) -> dict[str, str]:
    """The identities a shard check reads its objects by (no HEAD on S3, reads pinned to them)."""
    return {**plan.listed(relpath), plan.job.output_uri(relpath): plan.output.ids[relpath]}


def in_base_order(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Problems folded as footers arrived, by relpath (the listings' order); a shard's own in the order found."""
    return sorted(problems, key=lambda problem: problem[0])


def make_checks(ctx: Context, results: list[ShardResult], sampled: int, seed: int) -> list[Check]:
    """One report entry per registered check of this pipeline, in registry order."""
    checks = []
    for name, definition, index in report_order(ctx.job.pipeline.operations, ctx.job.pipeline.dataset):
        check = Check(name, definition.stage, len(ctx.present))
        if definition.stage == "listing":
            args = (ctx, check) if index is None else (ctx, check, index)
            definition.run(*args)
        elif definition.stage == "footer":
            for rel, detail in in_base_order(ctx.found.problems.get(name, ())):
                check.fail(rel, detail)
            check.note = definition.note(ctx) if definition.note else ""
        else:
            check.checked, check.note = sampled, f"{sampled} sampled shard(s), seed {seed}"
            for result in sorted(results, key=lambda r: r.relpath):
                if name in result.failures:
                    check.fail(result.relpath, result.failures[name])
        checks.append(check)
    return checks


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
