"""merge_from_sidecar's case for the shared operation tests (tests/test_operations.py); its own behaviour
(modes, keys, alignment errors, missing siblings) is tested in tests/test_merge_kernel.py, tests/test_bad_inputs.py
and tests/test_property_merge.py; its dry-run lines here."""
from __future__ import annotations

from types import SimpleNamespace

from core_fixtures import three_ops

from tasks.ops import MergeFromSidecar


def example(p: dict) -> list[dict]:
    """dqm by image_key, aes by s3_image_path, the optional watermark (missing for the last shard)."""
    return three_ops(p)


def test_dry_run_lines_name_mode_columns_and_the_columns_never_taken():
    """The dry run's line for the step, and one note for each listed column the sidecar never supplies (the
    dataset's key and image columns); with no columns listed, every column: '(all)', no note."""
    dataset = SimpleNamespace(key_column="image_key", image_column="image")
    listed = MergeFromSidecar("s3://b/dqm/", ("image_key", "dqm", "image"), "prefer_sidecar")
    assert listed.dry_run_lines(dataset) == (
        "merge_from_sidecar from s3://b/dqm/ mode=prefer_sidecar columns=['image_key', 'dqm', 'image']",
        ["image_key is the dataset's key column: kept from main, never taken from the sidecar",
         ("image is the dataset's image column: never taken from the sidecar (and dropped: a sidecar carries "
          "no image bytes)")])
    every = MergeFromSidecar("s3://b/aes/")
    assert every.dry_run_lines(dataset) == ("merge_from_sidecar from s3://b/aes/ mode=fill_missing columns=['(all)']",
                                            [])
