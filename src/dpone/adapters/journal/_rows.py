"""Journal rows -> contract records: one decoder for every SQL journal adapter.

Column order is the adapters' select lists (``_ENTRY_COLUMNS`` and kin), which they keep
identical on purpose.
"""

from __future__ import annotations

from typing import Any

from dpone.adapters.journal import _rules
from dpone.contracts.journal import AuditRecord, JournalEntry, Transition
from dpone.contracts.states import CommitState

__all__ = ["audit_from_row", "entry_from_row", "transition_from_row"]


def _state(value: object) -> CommitState | None:
    return None if value is None else CommitState(str(value))


def entry_from_row(row: tuple[Any, ...]) -> JournalEntry:
    return JournalEntry(
        operation_id=row[0],
        intent_digest=row[1],
        state=CommitState(row[2]),
        version=int(row[3]),
        lease_owner=row[4],
        lease_epoch=int(row[5]),
        lease_expires_at=None if row[6] is None else float(row[6]),
        metadata=_rules.decode_mapping(row[7]),
        result=None if row[8] is None else _rules.decode_mapping(row[8]),
        created_at=float(row[9]),
        updated_at=float(row[10]),
    )


def transition_from_row(row: tuple[Any, ...]) -> Transition:
    return Transition(
        operation_id=row[0],
        version=int(row[1]),
        seq=int(row[2]),
        from_state=_state(row[3]),
        to_state=CommitState(row[4]),
        kind=row[5],
        actor=row[6],
        lease_epoch=int(row[7]),
        evidence=_rules.decode_mapping(row[8]),
        at=float(row[9]),
    )


def audit_from_row(row: tuple[Any, ...]) -> AuditRecord:
    return AuditRecord(
        operation_id=row[0],
        principal=row[1],
        action=row[2],
        reason=row[3],
        attestation=row[4],
        before_state=_state(row[5]),
        after_state=_state(row[6]),
        before_version=None if row[7] is None else int(row[7]),
        after_version=None if row[8] is None else int(row[8]),
        outcome=row[9],
        at=float(row[10]),
    )
