"""The operation registry: a pipeline's `type:` name -> the class that validates and applies it.

Every operation implements tasks.ops.base.Operation; callers use only that protocol (docs/operations.md).
To add one, write a module in this folder (cast_columns.py is the small example to copy): every concrete
`Operation` subclass a module here defines is registered by its `type`, nothing to edit elsewhere.
"""
import importlib
import inspect
import pkgutil

from tasks.ops.base import ABSENT, NO_INPUT, FieldProblem, Findings, Input, Operation, provenance_record
from tasks.ops.lineage import History, Status, StepRecord

SUPPORT = {"base", "lineage", "alignment"}  # the protocol and its helpers: no operation in them


def discover() -> dict[str, type[Operation]]:
    """type name -> class, for every operation defined in a module of this package (in module name order)."""
    found: dict[str, type[Operation]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in SUPPORT:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for cls in vars(module).values():
            if (inspect.isclass(cls) and issubclass(cls, Operation) and cls.__module__ == module.__name__
                    and not inspect.isabstract(cls)):
                if cls.type in found:
                    raise TypeError(f"operation type {cls.type!r} defined twice: {found[cls.type]} and {cls}")
                found[cls.type] = cls
    return found


OPERATIONS: dict[str, type[Operation]] = discover()

from tasks.ops.drop_columns import DropColumns  # noqa: E402  (named by callers; registered by discover())
from tasks.ops.merge_from_sidecar import MergeFromSidecar  # noqa: E402
from tasks.ops.rename_columns import RenameColumns  # noqa: E402

__all__ = ["ABSENT", "NO_INPUT", "OPERATIONS", "DropColumns", "FieldProblem", "Findings", "History", "Input",
           "MergeFromSidecar", "Operation", "RenameColumns", "Status", "StepRecord", "provenance_record"]
