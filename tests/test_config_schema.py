"""Config models and their JSON Schemas: the committed schemas are current, the repo's YAMLs validate against them,
the schemas and the loader refuse the same mistakes (the loader with its exact `file:line: field: message`), and
the fingerprint of an existing pipeline does not move."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tasks import schemagen
from tasks.coltypes import builtin_types
from tasks.config import load_dataset, load_pipeline
from tasks.errors import ConfigError
from tasks.ops import OPERATIONS, MergeFromSidecar
from tasks.ops.merge_from_sidecar import MODES

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "docs" / "schemas"
SCHEMA_LINE = re.compile(r"# yaml-language-server: \$schema=(\S+)$")
REPO_YAMLS = sorted([*(REPO / "datasets").glob("*.yaml"), *(REPO / "pipelines").glob("*.yaml")])

# (legacy, canonical) per shipped pipeline. The legacy one was computed on the code before the config moved
# onto pydantic models and is what outputs written before issue 18 record (they must stay current); the
# canonical one ignores spelling (issue 18). cwd "/" makes the demo's relative local prefixes resolve to the
# same absolute paths on every machine.
PINNED_FINGERPRINTS = {
    "demo_merge_filters_dqm_ernie_image_aes": ("e35956a0d84fcd15", "d4e137e3073492ec"),
    "example_merge_filters_dqm_ernie_image_aes": ("a2953301b196c3c9", "6d8b50aecc7a0c14"),
}


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / name).read_text()))


# ----------------------------------------------------------------- the committed schemas

def test_committed_schemas_are_current():
    stale = schemagen.stale(SCHEMAS)
    assert not stale, f"docs/schemas/{', '.join(stale)} out of date; regenerate with: {schemagen.REGENERATE}"


def test_check_mode_names_the_stale_file_and_the_command(tmp_path, capsys):
    schemagen.write(tmp_path)
    assert schemagen.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "pipeline.schema.json").write_text("{}\n")
    assert schemagen.main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "pipeline.schema.json is out of date" in err and schemagen.REGENERATE in err
    assert "dataset.schema.json" not in err


@pytest.mark.parametrize("name", ["dataset.schema.json", "pipeline.schema.json"])
def test_schemas_are_draft_2020_12_with_a_description_for_every_field(name):
    schema = json.loads((SCHEMAS / name).read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    objects = [schema, *schema["$defs"].values()]
    for obj in objects:
        assert obj.get("title") and obj.get("description"), obj
        assert obj["additionalProperties"] is False, obj["title"]
        for field, sub in obj["properties"].items():
            assert sub.get("title") and len(sub.get("description", "")) > 20, f"{obj['title']}.{field}"


def test_type_names_known_at_generation_are_a_hint_not_a_limit():
    prop = json.loads((SCHEMAS / "dataset.schema.json").read_text())["$defs"]["ExtensionSpec"]["properties"]["type"]
    assert prop["examples"] == sorted(builtin_types()) and "enum" not in prop


# ----------------------------------------------------------------- the repo's YAMLs

@pytest.mark.parametrize("path", REPO_YAMLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_repo_yaml_names_its_schema_and_validates(path):
    first = path.read_text().splitlines()[0]
    match = SCHEMA_LINE.fullmatch(first)
    kind = "dataset" if path.parent.name == "datasets" else "pipeline"
    assert match and match.group(1) == f"../docs/schemas/{kind}.schema.json", first
    assert (path.parent / match.group(1)).resolve() == SCHEMAS / f"{kind}.schema.json"
    errors = [e.message for e in validator(f"{kind}.schema.json").iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


# ----------------------------------------------------------------- the schemas and the loader refuse the same

DATASET = """\
# yaml-language-server: $schema=../../docs/schemas/dataset.schema.json
name: ds
browse: false
main_prefix: s3://bucket/base/
sidecar_prefix: s3://bucket/all_in_one/
key_column: image_key
image_column: image
schema_types:
  watermark_v1:
    kind: struct
    fields: { score: floating }
schema_extensions:
  - { name: dqm_d1_v6_1, type: dqm_score_v1 }
  - { name: watermark, type: watermark_v1 }
"""

PIPELINE = """\
# yaml-language-server: $schema=../../docs/schemas/pipeline.schema.json
dataset: ds
operations:
  - type: merge_from_sidecar
    source_prefix: s3://bucket/dqm/
    columns: [dqm_d1_v6_1]
    mode: prefer_sidecar
"""

BAD_DATASETS = [
    ("colour: red\n", ("datasets/ds.yaml:15: colour: unknown field (allowed: browse, image_column, key_column, "
                      "main_prefix, name, schema_extensions, schema_types, sidecar_prefix, source_inference)")),
    (('browse: false', 'browse: "yes"'), 'datasets/ds.yaml:3: browse: must be true or false, got str'),
    (("key_column: image_key\n", ""), "datasets/ds.yaml:2: key_column: missing required field"),
    (("name: watermark, type: watermark_v1 }", "name: watermark, typ: watermark_v1 }"),
     "datasets/ds.yaml:14: schema_extensions[1].type: missing required field"),
    (("{ name: dqm_d1_v6_1, type: dqm_score_v1 }", "{ name: 7, type: dqm_score_v1 }"),
     "datasets/ds.yaml:13: schema_extensions[0].name: must be a non-empty column name, got int"),
    (("{ score: floating }", "{ score: floaty }"), ("datasets/ds.yaml:11: schema_types.watermark_v1.fields.score: "
     "unknown kind 'floaty' (known: floating, integer, string, boolean, binary, timestamp, list, any)")),
]

BAD_PIPELINES = [
    ("extra: 1\n", "pipelines/p.yaml:8: extra: unknown field (allowed: dataset, operations)"),
    (("mode: prefer_sidecar", "mode: prefer"),
     "pipelines/p.yaml:7: operations[0].mode: unknown mode 'prefer' (known: fill_missing, prefer_sidecar, error)"),
    (("mode: prefer_sidecar", "target_key_column: s3_image_path"), ("pipelines/p.yaml:7: "
     "operations[0].target_key_column: set together with source_key_column, or omit both to use the dataset's "
     "key_column (image_key)")),
    (("    columns: [dqm_d1_v6_1]\n", "    columns: [a, a]\n"),
     "pipelines/p.yaml:6: operations[0].columns: lists a column twice"),
    (("type: merge_from_sidecar", "type: merge"),
     "pipelines/p.yaml:4: operations[0].type: unknown operation type 'merge' (known: "
     + ", ".join(sorted(OPERATIONS)) + ")"),
    ((PIPELINE[PIPELINE.index("operations:"):], "operations: []\n"),
     "pipelines/p.yaml:3: operations: needs at least one operation"),
    (("dataset: ds", "dataset: true"), "pipelines/p.yaml:2: dataset: must be a non-empty dataset name or path, got bool"),
]


def edited(text: str, edit) -> str:
    if isinstance(edit, str):
        return text + edit
    old, new = edit
    assert old in text
    return text.replace(old, new, 1)


@pytest.fixture
def here(tmp_path, monkeypatch):
    for folder in ("datasets", "pipelines"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def loader_error(fn, path: str) -> str:
    with pytest.raises(ConfigError) as info:
        fn(path)
    return str(info.value)


@pytest.mark.parametrize("edit,message", BAD_DATASETS, ids=[m.split(": ", 1)[1][:40] for _, m in BAD_DATASETS])
def test_bad_dataset_refused_by_schema_and_loader(here, edit, message):
    text = edited(DATASET, edit)
    assert list(validator("dataset.schema.json").iter_errors(yaml.safe_load(text))), "the schema accepts it"
    (here / "datasets/ds.yaml").write_text(text)
    assert loader_error(load_dataset, "datasets/ds.yaml") == message


@pytest.mark.parametrize("edit,message", BAD_PIPELINES, ids=[m.split(": ", 1)[1][:40] for _, m in BAD_PIPELINES])
def test_bad_pipeline_refused_by_schema_and_loader(here, edit, message):
    text = edited(PIPELINE, edit)
    assert list(validator("pipeline.schema.json").iter_errors(yaml.safe_load(text))), "the schema accepts it"
    (here / "datasets/ds.yaml").write_text(DATASET)
    (here / "pipelines/p.yaml").write_text(text)
    assert loader_error(load_pipeline, "pipelines/p.yaml") == message


def test_the_valid_pair_passes_both(here):
    assert not list(validator("dataset.schema.json").iter_errors(yaml.safe_load(DATASET)))
    assert not list(validator("pipeline.schema.json").iter_errors(yaml.safe_load(PIPELINE)))
    (here / "datasets/ds.yaml").write_text(DATASET)
    (here / "pipelines/p.yaml").write_text(PIPELINE)
    pipe = load_pipeline("pipelines/p.yaml")
    assert [e.type.name for e in pipe.dataset.schema_extensions] == ["dqm_score_v1", "watermark_v1"]


def test_an_empty_optional_value_means_its_default_but_an_empty_name_is_an_error(here):
    (here / "datasets/ds.yaml").write_text(DATASET.replace("browse: false", "browse:"))
    assert load_dataset("datasets/ds.yaml").browse is False
    (here / "datasets/ds.yaml").write_text(DATASET.replace("image_column: image", "image_column:"))
    assert loader_error(load_dataset, "datasets/ds.yaml") == (
        "datasets/ds.yaml:7: image_column: must be a non-empty column name")


# Each entry of tasks.validation's translation from pydantic's error types to the loader's wording, verbatim.
WORDING = [
    (("browse: false", "browse: null"), None),
    (("key_column: image_key", "key_column:"), "datasets/ds.yaml:6: key_column: must be a non-empty column name"),
    (("schema_extensions:\n", "source_inference: true\nschema_extensions:\n"),
     "datasets/ds.yaml:12: source_inference: must be a mapping, got a boolean"),
    (("schema_extensions:\n", "source_inference: [a]\nschema_extensions:\n"),
     "datasets/ds.yaml:12: source_inference: must be a mapping, got list"),
    (("schema_types:\n", "schema_types:\n  5: {kind: integer}\n"),
     "datasets/ds.yaml:8: schema_types: type names must be strings"),
    (("    kind: struct\n", "    kind:\n"), "datasets/ds.yaml:10: schema_types.watermark_v1.kind: must not be empty"),
    (("    kind: struct\n", "    kind: 3\n"),
     "datasets/ds.yaml:10: schema_types.watermark_v1.kind: must be a string, got int"),
    (("    kind: struct\n", "    kind: floating\n"),
     "datasets/ds.yaml:11: schema_types.watermark_v1.fields: only a struct kind has fields"),
    (("  - { name: watermark, type: watermark_v1 }", "  - watermark"),
     "datasets/ds.yaml:14: schema_extensions[1]: must be a mapping"),
    (("image_column: image", "image_column: image_key"), "datasets/ds.yaml:7: image_column: must differ from key_column"),
    (("main_prefix: s3://bucket/base/", "main_prefix: s3:///base/"), ("datasets/ds.yaml:4: main_prefix: "
     "'s3:///base/' has no bucket; expected s3://bucket/path/, file:///abs/path/, or a local path")),
    (("  - { name: watermark, type: watermark_v1 }", "  - { name: dqm_d1_v6_1, type: watermark_v2 }"),
     ("datasets/ds.yaml:14: schema_extensions[1].type: unknown type 'watermark_v2' (known: dqm_score_v1, "
     "ernie_image_aes_score_v1, filter_clarity_v1, filter_color_entropy_v1, filter_edge_density_v1, filter_luma_v1, "
     "filter_saturation_v1, filter_texture_v1, watermark_v1; declare new ones under schema_types)")),
    (("  - { name: watermark, type: watermark_v1 }", "  - { name: dqm_d1_v6_1, type: watermark_v1 }"),
     ("datasets/ds.yaml:14: schema_extensions[1].name: column 'dqm_d1_v6_1' is declared twice (also "
     "schema_extensions[0])")),
]


@pytest.mark.parametrize("edit,message", WORDING, ids=[str(m).split(": ", 1)[-1][:40] for _, m in WORDING])
def test_loader_wording_of_each_error_type(here, edit, message):
    (here / "datasets/ds.yaml").write_text(edited(DATASET, edit))
    if message is None:
        assert load_dataset("datasets/ds.yaml").browse is False
    else:
        assert loader_error(load_dataset, "datasets/ds.yaml") == message


def test_top_level_not_a_mapping(here):
    (here / "datasets/ds.yaml").write_text("# a list, not a dataset\n- name: ds\n")
    assert loader_error(load_dataset, "datasets/ds.yaml") == "datasets/ds.yaml:2: (top level): must be a mapping"


def test_pipeline_operations_empty_or_missing(here):
    (here / "datasets/ds.yaml").write_text(DATASET)
    (here / "pipelines/p.yaml").write_text(PIPELINE[:PIPELINE.index("operations:")] + "operations:\n")
    assert loader_error(load_pipeline, "pipelines/p.yaml") == "pipelines/p.yaml:3: operations: must not be empty"
    (here / "pipelines/p.yaml").write_text(PIPELINE[:PIPELINE.index("operations:")])
    assert loader_error(load_pipeline, "pipelines/p.yaml") == "pipelines/p.yaml:2: operations: missing required field"


# ----------------------------------------------------------------- operation schemas

# What every operation's schema must be (generated from its fields model, published, describing each field):
# tests/test_operations.py.

def test_merge_from_sidecar_schema_offers_the_modes_and_requires_a_source():
    schema = MergeFromSidecar.json_schema()
    assert schema["properties"]["mode"]["enum"] == list(MODES)
    assert schema["required"] == ["type", "source_prefix"]


def test_an_operation_class_with_json_schema_is_asked_for_it(monkeypatch):
    class Stamp:
        type = "stamp"

        @classmethod
        def json_schema(cls) -> dict:
            return {"$schema": "x", "type": "object", "properties": {"type": {"const": "stamp"},
                    "label": {"$ref": "#/$defs/Label"}}, "$defs": {"Label": {"type": "string"}}}

    monkeypatch.setitem(OPERATIONS, "stamp", Stamp)
    schema = schemagen.pipeline_schema()
    assert schema["properties"]["operations"]["items"] == {
        "oneOf": [{"$ref": f"#/$defs/{n}"} for n in sorted([*OPERATIONS])]}
    assert schema["$defs"]["stamp"]["properties"]["type"] == {"const": "stamp"}
    assert "$schema" not in schema["$defs"]["stamp"] and schema["$defs"]["Label"] == {"type": "string"}
    assert schema["$defs"]["merge_from_sidecar"] == schemagen.operation_schema(MergeFromSidecar)
    check = jsonschema.Draft202012Validator(schema)
    entry = {"dataset": "ds", "operations": [{"type": "stamp", "label": "x"}]}
    assert check.is_valid(entry) and not check.is_valid({**entry, "operations": [{"type": "stamp", "label": 1}]})


# ----------------------------------------------------------------- fingerprint

@pytest.mark.parametrize("name", sorted(PINNED_FINGERPRINTS))
def test_fingerprint_of_existing_pipelines_is_pinned(name, monkeypatch):
    monkeypatch.chdir("/")
    pipeline = load_pipeline(REPO / "pipelines" / f"{name}.yaml")
    assert (pipeline.legacy_fingerprint, pipeline.fingerprint) == PINNED_FINGERPRINTS[name]
    assert all(pipeline.accepts(fp) for fp in PINNED_FINGERPRINTS[name])
