"""Fence capabilities and what a target fence can report (section 7)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FenceCapability", "FenceObservation", "FenceStatus", "SealOutcome", "SealResult"]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceObservation:
    """A read of the fence: status plus safe evidence."""

    status: FenceStatus
    epoch: int | None = None
    intent_digest: str | None = None
    row_count: int | None = None
    content_digest: str | None = None


class SealOutcome(str, enum.Enum):
    """Result of sealing a fence at a new epoch."""

    NOT_COMMITTED = "not_committed"  # proven: the mutation did not and now cannot commit
    COMMITTED = "committed"  # the mutation committed
    FENCED = "fenced"  # the fence has an epoch at or above the caller's: caller is stale
    UNKNOWN = "unknown"  # the connector cannot prove anything


@dataclass(frozen=True, slots=True, kw_only=True)
class SealResult:
    """Outcome of ``seal`` with the observation it was based on."""

    outcome: SealOutcome
    observation: FenceObservation
