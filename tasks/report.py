"""Rendering a verify report: the human table (stdout), JSON (--json), and the Prefect artifact bodies.

Everything here works on `Report.to_dict()` (the documented JSON, docs/verify-report.schema.json), so a
report read back from a file renders the same way.
"""
from __future__ import annotations

import json

from tasks import storage
from tasks.verification.registry import definition

SHOW_FAILURES = 10
BAR = 20


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def _scope(check: dict) -> str:
    known = definition(check["name"])
    unit = known.unit if known else "sampled" if check["stage"] == "data" else "shards"
    return f"{check['checked']:,} {unit}"


def _detail(check: dict) -> str:
    if check["passed"]:
        return check["note"]
    return f"{check['failed']:,} failing" + (f"; {check['note']}" if check["note"] else "")


def table_lines(report: dict) -> list[str]:
    """One line per check with PASS/FAIL, failing shards underneath (capped), then score statistics."""
    checks = report["checks"]
    width = max(len(c["name"]) for c in checks)
    out = [f"verify {report['pipeline']} -> {report['output_prefix']}",
           f"fingerprint {report['fingerprint']}, {report['shards']:,} base shards, {len(report['sampled']):,} "
           f"sampled (seed {report['seed']})", "",
           f"{'CHECK':<{width}}  {'RESULT':<6}  {'SCOPE':<14}  DETAIL"]
    for check in checks:
        out.append(f"{check['name']:<{width}}  {'PASS' if check['passed'] else 'FAIL':<6}  {_scope(check):<14}  "
                   f"{_detail(check)}")
        for failure in check["failures"][:SHOW_FAILURES]:
            out.append(f"    {failure['path']}: {failure['detail']}")
        if check["failed"] > SHOW_FAILURES:
            out.append(f"    ... and {check['failed'] - SHOW_FAILURES:,} more")
    out += ["", *stats_lines(report), ""]
    failed = [c["name"] for c in checks if not c["passed"]]
    out.append(f"verify: FAIL ({len(failed)} of {len(checks)} checks failed: {', '.join(failed)})" if failed
               else f"verify: PASS (all {len(checks)} checks)")
    return out


def stats_lines(report: dict) -> list[str]:
    stats = report["statistics"]
    if not stats:
        return ["score statistics: no declared struct score columns"]
    scope = "all shards" if report["stats_scope"] == "all" else "sampled shards"
    out = [f"score statistics over {report['stats_shards']:,} {scope}:"]
    width = max(len(s["column"]) for s in stats)
    out.append(f"  {'COLUMN':<{width}}  {'ROWS':>9}  {'ERRORS':>7}  {'NULL RAW':>8}  FIELD: MIN / MEAN / MAX")
    for s in stats:
        fields = "  ".join(f"{name}: {_num(f['min'])} / {_num(f['mean'])} / {_num(f['max'])}"
                           for name, f in s["fields"].items())
        out.append(f"  {s['column']:<{width}}  {s['rows']:>9,}  {_num(s['errors']):>7}  "
                   f"{_num(s['null_raw_score']):>8}  {fields}")
    return out


def artifact_rows(report: dict) -> list[dict]:
    """The table artifact: one row per check."""
    rows = []
    for check in report["checks"]:
        shown = [f"{f['path']}: {f['detail']}" for f in check["failures"][:SHOW_FAILURES]]
        if check["failed"] > SHOW_FAILURES:
            shown.append(f"... and {check['failed'] - SHOW_FAILURES:,} more")
        rows.append({"check": check["name"], "result": "PASS" if check["passed"] else "FAIL",
                     "scope": _scope(check), "detail": _detail(check), "failing": "; ".join(shown)})
    return rows


def _bar(count: int, top: int) -> str:
    return "#" * (round(BAR * count / top) if top else 0)


def stats_markdown(report: dict) -> str:
    """The markdown artifact: verdict, statistics table and one histogram per score field."""
    failed = [c["name"] for c in report["checks"] if not c["passed"]]
    verdict = f"**FAIL**: {', '.join(failed)}" if failed else "**PASS**: every check"
    scope = "all shards" if report["stats_scope"] == "all" else "sampled shards"
    out = [f"# verify {report['output_prefix']}", "", f"{verdict} (fingerprint `{report['fingerprint']}`)", "",
           f"## Score statistics over {report['stats_shards']:,} {scope}", "",
           "| column | type | rows | errors | null raw_score | field | count | min | mean | max |",
           "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for s in report["statistics"]:
        for name, f in s["fields"].items() or [("-", None)]:
            nums = [f["count"], f["min"], f["mean"], f["max"]] if f else [None] * 4
            out.append(f"| {s['column']} | {s['type']} | {s['rows']:,} | {_num(s['errors'])} | "
                       f"{_num(s['null_raw_score'])} | {name} | " + " | ".join(_num(n) for n in nums) + " |")
    for s in report["statistics"]:
        for name, f in s["fields"].items():
            hist = f["histogram"]
            if not hist:
                continue
            top = max(hist["counts"])
            out += ["", f"### {s['column']}.{name}", "", "```"]
            for i, count in enumerate(hist["counts"]):
                lo, hi = hist["edges"][i], hist["edges"][i + 1]
                close = "]" if i == len(hist["counts"]) - 1 else ")"
                out.append(f"[{lo:>10.4g}, {hi:>10.4g}{close} {count:>9,} {_bar(count, top)}")
            out.append("```")
    return "\n".join(out) + "\n"


def write_json(report: dict, path: str) -> None:
    """Write the JSON report to a local path or a URI (s3://, or another backend that writes atomically)."""
    storage.write_text(path, json.dumps(report, indent=2, sort_keys=True) + "\n")
