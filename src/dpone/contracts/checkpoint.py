"""Checkpoints (high watermarks) of incremental streams: pure data and the promotion rule.

A *stream* is one workload's incremental feed into one target, per partition. Its
watermark ``W`` means: every interval in ``[origin, W)`` is COMPLETE in the target. The
watermark moves only when an operation becomes COMPLETE, in the same control-plane
transaction as that transition, and only contiguously: a completed interval that starts
after ``W`` is remembered but does not move ``W`` until the gap before it is complete.

Moments are integer microseconds since the Unix epoch (UTC): exact, comparable in SQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import msgspec

from dpone.contracts.identity import Interval, digest_of

__all__ = [
    "Checkpoint",
    "CheckpointAdvance",
    "advance_watermark",
    "from_micros",
    "next_claim",
    "stream_id",
    "to_micros",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(moment: datetime) -> int:
    """Return ``moment`` (time-zone aware) as whole microseconds since the Unix epoch."""
    delta = moment.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    """Return the UTC moment ``value`` microseconds after the Unix epoch."""
    return _EPOCH + timedelta(microseconds=int(value))


def stream_id(*, workload_id: str, deployment_id: str, partition: str, target_identity: str) -> str:
    """Return the stream's ``sha256:`` id; a new release continues the same stream."""
    return digest_of(
        {
            "workload_id": workload_id,
            "deployment_id": deployment_id,
            "partition": partition,
            "target_identity": target_identity,
        }
    )


class CheckpointAdvance(msgspec.Struct, frozen=True, kw_only=True):
    """What a completing operation contributes to its stream's checkpoint."""

    stream_id: str
    workload_id: str
    partition: str
    target_identity: str
    origin: int  # the stream's configured start, used when the stream has no row yet
    start: int
    end: int

    @classmethod
    def of(
        cls,
        *,
        stream: str,
        workload_id: str,
        partition: str,
        target_identity: str,
        origin: datetime,
        interval: Interval,
    ) -> CheckpointAdvance:
        """Build the advance of one operation's interval."""
        return cls(
            stream_id=stream,
            workload_id=workload_id,
            partition=partition,
            target_identity=target_identity,
            origin=to_micros(origin),
            start=to_micros(interval.start),
            end=to_micros(interval.end),
        )


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A stream's checkpoint as stored in the journal."""

    stream_id: str
    workload_id: str
    partition: str
    target_identity: str
    origin: int
    watermark: int
    operation_id: str | None  # the operation whose completion last moved the watermark
    pending: int  # completed intervals beyond a gap (waiting for an earlier interval)
    claim_start: int | None  # the next interval handed out (reused until it completes)
    claim_end: int | None
    updated_at: float

    def as_dict(self) -> dict[str, object]:
        """Return a JSON-ready view with ISO-8601 moments."""
        return {
            "stream_id": self.stream_id,
            "workload_id": self.workload_id,
            "partition": self.partition,
            "target_identity": self.target_identity,
            "origin": _iso(self.origin),
            "watermark": _iso(self.watermark),
            "operation_id": self.operation_id,
            "pending_intervals": self.pending,
            "next_interval": (
                None
                if self.claim_start is None or self.claim_end is None
                else f"{_iso(self.claim_start)}/{_iso(self.claim_end)}"
            ),
            "updated_at": self.updated_at,
        }


def _iso(value: int) -> str:
    return Interval(start=from_micros(value), end=from_micros(value + 1)).canonical().split("/")[0]


def advance_watermark(watermark: int, completed: Iterable[tuple[int, int]]) -> int:
    """Return the watermark after chaining completed ``(start, end)`` intervals onto it.

    An interval extends the watermark when it starts at or before it and ends after it;
    intervals beyond a gap leave it where it is. Absolute and monotonic: applying the
    same intervals twice gives the same watermark, never a smaller one.
    """
    ordered = sorted(completed)
    moved = True
    while moved:
        moved = False
        for start, end in ordered:
            if start <= watermark < end:
                watermark = end
                moved = True
    return watermark


def next_claim(
    *, watermark: int, claim_start: int | None, claim_end: int | None, proposed_end: int
) -> tuple[int, int] | None:
    """Return the stream's next interval ``(start, end)``, or None when nothing is due.

    The recorded claim wins while it still starts at the watermark (a retry must load
    exactly the same interval); otherwise ``[watermark, proposed_end)``.
    """
    if claim_start == watermark and claim_end is not None and claim_end > watermark:
        return (claim_start, claim_end)
    if proposed_end <= watermark:
        return None
    return (watermark, proposed_end)
