"""The mutation score's inputs stay sound without running mutmut: the triage files parse, and every line names a
mutant of a module mutmut mutates, in the file of that module (tests/mutation_score.py, `make mutate`)."""
from __future__ import annotations

import mutation_score


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
