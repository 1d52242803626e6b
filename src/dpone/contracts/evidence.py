"""Safe metadata and evidence: allow-listed keys, scalar values, nothing secret (section 11)."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import cast

from dpone.errors import UnsafeValue

__all__ = ["EVIDENCE_KEYS", "SafeMapping", "Scalar", "looks_secret", "safe_mapping"]

Scalar = str | int | float | bool | None
SafeMapping = Mapping[str, Scalar]

#: Every key that may appear in journal metadata, results, transition evidence or audit.
EVIDENCE_KEYS: frozenset[str] = frozenset(
    {
        "action",
        "attestation",
        "audit_failed",
        "audit_violations",
        "audits_failed",
        "audits_run",
        "batches",
        "capability",
        "connector",
        "content_digest",
        "dag_id",
        "dag_run",
        "deployment_id",
        "dpone_version",
        "duration_ms",
        "error_code",
        "fence_epoch",
        "fence_state",
        "interval",
        "lease_epoch",
        "mode",
        "outcome",
        "owner",
        "pack_fingerprint",
        "partition",
        "principal",
        "reason",
        "recovery_ref",
        "release_id",
        "row_count",
        "rows_skipped",
        "rows_written",
        "source_identity",
        "source_kind",
        "strategy",
        "table",
        "target_identity",
        "target_kind",
        "workload_id",
        "task_id",
        "map_index",
    }
)

_SECRET_PATTERNS = (
    # URL with user info. The scheme may only start where a run of letters starts: the
    # same matches as starting anywhere, without quadratic backtracking on long words.
    r"(?i:(?<![a-z])[a-z][a-z0-9+.-]*://[^/\s@]+@)",
    r"(?i:(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key)\s*[=:])",
    r"(?i:\bbearer\s+[a-z0-9._~+/=-]{8,})",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    r"(?i:[?&](x-amz-signature|signature|sig)=)",
)
# One pass over the text instead of one per pattern (it runs on every journal value).
_SECRET_RE = re.compile("|".join(_SECRET_PATTERNS))
# A content or identity digest (most journal values) matches none of the patterns.
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_TEXT = 2048


# Values already found clean (workload, release and target names repeat on every
# operation). Only clean values are kept, never one that looked secret.
_CLEAN: set[str] = set()
_CLEAN_MAX = 4096


def looks_secret(text: str) -> bool:
    """Return True when ``text`` looks like a credential, a DSN with a password or a signed URL."""
    if text in _CLEAN or _DIGEST_RE.fullmatch(text):
        return False
    if _SECRET_RE.search(text) is not None:
        return True
    if len(_CLEAN) >= _CLEAN_MAX:
        _CLEAN.clear()
    _CLEAN.add(text)
    return False


# The plain scalar types other than text: a value of exactly one of these (not a
# subclass) needs no check in safe_mapping's fast path.
_PLAIN = frozenset({int, float, bool, type(None)})
_EMPTY: SafeMapping = MappingProxyType({})

# Mappings safe_mapping made, by id: a read-only view of a dict no one else holds, whose
# values were checked when it was made, so checking it again (a run's provenance and
# access, on every operation of a Runner) only needs its keys against the allow-list.
# The mapping itself is kept, so its id cannot name another object while it is here.
# Least recently checked first: the many one-off mappings (each operation's metadata)
# leave first, the few checked on every operation stay.
_MADE: OrderedDict[int, SafeMapping] = OrderedDict()
_MADE_MAX = 1024


def safe_mapping(
    values: Mapping[str, object] | None, *, allowed: frozenset[str] = EVIDENCE_KEYS
) -> SafeMapping:
    """Validate and freeze ``values``: allow-listed keys, scalar values, no secrets.

    Raises:
        UnsafeValue: a key is not allowed, a value is not a scalar, too long, or looks secret.

    """
    if not values:
        return _EMPTY
    made = _MADE.get(id(values))
    if made is values:
        # made (and its values checked) here: read-only, so only the keys are new
        if allowed.issuperset(made):
            try:
                _MADE.move_to_end(id(made))
            except KeyError:  # another thread let it go just now
                pass
            return made
        return _checked(made, allowed)  # raises for the first key not allowed
    # a copy no one else holds; its values are checked below before it is handed out
    out = cast("dict[str, Scalar]", dict(values))
    # one C-level pass for the keys; then a text is checked against the texts already
    # found clean first, and a value of a plain scalar type needs nothing (anything
    # unusual, and every refusal, goes through _checked: it names the first bad key)
    if not allowed.issuperset(out):
        return _checked(values, allowed)
    for value in out.values():
        if isinstance(value, str):
            if len(value) > _MAX_TEXT or (value not in _CLEAN and looks_secret(value)):
                return _checked(values, allowed)
        elif value.__class__ not in _PLAIN:
            return _checked(values, allowed)
    made = MappingProxyType(out)
    _MADE[id(made)] = made
    if len(_MADE) > _MADE_MAX:
        try:
            _MADE.popitem(last=False)
        except KeyError:  # emptied meanwhile by other threads
            pass
    return made


def _checked(values: Mapping[str, object], allowed: frozenset[str]) -> SafeMapping:
    """``safe_mapping`` one key at a time: raises for the first offending key, in order."""
    out: dict[str, Scalar] = {}
    for key, value in values.items():
        if key not in allowed:
            raise UnsafeValue(f"evidence key {key!r} is not on the allow-list", field=key)
        if value is not None and not isinstance(value, str | int | float | bool):
            raise UnsafeValue(f"evidence value for {key!r} must be a scalar", field=key)
        if isinstance(value, str):
            if len(value) > _MAX_TEXT:
                raise UnsafeValue(f"evidence value for {key!r} is too long", field=key)
            if looks_secret(value):
                raise UnsafeValue(
                    f"evidence value for {key!r} looks like a secret and was refused", field=key
                )
        out[key] = value
    return MappingProxyType(out)
