"""The shard plan: one listing per prefix, footers of existing outputs, and what is left to do.

The output shard is the only truth about progress: an output counts as complete when it is readable
parquet with the base shard's row count and this pipeline's fingerprint. No markers, no manifests.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from tasks import storage
from tasks.errors import ConfigError, ShardError
from tasks.merge import Job, check_extensions, read_provenance

FOOTER_THREADS = 32


@dataclass
class Plan:
    job: Job
    base: storage.Listing
    sources: list[storage.Listing]
    output: storage.Listing
    complete: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)   # (relpath, their fingerprint)
    broken: list[tuple[str, str]] = field(default_factory=list)  # (relpath, why it is not trusted)

    @property
    def shards(self) -> list[str]:
        return list(self.base.shards)

    def missing_siblings(self, index: int) -> list[str]:
        have = self.sources[index].shards
        return [rel for rel in self.base.shards if rel not in have]

    def extra_siblings(self, index: int) -> list[str]:
        return [rel for rel in self.sources[index].shards if rel not in self.base.shards]

    @property
    def output_strays(self) -> list[str]:
        extra = [rel for rel in self.output.shards if rel not in self.base.shards]
        return sorted(extra + list(self.output.others))


def _list(prefix: str, what: str) -> storage.Listing:
    try:
        return storage.list_prefix(prefix)
    except PermissionError as exc:
        raise ConfigError(f"cannot list {what} {prefix}: access denied ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"cannot list {what} {prefix}: {exc}") from None


def _exists(prefix: str) -> bool:
    fs, path = storage.filesystem(prefix)
    try:
        return fs.exists(path)
    except OSError:
        return True  # cannot tell; let the listing's own answer stand


def plain_relpath(relpath: str) -> bool:
    try:
        storage.check_relpath(relpath)
    except ValueError:
        return False
    return True


def output_status(job: Job, relpath: str) -> tuple[str, str]:
    """('complete'|'stale'|'broken', detail) for an existing output shard, from footers only.

    For a complete shard the detail is its row count."""
    try:
        out = storage.read_footer(job.output_uri(relpath))
    except Exception as exc:
        return "broken", f"unreadable: {type(exc).__name__}"
    prov = read_provenance(out)
    if prov is None:
        return "stale", "(no sidecar_ops provenance)"
    if prov.get("fingerprint") != job.fingerprint:
        return "stale", str(prov.get("fingerprint"))
    try:
        base_rows = storage.read_footer(job.base_uri(relpath)).num_rows
    except Exception as exc:
        return "broken", f"base footer unreadable: {type(exc).__name__}"
    if out.num_rows != base_rows:
        return "broken", f"{out.num_rows} rows, base has {base_rows}"
    return "complete", str(out.num_rows)


def make_plan(job: Job, overwrite: bool = False) -> Plan:
    """List base, sources and output once each; classify existing outputs; refuse stale ones."""
    pipeline = job.pipeline
    base = _list(pipeline.dataset.main_prefix, "main_prefix")
    if not base.shards:
        others = f" ({len(base.others)} other objects)" if base.others else ""
        exists = base.exists and (base.others or _exists(pipeline.dataset.main_prefix))
        state = "does not exist" if not exists else f"holds no non-empty *.parquet shards{others}"
        raise ConfigError(f"main_prefix {pipeline.dataset.main_prefix} {state}; check the dataset's main_prefix")
    unsafe = [rel for rel in base.shards if not plain_relpath(rel)]
    if unsafe:
        raise ConfigError(f"main_prefix {pipeline.dataset.main_prefix} holds {len(unsafe)} object key(s) that are not "
                          f"plain relative paths (an empty, '.' or '..' segment), e.g. {unsafe[0]!r}; outputs keep "
                          "the base's relative paths, so rename or remove these objects")
    sources = [_list(op.source_prefix, f"operations[{i}].source_prefix")
               for i, op in enumerate(pipeline.operations)]
    output = _list(job.output_prefix, "output prefix")
    if storage.is_s3(job.output_prefix) and not output.exists:
        bucket = job.output_prefix[len("s3://"):].split("/", 1)[0]
        if not _exists(f"s3://{bucket}/"):
            raise ConfigError(f"output prefix {job.output_prefix}: bucket {bucket!r} does not exist; create it or "
                              "choose another --output-prefix")
    plan = Plan(job, base, sources, output)
    existing = [rel for rel in base.shards if rel in output.shards]
    if overwrite:
        plan.todo = list(base.shards)
        return plan
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        statuses = dict(zip(existing, pool.map(lambda rel: output_status(job, rel), existing)))
    for rel in base.shards:
        status, detail = statuses.get(rel, ("missing", ""))
        if status == "complete":
            plan.complete.append(rel)
        else:
            plan.todo.append(rel)
            if status == "stale":
                plan.stale.append((rel, detail))
            elif status == "broken":
                plan.broken.append((rel, detail))
    return plan


def refuse_stale(plan: Plan) -> None:
    if plan.stale:
        rel, theirs = plan.stale[0]
        raise ConfigError(
            f"{len(plan.stale)} existing output shard(s) under {plan.job.output_prefix} were written by a different "
            f"pipeline (fingerprint {theirs}, this pipeline is {plan.job.fingerprint}), e.g. {rel}; "
            "use --overwrite to replace them or choose another --output-prefix")


def sample(items: list[str], n: int) -> list[str]:
    """A deterministic, evenly spread sample of at most n items."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def inspect_schemas(plan: Plan, n: int) -> tuple[pa.Schema | None, list[str]]:
    """Predict the output schema from footers of sampled shards; every problem found, one line each."""
    job = plan.job
    dataset = job.pipeline.dataset
    schema, problems = None, []
    for rel in sample(plan.shards, n):
        try:
            current = storage.read_footer(job.base_uri(rel)).schema.to_arrow_schema()
        except Exception as exc:
            problems.append(f"shard {rel}: base footer unreadable: {type(exc).__name__}: {exc}")
            continue
        if dataset.image_column in current.names:
            current = current.remove(current.get_field_index(dataset.image_column))
        skipped = False
        for i, op in enumerate(job.pipeline.operations):
            if rel not in plan.sources[i].shards:
                skipped = skipped or not op.required
                if op.required:
                    problems.append(f"shard {rel}: operations[{i}] ({op.describe()}): sibling shard missing")
                continue
            try:
                current, _ = op.plan(current, dataset, rel)
            except Exception as exc:
                detail = str(exc) if isinstance(exc, ShardError) else f"{type(exc).__name__}: {exc}"
                problems.append(f"shard {rel}: operations[{i}] ({op.describe()}): {detail}")
                current = None
                break
        if current is None:
            continue
        try:
            check_extensions(job, current, allow_missing=skipped)
        except ShardError as exc:
            problems.append(f"shard {rel}: {exc}")
        if skipped:
            continue  # a no-op step (required: false) legitimately leaves its columns out
        if schema is None:
            schema = current
        elif not schema.equals(current, check_metadata=False):
            problems.append(f"shard {rel}: output schema differs from the first sampled shard's")
    return schema, problems
