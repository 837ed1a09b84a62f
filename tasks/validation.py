"""Validate loaded YAML against pydantic models, failing with one line: `file:line: field: message`.

The models declare the shape (strict types, unknown fields refused); this module turns pydantic's first error into
the wording users have always seen, with the line of the offending key or item that tasks.yamlsrc recorded. A
field's markers say how to phrase it: `Name` for a non-empty string such as a column name, `Says` for a message of
its own keyed by pydantic's error type, `Items` for a list whose bad item is reported on the list's line.
"""
from __future__ import annotations

import types
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError, model_validator
from pydantic.fields import FieldInfo

from tasks.errors import ConfigError
from tasks.yamlsrc import value_kind

M = TypeVar("M", bound=BaseModel)

NonBlank = StringConstraints(pattern=r"\S")

# pydantic's error type for a wrong type -> what the value must be, in the words users have always seen
EXPECTED = {"bool_type": "true or false", "string_type": "a string", "int_type": "an integer",
            "float_type": "a number", "list_type": "a list", "dict_type": "a mapping"}


class Name:
    """Marks a non-empty string field (column, prefix, dataset name); `what` names it in errors."""

    def __init__(self, what: str):
        self.what = what


class Items:
    """Marks a list or mapping field whose bad item (value) is reported on the field itself: `message` formatted
    with the field's `name` and the item's `index` (list) or key (mapping), e.g. "{name}[{index}] must be a
    non-empty column name". A bad key of a mapping is `Says(dict_key=...)`'s."""

    def __init__(self, message: str):
        self.message = message


class Says:
    """A field's own messages keyed by pydantic error type; `dict_key` covers a bad key of a mapping field."""

    def __init__(self, **messages: str):
        self.messages = messages


class Spec(BaseModel):
    """Base of the config models: unknown fields refused, no type coercion (`browse: "yes"` is an error)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_means_default(cls, data: Any) -> Any:
        """A YAML key with no value (`browse:`) takes the default, except on a name field, where it is an error."""
        if not isinstance(data, dict):
            return data
        optional = {k for k, f in cls.model_fields.items() if not f.is_required() and not marker(f, Name)}
        return {k: v for k, v in data.items() if v is not None or k not in optional}


def validate(model: type[M], data: Any, source: str, path: str = "", parent_line: int = 1) -> M:
    """`model` validated from `data` (loaded by tasks.yamlsrc.load_yaml from `source`), or a ConfigError.

    `path` prefixes field names (a nested part validated alone); `parent_line` is the line to name when `data`
    carries none of its own (it is not a mapping)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise config_error(model, data, source, exc.errors()[0], path, parent_line) from None


def config_error(model: type[BaseModel], data: Any, source: str, error: dict, path: str = "",
                 parent_line: int = 1) -> ConfigError:
    loc = tuple(error["loc"])
    if loc[-1:] == ("[key]",):  # a bad key of a mapping: pydantic's loc is (..., mapping, key, "[key]")
        info, _ = field_at(model, loc[:-2])
        return located(source, data, loc[:-2], _says(info, "dict_key") or "keys must be non-empty strings", path,
                       parent_line)
    for n in range(1, len(loc)):
        items = marker(field_at(model, loc[:n])[0], Items)
        if items:
            return located(source, data, loc[:n], items.message.format(name=loc[n - 1], index=loc[n]), path,
                           parent_line)
    info, owner = field_at(model, loc)
    return located(source, data, loc, phrase(error, info, owner), path, parent_line)


def located(source: str, data: Any, loc: tuple, message: str, path: str = "", parent_line: int = 1) -> ConfigError:
    """A ConfigError for the value at `loc` in `data`: the line of its key or item; for an absent key, the line
    of the mapping that lacks it."""
    node, line, field, tracking = data, getattr(data, "line", parent_line), path, True
    for key in loc:
        in_list = isinstance(node, list) if tracking else isinstance(key, int)
        field += f"[{key}]" if in_list else (f".{key}" if field else str(key))
        if tracking and key in getattr(node, "item_lines", {}):
            line, node = node.item_lines[key], node[key]
        elif tracking:
            line, tracking = getattr(node, "line", line), False
    return ConfigError(f"{source}:{line}: {field or '(top level)'}: {message}")


def phrase(error: dict, info: FieldInfo | None, owner: type[BaseModel] | None) -> str:
    """Today's wording for one pydantic error on the field `info` of the model `owner`."""
    kind, value = error["type"], error["input"]
    name, own = marker(info, Name), _says(info, kind)
    if own:
        return own
    if kind == "missing":
        return "missing required field"
    if kind == "extra_forbidden" and owner is not None:
        return f"unknown field (allowed: {', '.join(sorted(owner.model_fields))})"
    if kind == "model_type":
        return "must be a mapping"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if name is not None:
        blank = value is None or isinstance(value, str)
        return f"must be a non-empty {name.what}" + ("" if blank else f", got {value_kind(value)}")
    if value is None:
        return "must not be empty"
    if kind in EXPECTED:
        got = "a boolean" if isinstance(value, bool) else value_kind(value)
        return f"must be {EXPECTED[kind]}, got {got}"
    return error["msg"]


def field_at(model: type[BaseModel], loc: tuple) -> tuple[FieldInfo | None, type[BaseModel] | None]:
    """The field that `loc` ends on (None inside a list or mapping value) and the model it belongs to."""
    tp, info, owner = model, None, None
    for key in loc:
        tp = _bare(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            owner, info = tp, tp.model_fields.get(key)
            if info is None:
                return None, owner
            tp = info.annotation
        else:
            args = get_args(tp)
            tp, info = (args[-1] if args else Any), None
    return info, owner


def marker(info: FieldInfo | None, cls: type) -> Any:
    return next((m for m in (info.metadata if info else ()) if isinstance(m, cls)), None)


def _says(info: FieldInfo | None, kind: str) -> str | None:
    says = marker(info, Says)
    return says.messages.get(kind) if says else None


def _bare(tp: Any) -> Any:
    """`tp` without Annotated[...] and without `| None`."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp
