"""W10 verify over many shards on S3 (issue 27, deliverable 2): `sidecar-ops verify` at several shard counts
behind W8's counting proxy, which adds a first-byte latency to every request (15 ms, `w10_latency_ms`).

A case of N tiny shards (10 rows, the bench schema and pipeline) per count, in its own bucket of one moto server
(loopback, in this process). Set-up, beside the proxy (not counted), built to take minutes at 10^5 shards:
- the inputs (base, DQM and AES): one shard of each written once locally, its bytes stored under every relpath
  through moto's own backend in this process (moto.s3.models.s3_backends, the store its server serves: ~50x the
  speed of boto3 puts over HTTP, 0.3 s against 17.8 s for 3,000 objects here), with what an HTTP PUT stores
  beside them (the CRC32 checksum boto3 sends, the bucket's ACL). Each sidecar's first object is then read back
  through the server (boto3 head_object and get_object) and must answer as an object put through boto3 does:
  ETag, size, CRC32 and bytes equal to those of the same bytes PUT into another bucket;
- the merged outputs: the run's own plan and shard kernel in a pool of 2 worker processes on moto's own port
  (no proxy), 4 shards in flight in each (a shard waits on moto most of its time; ~22-24 ms a shard here against
  ~50 ms for a `sidecar-ops run`, whose Prefect task runs cost the rest): the plan from listings of the base,
  the sources and the output (tasks.plan.make_plan, with the run's refusals), a Job built from the pipeline as the run builds it (flows.runconfig.RunConfig.load, then the
  fields flows/merge.py merge_until sets for the default fused thread-runner run: one run id and start for every
  shard, fetch-ahead on), and each shard through what its fused task runs on a first attempt
  (tasks/prefect_tasks.py shard_task: storage.listed with the plan's identities, kernel.opened_shard,
  kernel.stream_output and its post-write check). So each output records the run's provenance, its input key
  among it (tasks/kernel.py shard_key: the relpath and the inputs' identities as listed), and passes verify's
  `current inputs` check, which the measured runs assert for every shard;
- for counts up to `w10_run_max` (1,000), also a real `sidecar-ops run` (start -> exit) into another bucket, its
  every output compared with the kernel's: the same schema, data, row groups, column chunks, size and footer
  metadata, the provenance equal but for the fields each run records of its own (run_id, run_started,
  written_at). That catches the pool drifting from the run (the Job's fields, the kernel's entry points); the
  run's outputs are not the ones verified. It is cheap there (~50 s at 1,000); at 10^5 it would take over an hour.
moto's listing is made O(page) while W10 runs (paged_listing): moto walks and sorts every key of the bucket for
each page, which at 10^5 shards (400,000 keys) would add ~80 s a prefix to every listing, verify's included; the
pages are the same, and ScaleCase.check_listing compares them with moto's own on every count's bucket.
Measured, through the proxy, each a fresh process (bench/workloads/probe.py), once per count:
(a) `sidecar-ops verify --samples 50` (the default sample: every shard's footers, 50 shards' data)
(b) `sidecar-ops verify --samples 50 --all` (also every shard's score statistics, so every shard's data)
Per run: wall (start -> exit, so with a process's start-up), ms a shard, requests a shard by kind, the driver's
peak RSS, and CPU a shard: the verify process's (with any children it waited for) and this process's, which
serves moto and the proxy (what real S3 would do elsewhere: beside verify on these 2 cores, it slows it). Each report (--json) is
checked: every check passed, N shards, and the statistics hold every row of their scope. Where the largest count is below 10^5, rows give 10^5 by a linear fit over the counts measured,
labelled "extrapolated" (`python bench/run.py --size full --only W10 --w10-counts 1000,10000,100000` measures it).
A JSON line per stage (set-up, sample, all) and per count goes to w10-progress.jsonl in the data folder as each
ends.
"""
from __future__ import annotations

import base64
import collections
import contextlib
import contextvars
import json
import multiprocessing
import os
import resource
import statistics
import sys
import threading
import time
import uuid
import zlib
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from bench.workloads.common import Row, probe
from bench.workloads.data import SIDECARS, make_case, write_yamls
from bench.workloads.w0_fixed import cli_home
from bench.workloads.w8_latency import kinds_note, per_shard

ROWS = 10
SAMPLES = 50
TARGET = 100_000
RUN_MAX = 1_000            # counts up to it also get a real `sidecar-ops run`, compared with the kernel's outputs
PROCESSES = 2              # the kernel's worker processes (the machine's cores)
THREADS = 4                # shards in flight in each (a shard waits on moto most of its time)
CHUNK = 500                # shards a pool task
CLI_TIMEOUT = 4 * 3600     # a verify --all at 10^5 shards under load takes most of an hour
MODES = {"sample": (f"(a) verify --samples {SAMPLES}", []),
         "all": (f"(b) verify --samples {SAMPLES} --all", ["--all"])}
SCORE_COLUMNS = ("dqm_d1_v6_1", "ernie_image_aes")  # bench.yaml's score columns
PUT_CHECK_BUCKET = "w10-put-check"  # the same bytes put through boto3, to compare the backend's objects with


@contextlib.contextmanager
def moto_and_proxy(latency_ms: float):
    """moto on loopback and W8's counting proxy in front of it; yields (moto's URL, the proxy's URL, RequestLog).
    The set-up writes to moto itself; what is measured goes through the proxy."""
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    from bench.workloads.counting import RequestLog, _Proxy, _Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    real_listing = paged_listing()
    log = RequestLog()
    handler = type("Proxy", (_Proxy,), {"upstream": ("127.0.0.1", port), "log": log, "latency": latency_ms / 1000})
    proxy = _Server(("127.0.0.1", 0), handler)
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxy.server_address[1]}", log
    finally:
        proxy.shutdown()
        moto.stop()
        real_listing()


_INDEX: dict[str, tuple[tuple[int, int], list[str]]] = {}  # bucket -> ((its key count, writes seen), sorted names)
_WRITES = [0]
_MOTO_LISTING: list = []  # moto's own list_objects_v2 while paged_listing is installed


def paged_listing():
    """moto's list_objects_v2 walks and sorts every key of the bucket for each page it answers: 80 s to list a
    prefix of 100,000 keys in a bucket of 300,000 here (100 pages), where S3 answers a page in ~0.1 s, so at 10^5
    shards moto's listings alone would take minutes of each verify run. While installed (returns the call that
    takes it away), a listing without a delimiter (s3fs's find, every listing verify and the run make) is answered
    from a sorted index of the bucket's key names, rebuilt after any write or delete: the same page (the same
    keys, continuation token and truncation, moto's own code for the token) at O(page). Anything else is
    moto's own listing. ScaleCase.check_listing compares the two on every count's bucket."""
    from bisect import bisect_left, bisect_right

    from moto.s3.models import FakeBucket, FakeDeleteMarker, S3Backend

    real = {name: getattr(S3Backend, name) for name in ("list_objects_v2", "put_object", "delete_object")}

    def names(bucket) -> list[str]:
        state = (len(bucket.keys), _WRITES[0])
        cached = _INDEX.get(bucket.name)
        if cached is None or cached[0] != state:
            cached = state, sorted(name for name, key in bucket.keys.items() if not isinstance(key, FakeDeleteMarker))
            _INDEX[bucket.name] = cached
        return cached[1]

    def list_objects_v2(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys):
        token = self._pagination_tokens.get(continuation_token) if continuation_token else start_after
        if delimiter or type(bucket) is not FakeBucket or (continuation_token and token is None):
            return real["list_objects_v2"](self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
        index, prefix = names(bucket), prefix or ""
        start = max(bisect_left(index, prefix), bisect_right(index, token) if token else 0)
        page = []
        for name in index[start:start + max_keys + 1]:
            if not name.startswith(prefix):
                break
            page.append(bucket.keys[name])
        return self._truncate_result(page, max_keys)

    def counted(name):
        def call(self, *args, **kwargs):
            _WRITES[0] += 1
            return real[name](self, *args, **kwargs)
        return call

    S3Backend.list_objects_v2 = list_objects_v2
    S3Backend.put_object, S3Backend.delete_object = counted("put_object"), counted("delete_object")

    def restore():
        for name, call in real.items():
            setattr(S3Backend, name, call)
        _INDEX.clear()

    _MOTO_LISTING[:] = [real["list_objects_v2"]]
    return restore


def run(data: Path, size: dict) -> list[Row]:
    for key, value in {"AWS_ACCESS_KEY_ID": "bench-key-id", "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(key, value)
    template = make_case(data / "w10-template", 1, ROWS)
    bodies = {s: Path(template.path(s, template.relpaths[0])).read_bytes() for s in SIDECARS}
    latency = float(size.get("w10_latency_ms", 15))
    run_max = int(size.get("w10_run_max", RUN_MAX))
    results = {}
    with moto_and_proxy(latency) as (moto, proxy, log):
        import boto3

        s3 = boto3.client("s3", endpoint_url=moto)
        for n in size["w10_counts"]:
            results[n] = ScaleCase(data, n, s3, moto, proxy, log).measure(bodies, run_max)
            log_progress(data, n, results[n])
    return rows(results, latency)


def say(text: str) -> None:
    print(f"[bench] W10 {text}", file=sys.stderr, flush=True)


class ScaleCase:
    """N shards in bucket w10-N: inputs, current outputs, then the measured verify runs."""

    def __init__(self, data: Path, n: int, s3, moto: str, proxy: str, log):
        self.data, self.n, self.s3, self.moto, self.proxy, self.log = data, n, s3, moto, proxy, log
        self.bucket, self.root, self.home = f"w10-{n}", data / f"w10-{n}", cli_home(data)
        self.out = f"s3://{self.bucket}/out/"
        self.run_bucket = f"w10-{n}-run"  # a real `sidecar-ops run`'s outputs (counts up to w10_run_max)

    @property
    def pipeline(self) -> str:
        return str(self.root / "pipelines" / "bench.yaml")

    def measure(self, bodies: dict[str, bytes], run_max: int) -> dict:
        t0 = time.perf_counter()
        self.s3.create_bucket(Bucket=self.bucket)
        objects = self.put_inputs(bodies)
        self.check_served(bodies)
        result = {"put": time.perf_counter() - t0, "objects": objects}
        say(f"@ {self.n:,}: {objects:,} inputs in {result['put']:.1f} s")
        write_yamls(self.root, source_root=f"s3://{self.bucket}")
        result["outputs"] = self.kernel_outputs()
        say(f"@ {self.n:,}: outputs (kernel, {PROCESSES} processes) in {result['outputs']['seconds']:.1f} s")
        log_stage(self.data, self.n, "set-up", result)
        if self.n <= run_max:
            result["run"] = self.merge()
            result["compared"] = self.compare_with_run(result["outputs"]["run_id"])
            say(f"@ {self.n:,}: sidecar-ops run in {result['run']:.1f} s, its outputs equal to the kernel's")
        self.check_listing()
        for mode in MODES:
            result[mode] = self.verify(mode)
            log_stage(self.data, self.n, mode, result[mode])
        return result

    def check_listing(self) -> None:
        """paged_listing answers as moto's own listing would: the first two pages, and the last, of the base's
        and the output's prefixes."""
        backend = moto_backend(self.bucket)
        bucket = backend.get_bucket(self.bucket)
        for prefix in ("base/", "out/"):
            calls = [(None, None), ("next", None), (None, f"{prefix}{relpaths_tail(self.n)}")]
            token = None
            for continuation, start_after in calls:
                args = (bucket, prefix, "", token if continuation else None, start_after, 1000)
                got, want = (list_page(call, backend, *args) for call in (type(backend).list_objects_v2,
                                                                         _MOTO_LISTING[0]))
                assert got == want, f"W10 @ {self.n:,}: listing {prefix} ({continuation}, {start_after}): " \
                                    f"{str(got)[:300]} vs moto's {str(want)[:300]}"
                token = got[2]

    # ------------------------------------------------------------ the inputs
    def put_inputs(self, bodies: dict[str, bytes]) -> int:
        """Every relpath's base, DQM and AES object, stored through moto's backend (what its server stores for
        a PUT: the bytes, the CRC32 checksum boto3 sends with them, the bucket's ACL); returns the count."""
        from tasks.demo import relpaths

        backend = moto_backend(self.bucket)
        acl = backend.get_bucket(self.bucket).acl
        crc32 = {s: base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode() for s, body in bodies.items()}
        count = 0
        for rel in relpaths(self.n):
            for sidecar, body in bodies.items():
                key = backend.put_object(self.bucket, f"{sidecar}/{rel}", body, storage="STANDARD",
                                         checksum_value=crc32[sidecar])
                key.checksum_algorithm = "CRC32"
                key.set_acl(acl)
                count += 1
        return count

    def check_served(self, bodies: dict[str, bytes]) -> None:
        """Each sidecar's first object, read through the server, answers as the same bytes put through boto3."""
        from tasks.demo import relpaths

        with contextlib.suppress(self.s3.exceptions.BucketAlreadyOwnedByYou):
            self.s3.create_bucket(Bucket=PUT_CHECK_BUCKET)
        rel = relpaths(1)[0]
        for sidecar, body in bodies.items():
            self.s3.put_object(Bucket=PUT_CHECK_BUCKET, Key=sidecar, Body=body)
            got, want = (served(self.s3, bucket, key) for bucket, key in ((self.bucket, f"{sidecar}/{rel}"),
                                                                          (PUT_CHECK_BUCKET, sidecar)))
            assert got == want and got["body"] == body, f"W10 @ {self.n:,}: {sidecar}/{rel} served as {got}, " \
                                                        f"a PUT of its bytes as {want}"

    # ------------------------------------------------------------ the outputs
    def kernel_outputs(self) -> dict:
        """Every output through the run's plan and shard kernel, in PROCESSES worker processes on moto's own port:
        seconds (pool start to the last shard), shards by write path, and the run id they record."""
        run_id, started = str(uuid.uuid4()), now_utc()  # one run: one id and start recorded by every shard
        t0 = time.perf_counter()
        with ProcessPoolExecutor(PROCESSES, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=kernel_worker, initargs=(self.moto,)) as pool:
            todo = pool.submit(plan_shards, self.pipeline, self.out).result()
            assert len(todo) == self.n, f"W10 @ {self.n:,}: the plan has {len(todo):,} shards to merge"
            chunks = [todo[i:i + CHUNK] for i in range(0, len(todo), CHUNK)]
            paths = collections.Counter()
            for done in [pool.submit(merge_shards, self.pipeline, self.out, run_id, started, c) for c in chunks]:
                paths.update(done.result())
        assert sum(paths.values()) == self.n, f"W10 @ {self.n:,}: {paths}"
        return {"seconds": time.perf_counter() - t0, "paths": dict(paths), "run_id": run_id}

    def cli(self, endpoint: str, *args: str) -> dict:
        self.home.mkdir(parents=True, exist_ok=True)
        rep = probe("cli", "--", *args, env={"PREFECT_HOME": str(self.home), "AWS_ENDPOINT_URL": endpoint},
                    timeout=CLI_TIMEOUT)
        assert rep["exit_code"] == 0, f"W10 @ {self.n:,}: sidecar-ops {args[0]}: exit {rep['exit_code']}\n" \
                                      f"{rep['stderr_tail']}"
        return rep

    def merge(self) -> float:
        """A real `sidecar-ops run` on moto itself (no latency) into its own bucket; its wall."""
        self.s3.create_bucket(Bucket=self.run_bucket)
        rep = self.cli(self.moto, "run", self.pipeline, "--output-prefix", f"s3://{self.run_bucket}/out/")
        return rep["t_end"] - rep["t_start"]

    def compare_with_run(self, run_id: str) -> int:
        """Every output of the kernel's equals the real run's but for the per-run provenance fields; returns
        the count compared."""
        from tasks.demo import relpaths

        ours, theirs = moto_backend(self.bucket), moto_backend(self.run_bucket)
        ids = set()
        for rel in relpaths(self.n):
            a = ours.get_object(self.bucket, f"out/{rel}").value
            b = theirs.get_object(self.run_bucket, f"out/{rel}").value
            problem, a_run = output_difference(a, b)
            assert not problem, f"W10 @ {self.n:,}: {rel}: the kernel's output differs from sidecar-ops run's: " \
                                f"{problem}"
            ids.add(a_run)
        assert ids == {run_id}, f"W10 @ {self.n:,}: the kernel's outputs record run ids {ids}"
        return self.n

    def verify(self, mode: str) -> dict:
        report_path = self.root / f"verify-{mode}.json"
        self.log.clear()
        cpu0, child0 = time.process_time(), children_cpu()
        rep = self.cli(self.proxy, "verify", self.pipeline, "--output-prefix", self.out, "--samples", str(SAMPLES),
                       *MODES[mode][1], "--json", str(report_path))
        cpu, child = time.process_time() - cpu0, children_cpu() - child0
        entries = self.log.snapshot()
        scope = self.checked(json.loads(report_path.read_text()), mode)
        say(f"@ {self.n:,}: {MODES[mode][0]} in {rep['t_end'] - rep['t_start']:.1f} s")
        return {"wall": rep["t_end"] - rep["t_start"], "rss": rep["maxrss_mb"], "requests": per_shard(entries, self.n),
                "scope": scope, "cpu": child, "server_cpu": cpu}

    def checked(self, report: dict, mode: str) -> int:
        """Every check passed over the N shards and each score column's statistics hold every row of their scope
        (the sample, or every shard with --all); returns that scope's shard count."""
        label = f"W10 {MODES[mode][0]} @ {self.n:,}"
        failed = [c["name"] for c in report["checks"] if not c["passed"]]
        assert report["ok"] and not failed, f"{label}: checks failed: {failed}"
        assert report["shards"] == self.n, f"{label}: {report['shards']} shards in the report"
        scope = self.n if mode == "all" else min(SAMPLES, self.n)
        assert report["stats_shards"] == scope, f"{label}: statistics over {report['stats_shards']} shards"
        for column in SCORE_COLUMNS:
            stats = next(s for s in report["statistics"] if s["column"] == column)
            assert (stats["shards"], stats["rows"]) == (scope, scope * ROWS), f"{label}: {column} {stats}"
        return scope


def relpaths_tail(n: int) -> str:
    """A relpath a few shards before the last in listing order (a start-after for the last page)."""
    from tasks.demo import relpaths

    return sorted(relpaths(n))[max(n - 5, 0)]


def list_page(call, backend, *args) -> tuple[list[str], bool, str | None]:
    keys, truncated, token = call(backend, *args)
    return [key.name for key in keys], truncated, token


def moto_backend(bucket: str):
    """moto's in-process S3 backend holding `bucket` (the one its server answers for that bucket from)."""
    from moto.s3.models import s3_backends

    partition, account = s3_backends.bucket_accounts[bucket]
    return s3_backends[account][partition]


def served(s3, bucket: str, key: str) -> dict:
    """What the server answers for an object: HEAD's ETag and size, GET's CRC32 (checksum mode) and bytes."""
    head = s3.head_object(Bucket=bucket, Key=key)
    got = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    return {"etag": head["ETag"], "size": head["ContentLength"], "crc32": got.get("ChecksumCRC32"),
            "body": got["Body"].read()}


def now_utc() -> str:
    from tasks.kernel import now_utc as kernel_now

    return kernel_now()


def output_difference(ours: bytes, theirs: bytes) -> tuple[str, str | None]:
    """(what differs between two outputs of one shard, "" if nothing but the per-run provenance fields; the run
    id `ours` records)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.kernel import PER_RUN_FIELDS, PROVENANCE_KEY

    a, b = (pq.ParquetFile(pa.BufferReader(body)) for body in (ours, theirs))
    meta_a, meta_b = dict(a.metadata.metadata or {}), dict(b.metadata.metadata or {})
    prov_a, prov_b = (json.loads(m.pop(PROVENANCE_KEY)) for m in (meta_a, meta_b))
    run_id = prov_a.get("run_id")
    for prov in (prov_a, prov_b):
        for name in PER_RUN_FIELDS:
            prov.pop(name)
    meta_a.pop(b"ARROW:schema", None), meta_b.pop(b"ARROW:schema", None)  # holds the provenance too
    if prov_a != prov_b:
        return f"provenance {prov_a} vs {prov_b}", run_id
    if meta_a != meta_b:
        return f"footer metadata {meta_a} vs {meta_b}", run_id
    if len(ours) != len(theirs):
        return f"{len(ours)} bytes vs {len(theirs)}", run_id
    if not a.schema_arrow.remove_metadata().equals(b.schema_arrow.remove_metadata()):
        return f"schema {a.schema_arrow} vs {b.schema_arrow}", run_id
    if a.metadata.num_row_groups != b.metadata.num_row_groups:
        return f"{a.metadata.num_row_groups} row groups vs {b.metadata.num_row_groups}", run_id
    for g in range(a.metadata.num_row_groups):
        ga, gb = a.metadata.row_group(g), b.metadata.row_group(g)
        if ga.num_rows != gb.num_rows:
            return f"row group {g}: {ga.num_rows} rows vs {gb.num_rows}", run_id
        for c in range(ga.num_columns):
            ca, cb = ga.column(c).to_dict(), gb.column(c).to_dict()
            for offset in ("file_offset", "data_page_offset", "dictionary_page_offset", "index_page_offset"):
                ca.pop(offset, None), cb.pop(offset, None)  # after the footer's own bytes: equal sizes say enough
            if ca != cb:
                return f"row group {g} column {c}: {ca} vs {cb}", run_id
    if not a.read().equals(b.read()):
        return "data", run_id
    return "", run_id


# ---------------------------------------------------------------- the kernel's worker processes
_JOBS: dict[tuple, object] = {}


def kernel_worker(endpoint: str) -> None:
    """A worker process talks to moto's own port (the set-up is not counted)."""
    os.environ["AWS_ENDPOINT_URL"] = endpoint


def kernel_job(pipeline: str, output: str, run_id: str = "", started: str = ""):
    """The Job a `sidecar-ops run PIPELINE --output-prefix OUTPUT` builds (flows/merge.py merge_until, the default
    fused thread-runner run: fetch-ahead on, the window budget and recompression as the config says, no
    overwrite), once per worker."""
    key = (pipeline, output, run_id, started)
    if key not in _JOBS:
        from flows.runconfig import RunConfig
        from tasks.kernel import Job

        config = RunConfig.load(pipeline, output, writes=True)
        _JOBS[key] = Job(config.pipeline, config.output_prefix, run_id=run_id, started=started, fetch_ahead=True,
                         **config.window_bytes, recompress=config.recompress or "")
    return _JOBS[key]


def plan_shards(pipeline: str, output: str) -> list[tuple[str, dict[str, str]]]:
    """The run's plan (listings of the base, the sources and the output; its refusals): (relpath, the listed
    identities its shard task reads by) for every shard to merge."""
    from tasks.plan import make_plan, refuse_foreign, refuse_unmatched

    plan = make_plan(kernel_job(pipeline, output))
    refuse_unmatched(plan)
    refuse_foreign(plan)
    return [(rel, plan.listed(rel)) for rel in plan.todo]


def merge_shards(pipeline: str, output: str, run_id: str, started: str,
                 shards: list[tuple[str, dict[str, str]]]) -> dict[str, int]:
    """Each shard as its fused task's first attempt merges it (tasks/prefect_tasks.py shard_task: no cached
    output is looked for on a first attempt), THREADS at a time as the run's thread pool does (each in a copy of
    this context, as Prefect submits a task); returns shards by write path (copy, decode)."""
    from tasks import storage

    job = kernel_job(pipeline, output, run_id, started)
    paths: collections.Counter = collections.Counter()
    with storage.run_writes(), ThreadPoolExecutor(THREADS) as threads:
        for path in threads.map(lambda shard: contextvars.copy_context().run(merge_one, job, *shard), shards):
            paths[path] += 1
    return dict(paths)


def merge_one(job, relpath: str, listed: dict[str, str]) -> str:
    from tasks import kernel, storage

    with storage.listed(listed), kernel.opened_shard(job, relpath) as shard:
        return kernel.stream_output(job, relpath, shard).path


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def log_progress(data: Path, n: int, result: dict) -> None:
    """One JSON line per count (w10-progress.jsonl): a long run keeps what it measured if stopped."""
    line = {"shards": n, "loadavg": os.getloadavg(), "time": time.time(), **result}
    with open(data / "w10-progress.jsonl", "a") as f:
        f.write(json.dumps(line, default=str) + "\n")
    print(f"[bench] W10 @ {n:,}: " + ", ".join(f"{m} {result[m]['wall']:.1f} s" for m in MODES), file=sys.stderr,
          flush=True)


def log_stage(data: Path, n: int, stage: str, result: dict) -> None:
    """A JSON line as each stage of a count ends (w10-progress.jsonl, "stage": set-up, sample or all): a run
    stopped within a count keeps what it measured of it. The count's whole line follows when it is done."""
    line = {"shards": n, "stage": stage, "loadavg": os.getloadavg(), "time": time.time(), **result}
    with open(data / "w10-progress.jsonl", "a") as f:
        f.write(json.dumps(line, default=str) + "\n")


def fit(points: dict[int, float], x: int) -> float:
    """The least-squares line through (count, value), at count x."""
    slope, intercept = statistics.linear_regression(list(points), list(points.values()))
    return intercept + slope * x


def rows(results: dict[int, dict], latency: float) -> list[Row]:
    counts = sorted(results)
    lo, hi = counts[0], counts[-1]
    out = []
    for n in counts:
        r = results[n]
        out.append(Row("W10", f"set-up @ {n:,}: put the inputs", r["put"],
                       note=f"{r['objects']:,} objects through moto's backend in this process; each sidecar's "
                            "first read back through the server as a boto3 PUT of its bytes answers"))
        paths = ", ".join(f"{path} {count:,}" for path, count in sorted(r["outputs"]["paths"].items()))
        out.append(Row("W10", f"set-up @ {n:,}: the outputs, the run's plan and kernel in {PROCESSES} processes",
                       r["outputs"]["seconds"], note=f"moto without the proxy, {THREADS} shards in flight in each; "
                                                     f"shards by write path: {paths}"))
        if "run" in r:
            out.append(Row("W10", f"set-up @ {n:,}: sidecar-ops run (the outputs)", r["run"],
                           note=f"into another bucket, moto without the proxy; start -> exit; its {r['compared']:,} "
                                "outputs equal the kernel's but for run_id, run_started, written_at (the kernel's "
                                "are verified)"))
    for mode, (label, _) in MODES.items():
        for n in counts:
            out += mode_rows(label, n, results[n][mode], lo if n == hi and hi != lo else None, latency)
        if hi < TARGET and len(counts) > 1:
            out += extrapolated(label, {n: results[n][mode] for n in counts})
    return out


def mode_rows(label: str, n: int, r: dict, lo: int | None, latency: float) -> list[Row]:
    name, req = f"{label} @ {n:,}", r["requests"]
    return [
        Row("W10", f"{name}: wall", r["wall"], samples=[r["wall"]],
            note=f"{n:,} shards verified, statistics over {r['scope']:,} shards ({r['scope'] * ROWS:,} rows); "
                 f"{latency:g} ms a request; start -> exit"),
        Row("W10", f"{name}: ms a shard", r["wall"] / n * 1000, unit="ms",
            ref=f"{label} @ {lo:,}: ms a shard" if lo else None, note=f"vs {lo:,} shards" if lo else ""),
        Row("W10", f"{name}: requests a shard", req["per_shard"], unit="req",
            note=f"{kinds_note(req)}; in all: " + ", ".join(f"{k} {v:,}" for k, v in req["kinds"].items())
                 + f" ({req['total']:,})"),
        Row("W10", f"{name}: driver peak RSS", r["rss"], unit="MiB",
            ref=f"{label} @ {lo:,}: driver peak RSS" if lo else None, note=f"vs {lo:,} shards" if lo else ""),
        Row("W10", f"{name}: verify CPU a shard", r["cpu"] / n * 1000, unit="ms",
            note=f"the verify process; moto + proxy (the bench process): {r['server_cpu'] / n * 1000:.1f} ms a shard"),
    ]


def extrapolated(label: str, by_count: dict[int, dict]) -> list[Row]:
    """10^5 by a linear fit over the counts measured (not a measurement)."""
    how = f"NOT measured: linear fit over {', '.join(f'{n:,}' for n in by_count)} shards"
    wall = fit({n: r["wall"] for n, r in by_count.items()}, TARGET)
    requests = fit({n: r["requests"]["total"] for n, r in by_count.items()}, TARGET)
    rss = fit({n: r["rss"] for n, r in by_count.items()}, TARGET)
    name = f"{label} @ {TARGET:,} (extrapolated)"
    return [Row("W10", f"{name}: wall", wall, note=how),
            Row("W10", f"{name}: ms a shard", wall / TARGET * 1000, unit="ms", note=how),
            Row("W10", f"{name}: requests a shard", requests / TARGET, unit="req", note=how),
            Row("W10", f"{name}: driver peak RSS", rss, unit="MiB", note=how)]
