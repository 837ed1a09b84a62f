"""The verify driver: listings once, footers of every present shard, data of sampled shards, then the report.

The driver holds listings, small per-shard facts and statistics partials; a shard check holds a window of rows
of each file it reads, never a table.
Which checks exist, in which order, comes from the registry (tasks/verification/registry.py, checks.py).
"""
from __future__ import annotations

import random
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from tasks.errors import ConfigError
from tasks.kernel import Job
from tasks.plan import FOOTER_THREADS, Plan, make_plan
from tasks.progress import Progress
from tasks.scorestats import ColumnPartial, merge_ranges, stat_specs
from tasks.verification.checks import ROWS
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


@dataclass(frozen=True)
class Context:
    """What listing checks and footer-check notes see."""

    job: Job
    plan: Plan
    present: list[str]                 # base shards with an output shard, in base order
    facts: dict[str, FooterFacts]


def choose_sample(shards: list[str], n: int, seed: int) -> list[str]:
    """A seeded random sample of at most n shards, sorted (all of them when n >= the count)."""
    if n >= len(shards):
        return list(shards)
    return sorted(random.Random(seed).sample(sorted(shards), n))


def footer_reads(pool: ThreadPoolExecutor, plan: Plan, shards: list[str], specs, scope: set[str]) -> list[Future]:
    """Read both footers of each shard (sizes from the listings: no HEAD request on S3)."""
    job = plan.job
    return [pool.submit(read_footers, job, rel, specs, rel in scope, ROWS, plan.inputs(rel),
                        (plan.base.shards[rel], plan.output.shards[rel])) for rel in shards]


def collect(futures: list[Future], progress: Progress) -> dict[str, FooterFacts]:
    facts = {}
    for future in as_completed(futures):
        fact = future.result()
        facts[fact.relpath] = fact
        progress.update(done=1, rows=fact.out_rows or 0)
    return facts


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
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        facts = collect(footer_reads(pool, plan, scope, specs, scope_set), progress)
        rest = footer_reads(pool, plan, [rel for rel in present if rel not in scope_set], specs, scope_set)
        ranges: dict = {}
        for rel in scope:
            merge_ranges(ranges, facts[rel].ranges)
        tasks = [ShardTask(rel, rel in sample_set, rel in scope_set, facts[rel].records, ranges, listed(plan, rel))
                 for rel in sorted(sample_set | scope_set)]
        try:
            results, stats = _run(job, specs, tasks, run or check_locally, stream)
        except BaseException:
            for future in rest:  # interrupted: the footers not yet read are not waited for
                future.cancel()
            raise
        facts.update(collect(rest, progress))
    progress.close()
    ctx = Context(job, plan, present, facts)
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


def make_checks(ctx: Context, results: list[ShardResult], sampled: int, seed: int) -> list[Check]:
    """One report entry per registered check of this pipeline, in registry order."""
    checks = []
    for name, definition, index in report_order(ctx.job.pipeline.operations, ctx.job.pipeline.dataset):
        check = Check(name, definition.stage, len(ctx.present))
        if definition.stage == "listing":
            args = (ctx, check) if index is None else (ctx, check, index)
            definition.run(*args)
        elif definition.stage == "footer":
            for rel in ctx.present:
                for problem, detail in ctx.facts[rel].problems:
                    if problem == name:
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
