"""The operation registry: a pipeline's `type:` name -> the class that validates and applies it.

An operation is a frozen dataclass with:
  type                       the YAML name (class attribute)
  from_yaml(fields, dataset, prefix_field)  validate one YAML entry (tasks.yamlsrc.Fields) and build it
  to_dict()                  what goes into the pipeline fingerprint and provenance
  inputs()                   read-only prefixes it reads (guarded against the output prefix)
  plan(schema, dataset, relpath)  the output schema after this step, from footers only (dry run)
  apply(table, dataset, relpath)  -> (table, record): the step itself on one shard, record for provenance
To add one, write a module next to merge_from_sidecar.py and register it below.
"""
from tasks.ops.merge_from_sidecar import MergeFromSidecar

Operation = MergeFromSidecar  # the common shape; a Protocol once there is a second operation

OPERATIONS = {cls.type: cls for cls in (MergeFromSidecar,)}

__all__ = ["OPERATIONS", "Operation", "MergeFromSidecar"]
