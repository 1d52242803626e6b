"""Rules every delivery store applies the same way: checks and the row a step produces."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from dpone.contracts.delivery import (
    CAPACITY_HOLDING,
    DELIVERY_TRANSITIONS,
    BlockReason,
    DeliveryRecord,
    DeliveryState,
    DeliveryStep,
    PayloadRef,
    RemoteStatus,
)
from dpone.contracts.evidence import looks_secret
from dpone.errors import (
    IllegalTransition,
    IntentConflict,
    JournalConflict,
    OperationNotFound,
    UnsafeValue,
)

__all__ = [
    "RECORD_COLUMNS",
    "apply_step",
    "check_detail",
    "check_move",
    "check_registration",
    "conflict",
    "holds_capacity",
    "intent_conflict",
    "not_found",
    "record_from_row",
    "record_row",
]

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_MAX_DETAIL = 300

RECORD_COLUMNS: tuple[str, ...] = (
    "operation_id",
    "intent_digest",
    "state",
    "version",
    "receiver",
    "receiver_url",
    "credential_ref",
    "payload_path",
    "payload_digest",
    "payload_bytes",
    "payload_rows",
    "chunk_bytes",
    "attempts",
    "receipt",
    "remote_status",
    "rows_processed",
    "due_at",
    "next_check_at",
    "lease_owner",
    "lease_expires_at",
    "block_reason",
    "detail",
    "created_at",
    "updated_at",
    "parent_id",
    "child_index",
)


def record_from_row(row: tuple[Any, ...]) -> DeliveryRecord:
    """Decode a row selected with ``RECORD_COLUMNS``."""
    v = dict(zip(RECORD_COLUMNS, row, strict=True))
    return DeliveryRecord(
        operation_id=v["operation_id"],
        intent_digest=v["intent_digest"],
        state=DeliveryState(v["state"]),
        version=int(v["version"]),
        receiver=v["receiver"],
        receiver_url=v["receiver_url"],
        credential_ref=v["credential_ref"],
        payload=PayloadRef(
            path=v["payload_path"],
            digest=v["payload_digest"],
            size_bytes=int(v["payload_bytes"]),
            rows=int(v["payload_rows"]),
            chunk_bytes=int(v["chunk_bytes"]),
        ),
        attempts=int(v["attempts"]),
        receipt=v["receipt"],
        remote_status=RemoteStatus(v["remote_status"]) if v["remote_status"] else None,
        rows_processed=v["rows_processed"],
        due_at=v["due_at"],
        next_check_at=v["next_check_at"],
        lease_owner=v["lease_owner"],
        lease_expires_at=v["lease_expires_at"],
        block_reason=BlockReason(v["block_reason"]) if v["block_reason"] else None,
        detail=v["detail"],
        created_at=float(v["created_at"]),
        updated_at=float(v["updated_at"]),
        parent_id=v["parent_id"],
        child_index=v["child_index"],
    )


def record_row(record: DeliveryRecord) -> tuple[Any, ...]:
    """Encode a record as the values of ``RECORD_COLUMNS``."""
    return (
        record.operation_id,
        record.intent_digest,
        record.state.value,
        record.version,
        record.receiver,
        record.receiver_url,
        record.credential_ref,
        record.payload.path,
        record.payload.digest,
        record.payload.size_bytes,
        record.payload.rows,
        record.payload.chunk_bytes,
        record.attempts,
        record.receipt,
        record.remote_status.value if record.remote_status else None,
        record.rows_processed,
        record.due_at,
        record.next_check_at,
        record.lease_owner,
        record.lease_expires_at,
        record.block_reason.value if record.block_reason else None,
        record.detail,
        record.created_at,
        record.updated_at,
        record.parent_id,
        record.child_index,
    )


def check_detail(detail: str | None) -> str | None:
    """Return a safe, bounded detail text or raise UnsafeValue."""
    if detail is None:
        return None
    if looks_secret(detail):
        raise UnsafeValue("a delivery detail looked like a secret and was refused", field="detail")
    return detail[:_MAX_DETAIL]


def check_registration(*, operation_id: str, intent_digest: str, payload: PayloadRef) -> None:
    """Refuse malformed identities and payload descriptions before any write."""
    for name, value in (
        ("operation_id", operation_id),
        ("intent_digest", intent_digest),
        ("payload_digest", payload.digest),
    ):
        if not _DIGEST_RE.match(value):
            raise UnsafeValue(f"{name} must be sha256:<64 hex>", field=name)
    if payload.size_bytes < 0 or payload.rows < 0 or payload.chunk_bytes <= 0:
        raise UnsafeValue("payload sizes must be non-negative, chunks positive", field="payload")


def check_move(record: DeliveryRecord, *, expected_version: int, step: DeliveryStep) -> None:
    """Raise unless ``record`` is at ``expected_version`` and the move is allowed."""
    if record.version != expected_version:
        raise conflict(record, expected_version)
    if step.to_state not in DELIVERY_TRANSITIONS[record.state]:
        raise IllegalTransition(
            f"a delivery cannot move from {record.state.value} to {step.to_state.value}",
            operation_id=record.operation_id,
            state=record.state.value,
            journal_version=record.version,
        )


def apply_step(record: DeliveryRecord, step: DeliveryStep, *, now: float) -> DeliveryRecord:
    """Return the record after ``step`` (version + 1); the caller writes it."""
    observation = step.observation
    to = step.to_state
    return replace(
        record,
        state=to,
        version=record.version + 1,
        attempts=record.attempts + (1 if step.start_attempt else 0),
        receipt=step.receipt or record.receipt,
        remote_status=observation.status if observation else record.remote_status,
        rows_processed=(
            observation.rows_processed
            if observation and observation.rows_processed is not None
            else record.rows_processed
        ),
        due_at=now + max(step.due_in_s or 0.0, 0.0) if to is DeliveryState.RETRY_WAIT else None,
        next_check_at=(
            now + max(step.next_check_in_s, 0.0) if step.next_check_in_s is not None else None
        ),
        lease_owner=step.lease_owner if step.lease_ttl_s is not None else None,
        lease_expires_at=now + step.lease_ttl_s if step.lease_ttl_s is not None else None,
        block_reason=step.block_reason or (record.block_reason if to is record.state else None),
        detail=check_detail(step.detail),
        updated_at=now,
    )


def holds_capacity(state: DeliveryState) -> bool:
    """True when a delivery in ``state`` holds a capacity slot of its receiver."""
    return state in CAPACITY_HOLDING


def conflict(record: DeliveryRecord, expected_version: int) -> JournalConflict:
    """The CAS found another version than the caller's."""
    return JournalConflict(
        f"the delivery is at version {record.version}, not {expected_version}; "
        "re-read it and decide again",
        operation_id=record.operation_id,
        current_version=record.version,
        current_state=record.state.value,
    )


def intent_conflict(record: DeliveryRecord) -> IntentConflict:
    """The operation exists with another intent digest."""
    return IntentConflict(
        "this delivery operation was recorded with another intent (payload or receiver); "
        "the same operation id may not deliver something else",
        operation_id=record.operation_id,
        state=record.state.value,
        journal_version=record.version,
    )


def not_found(operation_id: str) -> OperationNotFound:
    """No delivery record exists for the operation."""
    return OperationNotFound(
        "no delivery is recorded for this operation id", operation_id=operation_id
    )
