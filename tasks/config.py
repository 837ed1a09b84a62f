"""Dataset and pipeline YAML: validated models, dataset resolution and the pipeline fingerprint."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from tasks import storage
from tasks.coltypes import ColumnType, builtin_types
from tasks.models import DatasetSpec, OperationEntry, PipelineSpec
from tasks.ops import OPERATIONS, FieldProblem, Operation
from tasks.validation import located, validate
from tasks.yamlsrc import ConfigError, display_path, load_yaml


@dataclass(frozen=True)
class Extension:
    name: str
    type: ColumnType


@dataclass(frozen=True)
class Dataset:
    name: str
    path: str
    main_prefix: str
    sidecar_prefix: str
    key_column: str
    image_column: str | None
    browse: bool = False
    source_inference: dict = field(default_factory=dict)
    schema_extensions: tuple[Extension, ...] = ()


@dataclass(frozen=True)
class Pipeline:
    path: str
    dataset: Dataset
    operations: tuple[Operation, ...]

    @property
    def fingerprint(self) -> str:
        """Hash of what decides the output's content (not where it is written, nor how the YAML spells it):
        schema_extensions as a set (their order decides nothing), each operation with its defaults filled in."""
        ds = self.dataset
        return _hash(self._doc(sorted(self._extensions()), [op.meaning(ds) for op in self.operations]))

    @property
    def legacy_fingerprint(self) -> str:
        """The fingerprint of this YAML as earlier versions computed it (spelling included): the outputs they
        wrote record it, and stay current as long as the YAML they were written with is unchanged."""
        return _hash(self._doc(self._extensions(), [op.to_dict() for op in self.operations]))

    def accepts(self, fingerprint: str | None) -> bool:
        """Whether an output recording `fingerprint` was written by this pipeline (by this version, or by an
        earlier one from this very YAML). The one place that decides it: plan, shard tasks, the post-write
        check and verify all ask here."""
        return fingerprint in (self.fingerprint, self.legacy_fingerprint)

    def _extensions(self) -> list[list]:
        return [[e.name, e.type.name, e.type.to_dict()] for e in self.dataset.schema_extensions]

    def _doc(self, extensions: list, operations: list[dict]) -> dict:
        ds = self.dataset
        return {"dataset": {"name": ds.name, "main_prefix": ds.main_prefix, "key_column": ds.key_column,
                            "image_column": ds.image_column, "source_inference": ds.source_inference,
                            "schema_extensions": extensions},
                "operations": operations}

    def prefixes(self) -> list[tuple[str, str]]:
        """(what, prefix) for every read-only input."""
        out = [("main_prefix", self.dataset.main_prefix)]
        for i, op in enumerate(self.operations):
            if source := op.input(self.dataset):
                out.append((f"operations[{i}].{source.field}", source.prefix))
        return out


def _hash(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def load_dataset(path: str | Path) -> Dataset:
    shown = display_path(path)
    raw = load_yaml(path)
    spec = validate(DatasetSpec, raw, shown)
    types = {**builtin_types(), **{name: t.column_type(name) for name, t in spec.schema_types.items()}}
    extensions, seen = [], {}
    for i, ext in enumerate(spec.schema_extensions):
        if ext.type not in types:
            raise located(shown, raw, ("schema_extensions", i, "type"),
                          f"unknown type {ext.type!r} (known: {', '.join(sorted(types))}; "
                          "declare new ones under schema_types)")
        if ext.name in seen:
            raise located(shown, raw, ("schema_extensions", i, "name"),
                          f"column {ext.name!r} is declared twice (also schema_extensions[{seen[ext.name]}])")
        seen[ext.name] = i
        extensions.append(Extension(ext.name, types[ext.type]))
    return Dataset(name=spec.name, path=shown, main_prefix=spec.main_prefix, sidecar_prefix=spec.sidecar_prefix,
                   key_column=spec.key_column, image_column=spec.image_column, browse=spec.browse,
                   source_inference=dict(spec.source_inference), schema_extensions=tuple(extensions))


def resolve_dataset(ref: str, pipeline_path: Path, datasets_dir: str | None) -> Path:
    """A dataset path, or a name looked up as datasets/<name>.yaml walking up from the pipeline's folder."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        candidate = Path(ref) if Path(ref).is_absolute() else pipeline_path.parent / ref
        if candidate.exists():
            return candidate
        if Path(ref).exists():
            return Path(ref)
        raise FileNotFoundError(str(candidate))
    if datasets_dir:
        candidate = Path(datasets_dir) / f"{ref}.yaml"
        if candidate.exists():
            return candidate
        raise FileNotFoundError(str(candidate))
    for folder in [pipeline_path.resolve().parent, *pipeline_path.resolve().parents]:
        candidate = folder / "datasets" / f"{ref}.yaml"
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"datasets/{ref}.yaml (searched upwards from {display_path(pipeline_path.parent)})")


def load_pipeline(path: str | Path, datasets_dir: str | None = None) -> Pipeline:
    path = Path(path)
    shown = display_path(path)
    raw = load_yaml(path)
    spec = validate(PipelineSpec, raw, shown)
    try:
        dataset_path = resolve_dataset(spec.dataset, path, datasets_dir)
    except FileNotFoundError as exc:
        raise located(shown, raw, ("dataset",),
                      f"unknown dataset {spec.dataset!r}: no file {display_path(str(exc))}") from None
    dataset = load_dataset(dataset_path)
    ops_raw = raw["operations"]
    entries = [(item, f"operations[{i}]", ops_raw.item_lines.get(i, raw.line)) for i, item in enumerate(ops_raw)]
    operations = tuple(load_operation(shown, *entry, dataset) for entry in entries)
    for op, (item, path, line) in zip(operations, entries):
        for key, message in op.conflicts(dataset, operations):
            raise located(shown, item, (key,), message, path, line)
    return Pipeline(path=shown, dataset=dataset, operations=operations)


def load_operation(shown: str, item, path: str, line: int, dataset: Dataset) -> Operation:
    """One entry of `operations`, validated by its class's pydantic model, then built against the dataset."""
    kind = validate(OperationEntry, item, shown, path, line).type
    if kind not in OPERATIONS:
        raise located(shown, item, ("type",), f"unknown operation type {kind!r} (known: "
                                              f"{', '.join(sorted(OPERATIONS))})", path, line)
    cls = OPERATIONS[kind]
    try:
        return cls.from_spec(validate(cls.spec, item, shown, path, line), dataset)
    except FieldProblem as problem:
        raise located(shown, item, (problem.field,), problem.message, path, line) from None


def check_output_prefix(pipeline: Pipeline, output_prefix: str) -> None:
    """Refuse an output prefix equal to, inside or above any read-only input."""
    for what, prefix in pipeline.prefixes():
        if storage.inside(output_prefix, prefix) or storage.inside(prefix, output_prefix):
            relation = ("equals" if output_prefix == prefix else
                        "is inside" if storage.inside(output_prefix, prefix) else "contains")
            raise ConfigError(f"output prefix {output_prefix} {relation} {what} {prefix}; inputs are read-only: "
                              "choose a separate --output-prefix")
