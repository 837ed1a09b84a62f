"""`--dry-run`: validate, list, inspect sampled footers and print the plan. Writes nothing, starts no server."""
from __future__ import annotations

import sys

from tasks.config import Pipeline
from tasks.kernel import Job, now_utc, overwrite_fields
from tasks.plan import inspect_schemas, make_plan
from tasks.storage import lifecycle_note

SHOW = 5


def _some(items: list[str]) -> str:
    shown = ", ".join(items[:SHOW])
    return shown + (f" and {len(items) - SHOW} more" if len(items) > SHOW else "")


def dry_run(pipeline: Pipeline, output_prefix: str, samples: int = 20, overwrite: bool = False,
            out=None, overwrite_before: str | None = None, continue_overwrite: str | None = None) -> int:
    out = out or sys.stdout
    job = Job(pipeline, output_prefix, started=now_utc(),
              **overwrite_fields(overwrite, "", continue_overwrite, overwrite_before))
    plan = make_plan(job, overwrite=overwrite)
    ds = pipeline.dataset
    problems: list[str] = []
    say = lambda line="": print(line, file=out)  # noqa: E731
    say(f"pipeline:               {pipeline.path} (fingerprint {pipeline.fingerprint})")
    say(f"dataset:                {ds.name} ({ds.path})")
    say(f"main_prefix (base):     {ds.main_prefix}")
    say(f"sidecar_prefix (yaml):  {ds.sidecar_prefix}")
    say(f"output prefix (effective): {output_prefix}")
    if note := lifecycle_note(output_prefix):
        say(note)
    say(f"shards:                 {len(plan.shards)} (+{len(plan.base.others)} other objects ignored: not *.parquet)")
    if empty := plan.base.empty_shards:
        problems.append(f"{len(empty)} base shard(s) are empty (0 bytes), a run fails them: {_some(empty)}")
    for i, op in enumerate(pipeline.operations):
        summary, notes = op.dry_run_lines(ds)
        say(f"operations[{i}]: {summary}")
        source = op.input(ds)
        missing = plan.missing_siblings(i)
        if source:
            say(f"    siblings: {len(plan.siblings(i).shards)} found, {len(missing)} missing, "
                f"{len(plan.extra_siblings(i))} extra (extra ones are ignored)")
        for note in notes:
            say(f"operations[{i}]: {note}")
        if missing:
            line = f"operations[{i}] ({op.describe()}): {len(missing)} sibling shard(s) missing: {_some(missing)}"
            (problems.append(line) if source.required else say(f"    skipped where missing (required: false): "
                                                              f"{_some(missing)}"))
    problems += plan.unmatched_optional()
    say(f"outputs complete:       {len(plan.complete)}")
    if plan.stale:
        say(f"outputs stale (inputs changed since written; recomputed): {len(plan.stale)}: "
            f"{_some([f'{r} ({why})' for r, why in plan.stale])}")
    say(f"shards to process:      {len(plan.todo)}")
    if plan.broken:
        say(f"outputs to recompute (untrusted): {_some([f'{r} ({why})' for r, why in plan.broken])}")
    if plan.replaced:
        say(f"outputs to recompute ({plan.replaced[0][1]}): {len(plan.replaced)}: "
            f"{_some([r for r, _ in plan.replaced])}")
    if plan.foreign and not overwrite:
        problems.append(f"{len(plan.foreign)} existing output(s) were written by a different pipeline: "
                        f"{_some([r for r, _ in plan.foreign])} (a real run refuses; use --overwrite)")
    if plan.output_strays:
        say(f"other objects already in the output prefix: {_some(plan.output_strays)}")
    schema, schema_problems = inspect_schemas(plan, samples)
    problems += schema_problems
    say(f"output schema (from footers of {min(samples, len(plan.shards))} sampled shards):")
    for field in schema or []:
        say(f"    {field.name}: {field.type}")
    if problems:
        say(f"PROBLEMS ({len(problems)}):")
        for line in problems:
            say(f"  - {line}")
        say("dry run: nothing written; fix the problems above before running")
        return 1
    say("dry run OK: nothing written")
    return 0
