"""Dataset and pipeline YAML: valid files load; every bad one fails with `file:line: field: message`."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tasks.config import check_output_prefix, load_dataset, load_pipeline
from tasks.errors import ConfigError
from tasks.ops import OPERATIONS, Input
from tasks.storage import normalize_prefix

REPO = Path(__file__).resolve().parents[1]

# The operator guide's dataset YAML, verbatim, including its broken last entry (line 21).
GUIDE_DATASET = """\
name: example_filters_dqm_ernie_image_aes
browse: false

main_prefix: s3://.../example_sidecar_filters/
sidecar_prefix: s3://core-cn-oss.canva.com/dataset/sidecar_parquet_all_in_one_0529/example/

key_column: image_key
image_column: image

source_inference:
  default: example

schema_extensions:
  - { name: filter_clarity, type: filter_clarity_v1 }
  - { name: filter_texture, type: filter_texture_v1 }
  - { name: filter_saturation, type: filter_saturation_v1 }
  - { name: filter_luma, type: filter_luma_v1 }
  - { name: filter_color_entropy, type: filter_color_entropy_v1 }
  - { name: filter_edge_density, type: filter_edge_density_v1 }
  - { name: dqm_d1_v6_1, type: dqm_score_v1 }
  - { name: ,   }
"""

DATASET = """\
name: ds
browse: false
main_prefix: s3://bucket/base/
sidecar_prefix: s3://bucket/all_in_one/
key_column: image_key
image_column: image
source_inference:
  default: test
schema_extensions:
  - { name: dqm_d1_v6_1, type: dqm_score_v1 }
"""

PIPELINE = """\
dataset: ds
operations:
  - type: merge_from_sidecar
    source_prefix: s3://bucket/dqm/
    columns: [dqm_d1_v6_1]
    mode: prefer_sidecar
"""


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A scratch checkout: cwd is tmp_path, so messages show `datasets/ds.yaml`."""
    (tmp_path / "datasets").mkdir()
    (tmp_path / "pipelines").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def config_error(fn, *args, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kw)
    message = str(info.value)
    assert "\n" not in message.strip(), "config errors are one line"
    return message


def load_both(here, dataset: str = DATASET, pipeline: str = PIPELINE):
    write(here / "datasets/ds.yaml", dataset)
    return load_pipeline(write(here / "pipelines/p.yaml", pipeline))


# ----------------------------------------------------------------- valid files

@pytest.mark.parametrize("name", ["demo_merge_filters_dqm_ernie_image_aes", "example_merge_filters_dqm_ernie_image_aes"])
def test_repo_pipelines_load(name):
    pipe = load_pipeline(REPO / "pipelines" / f"{name}.yaml")
    assert pipe.dataset.key_column == "image_key"
    assert pipe.dataset.image_column == "image"
    assert len(pipe.operations) >= 2
    aes = pipe.operations[1]
    assert (aes.target_key_column, aes.source_key_column) == ("s3_image_path", "s3_image_path")
    assert aes.mode == "prefer_sidecar" and aes.columns == ("ernie_image_aes",)
    names = [e.name for e in pipe.dataset.schema_extensions]
    assert names[:8] == ["filter_clarity", "filter_texture", "filter_saturation", "filter_luma",
                         "filter_color_entropy", "filter_edge_density", "dqm_d1_v6_1", "ernie_image_aes"]
    assert all(op.source_prefix.endswith("/") for op in pipe.operations)


def test_guide_pipeline_text_loads_with_completed_dataset(here):
    """The guide's pipeline YAML, verbatim except for real prefixes, against its dataset (entry fixed)."""
    fixed = GUIDE_DATASET.replace("  - { name: ,   }\n", "  - { name: ernie_image_aes, type: ernie_image_aes_score_v1 }\n")
    write(here / "datasets/example_filters_dqm_ernie_image_aes.yaml", fixed.replace("s3://.../", "s3://b/"))
    pipe = load_pipeline(write(here / "pipelines/p.yaml", """\
        dataset: example_filters_dqm_ernie_image_aes

        operations:
          - type: merge_from_sidecar
            source_prefix: s3://b/example_sidecar_dqm_key_score_v1/
            columns: [dqm_d1_v6_1]
            mode: prefer_sidecar

          - type: merge_from_sidecar
            source_prefix: s3://b/example_sidecar_ernie_image_aes_v1/
            columns: [ernie_image_aes]
            target_key_column: s3_image_path
            source_key_column: s3_image_path
            mode: prefer_sidecar
        """))
    dqm, aes = pipe.operations
    assert dqm.input(pipe.dataset) == Input("s3://b/example_sidecar_dqm_key_score_v1/", "image_key", "image_key",
                                            columns=("image_key", "dqm_d1_v6_1"))
    assert aes.input(pipe.dataset) == Input("s3://b/example_sidecar_ernie_image_aes_v1/", "s3_image_path",
                                            "s3_image_path", columns=("s3_image_path", "ernie_image_aes"))
    assert dqm.required is True and dqm.mode == "prefer_sidecar"


def test_defaults(here):
    pipe = load_both(here, pipeline="""\
        dataset: ds
        operations:
          - type: merge_from_sidecar
            source_prefix: s3://bucket/dqm
        """)
    op = pipe.operations[0]
    assert op.columns is None and op.mode == "fill_missing" and op.required is True
    assert op.input(pipe.dataset) == Input("s3://bucket/dqm/", "image_key", "image_key", required=True)


# ----------------------------------------------------------------- the guide's broken entry

def test_guide_blank_extension_names_file_line_and_field(here):
    write(here / "datasets/x.yaml", GUIDE_DATASET)
    message = config_error(load_dataset, "datasets/x.yaml")
    assert message == "datasets/x.yaml:21: schema_extensions[7].name: must be a non-empty column name"


# ----------------------------------------------------------------- bad fields, each with its line

BAD_DATASETS = [
    # (edit of DATASET, expected line, expected substring)
    (("image_column: image\n", "image_column: image\ncolour: red\n"), 7, "colour: unknown field"),
    (("key_column: image_key\n", ""), 1, "key_column: missing required field"),
    (("browse: false", 'browse: "yes"'), 2, "browse: must be true or false, got str"),
    (("browse: false", "browse: 1"), 2, "browse: must be true or false, got int"),
    (("name: ds", "name: [a, b]"), 1, "name: must be a non-empty dataset name, got list"),
    (("main_prefix: s3://bucket/base/", "main_prefix: "), 3, "main_prefix: must be a non-empty prefix"),
    (("main_prefix: s3://bucket/base/", "main_prefix: s3:///nobucket"), 3, "main_prefix: 's3:///nobucket' has no bucket"),
    (("main_prefix: s3://bucket/base/", "main_prefix: gs://bucket/base/"), 3, "unsupported URI scheme 'gs'"),
    (("source_inference:\n  default: test\n", "source_inference: test\n"), 7, "source_inference: must be a mapping, got str"),
    (("type: dqm_score_v1", "type: dqm_score_v9"), 10, "schema_extensions[0].type: unknown type 'dqm_score_v9'"),
    (("type: dqm_score_v1 }", "type: dqm_score_v1, kind: x }"), 10, "schema_extensions[0].kind: unknown field"),
    (("  - { name: dqm_d1_v6_1, type: dqm_score_v1 }\n",
      "  - { name: dqm_d1_v6_1, type: dqm_score_v1 }\n  - { name: dqm_d1_v6_1, type: dqm_score_v1 }\n"),
     11, "schema_extensions[1].name: column 'dqm_d1_v6_1' is declared twice"),
    (("  - { name: dqm_d1_v6_1, type: dqm_score_v1 }\n", "  - dqm_d1_v6_1\n"), 10,
     "schema_extensions[0]: must be a mapping"),
    (("image_column: image", "image_column: image_key"), 6, "image_column: must differ from key_column"),
]


@pytest.mark.parametrize("edit,line,expected", BAD_DATASETS, ids=[c[2][:40] for c in BAD_DATASETS])
def test_bad_dataset_field(here, edit, line, expected):
    old, new = edit
    assert old in DATASET
    write(here / "datasets/ds.yaml", DATASET.replace(old, new, 1))
    message = config_error(load_dataset, "datasets/ds.yaml")
    assert message.startswith(f"datasets/ds.yaml:{line}: "), message
    assert expected in message


BAD_PIPELINES = [
    (("mode: prefer_sidecar", "mode: prefer_sidecar\n    colour: red"), 7, "operations[0].colour: unknown field"),
    (("    columns: [dqm_d1_v6_1]", '    columns: "x"'), 5, "operations[0].columns: must be a list, got str"),
    (("    columns: [dqm_d1_v6_1]", "    columns: []"), 5, "operations[0].columns: must list at least one"),
    (("    columns: [dqm_d1_v6_1]", "    columns: [a, a]"), 5, "operations[0].columns: lists a column twice"),
    (("mode: prefer_sidecar", "mode: prefer"), 6, "operations[0].mode: unknown mode 'prefer' (known: "
                                                   "fill_missing, prefer_sidecar, error)"),
    (("mode: prefer_sidecar", "required: maybe"), 6, "operations[0].required: must be true or false"),
    (("type: merge_from_sidecar", "type: merge_from_sidecars"), 3,
     f"operations[0].type: unknown operation type 'merge_from_sidecars' (known: {', '.join(sorted(OPERATIONS))})"),
    (("    source_prefix: s3://bucket/dqm/\n", ""), 3, "operations[0].source_prefix: missing required field"),
    (("mode: prefer_sidecar", "target_key_column: s3_image_path"), 6,
     "operations[0].target_key_column: set together with source_key_column"),
    (("mode: prefer_sidecar", "source_key_column: s3_image_path"), 6,
     "operations[0].source_key_column: set together with target_key_column"),
    (("dataset: ds", "dataset: nope"), 1, "dataset: unknown dataset 'nope': no file datasets/nope.yaml"),
    ((PIPELINE[PIPELINE.index("operations:"):], "operations: []\n"), 2, "operations: needs at least one operation"),
    (("operations:\n", "extra: 1\noperations:\n"), 2, "extra: unknown field"),
]


@pytest.mark.parametrize("edit,line,expected", BAD_PIPELINES, ids=[c[2][:40] for c in BAD_PIPELINES])
def test_bad_pipeline_field(here, edit, line, expected):
    old, new = edit
    assert old in PIPELINE
    message = config_error(load_both, here, pipeline=PIPELINE.replace(old, new, 1))
    assert message.startswith(f"pipelines/p.yaml:{line}: "), message
    assert expected in message


def test_yaml_syntax_error_names_its_line(here):
    write(here / "datasets/ds.yaml", DATASET.replace("key_column: image_key", "key_column: [image_key"))
    message = config_error(load_dataset, "datasets/ds.yaml")
    assert re.match(r"datasets/ds\.yaml:(6|7): YAML syntax error", message), message
    write(here / "pipelines/bad.yaml", "dataset: ds\noperations:\n  - type: merge_from_sidecar\n\tsource_prefix: x\n")
    message = config_error(load_pipeline, "pipelines/bad.yaml")
    assert message.startswith("pipelines/bad.yaml:4: YAML syntax error"), message


def test_pipeline_top_level_must_be_mapping(here):
    write(here / "pipelines/list.yaml", "- 1\n- 2\n")
    assert "(top level): must be a mapping" in config_error(load_pipeline, "pipelines/list.yaml")


def test_yaml_is_loaded_safely(here):
    write(here / "datasets/ds.yaml", DATASET.replace("name: ds", "name: !!python/object/apply:os.system [echo hi]"))
    message = config_error(load_dataset, "datasets/ds.yaml")
    assert "YAML syntax error" in message and "python/object" in message


# ----------------------------------------------------------------- dataset resolution

def test_dataset_found_by_walking_up_from_the_pipeline_folder(here, monkeypatch):
    write(here / "datasets/ds.yaml", DATASET)
    deep = write(here / "pipelines/team/2024/p.yaml", PIPELINE)
    monkeypatch.chdir("/")
    assert load_pipeline(deep).dataset.name == "ds"
    # the nearest datasets/ folder wins
    write(here / "pipelines/team/datasets/ds.yaml", DATASET.replace("name: ds", "name: nearer"))
    assert load_pipeline(deep).dataset.name == "nearer"


def test_datasets_dir_overrides_the_walk(here, tmp_path_factory):
    write(here / "datasets/ds.yaml", DATASET)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    write(elsewhere / "ds.yaml", DATASET.replace("name: ds", "name: from_dir"))
    pipeline = write(here / "pipelines/p.yaml", PIPELINE)
    assert load_pipeline(pipeline, datasets_dir=str(elsewhere)).dataset.name == "from_dir"
    message = config_error(load_pipeline, pipeline, datasets_dir=str(here / "pipelines"))
    assert "unknown dataset 'ds'" in message


def test_dataset_given_as_path(here):
    write(here / "datasets/ds.yaml", DATASET)
    pipeline = write(here / "pipelines/p.yaml", PIPELINE.replace("dataset: ds", "dataset: ../datasets/ds.yaml"))
    assert load_pipeline(pipeline).dataset.name == "ds"


def test_pipeline_file_not_found(here):
    assert config_error(load_pipeline, "pipelines/none.yaml") == "pipelines/none.yaml: file not found"


# ----------------------------------------------------------------- types

def test_user_defined_type_used_by_an_extension(here):
    pipe = load_both(here, dataset=DATASET + textwrap.dedent("""\
          - { name: watermark, type: watermark_v1 }
          - { name: caption_len, type: count }
        schema_types:
          watermark_v1:
            kind: struct
            fields: { score: floating, error: string }
          count:
            kind: integer
        """))
    exts = {e.name: e.type for e in pipe.dataset.schema_extensions}
    import pyarrow as pa

    wm = exts["watermark"]
    assert wm.kind == "struct" and wm.fields == {"score": "floating", "error": "string"}
    assert wm.problem(pa.struct([("score", pa.float32()), ("error", pa.string()), ("x", pa.int8())])) is None
    assert "no field 'score'" in wm.problem(pa.struct([("error", pa.string())]))
    assert exts["caption_len"].problem(pa.int64()) is None
    assert exts["caption_len"].problem(pa.float64()) is not None


@pytest.mark.parametrize("body,line,expected", [
    ("    kind: structure\n", 13, "schema_types.t.kind: unknown kind 'structure'"),
    ("    kind: struct\n    fields: { score: floaty }\n", 14, "schema_types.t.fields.score: unknown kind 'floaty'"),
    ("    kind: floating\n    fields: { score: floating }\n", 14, "schema_types.t.fields: only a struct kind"),
    ("    kind: struct\n    colour: red\n", 14, "schema_types.t.colour: unknown field"),
])
def test_bad_user_type(here, body, line, expected):
    write(here / "datasets/ds.yaml", DATASET + "schema_types:\n  t:\n" + body)
    message = config_error(load_dataset, "datasets/ds.yaml")
    assert message.startswith(f"datasets/ds.yaml:{line}: "), message
    assert expected in message


def test_builtin_types_are_data_files():
    from tasks.coltypes import SCHEMAS_DIR, builtin_types

    files = {p.stem for p in SCHEMAS_DIR.glob("*.yaml")}
    assert set(builtin_types()) == files
    assert {"dqm_score_v1", "ernie_image_aes_score_v1", "filter_clarity_v1", "filter_texture_v1",
            "filter_saturation_v1", "filter_luma_v1", "filter_color_entropy_v1", "filter_edge_density_v1"} <= files
    aes = builtin_types()["ernie_image_aes_score_v1"]
    assert aes.fields == {"raw_score": "floating", "score": "floating", "error": "string"}


# ----------------------------------------------------------------- prefixes

@pytest.mark.parametrize("given,expected", [
    ("s3://bucket/a/b", "s3://bucket/a/b/"),
    ("s3://bucket/a/b/", "s3://bucket/a/b/"),
    ("s3://bucket//a//", "s3://bucket/a/"),
    ("s3://bucket", "s3://bucket/"),
    ("s3://bucket/X/dataX", "s3://bucket/X/dataX/"),
    ("file:///data/x", "/data/x/"),
    ("local:///data/x", "/data/x/"),
    ("file:///data/x/", "/data/x/"),
    ("/data/x", "/data/x/"),
    ("/data/x///", "/data/x/"),
])
def test_prefix_normalisation(given, expected):
    assert normalize_prefix(given) == expected


@pytest.mark.parametrize("given, message", [
    ("  ", "empty prefix; expected s3://bucket/path/, file:///abs/path/, or a local path"),
    ("s3:///path", "'s3:///path' has no bucket; expected s3://bucket/path/, file:///abs/path/, or a local path"),
])
def test_a_prefix_that_names_nothing_is_refused_with_what_is_accepted(given, message):
    with pytest.raises(ValueError) as refused:
        normalize_prefix(given)
    assert str(refused.value) == message


def test_relative_prefixes_are_made_absolute(here):
    pipe = load_both(here, dataset=DATASET.replace("s3://bucket/base/", "data/base"))
    assert pipe.dataset.main_prefix == str(here / "data/base") + "/"


def test_output_prefix_guard_equal_inside_above(here):
    pipe = load_both(here)
    for out, relation in [("s3://bucket/base/", "equals"), ("s3://bucket/base/out/", "is inside"),
                          ("s3://bucket/", "contains"), ("s3://bucket/dqm/x/", "is inside")]:
        message = config_error(check_output_prefix, pipe, out)
        assert relation in message and "read-only" in message
    check_output_prefix(pipe, "s3://bucket/base_out/")  # a sibling with a shared name prefix is fine
    check_output_prefix(pipe, "s3://other/base/")


# ----------------------------------------------------------------- fingerprint

def test_fingerprint_stable_and_keyed_on_content_not_destination(here):
    first = load_both(here).fingerprint
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert load_both(here).fingerprint == first
    moved = DATASET.replace("sidecar_prefix: s3://bucket/all_in_one/", "sidecar_prefix: s3://elsewhere/x/")
    assert load_both(here, dataset=moved).fingerprint == first
    changed_ops = [PIPELINE.replace("prefer_sidecar", "fill_missing"),
                   PIPELINE.replace("s3://bucket/dqm/", "s3://bucket/dqm2/"),
                   PIPELINE.replace("mode: prefer_sidecar", "mode: prefer_sidecar\n    required: false"),
                   PIPELINE.replace("columns: [dqm_d1_v6_1]", "columns: [dqm_d1_v6_1, other]")]
    prints = {load_both(here, pipeline=p).fingerprint for p in changed_ops}
    assert first not in prints and len(prints) == len(changed_ops)
    assert load_both(here, dataset=DATASET.replace("key_column: image_key", "key_column: k")).fingerprint != first
