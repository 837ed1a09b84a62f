"""The house's one direction of imports (docs/architecture.md): commands -> flows -> tasks, never back, no cycles.

Read from the source with `ast`, so the test sees every import, also one inside a function that a run would
only reach on some path.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks")
# Where a function may import project modules: the command layer loads a command's modules only once the
# arguments are checked (Prefect and Ray cost seconds to import, which --help, a dry run or a config error
# should not pay), and flows/launch.py imports a flow module while the run's Prefect server starts.
LAZY_PROJECT_IMPORTS = {"flows/cli.py", "flows/launch.py", "flows/scheduler.py"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(project module, line, at module level?) for every import of a project module in `path`, except those
    under `if __name__ == "__main__":` (an entry point that only calls main())."""
    tree = ast.parse(path.read_text(), str(path))
    main_blocks = {id(n) for node in tree.body if _is_main_guard(node) for n in ast.walk(node)}
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if id(node) in main_blocks:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                     for alias in node.names]
        else:
            continue
        at_top = id(node) in top
        for name in dict.fromkeys(names):
            target = _project_module(name, known)
            if target:
                out.append((target, node.lineno, at_top))
    return out


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _project_module(name: str, known: set[str]) -> str | None:
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> project modules it imports at module level (a cycle among these breaks at import time)."""
    mods = modules(root)
    known = set(mods)
    edges = {}
    for name, path in mods.items():
        edges[name] = {t for t, _, top in imports(path, known) if top and t != name and not name.startswith(t + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by a depth-first walk (one representative per strongly connected part)."""
    seen, stack, on_stack, found = set(), [], set(), []

    def visit(node: str) -> None:
        seen.add(node)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt in on_stack:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in seen:
                visit(nxt)
        stack.pop()
        on_stack.discard(node)

    for node in sorted(edges):
        if node not in seen:
            visit(node)
    return found


def violations(root: Path = ROOT) -> list[str]:
    mods = modules(root)
    known = set(mods)
    out = []
    for name, path in mods.items():
        rel = path.relative_to(root).as_posix()
        for target, line, at_top in imports(path, known):
            if name.startswith("tasks") and target.startswith("flows"):
                out.append(f"{rel}:{line}: the work layer imports {target} (tasks/ must not import flows/)")
            elif not at_top and rel not in LAZY_PROJECT_IMPORTS:
                out.append(f"{rel}:{line}: imports {target} inside a function")
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph(root))]
    return out


def test_imports_point_down_without_cycles():
    assert violations() == []


def importers_of_the_commands(root: Path = ROOT) -> list[str]:
    """Modules that import the command line (flows.cli, flows.console) anywhere, main guards and functions
    included, other than the console itself and the command layer's own main guard: the flows must never point
    back at the commands (the circle cli -> launch -> merge/verify -> cli, for `console`, is gone)."""
    mods = modules(root)
    known = set(mods)
    out = []
    for name, path in mods.items():
        if name in ("flows.console", "flows.cli"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            targets = {_project_module(n, known) for n in names}
            if "flows.cli" in targets or ("flows.console" in targets and not _in_main_guard(tree, node)):
                out.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return out


def _in_main_guard(tree: ast.Module, target: ast.AST) -> bool:
    return any(target is n for node in tree.body if _is_main_guard(node) for n in ast.walk(node))


def test_only_entry_points_import_the_console_and_only_the_console_imports_the_commands():
    assert importers_of_the_commands() == []
    import flows.cli
    import flows.console

    assert not hasattr(flows.cli, "console"), "the console script's function lives in flows/console.py"
    assert callable(flows.console.console)


def test_the_console_script_is_the_console_module():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'sidecar-ops = "flows.console:console"' in text


def test_the_command_check_sees_a_flow_importing_the_commands(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "flows" / "cli.py").write_text("")
    (tmp_path / "flows" / "console.py").write_text("from flows import cli\n")
    (tmp_path / "flows" / "merge.py").write_text('if __name__ == "__main__":\n    from flows.cli import main\n')
    (tmp_path / "flows" / "verify.py").write_text('if __name__ == "__main__":\n    from flows.console import console\n')
    assert importers_of_the_commands(tmp_path) == ["flows/merge.py:2"]


@pytest.mark.parametrize("source, expected", [
    ({"tasks/a.py": "from flows import b\n", "flows/b.py": ""}, "the work layer imports flows.b"),
    ({"tasks/a.py": "def f():\n    import tasks.b\n", "tasks/b.py": ""}, "imports tasks.b inside a function"),
    ({"tasks/a.py": "from tasks import b\n", "tasks/b.py": "from tasks.a import x\n"},
     "import cycle: tasks.a -> tasks.b -> tasks.a"),
])
def test_the_checker_finds_each_kind_of_violation(tmp_path, source, expected):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for rel, text in source.items():
        (tmp_path / rel).write_text(text)
    found = violations(tmp_path)
    assert any(expected in line for line in found), found


def test_a_main_guard_may_import_the_command_layer(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "flows" / "cli.py").write_text("from flows import merge\n")
    (tmp_path / "flows" / "merge.py").write_text('if __name__ == "__main__":\n    from flows.cli import main\n')
    assert violations(tmp_path) == []


def mapped_paths(text: str) -> set[str]:
    """Whole paths the module map's table names: each row's backticked `*.py` and `folder/` names, a bare name
    resolved against the folder of the full path before it in the row (`tasks/config.py`, `models.py` names
    tasks/models.py). So `merge.py` counts for tasks/ only if the map says `tasks/kernel.py` (or follows a
    tasks/ path with it), never because `flows/merge.py` exists."""
    import re

    found = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`\s]+)`", line):
            if not (name.endswith(".py") or name.endswith("/")):
                continue
            if "/" in name.rstrip("/"):
                folder = name if name.endswith("/") else name.rpartition("/")[0] + "/"
                found.add(name)
            elif folder:
                found.add(folder + name)
    return found


def test_mapped_paths_are_whole_paths():
    text = "| `flows/merge.py`, `verify.py` | x |\n| `tasks/ops/` | `base.py` |\nnot a row `tasks/kernel.py`\n"
    assert mapped_paths(text) == {"flows/merge.py", "flows/verify.py", "tasks/ops/", "tasks/ops/base.py"}


def test_the_module_map_names_every_module():
    """docs/architecture.md is the module map: every module and package of flows/ and tasks/ is named in its
    table by its whole path."""
    mapped = mapped_paths((ROOT / "docs" / "architecture.md").read_text())
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).iterdir()):
            if path.name.startswith(("_", ".")):
                continue
            if path.is_dir() and any(path.glob("*.py")):
                name = f"{package}/{path.name}/"
            elif path.suffix == ".py":
                name = f"{package}/{path.name}"
            else:
                continue
            if name not in mapped:
                missing.append(name)
    assert missing == [], f"not in docs/architecture.md's module map: {missing}"
