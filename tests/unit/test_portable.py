"""Values a SQL or Parquet source hands to connectors: plain scalars, the rest as text."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

from dpone.adapters.sources.sql import portable_batch


def test_plain_columns_pass_and_others_become_text() -> None:
    """Ints, floats, text, bools and NULL untouched; moments UTC text; decimals exact."""
    plus2 = timezone(timedelta(hours=2))
    rows = [
        (1, "a", datetime(2026, 11, 1, 12, 0, tzinfo=plus2), Decimal("1.10"), date(2026, 1, 2)),
        (2, None, None, None, None),
        (3, "c", datetime(2026, 11, 1, 1, 2, 3, 4), Decimal("7"), b"\x01\xff"),
    ]
    assert portable_batch(rows) == [
        (1, "a", "2026-11-01 10:00:00+00:00", "1.10", "2026-01-02"),
        (2, None, None, None, None),
        (3, "c", "2026-11-01 01:02:03.000004+00:00", "7", "01ff"),
    ]


def test_a_batch_of_plain_values_is_returned_as_tuples() -> None:
    """No conversion pass when every column is plain."""
    assert portable_batch([[1, 2.5, "x", True]]) == [(1, 2.5, "x", True)]
    assert portable_batch([(datetime(2026, 1, 1, tzinfo=UTC),)]) == [("2026-01-01 00:00:00+00:00",)]
