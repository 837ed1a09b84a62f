"""JSON Schemas (draft 2020-12) of the dataset and pipeline YAMLs, for editors: docs/schemas/*.schema.json.

    python -m tasks.schemagen --write docs/schemas     regenerate the committed files
    python -m tasks.schemagen --check docs/schemas     exit 1 if they are out of date

The dataset schema is tasks.models.DatasetSpec's; the pipeline schema is PipelineSpec's with each operation
entry described by its class: `cls.json_schema()`, generated from the pydantic model of its fields (`cls.spec`,
the operation protocol in tasks/ops/base.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tasks.models import DatasetSpec, PipelineSpec
from tasks.ops import OPERATIONS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE = "python -m tasks.schemagen --write docs/schemas"


def dataset_schema() -> dict:
    return {"$schema": DRAFT, **DatasetSpec.model_json_schema()}


def pipeline_schema() -> dict:
    schema = {"$schema": DRAFT, **PipelineSpec.model_json_schema()}
    defs = schema.setdefault("$defs", {})
    for name, cls in sorted(OPERATIONS.items()):
        op = dict(operation_schema(cls))
        op.pop("$schema", None)
        for key, sub in op.pop("$defs", {}).items():
            if defs.setdefault(key, sub) != sub:
                raise ValueError(f"operation {name}: its $defs entry {key!r} clashes with another schema's")
        defs[name] = op
    schema["properties"]["operations"]["items"] = {"oneOf": [{"$ref": f"#/$defs/{n}"} for n in sorted(OPERATIONS)]}
    return schema


def operation_schema(cls) -> dict:
    """The JSON Schema of one YAML entry of the operation class `cls`."""
    return cls.json_schema()


def rendered() -> dict[str, str]:
    """File name -> the text it must hold."""
    schemas = {"dataset.schema.json": dataset_schema(), "pipeline.schema.json": pipeline_schema()}
    return {name: json.dumps(schema, indent=2, ensure_ascii=False) + "\n" for name, schema in schemas.items()}


def stale(folder: Path) -> list[str]:
    """The schema files under `folder` that differ from a fresh generation (or are missing)."""
    return [name for name, text in rendered().items()
            if not (folder / name).exists() or (folder / name).read_text(encoding="utf-8") != text]


def write(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in rendered().items():
        (folder / name).write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.schemagen", description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="DIR", type=Path, help="write the schema files into DIR")
    action.add_argument("--check", metavar="DIR", type=Path, help="exit 1 if the files in DIR are out of date")
    args = parser.parse_args(argv)
    if args.write:
        write(args.write)
        return 0
    outdated = stale(args.check)
    for name in outdated:
        print(f"{args.check / name} is out of date; regenerate with: {REGENERATE}", file=sys.stderr)
    return 1 if outdated else 0


if __name__ == "__main__":
    sys.exit(main())
