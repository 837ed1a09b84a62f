"""The dataset YAML and the pipeline YAML's top level as pydantic models: the one description of their shape.

Loading (tasks.config) validates with these and builds the runtime objects; tasks.schemagen publishes them as
JSON Schemas for editors. Descriptions are written for a user typing the YAML. What a model cannot check alone
(a type declared elsewhere in the file, a column declared twice, a dataset file that exists) tasks.config checks
after validation.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, field_validator

from tasks import storage
from tasks.coltypes import TypeSpec, builtin_types
from tasks.validation import Name, NonBlank, Says, Spec

PREFIX_FORMS = "s3://bucket/path/ or a local path"


def _builtin_type_examples(schema: dict) -> None:
    schema["examples"] = sorted(builtin_types())


def _no_default(schema: dict) -> None:
    """An optional string with no default value: the schema should not suggest `null`."""
    schema.pop("default", None)


ColumnName = Annotated[str, NonBlank, Name("column name")]
Prefix = Annotated[str, NonBlank, Name(f"prefix ({PREFIX_FORMS})"), AfterValidator(storage.normalize_prefix)]
TypeName = Annotated[str, NonBlank, Name("type name")]


class ExtensionSpec(Spec):
    """One score column the merged output must carry, with the type its values must have."""

    model_config = ConfigDict(title="Score column")

    name: ColumnName = Field(description="The column's name in the merged output, e.g. dqm_d1_v6_1.")
    type: TypeName = Field(
        description="Its column type: a built-in one (tasks/schemas/*.yaml, e.g. dqm_score_v1, "
                    "ernie_image_aes_score_v1, filter_clarity_v1) or one declared under schema_types.",
        json_schema_extra=_builtin_type_examples)


class DatasetSpec(Spec):
    """A dataset (datasets/NAME.yaml): the base sidecar, where the all-in-one output goes, its score columns."""

    model_config = ConfigDict(title="sidecar-ops dataset YAML")

    name: Annotated[str, NonBlank, Name("dataset name")] = Field(
        description="The dataset's name; a pipeline's `dataset: NAME` finds this file as datasets/NAME.yaml.")
    browse: bool = Field(False, description="Kept from the operator guide's format (true or false, default false); "
                                            "the merge does not use it.")
    main_prefix: Prefix = Field(
        description=f"The base sidecar to preserve ({PREFIX_FORMS}): one parquet shard per relative path, one row "
                    "per image. Read-only. A relative local path is resolved against the working directory.")
    sidecar_prefix: Prefix = Field(
        description=f"The all-in-one output ({PREFIX_FORMS}). A run writes to --output-prefix; without it, to a new "
                    "timestamped sibling of this prefix (<sidecar_prefix>_run_YYYYMMDD_HHMMSS/).")
    key_column: ColumnName = Field(
        description="The column every row is keyed by (usually image_key); each operation checks it equals the score "
                    "sidecar's key row by row, unless the operation names its own keys.")
    image_column: ColumnName = Field(
        None, json_schema_extra=_no_default, description="The image column of the base (usually image), if it has one: never taken from a score "
                          "sidecar and dropped from the output (a sidecar carries no image bytes). Must differ from "
                          "key_column. Omit if there is none.")
    source_inference: dict[Any, Any] = Field(
        default_factory=dict,
        description="Where the scores came from, recorded as is in every output shard's provenance: `default` and, "
                    "optionally, one entry per column (e.g. dqm_d1_v6_1: DQM-d1-V6.1). Default: empty.")
    schema_types: Annotated[dict[Annotated[str, NonBlank], TypeSpec], Says(dict_key="type names must be strings")] = (
        Field(default_factory=dict,
              description="Optional: column types of your own, by name, for schema_extensions to use, e.g. "
                          "watermark_score_v1: {kind: struct, fields: {score: floating, error: string}}."))
    schema_extensions: list[ExtensionSpec] = Field(
        default_factory=list,
        description="The score columns the output must have, each with its type, checked on every output shard, "
                    "e.g. - { name: dqm_d1_v6_1, type: dqm_score_v1 }. Each column once. Default: none.")

    @field_validator("image_column")
    @classmethod
    def _not_the_key(cls, image_column: str, info: ValidationInfo) -> str:
        if image_column == info.data.get("key_column"):
            raise ValueError("must differ from key_column")
        return image_column


class PipelineSpec(Spec):
    """A pipeline (pipelines/NAME.yaml): a dataset and the operations applied, in order, to each of its shards."""

    model_config = ConfigDict(title="sidecar-ops pipeline YAML")

    dataset: Annotated[str, NonBlank, Name("dataset name or path")] = Field(
        description="The dataset: a name, looked up as datasets/NAME.yaml walking up from this file's folder "
                    "(--datasets-dir overrides), or a path to its YAML (relative to this file).")
    operations: Annotated[list[Any], Says(too_short="needs at least one operation")] = Field(
        min_length=1, description="The steps, applied in order to every shard; at least one. Each is a mapping "
                                  "whose `type` names the operation, e.g. merge_from_sidecar.")


class OperationEntry(Spec):
    """One entry of `operations` as far as choosing its class goes: its `type` (the class validates the rest)."""

    model_config = ConfigDict(extra="allow")

    type: Annotated[str, NonBlank, Name("operation type")]
