"""The shard plan: one listing per prefix, footers of existing outputs, and what is left to do.

The output shard is the only truth about progress: an output counts as complete when it is readable parquet
with this pipeline's fingerprint, the row count and the input identities it recorded equal to the current
base and siblings (kernel.shard_key over the listings). No markers, no manifests, no shard data read.
An existing output is one of:
  complete  current: kept
  stale     made from other inputs (a source or the base changed, or an older version wrote it): recomputed
  foreign   written by a different pipeline (another fingerprint), or no provenance this tool could have written
            (none, not a JSON object, a field missing or of another type): the run refuses (--overwrite replaces it)
  broken    unreadable, or a row count different from the one recorded: recomputed
  replaced  (an overwrite continued: --continue-overwrite ID, or --overwrite-before TIME) not written by that
            overwrite (or, by TIME, by a run started before it): recomputed
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from tasks import storage
from tasks.errors import ConfigError, ShardError
from tasks.kernel import Job, check_extensions, provenance_of, read_provenance, shard_inputs, shard_key
from tasks.ops import ABSENT, NO_INPUT, History, Input, Status, StepRecord

FOOTER_THREADS = 32


@dataclass
class Plan:
    job: Job
    base: storage.Listing
    sources: dict[str, storage.Listing]  # one listing per input prefix, however many operations read it
    output: storage.Listing
    complete: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)    # (relpath, which inputs changed)
    foreign: list[tuple[str, str]] = field(default_factory=list)  # (relpath, their fingerprint, or why none)
    broken: list[tuple[str, str]] = field(default_factory=list)   # (relpath, why it is not trusted)
    replaced: list[tuple[str, str]] = field(default_factory=list)  # (relpath, not written by the overwrite continued)
    rows: dict[str, int] = field(default_factory=dict)  # complete outputs' row counts, from their footers

    @property
    def shards(self) -> list[str]:
        return list(self.base.shards)

    def input(self, index: int) -> Input | None:
        return self.job.pipeline.operations[index].input(self.job.pipeline.dataset)

    def siblings(self, index: int) -> storage.Listing | None:
        """The listing of operations[index]'s input, None when it reads no sibling."""
        source = self.input(index)
        return self.sources[source.prefix] if source else None

    def has_sibling(self, index: int, relpath: str) -> bool:
        listing = self.siblings(index)
        return listing is not None and relpath in listing.shards

    def missing_siblings(self, index: int) -> list[str]:
        listing = self.siblings(index)
        if listing is None:
            return []
        return [rel for rel in self.base.shards if rel not in listing.shards]

    def extra_siblings(self, index: int) -> list[str]:
        listing = self.siblings(index)
        return [rel for rel in listing.shards if rel not in self.base.shards] if listing else []

    def inputs(self, relpath: str) -> dict:
        """The identities of relpath's inputs as listed now (an absent sibling is 'absent')."""
        return shard_inputs(self.base.ids.get(relpath, ""),
                            [self._identity(i, relpath) for i in range(len(self.job.pipeline.operations))])

    def listed(self, relpath: str) -> dict[str, str]:
        """URI -> listed identity of each input of relpath (storage.ABSENT for a sibling the listing did not
        have): what its shard task's first attempt reads (storage.listed), without asking the store again."""
        out = {self.job.base_uri(relpath): self.base.ids.get(relpath) or storage.ABSENT}
        for index in range(len(self.job.pipeline.operations)):
            source, listing = self.input(index), self.siblings(index)
            if source is not None:
                out[source.uri(relpath)] = listing.ids.get(relpath) or storage.ABSENT
        return out

    def _identity(self, index: int, relpath: str) -> str:
        listing = self.siblings(index)
        return NO_INPUT if listing is None else listing.ids.get(relpath, ABSENT)

    def unmatched_optional(self) -> list[str]:
        """One line per operation with an optional input that has a sibling for none of the base shards."""
        lines = []
        for i, op in enumerate(self.job.pipeline.operations):
            source, listing = self.input(i), self.siblings(i)
            if source is None or source.required or any(rel in listing.shards for rel in self.base.shards):
                continue
            state = "does not exist" if not listing.exists else "holds none of their relative paths"
            lines.append(f"operations[{i}] ({op.describe()}) has required: false, but its {source.field} "
                         f"{source.prefix} {state}: it would be skipped for all {len(self.base.shards)} "
                         f"base shards; check {source.field} for a typo, or remove the operation")
        return lines

    @property
    def output_strays(self) -> list[str]:
        extra = [rel for rel in self.output.shards if rel not in self.base.shards]
        return sorted(extra + list(self.output.others))


def list_or_refuse(prefix: str, what: str, listing=None) -> storage.Listing:
    """The listing of `prefix` (`listing()` when given: a listing task's result), or one line naming `what` the
    prefix is when the store fails it (ConfigError). A listing task's failure is the client library's own error
    as Prefect re-raises it (botocore's EndpointConnectionError for a store that is down, not s3fs's OSError):
    any error of the store's families (storage.store_errors) is that line; any other error is a bug of ours and
    goes on as it is (the command's "unexpected" line, exit 1), never read as a refusal."""
    try:
        return listing() if listing is not None else storage.list_prefix(prefix)
    except PermissionError as exc:
        raise ConfigError(f"cannot list {what} {prefix}: access denied ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"cannot list {what} {prefix}: {exc}") from None
    except storage.store_errors() as exc:
        raise ConfigError(f"cannot list {what} {prefix}: {type(exc).__name__}: {exc}") from None


class LazyListings(dict):
    """prefix -> its listing, listed when first asked for (a plan refused on its base lists nothing else)."""

    def __init__(self, what: dict[str, str]):
        super().__init__()
        self.what = what

    def __missing__(self, prefix: str) -> storage.Listing:
        self[prefix] = listing = list_or_refuse(prefix, self.what[prefix])
        return listing


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


def changed_inputs(recorded: dict | None, current: dict) -> str:
    """Which inputs differ between an output's recorded identities and the current ones, in words."""
    if not recorded:
        return "written without input identities (an older version)"
    names = [] if recorded.get("base") == current["base"] else ["base shard"]
    old_ops = list(recorded.get("operations") or [])
    for i, ident in enumerate(current["operations"]):
        if i >= len(old_ops) or old_ops[i] != ident:
            names.append(f"operations[{i}] sibling")
    return ", ".join(names) + " changed" if names else "merge semantics changed"


def judge_output(job: Job, relpath: str, meta, inputs: dict) -> tuple[str, str]:
    """(status, detail) of an existing output shard, given its footer and the inputs it must have been made
    from. The shared decision behind resume: the planner passes inputs from listings, the shard task those
    it read. For a complete shard the detail is its row count."""
    prov, problem = provenance_of(meta)
    if prov is None:
        return "foreign", problem
    if not job.pipeline.accepts(prov["fingerprint"]):
        return "foreign", f"fingerprint {prov['fingerprint']}"
    if prov.get("input_key") != shard_key(prov["fingerprint"], relpath, inputs):
        return "stale", changed_inputs(prov.get("inputs"), inputs)
    if meta.num_rows != prov.get("rows"):
        return "broken", f"{meta.num_rows} rows, {prov.get('rows')} recorded"
    return "complete", str(meta.num_rows)


def output_status(job: Job, relpath: str, inputs: dict, size: int | None = None) -> tuple[str, str]:
    """('complete'|'stale'|'foreign'|'broken'|'replaced', detail) for an existing output shard, from its footer
    only. In an overwrite run an output counts as complete only when that overwrite wrote it
    (Job.kept_by_overwrite); any other is 'replaced' (foreign ones included: an overwrite replaces them)."""
    try:
        out = storage.read_footer(job.output_uri(relpath), size)
    except Exception as exc:
        return "broken", f"unreadable: {type(exc).__name__}"
    status, detail = judge_output(job, relpath, out, inputs)
    if job.overwrite and status in ("complete", "foreign") and not job.kept_by_overwrite(read_provenance(out) or {}):
        return "replaced", replaced_why(job)
    return status, detail


def replaced_why(job: Job) -> str:
    if job.overwrite_before:
        return f"written by a run started before {job.overwrite_before}"
    return f"not written by overwrite {job.overwrite_id}"


def input_prefixes(pipeline) -> dict[str, str]:
    """Each distinct input prefix -> what it is, named after the first operation that reads it."""
    found: dict[str, str] = {}
    for i, op in enumerate(pipeline.operations):
        source = op.input(pipeline.dataset)
        if source and source.prefix not in found:
            found[source.prefix] = f"operations[{i}].{source.field}"
    return found


def prefixes(job: Job) -> dict[str, str]:
    """Every prefix a plan lists -> what it is (in messages): the base, each input prefix, the output."""
    found = {job.pipeline.dataset.main_prefix: "main_prefix"}
    for prefix, what in input_prefixes(job.pipeline).items():
        found.setdefault(prefix, what)
    found.setdefault(job.output_prefix, "output prefix")
    return found


def make_plan(job: Job, overwrite: bool = False, listings: dict[str, storage.Listing] | None = None) -> Plan:
    """List base, sources and output once each (unless `listings` holds them: the merge flow's listing tasks);
    classify existing outputs; refuse stale ones."""
    pipeline = job.pipeline
    if listings is None:
        listings = LazyListings(prefixes(job))
    base = listings[pipeline.dataset.main_prefix]
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
    sources = {prefix: listings[prefix] for prefix in input_prefixes(pipeline)}
    output = listings[job.output_prefix]
    missing = None if output.exists else storage.missing_root(job.output_prefix)
    if missing:
        raise ConfigError(f"output prefix {job.output_prefix}: {missing}")
    plan = Plan(job, base, sources, output)
    existing = [rel for rel in base.shards if rel in output.shards]
    if overwrite and not (job.continues or job.overwrite_before):
        plan.todo = list(base.shards)  # a new overwrite (or listings only): nothing existing can be its own
        return plan
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        status = lambda rel: output_status(job, rel, plan.inputs(rel), output.shards[rel])  # noqa: E731
        statuses = dict(zip(existing, pool.map(status, existing)))
    for rel in base.shards:
        status, detail = statuses.get(rel, ("missing", ""))
        if status == "complete":
            plan.complete.append(rel)
            plan.rows[rel] = int(detail)
            continue
        plan.todo.append(rel)
        if status in ("stale", "foreign", "broken", "replaced"):
            getattr(plan, status).append((rel, detail))
    return plan


def refuse_unmatched(plan: Plan) -> None:
    """An optional operation that matches no base shard is a mistake (a typo in its prefix), not a no-op."""
    if lines := plan.unmatched_optional():
        raise ConfigError(lines[0])


def refuse_foreign(plan: Plan) -> None:
    if plan.foreign:
        rel, theirs = plan.foreign[0]
        raise ConfigError(
            f"{len(plan.foreign)} existing output shard(s) under {plan.job.output_prefix} were written by a different "
            f"pipeline or carry no valid provenance ({theirs}; this pipeline is {plan.job.fingerprint}), e.g. {rel}; "
            "use --overwrite to replace them or choose another --output-prefix")


def sample(items: list[str], n: int) -> list[str]:
    """A deterministic, evenly spread sample of at most n items."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def inspect_schemas(plan: Plan, n: int) -> tuple[pa.Schema | None, list[str]]:
    """Predict the output schema (as Parquet will store it) from footers of sampled shards; every problem found,
    one line each."""
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
        skipped, history = False, History()
        for i, op in enumerate(job.pipeline.operations):
            source = plan.input(i)
            if source and not plan.has_sibling(i, rel):
                skipped = skipped or not source.required
                if source.required:
                    problems.append(f"shard {rel}: operations[{i}] ({op.describe()}): sibling shard missing")
                history = history.then(op, StepRecord(Status.SKIPPED if not source.required else Status.FAILED))
                continue
            try:
                current, step = op.plan(current, dataset, rel, history)
                history = history.then(op, step)
            except Exception as exc:
                detail = str(exc) if isinstance(exc, ShardError) else f"{type(exc).__name__}: {exc}"
                problems.append(f"shard {rel}: operations[{i}] ({op.describe()}): {detail}")
                current = None
                break
        if current is None:
            continue
        current = storage.as_stored(current)
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
