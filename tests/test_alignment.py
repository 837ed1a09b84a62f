"""Key alignment across key types, every pair decided (the property test samples pairs; a mutant it happened not
to draw survived: mutmut, tasks.ops.alignment._family)."""
from __future__ import annotations

import pyarrow as pa
import pytest
from test_property_merge import KEY_TYPES, encode, family

from tasks.errors import ShardError
from tasks.ops.alignment import check_aligned

KEYS = [0, 7, 42, 127]


def aligned(left: pa.Array, right: pa.Array) -> bool:
    try:
        check_aligned(pa.table({"key": left}), "key", pa.table({"key": right}), "key")
    except ShardError:
        return False
    return True


def test_every_pair_of_key_types_aligns_exactly_within_its_family():
    wrong = [(left_t, right_t) for left_t in KEY_TYPES for right_t in KEY_TYPES
             if aligned(encode(KEYS, left_t), encode(KEYS, right_t)) != (family(left_t) == family(right_t))]
    assert not wrong, f"pairs decided against their families: {wrong}"


def test_every_pair_within_a_family_still_finds_a_changed_key():
    changed = [*KEYS[:-1], 126]
    missed = [(left_t, right_t) for left_t in KEY_TYPES for right_t in KEY_TYPES
              if family(left_t) == family(right_t) and aligned(encode(KEYS, left_t), encode(changed, right_t))]
    assert not missed, f"a changed last key passed for: {missed}"


@pytest.mark.parametrize("index", [pa.int8(), pa.int32()])
def test_unsigned_keys_beyond_int64_align_with_themselves_dictionary_encoded(index):
    """Both sides unsigned: compared as uint64, so values above int64's range stay values (not nulls)."""
    big = [2**64 - 1, 2**63, 5]
    plain = pa.array(big, pa.uint64())
    encoded = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2], index), plain)
    assert aligned(plain, encoded)
    assert not aligned(pa.array([2**64 - 1, 2**63, 6], pa.uint64()), encoded)


def test_equal_keys_under_different_dictionaries_align():
    """Both sides dictionary-encoded with the same type but each its own dictionary: the same values align."""
    left = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["x", "y"]))
    right = pa.DictionaryArray.from_arrays(pa.array([1, 0, 1], pa.int32()), pa.array(["y", "x"]))
    assert aligned(left, right)
    changed = pa.DictionaryArray.from_arrays(pa.array([1, 0, 0], pa.int32()), pa.array(["y", "x"]))
    assert not aligned(left, changed)


def test_keys_of_two_families_are_refused_with_the_fix():
    with pytest.raises(ShardError) as info:
        check_aligned(pa.table({"image_key": ["a"]}), "image_key", pa.table({"key": [1]}), "key")
    assert str(info.value) == (
        "key types differ: image_key is string, source key is int64; keys align only within one family "
        "(string, binary or integer types), never by converting values; rewrite one sidecar's key column with "
        "the other's type")
