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


class Fields:
    """Reads typed fields out of one YAML mapping, raising ConfigError with file:line and field path."""

    def __init__(self, source: str, data: Any, path: str = "", parent_line: int = 1):
        self.source = source
        self.path = path
        line = getattr(data, "line", parent_line)
        if not isinstance(data, dict):
            raise ConfigError(f"{source}:{line}: {path or '(top level)'}: must be a mapping")
        self.data = data
        self.line = line
        self.seen: set[str] = set()

    def where(self, key: str | None = None) -> str:
        line = self.data.item_lines.get(key, self.line) if key is not None else self.line
        return f"{self.source}:{line}"

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str | None, message: str) -> ConfigError:
        field = self.sub(key) if key is not None else (self.path or "(top level)")
        return ConfigError(f"{self.where(key)}: {field}: {message}")

    def get(self, key: str, kinds: type | tuple[type, ...], required: bool = True, default: Any = None):
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                if key in self.data:
                    raise self.fail(key, "must not be empty")
                raise ConfigError(f"{self.where()}: {self.sub(key)}: missing required field")
            return default
        value = self.data[key]
        if kinds is not bool and isinstance(value, bool) and not (isinstance(kinds, tuple) and bool in kinds):
            raise self.fail(key, f"must be {_kind_name(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(key, f"must be {_kind_name(kinds)}, got {value_kind(value)}")
        return value

    def name(self, key: str, required: bool = True, what: str = "column name") -> str | None:
        """A non-empty string such as a column name."""
        self.seen.add(key)
        value = self.data.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            if required or key in self.data:
                raise (self.fail(key, f"must be a non-empty {what}") if key in self.data else
                       ConfigError(f"{self.where()}: {self.sub(key)}: missing required field"))
            return None
        if not isinstance(value, str):
            raise self.fail(key, f"must be a non-empty {what}, got {value_kind(value)}")
        return value

    def line_of(self, key: str) -> int:
        return self.data.item_lines.get(key, self.line)

    def done(self) -> None:
        """Reject keys nobody asked for."""
        for key in self.data:
            if key not in self.seen:
                allowed = ", ".join(sorted(self.seen))
                raise self.fail(str(key), f"unknown field (allowed: {allowed})")


def value_kind(value) -> str:
    """The YAML-level kind of a loaded value (`list`, not our line-carrying `LList`)."""
    for kind, name in ((bool, "bool"), (dict, "mapping"), (list, "list"), (str, "str"), (int, "int"),
                       (float, "float")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _kind_name(kinds) -> str:
    names = {str: "a string", bool: "true or false", int: "an integer", float: "a number",
             list: "a list", dict: "a mapping"}
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)
