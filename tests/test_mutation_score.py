"""The mutation score's inputs stay sound without running mutmut: the triage files parse, and every line names a
mutant of a module mutmut mutates, in the file of that module (tests/mutation_score.py, `make mutate`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mutation_score
import pytest

ROOT = Path(__file__).resolve().parents[1]


def dotted(module: str) -> str:
    return module[: -len(".py")].replace("/", ".").removesuffix(".__init__")


def test_every_triage_line_names_a_mutant_of_its_own_module():
    modules = {dotted(m) for m in mutation_score.modules()}
    for path in sorted(mutation_score.TRIAGE.glob("*.txt")):
        module = path.name[: -len(".txt")]
        assert module in modules, f"{path.name}: not a mutated module ({sorted(modules)})"
        for name in mutation_score.triage_file(path):
            assert name.startswith(f"{module}.x") and "__mutmut_" in name, f"{path.name}: {name}"


def test_the_score_counts_equivalents_and_timeouts_as_not_killed_and_slower_kills_as_killed():
    found = {"tasks/windows.py": {"tasks.windows.x_a__mutmut_1": 1, "tasks.windows.x_a__mutmut_2": 0,
                                  "tasks.windows.x_a__mutmut_3": 0, "tasks.windows.x_a__mutmut_4": 33,
                                  "tasks.windows.x_a__mutmut_5": 36, "tasks.windows.x_a__mutmut_6": 0}}
    triaged = {"tasks.windows.x_a__mutmut_2": ("equivalent", "why"),
               "tasks.windows.x_a__mutmut_6": ("killed-by", "tests/test_windows.py::test_x"),
               "tasks.windows.x_b__mutmut_9": ("equivalent", "gone")}
    rows, untriaged, stale = mutation_score.score(["tasks/windows.py"], found, triaged)
    assert rows == [{"module": "tasks/windows.py", "generated": 6, "killed": 2, "by slower tests": 1,
                     "equivalent": 1, "untriaged": 3, "score": 2 / 6}]
    assert untriaged == ["tasks.windows.x_a__mutmut_3 (survived)",
                         "tasks.windows.x_a__mutmut_4 (no test reaches it)",
                         "tasks.windows.x_a__mutmut_5 (timed out or crashed (36))"]
    assert stale == ["tasks.windows.x_b__mutmut_9"]


def test_a_triage_line_names_a_verdict_it_knows(tmp_path, capsys):
    good = tmp_path / "tasks.windows.txt"
    good.write_text("# note\ntasks.windows.x_a__mutmut_1  killed-by  tests/test_windows.py::test_x\n"
                    "tasks.windows.x_a__mutmut_2  equivalent  same bytes either way\n")
    assert mutation_score.triage_file(good) == {
        "tasks.windows.x_a__mutmut_1": ("killed-by", "tests/test_windows.py::test_x"),
        "tasks.windows.x_a__mutmut_2": ("equivalent", "same bytes either way")}
    bad = tmp_path / "tasks.plan.txt"
    bad.write_text("tasks.plan.x_a__mutmut_1  hard-to-test  later\n")
    try:
        mutation_score.triage_file(bad)
    except SystemExit as exc:
        assert "tasks.plan.txt:1: expected" in str(exc) and "hard-to-test" in str(exc)
    else:
        raise AssertionError("an unknown verdict was accepted")


@pytest.mark.slow
def test_a_mutant_process_that_crashes_leaves_its_stacks_and_the_score_names_them(tmp_path, capsys):
    """mutmut sends a mutant's output to /dev/null; the mutation tier writes the Python stacks of a process that
    crashes or meets mutmut's time limit (SIGXCPU) to mutants/faults/<mutant>.txt, removes the file of one that
    ends, and the score points at it."""
    mutants = tmp_path / "mutants"
    (mutants / "tests").mkdir(parents=True)
    (mutants / "tests" / "test_mutant.py").write_text(
        "import faulthandler\n\n\ndef test_ends():\n    pass\n\n\n"
        "def test_crashes_in_c():\n    faulthandler._sigsegv()\n\n\n"
        "def test_meets_the_cpu_limit():\n    import os, signal\n    os.kill(os.getpid(), signal.SIGXCPU)\n")

    def run(mutant: str, test: str) -> int:
        env = {**os.environ, "MUTANT_UNDER_TEST": mutant, "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}"}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "mutation_tier",
                               f"tests/test_mutant.py::{test}"], cwd=mutants, env=env, capture_output=True).returncode

    crashed, ended = "tasks.windows.x_window_rows__mutmut_1", "tasks.windows.x_window_rows__mutmut_2"
    assert run(ended, "test_ends") == 0
    assert run(crashed, "test_crashes_in_c") == -11
    timed_out = "tasks.windows.x_window_rows__mutmut_3"
    assert run(timed_out, "test_meets_the_cpu_limit") == -24
    trace = mutants / "faults" / f"{crashed}.txt"
    assert sorted(p.name for p in trace.parent.iterdir()) == sorted([trace.name, f"{timed_out}.txt"])
    assert "Segmentation fault" in trace.read_text() and "test_crashes_in_c" in trace.read_text()
    assert "test_meets_the_cpu_limit" in (trace.parent / f"{timed_out}.txt").read_text()

    (mutants / "tasks").mkdir()
    (mutants / "tasks" / "windows.py.meta").write_text(json.dumps({"exit_code_by_key": {crashed: -11, ended: 1}}))
    capsys.readouterr()
    mutation_score.main(["--mutants", str(mutants)])
    assert f"untriaged: {crashed} (timed out or crashed (-11))   (mutmut show {crashed}); its stacks: {trace}\n" \
        in capsys.readouterr().out
