"""The column type registry for `schema_extensions`: built-in types are data files in tasks/schemas/."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.types as pat

from tasks.yamlsrc import ConfigError, Fields, load_yaml

SCHEMAS_DIR = Path(__file__).parent / "schemas"

KINDS = {
    "floating": lambda t: pat.is_float32(t) or pat.is_float64(t),
    "integer": pat.is_integer,
    "string": lambda t: pat.is_string(t) or pat.is_large_string(t) or pat.is_string_view(t),
    "boolean": pat.is_boolean,
    "binary": lambda t: pat.is_binary(t) or pat.is_large_binary(t) or pat.is_fixed_size_binary(t),
    "timestamp": pat.is_timestamp,
    "list": lambda t: pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t),
    "struct": pat.is_struct,
    "any": lambda t: True,
}


@dataclass(frozen=True)
class ColumnType:
    """`kind` is one of KINDS; a struct also names the fields it must have, with their kinds."""

    name: str
    kind: str
    fields: dict[str, str] = field(default_factory=dict)

    def problem(self, dtype: pa.DataType) -> str | None:
        """Why `dtype` does not conform to this type, or None if it does."""
        if not KINDS[self.kind](dtype):
            return f"expected {self.describe()}, found {dtype}"
        if self.kind == "struct":
            present = {dtype.field(i).name: dtype.field(i).type for i in range(dtype.num_fields)}
            for name, kind in self.fields.items():
                if name not in present:
                    return f"expected {self.describe()}, found {dtype} (no field {name!r})"
                if not KINDS[kind](present[name]):
                    return f"field {name!r} must be {kind}, found {present[name]}"
        return None

    def describe(self) -> str:
        if self.kind != "struct":
            return f"{self.kind} ({self.name})"
        inner = ", ".join(f"{n}: {k}" for n, k in self.fields.items())
        return f"struct<{inner}, ...> ({self.name})"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "fields": dict(self.fields)}


def parse_type(source: str, name: str, data, path: str, line: int) -> ColumnType:
    spec = Fields(source, data, path, line)
    kind = spec.get("kind", str)
    if kind not in KINDS:
        raise spec.fail("kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    fields_spec = spec.get("fields", dict, required=False, default={})
    if fields_spec and kind != "struct":
        raise spec.fail("fields", "only a struct kind has fields")
    fields = {}
    for fname, fkind in fields_spec.items():
        if fkind not in KINDS or fkind == "struct":
            where = f"{source}:{fields_spec.item_lines.get(fname, spec.line)}"
            raise ConfigError(f"{where}: {path}.fields.{fname}: unknown kind {fkind!r} "
                              f"(known: {', '.join(k for k in KINDS if k != 'struct')})")
        fields[str(fname)] = fkind
    spec.done()
    return ColumnType(name, kind, fields)


@cache
def builtin_types() -> dict[str, ColumnType]:
    types = {}
    for path in sorted(SCHEMAS_DIR.glob("*.yaml")):
        types[path.stem] = parse_type(str(path), path.stem, load_yaml(path), "", 1)
    return types
