"""The operation registry (tasks/ops/__init__.py): `discover()` registers every concrete Operation a module of the
package defines, by its `type`, in module name order; support modules, imported and abstract classes are not
operations, and a type defined twice is refused. OPERATIONS is built at import, so these tests call discover()
itself (an import-time call would never see a change to it)."""
from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

import tasks.ops
from tasks.ops import OPERATIONS, DropColumns, MergeFromSidecar, RenameColumns, discover
from tasks.ops.cast_columns import CastColumns



def shipped_from_source() -> dict[str, type]:
    """type -> class of every operation the package's modules define, read from their source (not imported the
    way discover() finds them): each class of a module under tasks/ops/ (the support modules aside) whose body
    sets `type = "..."`, in module name order. A new operation module is in it with nothing to edit."""
    folder = Path(tasks.ops.__file__).parent
    found = {}
    for path in sorted(folder.glob("*.py"), key=lambda p: p.stem):
        if path.stem == "__init__" or path.stem in tasks.ops.SUPPORT:
            continue
        module = importlib.import_module(f"tasks.ops.{path.stem}")
        for node in ast.parse(path.read_text()).body:
            for item in node.body if isinstance(node, ast.ClassDef) else ():
                targets = item.targets if isinstance(item, ast.Assign) else \
                    [item.target] if isinstance(item, ast.AnnAssign) and item.value is not None else []
                if any(getattr(t, "id", None) == "type" for t in targets) and isinstance(item.value, ast.Constant):
                    found[item.value.value] = getattr(module, node.name)
    return found


SHIPPED = shipped_from_source()


def test_the_operations_read_from_source_include_the_first_four():
    """The derivation itself finds operations (one finding nothing would make the tests below vacuous): at least
    the first four shipped, each its own module's class. A new operation needs no edit here."""
    first = {"cast_columns": CastColumns, "drop_columns": DropColumns, "merge_from_sidecar": MergeFromSidecar,
             "rename_columns": RenameColumns}
    assert first.items() <= SHIPPED.items()

EXTRA = """
    from dataclasses import dataclass
    from typing import ClassVar

    from tasks.ops.base import Operation
    from tasks.ops.cast_columns import CastColumns  # imported here: registered by its own module only

    NOT_A_CLASS = "an operation module may hold anything else"


    def helper():
        return None


    class Unfinished(Operation):  # abstract (no to_dict, no stream): not an operation
        type: ClassVar[str] = "unfinished"


    @dataclass(frozen=True)
    class Extra(Operation):
        type: ClassVar[str] = "{type}"

        def to_dict(self) -> dict:
            return {{"type": self.type}}

        def stream(self, schema, dataset, relpath, history, rows, window_rows):
            raise AssertionError("discover() registers it; no test streams it")
"""


@pytest.fixture
def extra_folder(tmp_path, monkeypatch):
    """Add a folder to the package's __path__ holding the given modules: `add(module name, Extra's type)`."""
    monkeypatch.setattr(tasks.ops, "__path__", [*tasks.ops.__path__, str(tmp_path)])
    added = []

    def add(module: str, type_: str):
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(EXTRA.format(type=type_)))
        added.append(module)
        importlib.invalidate_caches()
    yield add
    for module in added:
        sys.modules.pop(f"tasks.ops.{module}", None)
        if hasattr(tasks.ops, module):
            delattr(tasks.ops, module)


def test_discover_registers_exactly_the_shipped_operations_in_module_name_order():
    found = discover()
    assert found == SHIPPED and list(found) == list(SHIPPED)
    assert OPERATIONS == SHIPPED


def test_discover_orders_by_module_name_across_folders_and_skips_imported_and_abstract_classes(extra_folder):
    extra_folder("aa_extra", "aa_extra")
    found = discover()
    assert list(found) == ["aa_extra", *SHIPPED]  # the added folder comes last in __path__, its module first
    assert found["aa_extra"].__module__ == "tasks.ops.aa_extra" and found["aa_extra"].__name__ == "Extra"
    assert {k: v for k, v in found.items() if k != "aa_extra"} == SHIPPED


def test_a_type_defined_twice_is_refused_naming_both_classes(extra_folder):
    extra_folder("zz_twice", "cast_columns")
    with pytest.raises(TypeError) as raised:
        discover()
    twice = sys.modules["tasks.ops.zz_twice"].Extra
    assert str(raised.value) == f"operation type 'cast_columns' defined twice: {CastColumns} and {twice}"
