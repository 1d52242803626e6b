"""The journal's storage encoding: compact JSON with sorted keys, the same values back.

Stored mappings are storage, not identity (jsonb in PostgreSQL, text in SQLite): any
valid JSON of exactly the same values (and types: True is not 1, -0.0 is not 0.0) will
do, so the fast encoder (msgspec) writes them, not byte-for-byte the standard library's.
"""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from dpone.adapters.journal import _rules
from dpone.contracts.result import RunMode


def _canonical(values: dict[str, object]) -> str:
    return json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _exactly(value: object) -> tuple[type, str]:
    return (type(value), repr(value))


def _same_values(text: str, values: dict[str, object]) -> bool:
    """``text`` decodes to ``values``: the same keys, value types and values."""
    decoded = json.loads(text)
    return {k: _exactly(v) for k, v in decoded.items()} == {
        k: _exactly(v) for k, v in values.items()
    }


def _sorted_keys(text: str) -> bool:
    keys = json.loads(text, object_pairs_hook=lambda pairs: [k for k, _ in pairs])
    return bool(keys == sorted(keys))


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
        {"n": 1e16, "m": 1e-7, "i": 2**70},
        {},
    ],
)
def test_encoding_is_sorted_json_of_the_same_values(values: dict[str, object]) -> None:
    """Encoded twice: the same text, with sorted keys, decoding to the same values."""
    first = _rules.encode_mapping(MappingProxyType(dict(values)))
    again = _rules.encode_mapping(MappingProxyType(dict(values)))
    assert first == again
    assert _sorted_keys(first)
    assert _same_values(first, values)
    assert dict(_rules.decode_mapping(first)) == values


def test_values_that_compare_equal_but_encode_apart_are_not_confused() -> None:
    """True == 1 and 0.0 == -0.0 in Python, but their JSON differs: each keeps its own."""
    pairs = [({"v": True}, {"v": 1}), ({"v": 0.0}, {"v": -0.0}), ({"v": 1}, {"v": 1.0})]
    for left, right in pairs:
        assert _rules.encode_mapping(MappingProxyType(left)) == _canonical(left)
        assert _rules.encode_mapping(MappingProxyType(right)) == _canonical(right)
        assert _rules.encode_mapping(MappingProxyType(left)) == _canonical(left)


@pytest.mark.parametrize(
    "values",
    [
        {"mode": RunMode.ATOMIC},  # a str subclass (an enum member)
        {"text": "\ud800"},  # a lone surrogate: no UTF-8 for it
    ],
)
def test_what_msgspec_does_not_take_is_encoded_as_before(values: dict[str, object]) -> None:
    """Subclasses and text that is not UTF-8 take the standard library's encoder."""
    assert _rules.encode_mapping(MappingProxyType(dict(values))) == _canonical(values)


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_a_value_that_is_not_json_is_refused(number: float) -> None:
    """NaN and infinities are refused (the storage rule), not written as null."""
    _rules.encode_mapping(MappingProxyType({"v": 1.5}))
    with pytest.raises(ValueError):
        _rules.encode_mapping(MappingProxyType({"v": number}))
    with pytest.raises(ValueError):
        _rules.encode_mapping(MappingProxyType({"v": number, "none": None}))


def test_decoding_takes_numbers_too_large_for_a_float() -> None:
    """jsonb keeps any number: what msgspec refuses is decoded as json.loads does."""
    assert dict(_rules.decode_mapping('{"n": 1E400, "i": 123456789012345678901234567890}')) == {
        "n": float("inf"),
        "i": 123456789012345678901234567890,
    }
