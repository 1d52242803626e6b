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
