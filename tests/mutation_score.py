"""The mutation score per guarantee module, from mutmut's results: `make mutate` runs mutmut, then this.

mutmut (configured in pyproject.toml, [tool.mutmut]) mutates the modules that hold a guarantee and runs, for each
mutant, the fast-tier tests that reach the mutated function; its results live in mutants/**/*.meta (resumable:
`mutmut run` again continues, and re-tests only functions whose code changed). This script reads them with the
triage files (tests/mutation_survivors/) and prints, per module: mutants generated, killed, survived and triaged
as equivalent, survived untriaged, and the score (killed / generated: an equivalent is not a kill).

Triage files (tests/mutation_survivors/<module>.txt), one surviving mutant a line, either
`<mutant name>  equivalent  <why, one line>` or `<mutant name>  killed-by  <test node id>`; `mutmut show <mutant
name>` prints the change. A survivor that is not equivalent gets a test that kills it instead. mutmut runs only
the mutation tier (tests/mutation_tier.py: the fast tests); a mutant only a slower test kills (a subprocess, a
signal, a flow run) is recorded `killed-by` that test, counted as killed, and proven by `--confirm-kills`, which
runs each such test against its mutant (mutmut's trampoline in mutants/, a fresh process, the whole suite's
plugins) and fails unless the test fails. A line naming a mutant that no longer survives (killed now,
or gone after a code change) is stale: reported, and an error with --check. Not collected by pytest (no `test_` prefix).

    python tests/mutation_score.py                # the table, the untriaged survivors, stale triage lines
    python tests/mutation_score.py --write-doc    # also the table into docs/guarantees.md
    python tests/mutation_score.py --check        # exit 1 unless every module >= GOAL and nothing untriaged
    python tests/mutation_score.py --retest-survivors   # after adding tests: the next `make mutate` re-tests
                                                        # every survivor (mutmut keeps a verdict otherwise)
    python tests/mutation_score.py --confirm-kills      # run every `killed-by` line's test against its mutant
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

from mutants import write_doc

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
TRIAGE = ROOT / "tests" / "mutation_survivors"  # one file a module: tasks.ops.alignment.txt, ...
BEGIN, END = "<!-- mutation-score:begin -->", "<!-- mutation-score:end -->"
GOAL = 0.85
# mutmut's exit codes (mutmut/stats.py): 1 and 3 are kills (a test failed; pytest's internal error); 0 survived;
# 33/5 no test reached the mutant; None not yet run. Anything else is a timeout or a crash of the worker: not a
# kill (a survivor runs every test that reaches it and can outlast mutmut's limit on a loaded machine; a test
# that sees a real hang fails by pytest-timeout, which is exit 1), so it is triaged like a survivor.
KILLED = {1, 3}
SURVIVED, NO_TESTS, NOT_RUN = {0}, {33, 5}, {None}


def modules() -> list[str]:
    """The modules mutmut mutates (pyproject.toml's only_mutate), in a stable order."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    found = sorted({str(p.relative_to(ROOT)) for pattern in config["only_mutate"] for p in ROOT.glob(pattern)})
    return [m for m in found if not m.endswith("__init__.py") or (ROOT / m).stat().st_size > 0]


def results(mutants: Path = MUTANTS) -> dict[str, dict[str, int | None]]:
    """module path -> {mutant name: exit code} from mutmut's meta files."""
    out = {}
    for meta in mutants.rglob("*.py.meta"):
        module = str(meta.relative_to(mutants))[: -len(".meta")]
        out[module] = json.loads(meta.read_text())["exit_code_by_key"]
    return out


def retest_survivors(mutants: Path) -> int:
    """Forget the verdict of every mutant not killed (survived, timed out, reached by no test): the next
    `mutmut run` tests it again."""
    forgotten = 0
    for meta in mutants.rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        codes = data["exit_code_by_key"]
        for name, code in codes.items():
            if code not in KILLED | NOT_RUN:
                codes[name] = None
                forgotten += 1
        meta.write_text(json.dumps(data, indent=4))
    return forgotten


VERDICTS = ("equivalent", "killed-by")


def triage() -> dict[str, tuple[str, str]]:
    """mutant name -> (verdict, why or test node id), from every triage file."""
    return {name: entry for path in sorted(TRIAGE.glob("*.txt")) for name, entry in triage_file(path).items()}


def triage_file(path: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, verdict, *why = line.split(None, 2) + [""]
        if verdict not in VERDICTS or not why[0]:
            sys.exit(f"{os.path.relpath(path, ROOT)}:{number}: expected '<mutant>  equivalent  <why>' or "
                     f"'<mutant>  killed-by  <test node id>', got {line!r}")
        out[name] = (verdict, why[0].strip())
    return out


def confirm_kills(mutants: Path, triaged: dict[str, tuple[str, str]]) -> list[str]:
    """Run each `killed-by` test against its mutant; the names of those the test did not kill. The tests are this
    checkout's (copied over mutmut's copy, which is as old as its last run)."""
    shutil.copytree(ROOT / "tests", mutants / "tests", dirs_exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{mutants.resolve()}{os.pathsep}{(mutants / 'tests').resolve()}"}
    alive = []
    for name, (verdict, test) in triaged.items():
        if verdict != "killed-by":
            continue
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test],
                             cwd=mutants, env={**env, "MUTANT_UNDER_TEST": name}, capture_output=True, text=True,
                             check=False)
        print(f"{'killed' if run.returncode == 1 else 'NOT KILLED'}  {name}  by {test}", flush=True)
        if run.returncode != 1:
            alive.append(name)
    return alive


def score(modules_: list[str], found: dict, triaged: dict[str, tuple[str, str]]
          ) -> tuple[list[dict], list[str], list[str]]:
    rows, untriaged, seen = [], [], set()
    for module in modules_:
        codes = found.get(module, {})
        counts = Counter()
        for name, code in codes.items():
            seen.add(name)
            if code in KILLED:
                counts["killed"] += 1
            elif code in NOT_RUN:
                counts["not run"] += 1
            elif name in triaged and triaged[name][0] == "killed-by":
                counts["killed"] += 1
                counts["by slower tests"] += 1
            elif name in triaged:
                counts["equivalent"] += 1
            else:
                counts["untriaged"] += 1
                why = ("no test reaches it" if code in NO_TESTS else "survived" if code in SURVIVED
                       else f"timed out or crashed ({code})")
                untriaged.append(f"{name} ({why})")
        total = len(codes)
        rows.append({"module": module, "generated": total, **counts,
                     "score": counts["killed"] / total if total else 1.0})
    stale = [name for name in triaged if name not in seen or found_code(found, name) in KILLED]
    return rows, untriaged, stale


def found_code(found: dict, name: str):
    return next((codes[name] for codes in found.values() if name in codes), None)


def table(rows: list[dict]) -> str:
    lines = ["| module | mutants | killed | of which by slower tests | equivalent | untriaged | not run | score |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = "" if r["score"] >= GOAL and not r.get("untriaged") and not r.get("not run") else " (below goal)"
        lines.append(f"| `{r['module']}` | {r['generated']} | {r.get('killed', 0)} | {r.get('by slower tests', 0)} | "
                     f"{r.get('equivalent', 0)} | "
                     f"{r.get('untriaged', 0)} | {r.get('not run', 0)} | {r['score']:.0%}{verdict} |")
    keys = ("generated", "killed", "by slower tests", "equivalent", "untriaged", "not run")
    total = {k: sum(r.get(k, 0) for r in rows) for k in keys}
    share = total["killed"] / total["generated"] if total["generated"] else 1.0
    lines.append(f"| all | {total['generated']} | {total['killed']} | {total['by slower tests']} | "
                 f"{total['equivalent']} | {total['untriaged']} | "
                 f"{total['not run']} | {share:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-doc", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--mutants", type=Path, default=MUTANTS, help="mutmut's results folder (default: mutants/)")
    parser.add_argument("--retest-survivors", action="store_true")
    parser.add_argument("--confirm-kills", action="store_true")
    args = parser.parse_args(argv)
    if not args.mutants.exists():
        sys.exit(f"no {args.mutants}: run `make mutate` (mutmut run) first")
    if args.retest_survivors:
        print(f"{retest_survivors(args.mutants)} survivors will be tested again by the next `make mutate`")
        return 0
    if args.confirm_kills:
        alive = confirm_kills(args.mutants, triage())
        print(f"{len(alive)} `killed-by` lines whose test did not kill the mutant" if alive else "every kill confirmed")
        return 1 if alive else 0
    rows, untriaged, stale = score(modules(), results(args.mutants), triage())
    text = table(rows)
    print(text)
    for name in untriaged:
        mutant = name.split()[0]
        trace = args.mutants / "faults" / f"{mutant}.txt"  # a crash's or a timeout's stacks (tests/mutation_tier.py)
        print(f"untriaged: {name}   (mutmut show {mutant})" + (f"; its stacks: {trace}" if trace.exists() else ""))
    for name in stale:
        print(f"stale triage line (no longer a survivor): {name}")
    if args.write_doc:
        write_doc(text, BEGIN, END)
    below = [r["module"] for r in rows if r["score"] < GOAL]
    return 1 if args.check and (below or untriaged or stale) else 0


if __name__ == "__main__":
    sys.exit(main())
