"""RESULTS.md's current table from bench/run.py's results.json files: each workload's latest goal figures.

    python bench/current.py RESULTS.json [RESULTS.json ...] [--all]

Later files win, per workload: pass the runs oldest first (e.g. a full run, then a `--only W9` run after it)
and each workload's rows come from the last file that has it. A row is shown when it has a goal (`--all`:
every row); its figure is the ratio when it has one, else the value. Each workload names the run it comes
from: date, size and the load average at its start and end (the machine is shared; read wall-time verdicts
with it). Paste the output at the top of bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import fmt_value  # bench/run.py, beside this file


def latest(results: list[dict]) -> dict[str, tuple[dict, list[dict]]]:
    """workload -> (the run it was last measured in, its rows there)."""
    by_workload: dict[str, tuple[dict, list[dict]]] = {}
    for result in results:
        for workload in dict.fromkeys([*(r["workload"] for r in result["rows"]), *result.get("errors", {})]):
            by_workload[workload] = (result, [r for r in result["rows"] if r["workload"] == workload])
    return dict(sorted(by_workload.items()))


def run_note(result: dict) -> str:
    m = result["machine"]
    return (f"{result['date'][:16].replace('T', ' ')}, {result['size']}, "
            f"load {m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}")


def figure(row: dict) -> str:
    if row.get("ratio") is not None:
        return f"{row['ratio']:.2f}x ({fmt_value(row)})"
    return fmt_value(row)


def verdict(row: dict) -> str:
    return {True: "met", False: "NOT met", None: ""}[row.get("met")]


def current_table(results: list[dict], every_row: bool = False) -> str:
    lines = ["| workload | measure | latest figure | goal | verdict | when, load |",
             "|---|---|---|---|---|---|"]
    for workload, (result, rows) in latest(results).items():
        shown = [r for r in rows if every_row or r.get("goal")]
        for row in shown:
            cells = [workload, row["name"], figure(row), row.get("goal") or "", verdict(row), run_note(result)]
            lines.append("| " + " | ".join(cells) + " |")
        if workload in result.get("errors", {}):
            error = result["errors"][workload]
            lines.append(f"| {workload} | FAILED: {error} | | | | {run_note(result)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="results.json files, oldest first")
    p.add_argument("--all", action="store_true", help="every row, not only those with a goal")
    args = p.parse_args(argv)
    print(current_table([json.loads(Path(f).read_text()) for f in args.results], args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
