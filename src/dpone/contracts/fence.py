"""Fence capabilities and what a target fence can report (section 7)."""

from __future__ import annotations

import enum

import msgspec

from dpone.errors import FencedOut, IntentConflict

__all__ = [
    "FenceCapability",
    "FenceObservation",
    "FenceStatus",
    "SealOutcome",
    "SealResult",
    "committed_fence",
    "require_prepared",
]


class FenceCapability(str, enum.Enum):
    """How a connector proves whether an operation's mutation committed."""

    TRANSACTIONAL_MARKER = "transactional_marker"
    STAGING_GENERATION = "staging_generation"
    IDEMPOTENCY_KEY = "idempotency_key"
    NONE = "none"

    @property
    def recoverable(self) -> bool:
        """True when the capability allows automatic recovery after a crash."""
        return self is not FenceCapability.NONE


class FenceStatus(str, enum.Enum):
    """What the target says about one operation."""

    ABSENT = "absent"
    PREPARED = "prepared"
    COMMITTED = "committed"
    UNKNOWN = "unknown"  # the connector cannot tell (capability none)


class FenceObservation(msgspec.Struct, frozen=True, kw_only=True):
    """A read of the fence: status plus safe evidence."""

    status: FenceStatus
    epoch: int | None = None
    intent_digest: str | None = None
    row_count: int | None = None
    content_digest: str | None = None


def require_prepared(
    current: FenceObservation, *, operation_id: str, intent_digest: str, epoch: int
) -> None:
    """Refuse a write unless the locked fence is PREPARED at ``epoch`` for this intent.

    Every transactional-marker connector asks this under its fence lock, before any row.
    """
    if current.status is not FenceStatus.PREPARED or current.epoch != epoch:
        at = f" at epoch {current.epoch}" if current.epoch is not None else ""
        raise FencedOut(
            f"the fence is {current.status.value}{at}, not prepared at this "
            f"executor's epoch {epoch}; nothing was written",
            operation_id=operation_id,
        )
    if current.intent_digest not in (None, intent_digest):
        raise IntentConflict(
            "the fence was prepared for another intent digest; nothing was written",
            operation_id=operation_id,
        )


def committed_fence(
    locked: FenceObservation, *, row_count: int, content_digest: str
) -> FenceObservation:
    """The fence row a mutation's commit leaves, from the row it locked and what it wrote.

    ``locked`` is the row as ``require_prepared`` accepted it under the lock; the commit
    statement changes only the state, the row count and the content digest. Report it
    only once the commit is acknowledged (``MutationReport.committed``).
    """
    return FenceObservation(
        status=FenceStatus.COMMITTED,
        epoch=locked.epoch,
        intent_digest=locked.intent_digest,
        row_count=row_count,
        content_digest=content_digest,
    )


class SealOutcome(str, enum.Enum):
    """Result of sealing a fence at a new epoch."""

    NOT_COMMITTED = "not_committed"  # proven: the mutation did not and now cannot commit
    COMMITTED = "committed"  # the mutation committed
    FENCED = "fenced"  # the fence has an epoch at or above the caller's: caller is stale
    UNKNOWN = "unknown"  # the connector cannot prove anything


class SealResult(msgspec.Struct, frozen=True, kw_only=True):
    """Outcome of ``seal`` with the observation it was based on."""

    outcome: SealOutcome
    observation: FenceObservation
