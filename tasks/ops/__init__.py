"""The operation registry: a pipeline's `type:` name -> the class that validates and applies it.

Every operation implements tasks.ops.base.Operation; callers use only that protocol (docs/operations.md).
To add one, write a module next to merge_from_sidecar.py and register it below.
"""
from tasks.ops.base import ABSENT, NO_INPUT, FieldProblem, Findings, Input, Operation, provenance_record
from tasks.ops.drop_columns import DropColumns
from tasks.ops.lineage import History, Status, Step
from tasks.ops.merge_from_sidecar import MergeFromSidecar
from tasks.ops.rename_columns import RenameColumns

OPERATIONS: dict[str, type[Operation]] = {cls.type: cls for cls in (MergeFromSidecar, DropColumns, RenameColumns)}

__all__ = ["ABSENT", "NO_INPUT", "OPERATIONS", "DropColumns", "FieldProblem", "Findings", "History", "Input",
           "MergeFromSidecar", "Operation", "RenameColumns", "Status", "Step", "provenance_record"]
