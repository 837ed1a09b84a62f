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


def test_the_score_counts_equivalents_and_timeouts_as_not_killed():
    found = {"tasks/windows.py": {"tasks.windows.x_a__mutmut_1": 1, "tasks.windows.x_a__mutmut_2": 0,
                                  "tasks.windows.x_a__mutmut_3": 0, "tasks.windows.x_a__mutmut_4": 33,
                                  "tasks.windows.x_a__mutmut_5": 36}}
    equivalent = {"tasks.windows.x_a__mutmut_2": "why", "tasks.windows.x_b__mutmut_9": "gone"}
    rows, untriaged, stale = mutation_score.score(["tasks/windows.py"], found, equivalent)
    assert rows == [{"module": "tasks/windows.py", "generated": 5, "killed": 1, "equivalent": 1, "untriaged": 3,
                     "score": 0.2}]
    assert untriaged == ["tasks.windows.x_a__mutmut_3 (survived)",
                         "tasks.windows.x_a__mutmut_4 (no test reaches it)",
                         "tasks.windows.x_a__mutmut_5 (timed out or crashed (36))"]
    assert stale == ["tasks.windows.x_b__mutmut_9"]
