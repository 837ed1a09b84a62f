"""docs/verify-report.schema.json's check names and stages, generated from the check registry.

The rest of the document is written by hand; `render` rewrites the registry-owned parts of it.
Regenerate with `python -m tasks.verify.schema_doc` (tests/test_verify_registry.py fails when it is stale).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tasks.verify import (
    checks,  # noqa: F401  (registers the checks)
    registry,
)
from tasks.verify.registry import STAGES

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "verify-report.schema.json"


def check_name_schema() -> dict:
    """One alternative per registered check, in report order: a constant name or a per-operation pattern."""
    options = [{"pattern": c.pattern(), "description": f"{c.name}: {c.about}"} if c.per_operation
               else {"const": c.name, "description": c.about} for c in registry.REGISTRY]
    names = " | ".join(c.name.replace("{index}", "i") for c in registry.REGISTRY)
    return {"type": "string", "description": f"in report order: {names}", "anyOf": options}


def stage_schema() -> dict:
    return {"enum": list(STAGES), "description": "what it reads: " + "; ".join(f"{k}: {v}" for k, v in STAGES.items())}


def dumps(value, indent: int = 0, width: int = 110) -> str:
    """JSON with every object or array that fits in `width` columns on one line, the rest indented by 2."""
    flat = json.dumps(value)
    if indent + len(flat) <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, list):
        items = [pad + dumps(v, indent + 2, width) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 2, width - len(json.dumps(k)) - 2)}"
             for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def render(doc: dict) -> str:
    check = doc["$defs"]["check"]["properties"]
    check["name"] = check_name_schema()
    check["stage"] = stage_schema()
    return dumps(doc) + "\n"


def main(path: Path = SCHEMA_PATH) -> int:
    path.write_text(render(json.loads(path.read_text())))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
