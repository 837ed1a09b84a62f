"""JSON Schemas of operation entries for operation classes that do not yet have a `json_schema()` of their own.

tasks.schemagen asks an operation class for `cls.json_schema()` and falls back to FALLBACK_SCHEMAS[cls.type] here;
each function returns the schema of one YAML entry of its type, what `from_yaml` accepts.
"""
from __future__ import annotations

from tasks.ops.merge_from_sidecar import MODES, MergeFromSidecar

COLUMN = {"type": "string", "pattern": r"\S"}


def merge_from_sidecar_schema() -> dict:
    key = ("Set it and {other} together, only when the score sidecar is aligned by a key other than the dataset's "
           "key_column (e.g. s3_image_path); omit both to use key_column on both sides.")
    return {
        "title": "merge_from_sidecar",
        "description": "Copy columns from a row-aligned score sidecar: for every base shard, the shard at the same "
                       "relative path under source_prefix, after checking row count and key equality row by row.",
        "type": "object",
        "properties": {
            "type": {"const": MergeFromSidecar.type, "title": "Type", "description": "The operation: "
                     "merge_from_sidecar."},
            "source_prefix": {"type": "string", "pattern": r"\S", "title": "Source Prefix",
                              "description": "The score sidecar (s3://bucket/path/ or a local path), with the same "
                                             "relative shard paths and row order as the base. Read-only."},
            "columns": {"type": "array", "items": COLUMN, "minItems": 1, "uniqueItems": True, "title": "Columns",
                        "description": "The columns to copy, e.g. [dqm_d1_v6_1]; each once. Omit to take every "
                                       "column of the source except its key and the dataset's key and image "
                                       "columns."},
            "mode": {"enum": list(MODES), "default": "fill_missing", "title": "Mode",
                     "description": "When a column already exists: fill_missing (default) keeps the table's, "
                                    "prefer_sidecar takes the sidecar's, error fails the shard. The dataset's "
                                    "key and image columns always stay from the base."},
            "target_key_column": {**COLUMN, "title": "Target Key Column", "description": "The key column of the "
                                  "table being merged. " + key.format(other="source_key_column")},
            "source_key_column": {**COLUMN, "title": "Source Key Column", "description": "The key column of the "
                                  "score sidecar. " + key.format(other="target_key_column")},
            "required": {"type": "boolean", "default": True, "title": "Required",
                         "description": "true (default): a missing sibling shard fails that shard. false: the "
                                        "operation does nothing on shards the sidecar does not cover."},
        },
        "required": ["type", "source_prefix"],
        "dependentRequired": {"target_key_column": ["source_key_column"],
                              "source_key_column": ["target_key_column"]},
        "additionalProperties": False,
    }


FALLBACK_SCHEMAS = {MergeFromSidecar.type: merge_from_sidecar_schema}
