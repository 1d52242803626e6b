"""Storage-independent journal rules all adapters share: legal moves, history, safe values."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from itertools import pairwise
from types import MappingProxyType

import msgspec

from dpone.contracts.evidence import SafeMapping, looks_secret, safe_mapping
from dpone.contracts.journal import AuditRecord, AuditRequest, JournalEntry, Transition
from dpone.contracts.states import (
    ATOMIC_FOLDS,
    FOLD_PATHS,
    RECOVERY_ONLY_TRANSITIONS,
    CommitState,
    is_allowed,
)
from dpone.errors import (
    IllegalTransition,
    IntentConflict,
    JournalConflict,
    LeaseHeld,
    LeaseLost,
    OperationNotFound,
    UnsafeValue,
    recovery_ref,
)

__all__ = [
    "AUDIT_OUTCOMES",
    "BORN_KIND",
    "BORN_PATHS",
    "audit_record",
    "born_rows",
    "check_identity",
    "check_move",
    "check_ttl",
    "conflict",
    "create_row",
    "decode_mapping",
    "encode_mapping",
    "intent_conflict",
    "lease_held",
    "lease_is_free",
    "lease_lost",
    "lease_request",
    "lease_row",
    "not_found",
    "safe_actor",
    "safe_audit",
    "safe_values",
    "transition_rows",
]

#: The values ``AuditRecord.outcome`` may take.
AUDIT_OUTCOMES: frozenset[str] = frozenset({"applied", "refused"})
#: Where an operator goes when a move needs an audited recovery action.
# Identities are digests; anything long or multi-line is a caller mistake, maybe a leak.
_MAX_IDENTITY = 256
# The identities dpone derives itself, in their exact shapes: a digest ("sha256:" and 64
# lowercase hex digits), the default idempotency key ("op:" and a digest) and a run id
# ("run-" and 20 hex digits). None can match a secret pattern (no "://", "@", "=",
# keyword or space), so a value of one of these shapes needs no other check.
_DERIVED = re.compile(r"(?:op:)?sha256:[0-9a-f]{64}|run-[0-9a-f]{20}")


def _sorted(states: frozenset[CommitState]) -> list[CommitState]:
    return sorted(states, key=lambda s: s.value)


def _names(states: frozenset[CommitState]) -> str:
    return "{" + ", ".join(s.value for s in _sorted(states)) + "}"


# ------------------------------------------------------------------ value checks
def check_identity(field: str, value: str) -> str:
    """Return ``value`` when it can serve as an operation id or intent digest.

    Raises:
        UnsafeValue: empty, too long, not printable, or looking like a secret.
    """
    if value.__class__ is str and _DERIVED.fullmatch(value):
        return value  # a shape dpone derives: short, printable, no secret pattern matches it
    if (
        not isinstance(value, str)
        or not value
        or len(value) > _MAX_IDENTITY
        or not value.isprintable()
        or looks_secret(value)
    ):
        raise UnsafeValue(
            f"{field} must be 1-{_MAX_IDENTITY} printable characters and no secret", field=field
        )
    return value


def safe_values(values: Mapping[str, object] | None) -> SafeMapping:
    """Validate metadata, evidence or a result: allow-listed keys, finite scalars, no secrets.

    Raises:
        UnsafeValue: the first offending key.
    """
    out = safe_mapping(values)
    for key, value in out.items():
        # NaN and infinities do not survive JSON storage and never describe a real load.
        if isinstance(value, float) and not math.isfinite(value):
            raise UnsafeValue(f"evidence value for {key!r} must be a finite number", field=key)
    return out


def safe_actor(actor: str) -> str:
    """Return ``actor`` (a host:pid label or a principal) after the evidence checks.

    Raises:
        UnsafeValue: empty, not a string, too long or secret-looking.
    """
    if not isinstance(actor, str) or not actor:
        raise UnsafeValue("actor must be a non-empty label", field="actor")
    safe_mapping({"owner": actor})
    return actor


def safe_audit(request: AuditRequest, outcome: str) -> AuditRequest:
    """Check an audit request's free text and its outcome before anything is stored.

    Raises:
        UnsafeValue: a field looks secret or is too long, or the outcome is unknown.
    """
    if outcome not in AUDIT_OUTCOMES:
        raise UnsafeValue(f"audit outcome must be one of {sorted(AUDIT_OUTCOMES)}", field="outcome")
    if not request.principal or not request.action:
        raise UnsafeValue("an audit request needs a principal and an action", field="principal")
    safe_mapping(
        {
            "principal": request.principal,
            "action": request.action,
            "reason": request.reason,
            "attestation": request.attestation,
        }
    )
    return request


def check_ttl(ttl_seconds: float) -> float:
    """Return the TTL as a float when it is a positive, finite number of seconds.

    Raises:
        ValueError: zero, negative, NaN or infinite (a caller bug, not a journal state).
    """
    ttl = float(ttl_seconds)
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl_seconds must be a positive finite number, got {ttl_seconds!r}")
    return ttl


# ------------------------------------------------------------------ state machine
def check_move(
    *,
    operation_id: str,
    expected_states: frozenset[CommitState],
    next_state: CommitState,
    atomic: bool,
    audited: bool,
) -> None:
    """Refuse a state change the journal may not write, before any storage access.

    Every expected state must be a legal source for ``next_state``: the check does not
    depend on which of them the entry is actually in, so the answer never races.

    Args:
        operation_id: the entry, for the error.
        expected_states: the states the caller expects the entry in.
        next_state: the requested state.
        atomic: True inside ``compare_and_set_within`` (the target's data transaction).
        audited: True when the write carries an ``AuditRequest``.

    Raises:
        IllegalTransition: no expected state, a move outside ALLOWED_TRANSITIONS, an
            atomic-only fold outside the data transaction, or a recovery-only move
            without an audit request.
    """
    if not expected_states:
        raise IllegalTransition(
            "compare_and_set needs at least one expected state", operation_id=operation_id
        )
    for frm in _sorted(expected_states):
        move = f"{frm.value} -> {next_state.value}"
        if not is_allowed(frm, next_state):
            raise IllegalTransition(
                f"{move} is not an allowed transition",
                operation_id=operation_id,
                state=frm.value,
                hint="see ARCHITECTURE section 6 for the state machine",
            )
        if (frm, next_state) in ATOMIC_FOLDS and not atomic:
            raise IllegalTransition(
                f"{move} is an atomic-mode fold; only a write inside the target's data "
                "transaction (compare_and_set_within) may make it",
                operation_id=operation_id,
                state=frm.value,
            )
        if (frm, next_state) in RECOVERY_ONLY_TRANSITIONS and not audited:
            raise IllegalTransition(
                f"{move} is a recovery action and needs an audited operator request",
                operation_id=operation_id,
                state=frm.value,
                recovery_ref=recovery_ref(operation_id),
            )


def transition_rows(
    *,
    operation_id: str,
    from_state: CommitState,
    to_state: CommitState,
    version: int,
    actor: str,
    lease_epoch: int,
    evidence: SafeMapping,
    at: float,
) -> tuple[Transition, ...]:
    """Return the history rows of one CAS write: one row, or one per step of a fold.

    All rows carry the new ``version``; ``seq`` orders them 0..n-1 within it.
    """
    path = FOLD_PATHS.get((from_state, to_state))
    steps = [(from_state, to_state)] if path is None else list(pairwise(path))
    kind = "transition" if path is None else "fold"
    return tuple(
        Transition(
            operation_id=operation_id,
            version=version,
            seq=seq,
            from_state=frm,
            to_state=to,
            kind=kind,
            actor=actor,
            lease_epoch=lease_epoch,
            evidence=evidence,
            at=at,
        )
        for seq, (frm, to) in enumerate(steps)
    )


def create_row(entry: JournalEntry, *, actor: str) -> Transition:
    """Return the history row recording the creation of ``entry``."""
    return Transition(
        operation_id=entry.operation_id,
        version=entry.version,
        seq=0,
        from_state=None,
        to_state=entry.state,
        kind="create",
        actor=actor,
        lease_epoch=entry.lease_epoch,
        evidence=MappingProxyType({}),
        at=entry.created_at,
    )


def lease_request(owner: str | None, ttl_seconds: float | None) -> float | None:
    """Validate a create-with-lease request; return the TTL, or None for no lease."""
    if owner is None and ttl_seconds is None:
        return None
    if owner is None or ttl_seconds is None:
        raise ValueError("lease_owner and lease_ttl_seconds go together")
    safe_actor(owner)
    return check_ttl(ttl_seconds)


def lease_row(entry: JournalEntry, *, seq: int = 0) -> Transition:
    """Return the history row recording the lease grant that produced ``entry``."""
    owner = entry.lease_owner or ""
    return Transition(
        operation_id=entry.operation_id,
        version=entry.version,
        seq=seq,
        from_state=entry.state,
        to_state=entry.state,
        kind="lease",
        actor=owner,
        lease_epoch=entry.lease_epoch,
        evidence=safe_values({"owner": owner, "lease_epoch": entry.lease_epoch}),
        at=entry.updated_at,
    )


#: The history kind of ONE stored row standing for an entry's whole birth past PREPARING
#: (ADR 0023). Never returned by ``history()``: it reads as ``born_rows``.
BORN_KIND = "born"
#: The states a ``born`` row's fold passes through, frozen as they were when the kind was
#: introduced: a stored row must read the same forever, whatever later changes
#: ``FOLD_PATHS``. A birth along another path needs a new kind (unit tests pin both).
BORN_PATHS: Mapping[CommitState, tuple[CommitState, ...]] = MappingProxyType(
    {
        CommitState.COMMITTING: (
            CommitState.PREPARING,
            CommitState.PREPARED,
            CommitState.COMMITTING,
        ),
        CommitState.COMPLETE: (
            CommitState.PREPARING,
            CommitState.PREPARED,
            CommitState.COMMITTING,
            CommitState.TARGET_COMMITTED,
            CommitState.COMPLETE,
        ),
    }
)


def born_rows(
    *,
    operation_id: str,
    state: CommitState,
    actor: str,
    lease_epoch: int,
    evidence: SafeMapping,
    at: float,
) -> tuple[Transition, ...]:
    """The history of an entry born in ``state`` with its lease at ``lease_epoch``.

    What the unfolded path writes for the same birth, in one commit: ``create`` and
    ``lease`` at version 1, then one ``fold`` row per step of ``BORN_PATHS[state]`` at
    version 2 with ``evidence``; every row by ``actor`` at ``at``. A journal may store
    these rows as one row of kind ``BORN_KIND`` and expand it here when history is read.

    Raises:
        ValueError: no entry is born in ``state``.
    """
    path = BORN_PATHS.get(state)
    if path is None:
        raise ValueError(f"no entry is born {state.value}: not a {BORN_KIND!r} history row")
    # create and lease exactly as the unfolded path writes them, for the entry at version 1
    leased = JournalEntry(
        operation_id=operation_id,
        intent_digest="-",
        state=CommitState.PREPARING,
        version=1,
        lease_owner=actor,
        lease_epoch=lease_epoch,
        lease_expires_at=None,
        metadata=MappingProxyType({}),
        result=None,
        created_at=at,
        updated_at=at,
    )
    head = (create_row(leased, actor=actor), lease_row(leased, seq=1))
    return head + tuple(
        Transition(
            operation_id=operation_id,
            version=2,
            seq=seq,
            from_state=frm,
            to_state=to,
            kind="fold",
            actor=actor,
            lease_epoch=lease_epoch,
            evidence=evidence,
            at=at,
        )
        for seq, (frm, to) in enumerate(pairwise(path))
    )


# ------------------------------------------------------------------ leases
def lease_is_free(
    *,
    lease_owner: str | None,
    lease_expires_at: float | None,
    now: float,
    owner: str,
    break_owner: str | None,
) -> bool:
    """Return True when ``owner`` may be granted the lease now (journal clock).

    Free: no holder, expired, already held by ``owner`` (it gets a new epoch anyway),
    or held by ``break_owner``, a holder the caller proved dead.
    """
    return (
        lease_owner is None
        or lease_expires_at is None
        or lease_expires_at <= now
        or lease_owner == owner
        or (break_owner is not None and lease_owner == break_owner)
    )


# ------------------------------------------------------------------ errors
def not_found(operation_id: str) -> OperationNotFound:
    """Return the error for an operation id with no journal entry."""
    return OperationNotFound(
        "no journal entry exists for this operation", operation_id=operation_id
    )


def intent_conflict(current: JournalEntry) -> IntentConflict:
    """Return the error for an operation id recorded with another intent digest."""
    return IntentConflict(
        "the operation was already recorded with another intent digest; the workload, "
        "source cut or target changed under the same operation id",
        operation_id=current.operation_id,
        state=current.state.value,
        journal_version=current.version,
        recovery_ref=recovery_ref(current.operation_id),
    )


def conflict(
    *,
    expected_version: int,
    expected_states: frozenset[CommitState] | None,
    lease_epoch: int | None,
    current: JournalEntry,
) -> JournalConflict:
    """Return the CAS conflict error, carrying the entry's current version and state."""
    wanted = f"version {expected_version}"
    if expected_states is not None:
        wanted += f" in {_names(expected_states)}"
    if lease_epoch is not None:
        wanted += f" at epoch {lease_epoch}"
    return JournalConflict(
        f"the journal entry moved on: expected {wanted}, found version {current.version} "
        f"in {current.state.value} at epoch {current.lease_epoch}; re-read it and decide again",
        operation_id=current.operation_id,
        state=current.state.value,
        journal_version=current.version,
        current_version=current.version,
        current_state=current.state.value,
    )


def lease_held(current: JournalEntry, *, now: float) -> LeaseHeld:
    """Return the error for a live lease held by another owner."""
    expires_in = max(0.0, (current.lease_expires_at or now) - now)
    return LeaseHeld(
        f"another executor holds the lease for {expires_in:.1f} s more",
        operation_id=current.operation_id,
        state=current.state.value,
        journal_version=current.version,
        lease_owner=current.lease_owner,
        lease_expires_in=expires_in,
    )


def lease_lost(current: JournalEntry, *, lease_epoch: int) -> LeaseLost:
    """Return the error for a renewal by an owner whose epoch was superseded."""
    return LeaseLost(
        f"the lease at epoch {lease_epoch} is no longer held by this executor (now epoch "
        f"{current.lease_epoch}); stop writing and start the operation over",
        operation_id=current.operation_id,
        state=current.state.value,
        journal_version=current.version,
        current_version=current.version,
        current_state=current.state.value,
        lease_owner=current.lease_owner,
    )


# ------------------------------------------------------------------ audit
def audit_record(
    *,
    operation_id: str,
    request: AuditRequest,
    outcome: str,
    before_state: CommitState | None,
    before_version: int | None,
    after: JournalEntry | None,
    at: float,
) -> AuditRecord:
    """Return the audit record of an operator action (checked by ``safe_audit`` first).

    ``after`` is the entry the action left (the unchanged entry for a refused one).
    """
    return AuditRecord(
        operation_id=operation_id,
        principal=request.principal,
        action=request.action,
        reason=request.reason,
        attestation=request.attestation,
        before_state=before_state,
        after_state=after.state if after is not None else None,
        before_version=before_version,
        after_version=after.version if after is not None else None,
        outcome=outcome,
        at=at,
    )


# ------------------------------------------------------------------ storage encoding
# Stored mappings are storage, not identity (JSON text in SQLite, jsonb in PostgreSQL):
# any valid JSON of the same values will do, so the fast encoder writes them. The
# standard library's (the former encoder) takes what msgspec does not: a scalar of a
# subclass (an enum member, say), text that is not UTF-8, and a NaN or infinity, which
# msgspec would write as null where the standard library refuses it.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_JSON = msgspec.json.Encoder(order="sorted")
_FROM_JSON = msgspec.json.Decoder()


def encode_mapping(values: SafeMapping) -> str:
    """Encode a safe mapping as JSON text (sorted keys, no spaces) for storage.

    Raises:
        ValueError: a float is NaN or infinite (JSON has no such number).
        TypeError: a value is not a scalar.
    """
    plain = values.copy() if isinstance(values, MappingProxyType) else values
    try:
        raw = _JSON.encode(plain)
    except (TypeError, ValueError, msgspec.EncodeError):
        # a subclass of a scalar type, a lone surrogate (not UTF-8), or not a scalar:
        # the standard library encodes it as before, or says what is wrong
        return _ENCODER.encode(dict(values))
    if b"null" in raw and not all(
        math.isfinite(v) for v in values.values() if isinstance(v, float)
    ):
        return _ENCODER.encode(dict(values))  # msgspec wrote NaN as null: json refuses it
    return raw.decode()


def decode_mapping(text: str) -> SafeMapping:
    """Decode stored JSON text back into a read-only mapping."""
    try:
        value = _FROM_JSON.decode(text)
    except msgspec.DecodeError:
        value = json.loads(text)  # what msgspec refuses: a number too large for a float
    if not isinstance(value, dict):
        raise TypeError("stored evidence is not a JSON object")
    return MappingProxyType(value)
