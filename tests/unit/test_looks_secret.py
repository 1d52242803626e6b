"""looks_secret: the same answers as the six original patterns, in linear time."""

from __future__ import annotations

import random
import re
import time

import pytest

from dpone.contracts.evidence import looks_secret

# The patterns as first written (one search each); the single-pass version must agree.
ORIGINAL = (
    re.compile(r"[a-z][a-z0-9+.-]*://[^/\s@]+@", re.IGNORECASE),
    re.compile(r"(?i)(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key)\s*[=:]"),
    re.compile(r"(?i)\bbearer\s+[a-z0-9._~+/=-]{8,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"(?i)[?&](x-amz-signature|signature|sig)="),
)
PIECES = [
    "a",
    "Z",
    "9",
    "+",
    ".",
    "-",
    ":",
    "/",
    "//",
    "://",
    "@",
    "?",
    "&",
    "=",
    " ",
    "\t",
    "sha256:",
    "postgresql",
    "9http",
    "user",
    "pw",
    "password",
    "Token",
    "api_key",
    "bearer ",
    "abcdefghij",
    "AKIA",
    "ABCDEFGHIJKLMNOP",
    "-----BEGIN ",
    "RSA ",
    "PRIVATE KEY-----",
    "sig",
    "X-Amz-Signature",
    "é",
    "K",
]


def _original(text: str) -> bool:
    return any(p.search(text) for p in ORIGINAL)


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://u:pw@h/db",
        "x9http://user@host",
        "PASSWORD = x",
        "Bearer abcdefghij",
        "key AKIA1234567890ABCDEF here",
        "-----BEGIN RSA PRIVATE KEY-----",
        "https://b/k?X-Amz-Signature=1",
    ],
)
def test_secrets_are_recognised(text: str) -> None:
    assert looks_secret(text)
    assert _original(text)


def test_agrees_with_the_original_patterns_on_random_text() -> None:
    rng = random.Random(20261130)
    for _ in range(1500):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
        assert looks_secret(text) == _original(text), text


def test_digests_and_long_words_are_cheap() -> None:
    digest = "sha256:" + "ab12" * 16
    assert not looks_secret(digest)
    word = "a" * 2048  # quadratic backtracking took about 100 ms here
    started = time.perf_counter()
    assert not looks_secret(word)
    assert time.perf_counter() - started < 0.02


def test_only_clean_values_are_remembered() -> None:
    from dpone.contracts import evidence

    dsn = "postgresql://u:Canary-7f3a@h/db"
    assert looks_secret(dsn)
    assert looks_secret(dsn)
    assert dsn not in evidence._CLEAN
    assert not looks_secret("orders-2026")
    assert "orders-2026" in evidence._CLEAN
    assert not looks_secret("orders-2026")


def _one_key_at_a_time(values: dict[str, object], allowed: frozenset[str]) -> object:
    """safe_mapping as first written: the first offending key's message, else the values."""
    for key, value in values.items():
        if key not in allowed:
            return f"evidence key {key!r} is not on the allow-list"
        if value is not None and not isinstance(value, str | int | float | bool):
            return f"evidence value for {key!r} must be a scalar"
        if isinstance(value, str):
            if len(value) > 2048:
                return f"evidence value for {key!r} is too long"
            if _original(value):
                return f"evidence value for {key!r} looks like a secret and was refused"
    return values


class _Text(str):
    pass


class _Count(int):
    pass


def test_safe_mapping_agrees_with_the_check_one_key_at_a_time() -> None:
    """The fast path (plain types, texts found clean before) refuses and keeps the same."""
    from dpone.contracts.evidence import EVIDENCE_KEYS, safe_mapping
    from dpone.errors import UnsafeValue

    rng = random.Random(20261130)
    keys = ["reason", "owner", "row_count", "table", "mode", "not_allowed"]
    for _ in range(3000):
        values: dict[str, object] = {}
        for key in rng.sample(keys, rng.randint(1, len(keys))):
            roll = rng.random()
            if roll < 0.5:
                text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8)))
                values[key] = _Text(text) if rng.random() < 0.1 else text
            elif roll < 0.6:
                values[key] = "x" * rng.choice([2048, 2049])
            elif roll < 0.8:
                values[key] = rng.choice([0, -1, 2.5, True, None, _Count(3)])
            else:
                values[key] = rng.choice([[1], {"a": 1}, b"bytes"])
        expected = _one_key_at_a_time(values, EVIDENCE_KEYS)
        for _twice in range(2):  # the second time the clean texts are remembered
            try:
                got: object = dict(safe_mapping(values))
            except UnsafeValue as exc:
                got = exc.message
            assert got == expected, values


def test_a_mapping_checked_once_is_checked_again_against_another_allow_list() -> None:
    """A mapping safe_mapping made passes again without a copy, but only for its keys."""
    from dpone.contracts.evidence import EVIDENCE_KEYS, safe_mapping
    from dpone.errors import UnsafeValue

    made = safe_mapping({"owner": "host:1", "row_count": 3})
    assert safe_mapping(made) is made
    assert safe_mapping(made, allowed=frozenset({"owner", "row_count"})) is made
    with pytest.raises(UnsafeValue, match="row_count"):
        safe_mapping(made, allowed=frozenset({"owner"}))
    # a read-only view of a dict someone else holds is checked every time
    from types import MappingProxyType

    held = {"reason": "fine"}
    view = MappingProxyType(held)
    assert dict(safe_mapping(view, allowed=EVIDENCE_KEYS)) == held
    held["reason"] = "password=hunter2"
    with pytest.raises(UnsafeValue, match="secret"):
        safe_mapping(view)


def test_identities_in_a_derived_shape_and_any_other_get_the_same_answer() -> None:
    """check_identity's shape shortcut accepts only what the full checks accept."""
    from dpone.adapters.journal._rules import check_identity
    from dpone.errors import UnsafeValue

    def full(value: str) -> bool:
        return bool(value) and len(value) <= 256 and value.isprintable() and not _original(value)

    digest = "sha256:" + "0123456789abcdef" * 4
    rng = random.Random(7)
    candidates = [
        digest,
        "op:" + digest,
        "run-" + "a1" * 10,
        digest.upper(),
        digest + "\n",
        "op:" + digest + "@x",
        "run-" + "a1" * 10 + "://u:p@h",
        "sha256:" + "g" * 64,
        "",
        "password=" + digest,
    ]
    candidates += [
        "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 10))) for _ in range(500)
    ]
    for value in candidates:
        try:
            ok = check_identity("operation_id", value) == value
        except UnsafeValue:
            ok = False
        assert ok == full(value), value
