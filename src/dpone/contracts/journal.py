"""Journal records: entries, transitions (append-only history) and audit records."""

from __future__ import annotations

import msgspec

from dpone.contracts.evidence import SafeMapping
from dpone.contracts.states import CommitState

__all__ = ["AuditRecord", "AuditRequest", "JournalEntry", "Transition", "TransitionKind"]

TransitionKind = str  # "create" | "transition" | "fold" | "lease"


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One operation's durable record. Times are seconds since the epoch, journal clock."""

    operation_id: str
    intent_digest: str
    state: CommitState
    version: int  # +1 per state write and per lease grant; never reused
    lease_owner: str | None
    lease_epoch: int  # 0 until the first lease; +1 on every acquire
    lease_expires_at: float | None
    metadata: SafeMapping
    result: SafeMapping | None
    created_at: float
    updated_at: float


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """One history row. A fold writes one row per step, all with the same version."""

    operation_id: str
    version: int
    seq: int  # order of rows within one version
    from_state: CommitState | None
    to_state: CommitState
    kind: TransitionKind
    actor: str
    lease_epoch: int
    evidence: SafeMapping
    at: float


class AuditRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What an operator action asks the journal to record with its state change."""

    principal: str
    action: str
    reason: str
    attestation: str | None = None


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An audited operator action: who, when, what, before and after."""

    operation_id: str
    principal: str
    action: str
    reason: str
    attestation: str | None
    before_state: CommitState | None
    after_state: CommitState | None
    before_version: int | None
    after_version: int | None
    outcome: str  # "applied" | "refused"
    at: float
