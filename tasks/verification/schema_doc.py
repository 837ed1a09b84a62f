"""The documents' parts owned by the check registry: docs/verify-report.schema.json's check names and stages, and
the list of checks in docs/operating-guide.md (section 6, between the verify-checks markers).

The rest of both documents is written by hand; `render` and `render_guide` rewrite the registry-owned parts.
Regenerate both with `python -m tasks.verification.schema_doc` (tests/test_verify_registry.py fails when one is stale).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tasks.verification import (
    checks,  # noqa: F401  (registers the checks)
    registry,
)
from tasks.verification.registry import STAGES

DOCS = Path(__file__).resolve().parents[2] / "docs"
SCHEMA_PATH = DOCS / "verify-report.schema.json"
GUIDE_PATH = DOCS / "operating-guide.md"
BEGIN, END = "<!-- verify-checks:begin -->", "<!-- verify-checks:end -->"


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


def checks_table() -> str:
    """The operator guide's list: every registered check in report order, then what each stage reads."""
    lines = ["| check (report order) | stage | counts | what it proves |", "|---|---|---|---|"]
    for c in registry.REGISTRY:
        name = c.name.replace("{index}", "i")
        lines.append(f"| `{name}` | {c.stage} | {c.unit} | {c.about} |")
    lines.append("")
    lines.append("Stages: " + "; ".join(f"`{stage}` reads {what}" for stage, what in STAGES.items()) + ". "
                 "A check named `operations[i] ...` appears once for each operation i that contributes it.")
    return "\n".join(lines)


def render_guide(text: str) -> str:
    """`text` (the operator guide) with the list between its verify-checks markers generated afresh."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise ValueError(f"{GUIDE_PATH.name}: the markers {BEGIN} and {END} are missing")
    return f"{head}{BEGIN}\n{checks_table()}\n{END}{tail}"


def main() -> int:
    SCHEMA_PATH.write_text(render(json.loads(SCHEMA_PATH.read_text())))
    GUIDE_PATH.write_text(render_guide(GUIDE_PATH.read_text()))
    print(f"wrote {SCHEMA_PATH} and {GUIDE_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
