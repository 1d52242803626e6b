"""Resumable delivery to REST bulk receivers: states, records and results (section 14).

A delivery is one operation whose mutation is an asynchronous job at a remote
receiver. Its life in the control plane (``DELIVERY_TRANSITIONS`` is the table)::

    STAGED | RETRY_WAIT -> SUBMITTING -> ACCEPTED -> REMOTE_SUCCEEDED -> COMPLETE
    SUBMITTING -> RETRY_WAIT | SUBMIT_UNKNOWN | REJECTED
    SUBMIT_UNKNOWN -> ACCEPTED | SUBMITTING | BLOCKED
    ACCEPTED -> REMOTE_FAILED | REMOTE_CANCELLED

- STAGED: the payload authority (file, digest, size, rows, chunking) is durable.
- SUBMITTING: capacity reserved and an attempt appended in the same transaction.
- RETRY_WAIT: a failure proven to be before acceptance; ``due_at`` says when to retry.
- SUBMIT_UNKNOWN: the submit got no conclusive answer; reconciled by key lookup.
- ACCEPTED: the receipt is durable; observed with GET until the job is terminal.
- BLOCKED: an operator must decide (e.g. a receiver without key lookup).

Capacity is held from SUBMITTING through ACCEPTED, SUBMIT_UNKNOWN and BLOCKED, and
released at a terminal remote state, at RETRY_WAIT and at REJECTED (both proven
not accepted).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CAPACITY_HOLDING",
    "DELIVERY_TRANSITIONS",
    "BlockReason",
    "DeliveryBlocked",
    "DeliveryCompleted",
    "DeliveryPending",
    "DeliveryRecord",
    "DeliveryRegistration",
    "DeliveryResult",
    "DeliveryState",
    "DeliveryStep",
    "JobObservation",
    "KeyLookup",
    "LookupAbsent",
    "LookupFound",
    "LookupUnsupported",
    "PayloadRef",
    "RemoteStatus",
    "SubmitAccepted",
    "SubmitInconclusive",
    "SubmitOutcome",
    "SubmitRefused",
]


class RemoteStatus(str, enum.Enum):
    """A remote job's status as the receiver reports it."""

    ACCEPTED = "accepted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True when the job will not change any more."""
        return self in (RemoteStatus.SUCCEEDED, RemoteStatus.FAILED, RemoteStatus.CANCELLED)


class DeliveryState(str, enum.Enum):
    """Where a delivery stands in the control plane; values equal names."""

    STAGED = "STAGED"
    SUBMITTING = "SUBMITTING"
    RETRY_WAIT = "RETRY_WAIT"
    SUBMIT_UNKNOWN = "SUBMIT_UNKNOWN"
    ACCEPTED = "ACCEPTED"
    REMOTE_SUCCEEDED = "REMOTE_SUCCEEDED"
    COMPLETE = "COMPLETE"
    REMOTE_FAILED = "REMOTE_FAILED"
    REMOTE_CANCELLED = "REMOTE_CANCELLED"
    REJECTED = "REJECTED"
    BLOCKED = "BLOCKED"


D = DeliveryState

#: Every move the control plane accepts (self-moves record observations and bumps).
DELIVERY_TRANSITIONS: Mapping[DeliveryState, frozenset[DeliveryState]] = {
    D.STAGED: frozenset({D.SUBMITTING, D.BLOCKED}),
    D.RETRY_WAIT: frozenset({D.SUBMITTING, D.BLOCKED}),
    D.SUBMITTING: frozenset(
        {D.ACCEPTED, D.RETRY_WAIT, D.SUBMIT_UNKNOWN, D.REJECTED, D.REMOTE_SUCCEEDED}
        | {D.REMOTE_FAILED, D.REMOTE_CANCELLED}
    ),
    # SUBMITTING again: the key lookup proved no job exists; the same key is sent again
    # (the receiver dedupes by key, so a late original cannot make a second job)
    D.SUBMIT_UNKNOWN: frozenset(
        {D.ACCEPTED, D.SUBMITTING, D.BLOCKED, D.SUBMIT_UNKNOWN}
        | {D.REMOTE_SUCCEEDED, D.REMOTE_FAILED, D.REMOTE_CANCELLED}
    ),
    D.ACCEPTED: frozenset(
        {D.ACCEPTED, D.REMOTE_SUCCEEDED, D.REMOTE_FAILED, D.REMOTE_CANCELLED, D.BLOCKED}
    ),
    D.REMOTE_SUCCEEDED: frozenset({D.COMPLETE}),
    D.COMPLETE: frozenset(),
    D.REMOTE_FAILED: frozenset(),
    D.REMOTE_CANCELLED: frozenset(),
    D.REJECTED: frozenset(),
    D.BLOCKED: frozenset(),
}

#: States in which the delivery may hold one capacity slot of its receiver. A slot is
#: taken only on the move to SUBMITTING (the start of an attempt) and kept through these
#: states; a delivery blocked before anything was sent (STAGED or RETRY_WAIT -> BLOCKED)
#: holds none.
CAPACITY_HOLDING: frozenset[DeliveryState] = frozenset(
    {D.SUBMITTING, D.SUBMIT_UNKNOWN, D.ACCEPTED, D.BLOCKED}
)


class BlockReason(str, enum.Enum):
    """Why a delivery needs an operator."""

    KEY_LOOKUP_UNSUPPORTED = "key_lookup_unsupported"
    RECEIPT_CONFLICT = "receipt_conflict"
    PAYLOAD_CHANGED = "payload_changed"
    SUBMIT_REJECTED = "submit_rejected"
    REMOTE_FAILED = "remote_failed"
    REMOTE_CANCELLED = "remote_cancelled"
    RECEIPT_UNKNOWN = "receipt_unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadRef:
    """The payload authority: a staged file identified by its content digest."""

    path: str
    digest: str  # sha256:<hex> of the file's bytes
    size_bytes: int
    rows: int
    chunk_bytes: int  # uploads send the file in chunks of at most this many bytes

    @property
    def chunk_count(self) -> int:
        """How many chunks the upload sends (0 for an empty payload)."""
        return -(-self.size_bytes // self.chunk_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryRecord:
    """One delivery's durable record. Times are seconds since the epoch, store clock."""

    operation_id: str
    intent_digest: str
    state: DeliveryState
    version: int
    receiver: str  # receiver identity (capacity key): kind + normalized URL, no credentials
    receiver_url: str
    credential_ref: str | None  # "env:NAME" or "file:PATH", never a value
    payload: PayloadRef
    attempts: int
    receipt: str | None
    remote_status: RemoteStatus | None
    rows_processed: int | None
    due_at: float | None  # RETRY_WAIT: not before this time
    next_check_at: float | None  # ACCEPTED: when to observe next
    lease_owner: str | None  # SUBMITTING: the process sending the submit
    lease_expires_at: float | None
    block_reason: BlockReason | None
    detail: str | None  # a safe, short explanation of the last decision
    created_at: float
    updated_at: float
    parent_id: str | None = None  # a child job of a split delivery: its parent's operation id
    child_index: int | None = None  # 0, 1, ...: children run strictly one after another


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryRegistration:
    """What ``register_all`` records for one delivery (a child of a split one, usually)."""

    operation_id: str
    intent_digest: str
    receiver: str
    receiver_url: str
    credential_ref: str | None
    payload: PayloadRef
    parent_id: str | None = None
    child_index: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobObservation:
    """One read of a remote job (GET), without side effects."""

    receipt: str
    status: RemoteStatus
    payload_digest: str | None = None
    rows_total: int | None = None
    rows_processed: int | None = None
    rows_failed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryStep:
    """One control-plane write: a move plus what it records, all in one transaction."""

    to_state: DeliveryState
    detail: str | None = None
    start_attempt: bool = False  # append an attempt (and reserve capacity if not held)
    attempt_outcome: str | None = None  # close the open attempt with this outcome
    http_status: int | None = None
    receipt: str | None = None
    receipt_source: Literal["submit", "lookup"] | None = None
    observation: JobObservation | None = None
    due_in_s: float | None = None
    next_check_in_s: float | None = None
    lease_owner: str | None = None
    lease_ttl_s: float | None = None
    block_reason: BlockReason | None = None


# ---------------------------------------------------------------- sink answers
@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitAccepted:
    """The receiver accepted (or had already accepted) the job under the key."""

    observation: JobObservation
    replayed: bool
    http_status: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRefused:
    """The receiver answered before accepting anything: transient (503, 429) or not (4xx)."""

    transient: bool
    http_status: int | None  # None: the connection was never made
    reason: str  # a short safe code, e.g. "unavailable", "idempotency_key_reused"
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitInconclusive:
    """No conclusive answer (timeout, cut connection, 5xx): the job may or may not exist."""

    reason: str


SubmitOutcome = SubmitAccepted | SubmitRefused | SubmitInconclusive


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupFound:
    """The receiver knows jobs under the key (normally one)."""

    jobs: tuple[JobObservation, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupAbsent:
    """The receiver has no job under the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupUnsupported:
    """The receiver cannot answer "what happened to key K"."""

    http_status: int


KeyLookup = LookupFound | LookupAbsent | LookupUnsupported


# ---------------------------------------------------------------- results
@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryCompleted:
    """The remote job succeeded and the delivery is COMPLETE."""

    operation_id: str
    receipt: str
    rows: int | None
    replayed: bool  # True: it was COMPLETE before this call


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryPending:
    """The receipt is durable and the job is not terminal yet: check again later."""

    operation_id: str
    continuation: Literal["poll_receipt"]
    next_check_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryBlocked:
    """An operator must decide; nothing more happens automatically."""

    operation_id: str
    state: DeliveryState
    reason: BlockReason
    message: str
    recovery_ref: str


DeliveryResult = DeliveryCompleted | DeliveryPending | DeliveryBlocked
