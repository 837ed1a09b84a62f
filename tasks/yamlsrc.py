"""Safe YAML loading that remembers where every value came from, for `file:line: field: message` errors."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tasks.errors import ConfigError


class Located:
    """Mixin carrying the YAML line of a mapping/sequence and of each of its items."""

    line: int = 0
    item_lines: dict


class LDict(dict, Located):
    pass


class LList(list, Located):
    pass


class _LineLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        mapping = LDict(super().construct_mapping(node, deep=True))
        mapping.line = node.start_mark.line + 1
        mapping.item_lines = {
            self.construct_object(k, deep=True): k.start_mark.line + 1 for k, _ in node.value
        }
        return mapping

    def construct_sequence(self, node, deep=False):
        seq = LList(super().construct_sequence(node, deep=True))
        seq.line = node.start_mark.line + 1
        seq.item_lines = {i: item.start_mark.line + 1 for i, item in enumerate(node.value)}
        return seq


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_sequence)


def display_path(path: str | os.PathLike) -> str:
    """The path as the user would type it: relative to the working directory when below it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def load_yaml(path: str | os.PathLike) -> Any:
    """Load a YAML file with line information; syntax errors become a ConfigError naming the line."""
    shown = display_path(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{shown}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc.strerror}") from None
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - _LineLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise ConfigError(f"{shown}:{line}: YAML syntax error: {exc.problem or exc.context}") from None


def value_kind(value) -> str:
    """The YAML-level kind of a loaded value (`list`, not our line-carrying `LList`)."""
    for kind, name in ((bool, "bool"), (dict, "mapping"), (list, "list"), (str, "str"), (int, "int"),
                       (float, "float")):
        if isinstance(value, kind):
            return name
    return type(value).__name__
