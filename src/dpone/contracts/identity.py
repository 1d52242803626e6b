"""Operation identity and intent digest: canonical encoding, no per-try values (section 4)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NewType

import msgspec

from dpone.errors import ConfigInvalid, UnsafeValue

__all__ = [
    "CLI_DAG_ID",
    "IDENTITY_VERSION",
    "IntentDigest",
    "Interval",
    "OperationId",
    "canonical_json",
    "derive_intent_digest",
    "derive_operation_id",
    "digest_of",
    "is_operation_id",
    "parse_interval",
]

OperationId = NewType("OperationId", str)
IntentDigest = NewType("IntentDigest", str)

IDENTITY_VERSION = 1
#: dag_id / dag_run_logical_identity used when an operation is started outside Airflow.
CLI_DAG_ID = "-"

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_MAX_FIELD = 1024
# Values that vary per try, per process or per call; none may enter an identity.
_UUID_RE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[14][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", re.IGNORECASE
)
# a try marker needs a separator before the number ("try_number=2", "attempt-3"), so a
# directory called "try1" or a word like "retry" is not mistaken for one
_TRY_RE = re.compile(r"(?i)(?:^|[^a-z])(?:try|attempt)(?:[ _-]?(?:number|num|no))?[ _=:#-]+\d+")
_POD_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?-[a-z0-9]{8,10}-[a-z0-9]{5}$")
_NOW_RE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}\.\d+")
_PID_RE = re.compile(r"(?i)(?:^|[^a-z])pid\s*[=:]\s*\d+")


# What ``json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False)`` builds on every call (the encoder keeps no state between calls), made
# once: the same encoder, so the same bytes (tests/unit/test_identity_pins.py pins them).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(fields: Mapping[str, object]) -> bytes:
    """Encode ``fields`` plus ``"v": 1`` as UTF-8 JSON, sorted keys, no insignificant space."""
    return _CANONICAL.encode({**fields, "v": IDENTITY_VERSION}).encode("utf-8")


def digest_of(fields: Mapping[str, object]) -> str:
    """Return ``sha256:<hex>`` of the canonical encoding of ``fields``."""
    return "sha256:" + hashlib.sha256(canonical_json(fields)).hexdigest()


def is_operation_id(value: str) -> bool:
    """Return True when ``value`` has the form ``sha256:<64 lowercase hex>``."""
    return bool(_DIGEST_RE.match(value))


def _check_stable(name: str, value: str) -> str:
    if not isinstance(value, str):
        raise UnsafeValue(f"identity field {name!r} must be a string", field=name)
    return _check_stable_text(name, value)


@functools.lru_cache(maxsize=1024)
def _check_stable_text(name: str, value: str) -> str:
    # cached: a Runner derives many operations from the same few values (a refusal
    # raises and is not cached), and the pattern checks cost more than the digest
    if not value or len(value) > _MAX_FIELD or any(ord(c) < 32 for c in value):
        raise UnsafeValue(
            f"identity field {name!r} must be 1-{_MAX_FIELD} printable characters",
            field=name,
        )
    checks = [
        (_UUID_RE, "a random or time-based UUID"),
        (_NOW_RE, "a current time with sub-second precision"),
    ]
    if name != "canonical_target_identity":
        # a target location is a path or URL the user chose; words in it are not markers
        checks += [
            (_TRY_RE, "a try or attempt number"),
            (_PID_RE, "a process id"),
            (_POD_RE, "a Kubernetes pod name"),
        ]
    for pattern, what in checks:
        if pattern.search(value):
            raise UnsafeValue(
                f"identity field {name!r} looks like {what}; an operation identity must be "
                "the same on every try, so it may not contain per-try, per-host or random values",
                field=name,
                hint="derive the field from the logical run (DAG run logical date, interval)",
            )
    return value


class Interval(msgspec.Struct, frozen=True, kw_only=True):
    """A half-open UTC interval ``[start, end)``."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ConfigInvalid("interval bounds must carry a time zone", field="interval")
        if self.end <= self.start:
            raise ConfigInvalid(
                "interval end must be after its start (half-open [start, end))",
                field="interval",
                hint="write --interval START/END with START < END",
            )

    def canonical(self) -> str:
        """Return ``start/end`` in ISO-8601 UTC with a ``Z`` suffix."""
        # keyed on the UTC instants: two equal aware datetimes in one zone may still be
        # different instants (``fold``, the repeated hour when clocks go back)
        return _canonical(self.start.astimezone(UTC), self.end.astimezone(UTC))

    def contains(self, moment: datetime) -> bool:
        """Return True when ``moment`` lies in ``[start, end)``."""
        return self.start <= moment < self.end


@functools.lru_cache(maxsize=256)
def _canonical(start: datetime, end: datetime) -> str:
    # cached: a Runner's operations share a few intervals and each operation renders its
    # own twice (identity, metadata). Called with UTC datetimes only: equal UTC
    # datetimes are the same instant (UTC has no fold), and the text depends on it only.
    return f"{_iso(start)}/{_iso(end)}"


def _iso(moment: datetime) -> str:
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}"
    return text + "Z"


def _parse_moment(text: str) -> datetime:
    raw = text.strip()
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ConfigInvalid(
            f"interval bound {raw!r} is not an ISO-8601 date or time",
            field="interval",
            hint="use e.g. 2026-11-01/2026-11-02 or 2026-11-01T00:00:00Z/2026-11-01T06:00:00Z",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def parse_interval(text: str) -> Interval:
    """Parse ``START/END`` (ISO dates or times; naive means UTC) into an :class:`Interval`."""
    if not isinstance(text, str) or text.count("/") != 1:
        raise ConfigInvalid(
            f"interval {text!r} must be START/END",
            field="interval",
            hint="use e.g. --interval 2026-11-01/2026-11-02",
        )
    start_text, end_text = text.split("/")
    return Interval(start=_parse_moment(start_text), end=_parse_moment(end_text))


def derive_operation_id(
    *,
    release_id: str,
    deployment_id: str,
    dag_id: str,
    dag_run_logical_identity: str,
    workload_id: str,
    mapped_partition_identity: str,
    canonical_interval: Interval,
    canonical_target_identity: str,
) -> OperationId:
    """Return the operation id: the same for every try of one logical load.

    There is deliberately no parameter for a try number, host, pod, correlation id,
    current time or random value; values that look like one raise ``UnsafeValue``.
    """
    fields = {
        "release_id": release_id,
        "deployment_id": deployment_id,
        "dag_id": dag_id,
        "dag_run_logical_identity": dag_run_logical_identity,
        "workload_id": workload_id,
        "mapped_partition_identity": mapped_partition_identity,
        "canonical_target_identity": canonical_target_identity,
    }
    checked: dict[str, object] = {k: _check_stable(k, v) for k, v in fields.items()}
    if not isinstance(canonical_interval, Interval):
        raise UnsafeValue("canonical_interval must be an Interval", field="canonical_interval")
    checked["canonical_interval"] = canonical_interval.canonical()
    return OperationId(digest_of(checked))


def derive_intent_digest(
    *,
    pack_fingerprint: str,
    normalized_load_strategy: str,
    source_snapshot_identity: str,
    target_contract: str,
    schema_fingerprint: str,
) -> IntentDigest:
    """Return the digest of exactly what the operation will write."""
    fields = {
        "pack_fingerprint": pack_fingerprint,
        "normalized_load_strategy": normalized_load_strategy,
        "source_snapshot_identity": source_snapshot_identity,
        "target_contract": target_contract,
        "schema_fingerprint": schema_fingerprint,
    }
    for name, value in fields.items():
        if not isinstance(value, str) or not value:
            raise UnsafeValue(f"intent field {name!r} must be a non-empty string", field=name)
    return IntentDigest(digest_of(fields))
