"""The registered verify checks, in report order. Each names what it proves; tasks/verification/registry.py says how
the driver runs each stage. Operations add value checks through Operation.compare_values (key and merged columns)
and per-operation checks through Operation.verify_checks."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tasks import storage
from tasks.kernel import shard_key
from tasks.ops.base import SIBLINGS
from tasks.ops.lineage import Status, replay
from tasks.plan import changed_inputs
from tasks.verification.registry import RowRule, register

SHARD_SET, STRAYS, SIBLINGS_OF = "output shard set", "stray objects", "operations[{index}] siblings"
ROWS, SCHEMA, PROVENANCE, INPUTS = "row counts", "schema", "provenance", "current inputs"
BASE, KEYS, MERGED = "base columns", "key columns", "merged columns"  # BASE also takes unreadable data
NO_NAN = "no NaN scores"


def siblings_check(index: int) -> str:
    return SIBLINGS_OF.format(index=index)


# ---------------------------------------------------------------- listings
@register(SHARD_SET, "listing", "shards", "every base shard has an output shard, and the output has no shard "
          "the base lacks")
def shard_set(ctx, check) -> None:
    base, output = ctx.plan.base.shards, ctx.plan.output.shards
    check.checked = len(base)
    for rel in base:
        if rel not in output:
            check.fail(rel, "output shard missing")
    for rel in output:
        if rel not in base:
            check.fail(rel, "output shard not in the base (extra)")
    check.note = f"{len(ctx.present)} of {len(base)} present"


@register(STRAYS, "listing", "objects", "the output prefix holds nothing but non-empty `*.parquet` shards "
          "(no temporary file of an interrupted write, no other object)")
def strays(ctx, check) -> None:
    others = ctx.plan.output.others
    check.checked = len(ctx.plan.output.shards) + len(others)
    for obj in others:
        what = "temporary file of an interrupted write" if storage.TEMP_MARK in obj else "not a non-empty *.parquet"
        check.fail(obj, what)
    check.note = f"{len(others)} stray of {check.checked} objects"


@register(SIBLINGS_OF, "listing", "shards", "operation i's sibling shard exists for every base shard (a missing "
          "one fails unless the operation says `required: false`), and each output merged exactly the siblings "
          "that exist now", key=SIBLINGS)
def siblings(ctx, check, index: int) -> None:
    plan, source = ctx.plan, ctx.plan.input(index)
    base, missing = plan.base.shards, plan.missing_siblings(index)
    check.checked = len(base)
    if source.required:
        for rel in missing:
            check.fail(rel, f"sibling shard missing: {source.uri(rel)}")
    check.note = (f"{len(missing)} missing, skipped (required: false)" if missing and not source.required
                  else f"{len(base) - len(missing)} of {len(base)} present")
    for rel, detail in sorted(ctx.found.siblings.get(index, ()), key=lambda problem: problem[0]):
        check.fail(rel, detail)  # folded as footers arrived: in the listings' order again


def sibling_problems(plan, relpath: str, records) -> list[tuple[int, str]]:
    """(operation index, detail) for each operation whose recorded step disagrees with its sibling's presence
    now; folded per shard as its footers are read (tasks/verification/driver.py Found)."""
    if records is None:
        return []
    problems = []
    for index, record in enumerate(records):
        if plan.input(index) is None:
            continue
        have = plan.has_sibling(index, relpath)
        if record.status is Status.SKIPPED and have:
            problems.append((index, "sibling exists now but the output skipped it; delete the output shard and "
                                    "rerun to merge it"))
        elif record.applied and not have:
            problems.append((index, "sibling merged into the output has since vanished"))
    return problems


# ---------------------------------------------------------------- footers
@register(ROWS, "footer", "shards", "the base's and the output's parquet footers are readable and the "
          "output has the base's row count",
          note=lambda ctx: f"{ctx.found.rows:,} rows")
def row_counts(job, footers) -> list[str]:
    if footers.out_rows != footers.base_rows:
        return [f"output has {footers.out_rows} rows, base has {footers.base_rows}"]
    return []


@register(SCHEMA, "footer", "shards", "the output starts with the base's columns, in order and with their "
          "types (less those an operation dropped, renamed ones under their new names), then the columns the "
          "operations added, as the provenance records them; each declared schema extension is there and conforms "
          "to its type")
def schema(job, footers) -> list[str]:
    base, out, records = footers.base, footers.out, footers.records
    problems = []
    layout = replay(base.names, records)
    kept, added, origin = layout.base_part, layout.added, layout.origin
    if out.names[:len(kept)] != kept:
        problems.append(f"base columns not first and in order: output starts {out.names[:len(kept)]}, "
                        f"base has {kept}")
    else:
        for name in kept:
            source = origin[name]  # a base column, perhaps renamed, unless a step replaced its values
            if source.step is None and not out.field(name).type.equals(base.field(source.column).type):
                problems.append(f"base column {name!r} is {out.field(name).type}, base has "
                                f"{base.field(source.column).type}")
    if records is not None and out.names[len(kept):] != added:
        problems.append(f"columns after the base ones are {out.names[len(kept):]}, provenance says {added}")
    skipped = [op for op, r in zip(job.pipeline.operations, records or ()) if not r.applied]
    for ext in job.pipeline.dataset.schema_extensions:
        if ext.name not in out.names:
            if ext.name not in layout.explained and not any(op.supplies(ext.name) for op in skipped):
                problems.append(f"declared extension column {ext.name!r} ({ext.type.name}) is missing")
            continue
        if problem := ext.type.problem(out.field(ext.name).type):
            problems.append(f"column {ext.name!r}: {problem}")
    return problems


@register(PROVENANCE, "footer", "shards", "the output's footer records this pipeline's fingerprint (another "
          "one: stale, made by a different configuration) and one entry per operation",
          note=lambda ctx: f"fingerprint {ctx.job.fingerprint}")
def provenance(job, footers) -> list[str]:
    prov = footers.provenance
    if prov is None:
        return ["no sidecar_ops provenance in the footer"]
    if not job.pipeline.accepts(prov.get("fingerprint")):
        return [(f"stale: written by pipeline fingerprint {prov.get('fingerprint')}, this pipeline is "
                 f"{job.fingerprint}")]
    if footers.records is None:
        return ["provenance does not record one entry per operation"]
    return []


@register(INPUTS, "footer", "shards", "each output was made from the base and sibling shards listed now: the "
          "input key it recorded equals the key of their current identities (else it is stale)")
def current_inputs(job, footers) -> list[str]:
    prov = footers.provenance
    if prov is None or not job.pipeline.accepts(prov.get("fingerprint")) or footers.inputs is None:
        return []  # no provenance or another pipeline's: the provenance check says so
    if prov.get("input_key") != shard_key(prov["fingerprint"], footers.relpath, footers.inputs):
        return [(f"stale: {changed_inputs(prov.get('inputs'), footers.inputs)} since it was written (the same "
                 "comparison a run's plan makes); rerun the merge to recompute it")]
    return []


# ---------------------------------------------------------------- data (sampled shards)
@register(BASE, "data", "sampled", "every column the output took unchanged from the base equals the base, value "
          "for value")
def base_columns(shard) -> list[str]:
    lines = []
    for name, source in shard.layout.columns:
        if source.step is not None:
            continue
        if name not in shard.out.column_names:
            lines.append(f"base column {name!r} missing from the output")
        elif line := shard.compare(name, shard.out[name], shard.base[source.column]):
            lines.append(line)
    return lines


@register(KEYS, "data", "sampled", "the dataset key column equals the base's, and each operation's key "
          "column equals its sibling's, row for row")
def key_columns(shard) -> list[str]:
    lines, key, out = [], shard.dataset.key_column, shard.out
    if key in out.column_names and (line := shard.compare(key, out[key], shard.base[key])):
        lines.append(f"{line} (dataset key vs base)")
    return lines + [line for found in shard.findings for line in found.keys]


@register(MERGED, "data", "sampled", "no operation failed on the shard, and every column an operation "
          "supplied equals its sibling's, value for value")
def merged_columns(shard) -> list[str]:
    lines = []
    for i, (rec, found) in enumerate(zip(shard.records, shard.findings)):
        if rec.status is Status.FAILED:
            lines.append(f"operations[{i}]: {rec.detail}")
        lines += found.columns
    return lines


def added_floats(shard):
    """(dotted name, values) of every floating-point column an operation added to the output, and of every
    floating-point field, at any depth, of a struct column it added (a score's `raw_score`)."""
    def leaves(name: str, values: pa.ChunkedArray):
        if pa.types.is_floating(values.type):
            yield name, values
        elif pa.types.is_struct(values.type):
            for i in range(values.type.num_fields):
                field = values.type.field(i)
                yield from leaves(f"{name}.{field.name}", pc.struct_field(values, [i]))

    for name, source in shard.layout.columns:
        if source.step is not None and name in shard.out.column_names:
            yield from leaves(name, shard.out[name])


register(NO_NAN, "data", "sampled", "no floating-point column an operation added (nor any floating-point field "
         "of a struct it added) holds NaN: a score that was not computed is null, never NaN")(
    RowRule("NaN", added_floats, pc.is_nan))
