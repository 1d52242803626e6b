"""The journal's storage encoding: canonical JSON, the same text cached or not."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from dpone.adapters.journal import _rules


def _canonical(values: dict[str, object]) -> str:
    return json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False)


@pytest.mark.parametrize(
    "values",
    [
        {"b": 1, "a": "x"},
        {"flag": True},
        {"flag": 1},
        {"n": 0.0},
        {"n": -0.0},
        {"n": 1.0},
        {"n": 1},
        {"none": None, "text": "é"},
        {},
    ],
)
def test_encoding_is_canonical_json_every_time(values: dict[str, object]) -> None:
    """Encoded twice (the second time from the cache): the canonical JSON text both times."""
    first = _rules.encode_mapping(MappingProxyType(dict(values)))
    again = _rules.encode_mapping(MappingProxyType(dict(values)))
    assert first == again == _canonical(values)


def test_values_that_compare_equal_but_encode_apart_are_not_confused() -> None:
    """True == 1 and 0.0 == -0.0 in Python, but their JSON differs: the cache keeps them apart."""
    pairs = [({"v": True}, {"v": 1}), ({"v": 0.0}, {"v": -0.0}), ({"v": 1}, {"v": 1.0})]
    for left, right in pairs:
        assert _rules.encode_mapping(MappingProxyType(left)) == _canonical(left)
        assert _rules.encode_mapping(MappingProxyType(right)) == _canonical(right)
        assert _rules.encode_mapping(MappingProxyType(left)) == _canonical(left)


def test_a_value_that_is_not_json_is_refused_cached_or_not() -> None:
    """NaN is refused (the storage rule), also after a finite value under the same key."""
    _rules.encode_mapping(MappingProxyType({"v": 1.5}))
    with pytest.raises(ValueError):
        _rules.encode_mapping(MappingProxyType({"v": float("nan")}))
