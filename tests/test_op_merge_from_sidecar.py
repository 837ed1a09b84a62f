"""merge_from_sidecar's case for the shared operation tests (tests/test_operations.py); its own behaviour
(modes, keys, alignment errors, missing siblings) is tested in tests/test_merge_kernel.py, tests/test_bad_inputs.py
and tests/test_property_merge.py."""
from __future__ import annotations

from core_fixtures import three_ops


def example(p: dict) -> list[dict]:
    """dqm by image_key, aes by s3_image_path, the optional watermark (missing for the last shard)."""
    return three_ops(p)
