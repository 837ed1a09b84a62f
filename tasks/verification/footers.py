"""Footer facts of every present shard: both footers read once, the footer checks run on them, small facts kept.

Also what verify knows of each operation's effect on a shard: its recorded `StepRecord` (tasks/ops/lineage.py), read
from provenance; tasks.ops.lineage.replay turns those records into the expected layout and origins.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from tasks import storage
from tasks.kernel import Job, read_provenance
from tasks.ops.lineage import StepRecord
from tasks.scorestats import StatSpec, footer_ranges
from tasks.verification.compare import one_line
from tasks.verification.registry import of_stage


def op_records(prov: dict | None, n_ops: int) -> tuple[StepRecord, ...] | None:
    """Each operation's recorded step (records of earlier versions converted), or None when provenance does not
    hold one record per operation."""
    ops = (prov or {}).get("operations")
    if not isinstance(ops, list) or len(ops) != n_ops or not all(isinstance(r, dict) for r in ops):
        return None
    try:
        return tuple(StepRecord.from_dict(r) for r in ops)
    except (ValueError, TypeError, AttributeError):
        return None  # lineage that does not parse: as good as none


@dataclass(frozen=True)
class Footers:
    """Both footers of one shard, as the footer checks see them (base schema without the image column)."""

    relpath: str
    base_rows: int
    out_rows: int
    base: pa.Schema
    out: pa.Schema
    provenance: dict | None
    records: tuple[StepRecord, ...] | None
    inputs: dict | None = None  # identities of the shard's inputs as listed now (Plan.inputs)


@dataclass(frozen=True)
class FooterFacts:
    relpath: str
    base_rows: int | None
    out_rows: int | None
    problems: tuple[tuple[str, str], ...]          # (check name, detail)
    records: tuple[StepRecord, ...] | None
    ranges: dict = field(default_factory=dict)     # 'col.field' -> (min, max) | None, scope shards only


def read_footers(job: Job, relpath: str, specs: tuple[StatSpec, ...], want_ranges: bool,
                 unreadable: str, inputs: dict | None = None, sizes: tuple[int | None, int | None] = (None, None)) -> FooterFacts:
    """Read both footers and run every footer check; an unreadable footer is one problem of check `unreadable`.
    `inputs`: the identities of the shard's inputs as listed now, for the check that the output is current;
    `sizes`: the base's and the output's sizes as listed (no HEAD request on S3)."""
    image = job.pipeline.dataset.image_column
    try:
        base_meta, base_schema = storage.read_footer_schema(job.base_uri(relpath), sizes[0])
        if image in base_schema.names:
            base_schema = base_schema.remove(base_schema.get_field_index(image))
    except Exception as exc:
        return FooterFacts(relpath, None, None, ((unreadable, f"base footer unreadable: {one_line(exc)}"),), None)
    try:
        out_meta, out_schema = storage.read_footer_schema(job.output_uri(relpath), sizes[1])
    except Exception as exc:
        return FooterFacts(relpath, base_meta.num_rows, None,
                           ((unreadable, f"output footer unreadable: {one_line(exc)}"),), None)
    prov = read_provenance(out_meta)
    records = op_records(prov, len(job.pipeline.operations))
    footers = Footers(relpath, base_meta.num_rows, out_meta.num_rows, base_schema, out_schema, prov, records,
                      inputs)
    problems = tuple((check.name, line) for check in of_stage("footer") for line in check.run(job, footers))
    ranges = footer_ranges(out_meta, specs) if want_ranges else {}
    return FooterFacts(relpath, base_meta.num_rows, out_meta.num_rows, problems, records, ranges)
