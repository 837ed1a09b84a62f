"""The column type registry for `schema_extensions`: built-in types are data files in tasks/schemas/."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.types as pat
from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema, field_validator

from tasks.validation import Spec, validate
from tasks.yamlsrc import load_yaml

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


FIELD_KINDS = tuple(k for k in KINDS if k != "struct")


def _one_of(kinds: tuple[str, ...]) -> tuple:
    """Annotated metadata: the value must be one of `kinds` (an enum in the JSON Schema)."""
    def check(kind: Any) -> str:
        if not isinstance(kind, str) or kind not in kinds:
            raise ValueError(f"unknown kind {kind!r} (known: {', '.join(kinds)})")
        return kind
    return AfterValidator(check), WithJsonSchema({"type": "string", "enum": list(kinds)})


Kind = Annotated[str, *_one_of(tuple(KINDS))]
FieldKind = Annotated[Any, *_one_of(FIELD_KINDS)]  # any value: a non-string one is an unknown kind too


class TypeSpec(Spec):
    """A column type of your own, in the same terms as the built-in ones (tasks/schemas/*.yaml)."""

    model_config = ConfigDict(title="Column type")

    kind: Kind = Field(description="What the column's values are: floating (float32 or float64), integer, string, "
                                   "boolean, binary, timestamp, list, struct, or any (not checked).")
    fields: dict[Any, FieldKind] = Field(
        default_factory=dict,
        description="Only for kind struct: fields the struct must have, each with its kind (any kind but struct), "
                    "e.g. {score: floating, error: string}. Extra fields in the data are allowed.")

    @field_validator("fields")
    @classmethod
    def _struct_only(cls, fields: dict, info: ValidationInfo) -> dict:
        if fields and "kind" in info.data and info.data["kind"] != "struct":
            raise ValueError("only a struct kind has fields")
        return fields

    def column_type(self, name: str) -> ColumnType:
        return ColumnType(name, self.kind, {str(k): v for k, v in self.fields.items()})


def parse_type(source: str, name: str, data, path: str, line: int) -> ColumnType:
    return validate(TypeSpec, data, source, path, line).column_type(name)


@cache
def builtin_types() -> dict[str, ColumnType]:
    types = {}
    for path in sorted(SCHEMAS_DIR.glob("*.yaml")):
        types[path.stem] = parse_type(str(path), path.stem, load_yaml(path), "", 1)
    return types
