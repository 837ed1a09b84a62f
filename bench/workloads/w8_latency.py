"""W8 latency-true S3: moto (server mode, loopback) behind the counting proxy, which adds a first-byte latency
to every answer (default 15 ms, `w8_latency_ms`), so that a round trip costs about what it costs on S3.

Contenders, each a fresh process, in the same run (rounds alternated; walls are start -> exit, medians):
(a) a minimal pyarrow script (bench/workloads/s3_script.py, pyarrow's own S3 filesystem): each input opened
    once, each output written once (base + each sibling: the same merge result), shard after shard
(b) the same script, 8 shards at once (threads)
(c) `sidecar-ops run` with its defaults (its own run-scoped Prefect server, warm PREFECT_HOME; one task a shard)
(d) a second `sidecar-ops run` on (c)'s finished output: a resume
(e) a one-shard `sidecar-ops run` (a dataset of one shard of the same size): the start-up
(f) (c) with `--task-per-operation`: a task run per operation, the chain (Ray runs each step where it likes)
(g) `sidecar-ops verify --samples N --all` on (c)'s output (N = every shard: every shard's deep checks)
(h) a one-shard `sidecar-ops verify --samples 1 --all` on (e)'s output: verify's start-up
(i) the guide's validation as a minimal script, 8 shards at once (s3_script.py with "verify"): list the four
    prefixes; read the base, each source and the output once each; compare keys, base columns, merged columns
Requests are counted by the proxy by kind (LIST, HEAD, GET, PUT, multipart steps) with the bytes GETs return.
Ratios: requests (c)/(a); wall ((c) - (e)) / (b); the I/O phase (first GET to last PUT at the proxy: the shards'
own time, without a process's start-up and end) (c) / (b); resume requests per shard beyond the listings;
verify's requests (g) / (i) and wall ((g) - (h)) / (i).
(d) and (e) also record which code made each request (bench/workloads/s3trace.py): that table goes to
DATA/w8-requests.md. Outputs are checked (row counts; (a)'s and (c)'s first shard hold the same table).
"""
from __future__ import annotations

import collections
import io
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.workloads.common import REPO, Row, bench_env, median, probe
from bench.workloads.counting import W8_KINDS, bench_s3
from bench.workloads.data import SIDECARS, Case, make_case, write_yamls
from bench.workloads.w0_fixed import cli_home, is_warm

BUCKET = "bench"
SCRIPT = REPO / "bench" / "workloads" / "s3_script.py"
SOURCES = (("dqm", "image_key", "dqm_d1_v6_1"), ("aes", "s3_image_path", "ernie_image_aes"))  # as in bench.yaml
NAMES = {"a": "(a) script, sequential", "b": "(b) script, 8 shards at once", "c": "(c) sidecar-ops run",
         "d": "(d) resume: sidecar-ops run on the finished output", "e": "(e) one-shard sidecar-ops run",
         "f": "(f) sidecar-ops run --task-per-operation", "g": "(g) sidecar-ops verify --all",
         "h": "(h) one-shard sidecar-ops verify", "i": "(i) verify script, 8 shards at once"}


def run(data: Path, size: dict) -> list[Row]:
    case = make_case(data / "w8", size["w8_shards"], size["w8_rows"])
    one = make_case(data / "w8-one", 1, size["w8_rows"])
    latency = float(size.get("w8_latency_ms", 15))
    with bench_s3(latency_ms=latency) as (url, log):
        return W8(data, size, case, one, url, log, latency).measure()


def io_phase(entries: list[dict]) -> float:
    """Seconds from the first GET to the last PUT arriving at the proxy: the shards' own phase, without a
    process's start-up or end (the same definition for the script and the run)."""
    gets = [e["t"] for e in entries if e["kind"] == "GET"]
    puts = [e["t"] for e in entries if e["kind"] == "PUT"]
    return max(puts) - min(gets)


def per_shard(entries: list[dict], n: int) -> dict:
    """Requests per shard by kind, GET bytes per shard, and the totals."""
    kinds = collections.Counter(e["kind"] for e in entries)
    got = sum(e["bytes"] for e in entries if e["kind"] == "GET")
    return {"n": n, "total": len(entries), "kinds": dict(kinds), "per_shard": len(entries) / n,
            "beyond_listings": (len(entries) - kinds.get("LIST", 0)) / n, "get_bytes": got / n}


def kinds_note(counts: dict) -> str:
    n = counts["n"]
    return ", ".join(f"{k} {counts['kinds'][k] / n:.2f}".rstrip("0").rstrip(".")
                     for k in W8_KINDS if counts["kinds"].get(k)) or "none"


class W8:
    def __init__(self, data: Path, size: dict, case: Case, one: Case, url: str, log, latency: float):
        self.data, self.size, self.case, self.one, self.url, self.log = data, size, case, one, url, log
        self.latency, self.n = latency, len(case.relpaths)
        self.home = cli_home(data)
        self.tmp = Path(tempfile.mkdtemp(prefix="w8-", dir=data))
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=url)

    # ------------------------------------------------------------------ setup
    def upload(self) -> None:
        self.s3.create_bucket(Bucket=BUCKET)
        jobs = [(c.path(sidecar, rel), f"{name}/{sidecar}/{rel}") for c, name in ((self.case, "w8"), (self.one, "w8-one"))
                for sidecar in SIDECARS for rel in c.relpaths]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda job: self.s3.upload_file(job[0], BUCKET, job[1]), jobs))
        for name in ("w8", "w8-one"):
            write_yamls(self.tmp / name, source_root=f"s3://{BUCKET}/{name}")

    def pipeline(self, name: str) -> str:
        return str(self.tmp / name / "pipelines" / "bench.yaml")

    # ------------------------------------------------------------------ contenders
    def counted(self, fn, *args) -> tuple[float, dict, object]:
        self.log.clear()
        wall, extra = fn(*args)
        entries = self.log.snapshot()
        return wall, entries, extra

    def script(self, out: str, threads: int, verify: bool = False) -> tuple[float, dict]:
        spec = {"bucket": BUCKET, "base": "w8/base/", "output": out, "threads": threads, "verify": verify,
                "sources": [[f"w8/{s}/", key, col] for s, key, col in SOURCES], "relpaths": list(self.case.relpaths)}
        spec_path, report_path = self.tmp / "spec.json", self.tmp / "script-report.json"
        spec_path.write_text(json.dumps(spec))
        t0 = time.time()
        proc = subprocess.run([sys.executable, str(SCRIPT), str(spec_path), str(report_path)], env=bench_env(),
                              cwd=REPO, capture_output=True, text=True, timeout=3600)
        wall = time.time() - t0
        what = "verify" if verify else "merge"
        assert proc.returncode == 0, f"s3_script.py ({what}, {threads} threads) failed:\n{proc.stderr[-3000:]}"
        report = json.loads(report_path.read_text())
        return wall, report

    def cli(self, pipeline: str, out: str, trace: Path | None = None, *flags: str, command: str = "run"
            ) -> tuple[float, dict]:
        env = {"PREFECT_HOME": str(self.home)}
        if trace is not None:
            env["SIDECAR_BENCH_S3_TRACE"] = str(trace)
        self.home.mkdir(parents=True, exist_ok=True)
        rep = probe("cli", "--", command, pipeline, "--output-prefix", out, *flags, env=env)
        assert rep["exit_code"] == 0, f"sidecar-ops {command}: exit {rep['exit_code']}\n{rep['stderr_tail']}"
        return rep["t_end"] - rep["t_start"], rep

    def verify(self, pipeline: str, out: str, samples: int) -> tuple[float, dict]:
        return self.cli(pipeline, out, None, "--samples", str(samples), "--all", command="verify")

    # ------------------------------------------------------------------ the run
    def measure(self) -> list[Row]:
        self.upload()
        big, small = self.pipeline("w8"), self.pipeline("w8-one")
        if not is_warm(self.home):  # a cold home migrates a new database: not the start-up a user sees daily
            self.cli(small, f"s3://{BUCKET}/w8-out/warm-up/")
        walls: dict[str, list[float]] = {k: [] for k in NAMES}
        phases: dict[str, list[float]] = {"b": [], "c": [], "f": []}
        counts: dict[str, dict] = {}
        traces = {"d": self.tmp / "trace-resume.jsonl", "e": self.tmp / "trace-one.jsonl"}
        entries_of: dict[str, list[dict]] = {}
        for rep in range(self.size["repeats"]):
            runs = {"a": (self.script, f"w8-out/script1-{rep}/", 1),
                    "b": (self.script, f"w8-out/script8-{rep}/", 8),
                    "c": (self.cli, big, f"s3://{BUCKET}/w8-out/cli-{rep}/"),
                    "d": (self.cli, big, f"s3://{BUCKET}/w8-out/cli-{rep}/", traces["d"]),
                    "e": (self.cli, small, f"s3://{BUCKET}/w8-out/one-{rep}/", traces["e"]),
                    "f": (self.cli, big, f"s3://{BUCKET}/w8-out/chain-{rep}/", None, "--task-per-operation"),
                    "g": (self.verify, big, f"s3://{BUCKET}/w8-out/cli-{rep}/", self.n),
                    "h": (self.verify, small, f"s3://{BUCKET}/w8-out/one-{rep}/", 1),
                    "i": (self.script, f"w8-out/cli-{rep}/", 8, True)}
            for name, (fn, *args) in runs.items():
                wall, entries, _ = self.counted(fn, *args)
                walls[name].append(wall)
                if name in phases:
                    phases[name].append(io_phase(entries))
                counts[name] = per_shard(entries, 1 if name in "eh" else self.n)  # the last round's counts
                entries_of[name] = entries
        last = self.size["repeats"] - 1
        self.check(f"w8-out/script1-{last}/", f"w8-out/cli-{last}/")
        self.check(f"w8-out/script1-{last}/", f"w8-out/chain-{last}/")
        self.write_requests(counts, entries_of, traces)
        return self.rows(walls, counts, phases)

    def check(self, script_out: str, cli_out: str) -> None:
        """Every output shard is there with its rows; (a)'s first shard holds the same table as (c)'s."""
        import pyarrow.parquet as pq

        def table(key: str):
            body = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            return pq.read_table(io.BytesIO(body))

        for prefix in (script_out, cli_out):
            for rel, rows in zip(self.case.relpaths, self.case.rows):
                head = self.s3.get_object(Bucket=BUCKET, Key=prefix + rel)["Body"].read()
                got = pq.ParquetFile(io.BytesIO(head)).metadata.num_rows
                assert got == rows, f"W8: {prefix}{rel} has {got} rows, expected {rows}"
        rel = self.case.relpaths[0]
        a, c = table(script_out + rel), table(cli_out + rel)
        a, c = a.replace_schema_metadata(None), c.replace_schema_metadata(None)
        assert a.equals(c), f"W8: the script's and sidecar-ops' outputs of {rel} differ:\n{a.schema}\n{c.schema}"

    # ------------------------------------------------------------------ results
    def rows(self, walls: dict, counts: dict, phases: dict) -> list[Row]:
        m = {k: median(v) for k, v in walls.items()}
        desc = (f"{self.n} shards x {self.case.rows[0]:,} rows, {self.latency:g} ms per request; start -> exit, "
                f"median of {self.size['repeats']}")
        steady = [c - e for c, e in zip(walls["c"], walls["e"])]
        verify_steady = [g - h for g, h in zip(walls["g"], walls["h"])]
        req = lambda k: counts[k]["per_shard"]  # noqa: E731
        rows = [
            Row("W8", f"{NAMES['a']}: wall", m["a"], samples=walls["a"], note=desc),
            Row("W8", f"{NAMES['b']}: wall", m["b"], samples=walls["b"], ref=f"{NAMES['a']}: wall"),
            Row("W8", f"{NAMES['c']}: wall", m["c"], samples=walls["c"], ref=f"{NAMES['b']}: wall",
                note="thread runner, defaults, its own Prefect server, warm PREFECT_HOME"),
            Row("W8", f"{NAMES['d']}: wall", m["d"], samples=walls["d"], ref=f"{NAMES['c']}: wall"),
            Row("W8", f"{NAMES['e']}: wall (start-up)", m["e"], samples=walls["e"],
                note=f"1 shard x {self.one.rows[0]:,} rows"),
            Row("W8", "(c) - (e): wall minus start-up", median(steady), samples=steady, ref=f"{NAMES['b']}: wall",
                goal="<= 1.0", note="per round, then the median"),
            Row("W8", f"{NAMES['b']}: I/O phase", median(phases["b"]), samples=phases["b"],
                note="first GET -> last PUT at the proxy, median"),
            Row("W8", f"{NAMES['c']}: I/O phase", median(phases["c"]), samples=phases["c"],
                ref=f"{NAMES['b']}: I/O phase", goal="<= 1.0",
                note="the steady state without a process's start-up and end, measured alike for both"),
            Row("W8", f"{NAMES['f']}: wall", m["f"], samples=walls["f"], ref=f"{NAMES['b']}: wall",
                note="a task run per operation instead of one a shard"),
            Row("W8", f"{NAMES['f']}: I/O phase", median(phases["f"]), samples=phases["f"],
                ref=f"{NAMES['b']}: I/O phase", note=f"{counts['f']['per_shard']:.2f} requests per shard"),
        ]
        for k in "abcd":
            rows.append(Row("W8", f"{NAMES[k]}: requests per shard", req(k), unit="req",
                            ref=f"{NAMES['a']}: requests per shard" if k == "c" else None,
                            goal="<= 0.8" if k == "c" else None,
                            note=f"{kinds_note(counts[k])}; {counts[k]['total']} in all"))
        rows.append(Row("W8", f"{NAMES['e']}: requests", counts["e"]["total"], unit="req", note=kinds_note(counts["e"])))
        rows += self.verify_rows(m, walls, verify_steady, counts)
        beyond = counts["d"]["beyond_listings"]
        rows.append(Row("W8", "(d) resume: requests per shard beyond the listings", beyond, unit="req",
                        goal="<= 1 req", met=beyond <= 1.0,
                        note=f"{counts['d']['kinds'].get('LIST', 0)} LIST requests in the run"))
        for k in "acd":
            rows.append(Row("W8", f"{NAMES[k]}: GET bytes per shard", counts[k]["get_bytes"] / 2**20, unit="MiB",
                            ref=f"{NAMES['a']}: GET bytes per shard" if k == "c" else None,
                            note=f"inputs: {self.input_bytes() / 2**20:.2f} MiB per shard" if k == "a" else ""))
        return rows

    def verify_rows(self, m: dict, walls: dict, steady: list[float], counts: dict) -> list[Row]:
        """(g) verify against (i) the 8-thread validation script: requests a shard and wall minus start-up."""
        script_wall, script_req = f"{NAMES['i']}: wall", f"{NAMES['i']}: requests per shard"
        return [
            Row("W8", script_wall, m["i"], samples=walls["i"], note="the guide's validation, whole tables"),
            Row("W8", f"{NAMES['g']}: wall", m["g"], samples=walls["g"], ref=script_wall,
                note=f"--samples {self.n} --all: every shard's deep checks"),
            Row("W8", f"{NAMES['h']}: wall (start-up)", m["h"], samples=walls["h"],
                note=f"1 shard x {self.one.rows[0]:,} rows, --samples 1 --all"),
            Row("W8", "(g) - (h): verify wall minus start-up", median(steady), samples=steady, ref=script_wall,
                goal="<= 1.0", note="per round, then the median"),
            Row("W8", script_req, counts["i"]["per_shard"], unit="req",
                note=f"{kinds_note(counts['i'])}; {counts['i']['total']} in all"),
            Row("W8", f"{NAMES['g']}: requests per shard", counts["g"]["per_shard"], unit="req", ref=script_req,
                goal="<= 1.0", note=f"{kinds_note(counts['g'])}; {counts['g']['total']} in all"),
            Row("W8", f"{NAMES['h']}: requests", counts["h"]["total"], unit="req", note=kinds_note(counts["h"])),
        ]

    def input_bytes(self) -> float:
        return sum(self.case.bytes_on_disk(s) for s in SIDECARS) / self.n

    def write_requests(self, counts: dict, entries_of: dict, traces: dict) -> None:
        """DATA/w8-requests.md: requests per shard by kind and by object, and which code made them."""
        lines = [f"# W8 requests ({self.n} shards x {self.case.rows[0]:,} rows, {self.latency:g} ms per request)", "",
                 "## Per shard, by kind", "", "| contender | " + " | ".join(W8_KINDS) + " | all | GET bytes |",
                 "|" + "---|" * (len(W8_KINDS) + 3)]
        for k, c in counts.items():
            n = c["n"]
            lines.append(f"| {NAMES[k]} | " + " | ".join(f"{c['kinds'].get(kind, 0) / n:.2f}" for kind in W8_KINDS)
                         + f" | {c['per_shard']:.2f} | {c['get_bytes']:,.0f} |")
        lines += ["", "## Per shard, by object and kind (proxy log)", ""]
        for k, entries in entries_of.items():
            n = counts[k]["n"]
            by = collections.Counter((role(e["path"].split("/", 2)[-1]), e["kind"]) for e in entries)
            lines.append(f"- {NAMES[k]}: " + ", ".join(f"{r} {kind} {v / n:.2f}" for (r, kind), v in sorted(by.items())))
        for k, path in traces.items():
            lines += ["", f"## Which code: {NAMES[k]} (s3trace, {counts[k]['n']} shard(s))", "",
                      "| requests | S3 operation | object | range | code (outermost -> innermost), entry into s3fs |",
                      "|---|---|---|---|---|"]
            for (op, obj, rng, code), v in trace_groups(path, exact=counts[k]["n"] == 1).items():
                lines.append(f"| {v} | {op} | {obj} | {rng} | {code} |")
        out = self.data / "w8-requests.md"
        out.write_text("\n".join(lines) + "\n")
        print(f"[bench] W8 request analysis: {out}", file=sys.stderr, flush=True)


def role(key: str) -> str:
    """What an object key is: base / dqm / aes input, output, or a prefix (listings)."""
    parts = key.split("/")
    if parts and parts[0] in ("w8", "w8-one") and len(parts) > 1 and parts[1] in SIDECARS:
        return parts[1] + ("" if len(parts) > 2 and parts[2] else " prefix")
    if parts and parts[0] == "w8-out":
        return "output" if len(parts) > 2 and parts[-1].endswith(".parquet") else "output prefix"
    return "bucket" if not key else key


def trace_groups(path: Path, exact: bool = False) -> collections.Counter:
    """(S3 operation, object, range, code) -> requests, in order of first appearance; `exact` keeps each range."""
    groups: collections.Counter = collections.Counter()
    if not path.exists():
        return groups
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        rng = rec["range"] if exact else ("ranged" if rec["range"] else "")
        code = " -> ".join(rec["repo"][-3:])
        groups[(rec["op"], role(rec["key"]), rng, f"{code}; {rec['entry']}")] += 1
    return groups
