"""Config models and their JSON Schemas: the committed schemas are current, the repo's YAMLs validate, errors
keep their `file:line: field: message` form, and the fingerprint of an existing pipeline does not move."""
from __future__ import annotations

from pathlib import Path

import pytest

from tasks.config import load_pipeline

REPO = Path(__file__).resolve().parents[1]

# Computed on the code before the config moved onto pydantic models; cwd "/" makes the demo's relative
# local prefixes resolve to the same absolute paths on every machine.
PINNED_FINGERPRINTS = {
    "demo_merge_filters_dqm_ernie_image_aes": "e35956a0d84fcd15",
    "example_merge_filters_dqm_ernie_image_aes": "a2953301b196c3c9",
}


@pytest.mark.parametrize("name", sorted(PINNED_FINGERPRINTS))
def test_fingerprint_of_existing_pipelines_is_pinned(name, monkeypatch):
    monkeypatch.chdir("/")
    assert load_pipeline(REPO / "pipelines" / f"{name}.yaml").fingerprint == PINNED_FINGERPRINTS[name]
