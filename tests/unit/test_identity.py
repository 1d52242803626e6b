"""Identity: canonical encoding, determinism, sensitivity, and no per-try values."""

from __future__ import annotations

import inspect
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpone.contracts.identity import (
    Interval,
    canonical_json,
    derive_intent_digest,
    derive_operation_id,
    digest_of,
    is_operation_id,
    parse_interval,
)
from dpone.errors import ConfigInvalid, UnsafeValue

moments = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
OP_FIELDS = (
    "release_id",
    "deployment_id",
    "dag_id",
    "dag_run_logical_identity",
    "workload_id",
    "mapped_partition_identity",
    "canonical_target_identity",
)
INTENT_FIELDS = (
    "pack_fingerprint",
    "normalized_load_strategy",
    "source_snapshot_identity",
    "target_contract",
    "schema_fingerprint",
)


def _stable(value: str) -> bool:
    fields: dict[str, object] = dict.fromkeys(OP_FIELDS, value)
    fields["canonical_interval"] = parse_interval("2026-11-01/2026-11-02")
    try:
        derive_operation_id(**fields)  # type: ignore[arg-type]
    except UnsafeValue:
        return False
    return True


# printable text, digits and symbols included; a rare draw that looks per-try is dropped
safe_text = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=24
).filter(_stable)


@st.composite
def op_fields(draw: st.DrawFn) -> dict[str, object]:
    fields: dict[str, object] = {name: draw(safe_text) for name in OP_FIELDS}
    start = draw(moments)
    fields["canonical_interval"] = Interval(
        start=start, end=start + timedelta(seconds=draw(st.integers(1, 10**7)))
    )
    return fields


@given(op_fields())
def test_operation_id_is_deterministic(fields: dict[str, object]) -> None:
    """The same fields give the same id, in the sha256:<hex> form."""
    first = derive_operation_id(**fields)  # type: ignore[arg-type]
    again = derive_operation_id(**dict(reversed(list(fields.items()))))  # type: ignore[arg-type]
    assert first == again
    assert is_operation_id(first)


@given(st.dictionaries(safe_text, safe_text, min_size=1, max_size=8))
def test_canonical_encoding_ignores_mapping_order(mapping: dict[str, str]) -> None:
    """Insertion order of a mapping never changes its digest."""
    reordered = dict(sorted(mapping.items(), reverse=True))
    assert canonical_json(mapping) == canonical_json(reordered)
    assert digest_of(mapping) == digest_of(reordered)


def test_canonical_encoding_shape() -> None:
    """UTF-8 JSON, sorted keys, no white space, with v=1."""
    assert canonical_json({"b": "é", "a": "x"}) == '{"a":"x","b":"é","v":1}'.encode()
    assert json.loads(canonical_json({"a": "x"}))["v"] == 1


@given(op_fields(), st.sampled_from((*OP_FIELDS, "canonical_interval")), safe_text)
def test_every_operation_field_changes_the_id(
    fields: dict[str, object], name: str, replacement: str
) -> None:
    """Changing any one identity field changes the operation id."""
    changed = dict(fields)
    if name == "canonical_interval":
        interval = fields[name]
        assert isinstance(interval, Interval)
        changed[name] = Interval(start=interval.start, end=interval.end + timedelta(seconds=1))
    else:
        if replacement == fields[name]:
            replacement += "x"
        changed[name] = replacement
    assert derive_operation_id(**fields) != derive_operation_id(**changed)  # type: ignore[arg-type]


@given(
    st.fixed_dictionaries({name: safe_text for name in INTENT_FIELDS}),
    st.sampled_from(INTENT_FIELDS),
    safe_text,
)
def test_every_intent_field_changes_the_digest(
    fields: dict[str, str], name: str, replacement: str
) -> None:
    """Changing any one intent field changes the intent digest."""
    changed = dict(fields)
    changed[name] = replacement if replacement != fields[name] else replacement + "x"
    assert derive_intent_digest(**fields) != derive_intent_digest(**changed)


def test_builder_has_no_parameter_for_per_try_values() -> None:
    """The signature admits only the logical identity fields."""
    params = set(inspect.signature(derive_operation_id).parameters)
    assert params == set(OP_FIELDS) | {"canonical_interval"}
    for forbidden in ("try_number", "attempt", "host", "hostname", "pod", "now", "uuid", "seed"):
        assert forbidden not in params
    with pytest.raises(TypeError):
        derive_operation_id(try_number=2)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dag_run_logical_identity", "9b2f7c1e-4a3d-4f6b-9c2d-1e5f8a7b6c4d"),  # random uuid4
        ("mapped_partition_identity", "try_number=2"),
        ("mapped_partition_identity", "attempt-3"),
        ("deployment_id", "worker-7d9f8b6c5d-x2x7k"),  # a Kubernetes pod name
        ("dag_run_logical_identity", "2026-11-30T07:16:21.123456"),  # now() with microseconds
        ("workload_id", "orders pid=4242"),
    ],
)
def test_values_that_look_per_try_are_refused(field: str, value: str) -> None:
    """A try number, pod, pid, random UUID or current time cannot enter the identity."""
    fields: dict[str, object] = {name: "stable" for name in OP_FIELDS}
    fields["canonical_interval"] = parse_interval("2026-11-01/2026-11-02")
    fields[field] = value
    with pytest.raises(UnsafeValue) as caught:
        derive_operation_id(**fields)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("canonical_target_identity", "sqlite:/data/try1/wh.db#orders"),
        ("canonical_target_identity", "sqlite:/data/try-1/attempt_2/wh.db#orders"),
        ("deployment_id", "pid-7"),
        ("workload_id", "retry_queue"),
        ("mapped_partition_identity", "tenant=eu-1"),
    ],
)
def test_ordinary_names_are_not_mistaken_for_per_try_values(field: str, value: str) -> None:
    """Directory names, words containing 'try' and tenant ids are legitimate values."""
    fields: dict[str, object] = dict.fromkeys(OP_FIELDS, "stable")
    fields["canonical_interval"] = parse_interval("2026-11-01/2026-11-02")
    fields[field] = value
    assert is_operation_id(derive_operation_id(**fields))  # type: ignore[arg-type]


def test_logical_dates_are_stable_values() -> None:
    """An Airflow logical date (whole seconds) is a legitimate identity value."""
    fields: dict[str, object] = {name: "stable" for name in OP_FIELDS}
    fields["dag_run_logical_identity"] = "2026-11-30T00:00:00+00:00"
    fields["canonical_interval"] = parse_interval("2026-11-01/2026-11-02")
    assert is_operation_id(derive_operation_id(**fields))  # type: ignore[arg-type]


def test_interval_parsing_and_canonical_form() -> None:
    """Naive bounds are UTC; offsets are normalised; the form is ISO Z, half-open."""
    assert parse_interval("2026-11-01/2026-11-02").canonical() == (
        "2026-11-01T00:00:00Z/2026-11-02T00:00:00Z"
    )
    assert parse_interval("2026-11-01T02:00:00+02:00/2026-11-01T06:00:00Z").canonical() == (
        "2026-11-01T00:00:00Z/2026-11-01T06:00:00Z"
    )


@given(moments, st.integers(min_value=1, max_value=10**12), st.integers(-23 * 60, 23 * 60))
def test_canonical_form_depends_on_the_instants_only(
    start: datetime, micros: int, offset_minutes: int
) -> None:
    """Rendered once and kept: an equal interval in another zone gets the same text."""
    end = start + timedelta(microseconds=micros)
    utc = Interval(start=start, end=end)
    zone = timezone(timedelta(minutes=offset_minutes))
    shifted = Interval(start=start.astimezone(zone), end=end.astimezone(zone))

    def rendered(moment: datetime) -> str:
        text = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
        micro = moment.astimezone(UTC).microsecond
        return text + (f".{micro:06d}" if micro else "") + "Z"

    expected = f"{rendered(start)}/{rendered(end)}"
    assert utc.canonical() == expected
    assert shifted.canonical() == expected
    assert utc.canonical() == expected


def test_the_repeated_hour_gives_each_interval_its_own_text() -> None:
    """Equal datetimes in one zone can be different instants (``fold``): each interval
    keeps its own text, so two windows never share an operation id."""
    from zoneinfo import ZoneInfo

    new_york = ZoneInfo("America/New_York")

    def local(hour: int) -> datetime:
        return datetime(2026, 11, 1, hour, tzinfo=UTC).astimezone(new_york)

    assert local(5) == local(6)  # 01:00 EDT and 01:00 EST compare equal in one zone
    first = Interval(start=local(5), end=local(7)).canonical()
    second = Interval(start=local(6), end=local(7)).canonical()
    assert first == "2026-11-01T05:00:00Z/2026-11-01T07:00:00Z"
    assert second == "2026-11-01T06:00:00Z/2026-11-01T07:00:00Z"


@pytest.mark.parametrize(
    "text", ["2026-11-02/2026-11-01", "2026-11-01/2026-11-01", "yesterday/today", "2026-11-01"]
)
def test_bad_or_reversed_intervals_are_config_errors(text: str) -> None:
    """A reversed, empty or unparsable interval is DPONE_CONFIG_INVALID on field interval."""
    with pytest.raises(ConfigInvalid) as caught:
        parse_interval(text)
    assert caught.value.field == "interval"
