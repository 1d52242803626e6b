"""The checkpoint rules as pure functions: contiguous promotion and reusable claims."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from dpone.adapters.connectors._audit import audit_queries
from dpone.contracts.audit import Audits, CustomAudit
from dpone.contracts.checkpoint import advance_watermark, from_micros, next_claim, to_micros


def test_micros_round_trip_exactly() -> None:
    """Moments survive the integer encoding to the microsecond."""
    moment = datetime(2026, 11, 1, 12, 30, 15, 123456, tzinfo=UTC)
    assert from_micros(to_micros(moment)) == moment


def test_a_gap_holds_the_watermark() -> None:
    """[2,3) completed before [1,2): the watermark waits at 1, then chains to 3."""
    assert advance_watermark(1, [(2, 3)]) == 1
    assert advance_watermark(1, [(2, 3), (1, 2)]) == 3


def test_overlapping_and_repeated_intervals_are_absolute() -> None:
    """Completing twice, or overlapping backfills, never move the watermark backwards."""
    assert advance_watermark(5, [(1, 3), (2, 6), (2, 6)]) == 6
    assert advance_watermark(9, [(1, 3)]) == 9


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 10)), max_size=12))
def test_the_watermark_is_covered_by_completed_intervals(pairs: list[tuple[int, int]]) -> None:
    """Every point below the new watermark (and at or above the old one) is covered."""
    intervals = [(start, start + length) for start, length in pairs]
    moved = advance_watermark(0, intervals)
    for point in range(moved):
        assert any(start <= point < end for start, end in intervals)


def test_a_claim_is_reused_until_the_watermark_moves() -> None:
    """A retry gets the recorded claim, whatever the clock says now."""
    assert next_claim(watermark=10, claim_start=10, claim_end=20, proposed_end=99) == (10, 20)
    assert next_claim(watermark=20, claim_start=10, claim_end=20, proposed_end=99) == (20, 99)
    assert next_claim(watermark=20, claim_start=None, claim_end=None, proposed_end=20) is None


def test_audit_queries_quote_names_and_fill_the_table() -> None:
    """Every audit is one SELECT count over the quoted table; {table} is substituted."""
    audits = Audits(
        not_null=("email",),
        unique_key=("id", "day"),
        custom=(CustomAudit(name="neg", query="SELECT id FROM {table} WHERE id < 0"),),
    )
    queries = dict(audit_queries(audits, table_sql='"main"."t"', quote=lambda n: f'"{n}"'))
    assert queries["not_null:email"] == 'SELECT count(*) FROM "main"."t" WHERE "email" IS NULL'
    assert 'GROUP BY "id", "day" HAVING count(*) > 1' in queries["unique_key:id,day"]
    assert 'FROM (SELECT id FROM "main"."t" WHERE id < 0)' in queries["sql:neg"]
