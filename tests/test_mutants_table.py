"""The mutation table (docs/guarantees.md) and its script (tests/mutants.py) agree, and every test a mutant
names exists: a renamed or deleted killing test, or a mutant whose code moved away, fails here, in the fast tier.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_mutants():
    spec = importlib.util.spec_from_file_location("sidecar_mutants", ROOT / "tests" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def doc_rows() -> dict[str, tuple[str, list[str], str]]:
    """id -> (file, tests, result) of each row between the doc's markers."""
    mod = load_mutants()
    text = (ROOT / "docs" / "guarantees.md").read_text()
    assert text.count(mod.BEGIN) == 1 and text.count(mod.END) == 1
    section = text.split(mod.BEGIN)[1].split(mod.END)[0]
    rows = {}
    for line in section.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = (cells[3].strip("`"), re.findall(r"`([^`]+)`", cells[4]), cells[5])
    return rows


def test_doc_table_and_script_list_the_same_mutants_all_killed():
    mod = load_mutants()
    rows = doc_rows()
    assert list(rows) == [m.id for m in mod.MUTANTS]
    for m in mod.MUTANTS:
        file, tests, result = rows[m.id]
        assert (file, tests) == (m.file, list(m.tests)), m.id
        assert result.startswith("killed"), (m.id, result)


def test_every_mutant_applies_once_and_names_tests_that_exist():
    mod = load_mutants()
    assert len({m.id for m in mod.MUTANTS}) == len(mod.MUTANTS)
    for m in mod.MUTANTS:
        text = (ROOT / m.file).read_text()
        assert text.count(m.original) == 1, f"{m.id}: its original text is in {m.file} {text.count(m.original)} times"
        assert m.replacement != m.original
        for node in m.tests:
            path, _, name = node.partition("::")
            func = name.partition("[")[0]
            tree = ast.parse((ROOT / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert func in names, f"{m.id}: no test {func} in {path}"
            if "[" in name and path.endswith("test_bad_inputs.py"):
                case = name.partition("[")[2].rstrip("]")
                assert f'Case("{case}"' in (ROOT / path).read_text(), f"{m.id}: no case {case}"
