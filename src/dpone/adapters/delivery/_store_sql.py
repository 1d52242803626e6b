"""The delivery control plane's statements, shared by the SQLite and PostgreSQL stores.

Each function runs on an open DB-API cursor inside the caller's transaction. SQL is
written once with ``?`` placeholders and ``{p}`` for the schema prefix; a
:class:`Dialect` adapts both. Capacity is serialized by locking the receiver's row
(PostgreSQL ``FOR UPDATE``; on SQLite ``BEGIN IMMEDIATE`` already serializes writers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dpone.adapters.delivery import _rules
from dpone.contracts.delivery import (
    DeliveryRecord,
    DeliveryRegistration,
    DeliveryState,
    DeliveryStep,
    JobObservation,
    RemoteStatus,
)
from dpone.errors import (
    ConfigInvalid,
    DeliveryCapacityFull,
    IllegalTransition,
    RecoveryConflict,
    RecoveryRefused,
    UnsafeValue,
)

__all__ = [
    "ATTEMPTS_SQL",
    "AUDIT_SQL",
    "HISTORY_SQL",
    "Dialect",
    "active_reservations",
    "advance",
    "children",
    "dicts",
    "list_records",
    "now",
    "observations",
    "read",
    "register",
    "release_capacity",
]

_COLUMNS = ", ".join(_rules.RECORD_COLUMNS)

HISTORY_SQL = (
    "SELECT version, from_state, to_state, actor, detail, at "
    "FROM {p}dpone_delivery_transitions WHERE operation_id = ? ORDER BY version"
)
ATTEMPTS_SQL = (
    "SELECT attempt, owner, started_at, outcome, http_status, ended_at "
    "FROM {p}dpone_delivery_attempts WHERE operation_id = ? ORDER BY attempt"
)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells placeholders, the schema prefix, the clock and row locks."""

    prefix: str  # e.g. '' (SQLite) or '"dpone".' (PostgreSQL)
    placeholder: str  # '?' or '%s'
    now_sql: str  # an expression for seconds since the epoch
    for_update: str  # '' or ' FOR UPDATE'

    def q(self, sql: str) -> str:
        """Return ``sql`` with the prefix and placeholders of this dialect."""
        return sql.replace("{p}", self.prefix).replace("?", self.placeholder)


def now(cur: Any, d: Dialect) -> float:
    """The database's clock, seconds since the epoch."""
    cur.execute(f"SELECT {d.now_sql}")
    return float(cur.fetchone()[0])


def read(cur: Any, d: Dialect, operation_id: str, *, lock: bool = False) -> DeliveryRecord | None:
    """Read one record (locked for the transaction when ``lock``)."""
    cur.execute(
        d.q(f"SELECT {_COLUMNS} FROM {{p}}dpone_delivery WHERE operation_id = ?")
        + (d.for_update if lock else ""),
        (operation_id,),
    )
    row = cur.fetchone()
    return _rules.record_from_row(tuple(row)) if row else None


def list_records(cur: Any, d: Dialect, limit: int) -> list[DeliveryRecord]:
    """Records, newest update first."""
    cur.execute(
        d.q(f"SELECT {_COLUMNS} FROM {{p}}dpone_delivery ORDER BY updated_at DESC LIMIT ?"),
        (max(int(limit), 0),),
    )
    return [_rules.record_from_row(tuple(row)) for row in cur.fetchall()]


def dicts(cur: Any, d: Dialect, sql: str, operation_id: str) -> list[dict[str, object]]:
    """Rows of ``sql`` (one ``?`` for the operation id) as dicts."""
    cur.execute(d.q(sql), (operation_id,))
    names = [col[0] for col in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def observations(cur: Any, d: Dialect, operation_id: str) -> list[JobObservation]:
    """Recorded observations of one delivery, in order."""
    cur.execute(
        d.q(
            "SELECT receipt, status, rows_total, rows_processed, rows_failed "
            "FROM {p}dpone_delivery_observations WHERE operation_id = ? ORDER BY id"
        ),
        (operation_id,),
    )
    return [
        JobObservation(
            receipt=r[0],
            status=RemoteStatus(r[1]),
            rows_total=r[2],
            rows_processed=r[3],
            rows_failed=r[4],
        )
        for r in cur.fetchall()
    ]


def active_reservations(cur: Any, d: Dialect, receiver: str) -> int:
    """How many slots of ``receiver`` are held."""
    cur.execute(
        d.q(
            "SELECT COUNT(*) FROM {p}dpone_delivery_reservations "
            "WHERE receiver = ? AND released_at IS NULL"
        ),
        (receiver,),
    )
    return int(cur.fetchone()[0])


def check_read_only_schema(current: int | None, *, schema_version: int, locator: str) -> None:
    """Refuse a read-only open of a missing or not-yet-migrated control plane, clearly.

    ``current`` is the recorded schema version, None when the version table is absent.
    A read-only open never creates or migrates anything, so it can only read a control
    plane already at this dpone's version.
    """
    if current is None or current == 0:
        raise ConfigInvalid(
            f"no control plane at {locator}: no delivery was ever recorded there",
            field="journal",
            hint="check the --journal URL / --schema (or the workload's journal)",
        )
    if current > schema_version:
        raise ConfigInvalid(
            f"the delivery store at {locator} has schema {current}, newer than this dpone "
            f"({schema_version}); upgrade dpone",
            field="journal",
        )
    if current < schema_version:
        raise ConfigInvalid(
            f"the delivery store at {locator} has schema {current}, older than this dpone "
            f"({schema_version}); a read-only command does not migrate it, run "
            "`dpone delivery resume` (or any writing command) once",
            field="journal",
        )


def capacity_available(cur: Any, d: Dialect, receiver: str) -> bool:
    """True when ``receiver`` has no recorded limit or fewer held slots than it (no lock)."""
    cur.execute(
        d.q("SELECT capacity_limit FROM {p}dpone_delivery_receivers WHERE receiver = ?"),
        (receiver,),
    )
    row = cur.fetchone()
    if row is None or row[0] is None:
        return True
    return active_reservations(cur, d, receiver) < int(row[0])


def _set_limit(cur: Any, d: Dialect, receiver: str, limit: int) -> None:
    """Record ``receiver``'s capacity limit; refuse a different one while slots are held.

    One limit per receiver: two workloads declaring different limits for one receiver
    is a configuration conflict, refused by name (last-writer-wins would let either
    one exceed the other's limit). While no slot is held the new limit replaces the
    old one, so changing a workload's ``capacity`` takes effect once the receiver is
    idle (in the control plane's view). The same limit again takes no lock; another one
    locks the receiver's row first, as a reservation does, so the check and the write
    cannot interleave with one.
    """
    cur.execute(
        d.q("SELECT capacity_limit FROM {p}dpone_delivery_receivers WHERE receiver = ?"),
        (receiver,),
    )
    row = cur.fetchone()
    if row is not None and row[0] == limit:
        return
    cur.execute(
        d.q(
            "INSERT INTO {p}dpone_delivery_receivers (receiver, capacity_limit) "
            "VALUES (?, ?) ON CONFLICT (receiver) DO NOTHING"
        ),
        (receiver, limit),
    )
    cur.execute(
        d.q("SELECT capacity_limit FROM {p}dpone_delivery_receivers WHERE receiver = ?")
        + d.for_update,
        (receiver,),
    )
    current = cur.fetchone()[0]
    if current == limit:
        return
    held = active_reservations(cur, d, receiver)
    if current is not None and held > 0:
        raise ConfigInvalid(
            f"the receiver {receiver} has capacity limit {current} recorded and {held} "
            f"slot(s) in use; this delivery declares capacity {limit}. One receiver has "
            "one limit: give every workload that delivers there the same capacity",
            field="capacity",
            hint=f"set capacity: {current} (or change all of them while the receiver is "
            "idle); `dpone delivery resume` continues a recorded delivery as it is",
        )
    cur.execute(
        d.q("UPDATE {p}dpone_delivery_receivers SET capacity_limit = ? WHERE receiver = ?"),
        (limit, receiver),
    )


def register(
    cur: Any,
    d: Dialect,
    registrations: list[DeliveryRegistration],
    *,
    capacity_limit: int | None,
    actor: str,
) -> list[DeliveryRecord]:
    """Create each record in STAGED if absent, else return it (same intent only).

    All of them in the caller's one transaction: a split delivery's children are
    recorded all or none.
    """
    for reg in registrations:
        _rules.check_registration(
            operation_id=reg.operation_id, intent_digest=reg.intent_digest, payload=reg.payload
        )
    if capacity_limit is not None and (not isinstance(capacity_limit, int) or capacity_limit < 1):
        raise ConfigInvalid("a receiver's capacity limit must be an integer >= 1", field="capacity")
    out: list[DeliveryRecord] = []
    for reg in registrations:
        if capacity_limit is not None:
            _set_limit(cur, d, reg.receiver, capacity_limit)
        existing = read(cur, d, reg.operation_id, lock=True)
        if existing is None:
            created = _insert(cur, d, reg, actor=actor)
            if created is not None:
                out.append(created)
                continue
            # another process created it between our read and our insert
            existing = read(cur, d, reg.operation_id, lock=True)
        if existing is None:  # pragma: no cover - the insert conflicted on this key
            raise _rules.not_found(reg.operation_id)
        if existing.intent_digest != reg.intent_digest:
            raise _rules.intent_conflict(existing)
        out.append(existing)
    return out


def children(cur: Any, d: Dialect, parent_id: str) -> list[DeliveryRecord]:
    """The children of a split delivery, in order."""
    cur.execute(
        d.q(f"SELECT {_COLUMNS} FROM {{p}}dpone_delivery WHERE parent_id = ? ORDER BY child_index"),
        (parent_id,),
    )
    return [_rules.record_from_row(tuple(row)) for row in cur.fetchall()]


def _insert(
    cur: Any, d: Dialect, reg: DeliveryRegistration, *, actor: str
) -> DeliveryRecord | None:
    at = now(cur, d)
    record = DeliveryRecord(
        operation_id=reg.operation_id,
        intent_digest=reg.intent_digest,
        state=DeliveryState.STAGED,
        version=1,
        receiver=reg.receiver,
        receiver_url=reg.receiver_url,
        credential_ref=reg.credential_ref,
        payload=reg.payload,
        attempts=0,
        receipt=None,
        remote_status=None,
        rows_processed=None,
        due_at=None,
        next_check_at=None,
        lease_owner=None,
        lease_expires_at=None,
        block_reason=None,
        detail=None,
        created_at=at,
        updated_at=at,
        parent_id=reg.parent_id,
        child_index=reg.child_index,
    )
    marks = ", ".join("?" * len(_rules.RECORD_COLUMNS))
    cur.execute(
        d.q(
            f"INSERT INTO {{p}}dpone_delivery ({_COLUMNS}) VALUES ({marks}) "
            "ON CONFLICT (operation_id) DO NOTHING"
        ),
        _rules.record_row(record),
    )
    if cur.rowcount != 1:
        return None
    _transition(cur, d, None, record, actor)
    return record


def advance(
    cur: Any,
    d: Dialect,
    *,
    operation_id: str,
    expected_version: int,
    step: DeliveryStep,
    actor: str,
) -> DeliveryRecord:
    """Apply ``step``: CAS, capacity, attempt, receipt, observation, history, all in ``cur``."""
    record = read(cur, d, operation_id, lock=True)
    if record is None:
        raise _rules.not_found(operation_id)
    _rules.check_move(record, expected_version=expected_version, step=step)
    if step.to_state is DeliveryState.SUBMITTING and record.parent_id is not None:
        _check_serial(cur, d, record)
    at = now(cur, d)
    after = _rules.apply_step(record, step, now=at)
    _capacity(cur, d, record, after, actor=actor, now=at)
    if step.start_attempt:
        cur.execute(
            d.q(
                "INSERT INTO {p}dpone_delivery_attempts (operation_id, attempt, owner, "
                "started_at) VALUES (?, ?, ?, ?)"
            ),
            (operation_id, after.attempts, step.lease_owner or actor, at),
        )
    if step.attempt_outcome is not None:
        cur.execute(
            d.q(
                "UPDATE {p}dpone_delivery_attempts SET outcome = ?, http_status = ?, "
                "ended_at = ? WHERE operation_id = ? AND attempt = ? AND outcome IS NULL"
            ),
            (step.attempt_outcome, step.http_status, at, operation_id, record.attempts),
        )
    if step.receipt is not None:
        _receipt(cur, d, operation_id, step, attempt=after.attempts, now=at)
    if step.observation is not None:
        obs = step.observation
        cur.execute(
            d.q(
                "INSERT INTO {p}dpone_delivery_observations (operation_id, receipt, status, "
                "rows_total, rows_processed, rows_failed, observed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)"
            ),
            (
                operation_id,
                obs.receipt,
                obs.status.value,
                obs.rows_total,
                obs.rows_processed,
                obs.rows_failed,
                at,
            ),
        )
    assignments = ", ".join(f"{c} = ?" for c in _rules.RECORD_COLUMNS[2:])
    cur.execute(
        d.q(f"UPDATE {{p}}dpone_delivery SET {assignments} WHERE operation_id = ? AND version = ?"),
        (*_rules.record_row(after)[2:], operation_id, expected_version),
    )
    if cur.rowcount != 1:  # pragma: no cover - the row is locked by this transaction
        raise _rules.conflict(record, expected_version)
    _transition(cur, d, record.state, after, actor)
    return after


def release_capacity(
    cur: Any,
    d: Dialect,
    *,
    operation_id: str,
    expected_version: int,
    principal: str,
    reason: str,
) -> DeliveryRecord:
    """An operator frees a BLOCKED delivery's slot: release, audit and version + 1 in one write.

    The delivery stays BLOCKED; only its capacity slot is given back, on the operator's
    word (recorded) that no remote job of it is active any more.
    """
    if not reason.strip() or not principal.strip():
        raise UnsafeValue("an operator action needs a principal and a reason", field="reason")
    _rules.check_detail(principal)
    _rules.check_detail(reason)
    record = read(cur, d, operation_id, lock=True)
    if record is None:
        raise _rules.not_found(operation_id)
    if record.version != expected_version:
        raise _rules.conflict(record, expected_version)
    if record.state is not DeliveryState.BLOCKED:
        raise RecoveryRefused(
            f"only a BLOCKED delivery's slot can be released by an operator; this one is "
            f"{record.state.value} and releases its slot itself when it ends",
            operation_id=operation_id,
            state=record.state.value,
            journal_version=record.version,
        )
    cur.execute(
        d.q(
            "SELECT id FROM {p}dpone_delivery_reservations "
            "WHERE operation_id = ? AND released_at IS NULL"
        ),
        (operation_id,),
    )
    held = cur.fetchone()
    if held is None:
        raise RecoveryRefused(
            "this delivery holds no capacity slot", operation_id=operation_id, state="BLOCKED"
        )
    at = now(cur, d)
    detail = _rules.check_detail(f"capacity released by operator {principal}")
    cur.execute(
        d.q(
            "UPDATE {p}dpone_delivery_reservations SET released_at = ?, released_by = ? "
            "WHERE id = ?"
        ),
        (at, f"operator {principal}", held[0]),
    )
    cur.execute(
        d.q(
            "INSERT INTO {p}dpone_delivery_audit (operation_id, principal, action, reason, "
            "state, before_version, after_version, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        ),
        (
            operation_id,
            principal,
            "release-capacity",
            reason,
            record.state.value,
            record.version,
            record.version + 1,
            at,
        ),
    )
    after = replace(record, version=record.version + 1, detail=detail, updated_at=at)
    cur.execute(
        d.q(
            "UPDATE {p}dpone_delivery SET version = ?, detail = ?, updated_at = ? "
            "WHERE operation_id = ? AND version = ?"
        ),
        (after.version, after.detail, at, operation_id, expected_version),
    )
    _transition(cur, d, record.state, after, f"operator:{principal}")
    return after


AUDIT_SQL = (
    "SELECT principal, action, reason, state, before_version, after_version, at "
    "FROM {p}dpone_delivery_audit WHERE operation_id = ? ORDER BY id"
)


def _check_serial(cur: Any, d: Dialect, record: DeliveryRecord) -> None:
    """A child may be submitted only when every earlier sibling is COMPLETE."""
    cur.execute(
        d.q(
            "SELECT COUNT(*) FROM {p}dpone_delivery WHERE parent_id = ? AND child_index < ? "
            "AND state <> 'COMPLETE'"
        ),
        (record.parent_id, record.child_index),
    )
    if int(cur.fetchone()[0]) > 0:
        raise IllegalTransition(
            f"child {record.child_index} of a split delivery may start only after every "
            "earlier child is COMPLETE (one child in flight per parent)",
            operation_id=record.operation_id,
            state=record.state.value,
            journal_version=record.version,
        )


def _transition(
    cur: Any, d: Dialect, frm: DeliveryState | None, after: DeliveryRecord, actor: str
) -> None:
    cur.execute(
        d.q(
            "INSERT INTO {p}dpone_delivery_transitions (operation_id, version, from_state, "
            "to_state, actor, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?)"
        ),
        (
            after.operation_id,
            after.version,
            frm.value if frm else None,
            after.state.value,
            actor,
            after.detail,
            after.updated_at,
        ),
    )


def _capacity(
    cur: Any, d: Dialect, before: DeliveryRecord, after: DeliveryRecord, *, actor: str, now: float
) -> None:
    cur.execute(
        d.q(
            "SELECT id FROM {p}dpone_delivery_reservations "
            "WHERE operation_id = ? AND released_at IS NULL"
        ),
        (before.operation_id,),
    )
    held = cur.fetchone()
    # a slot is taken only when an attempt starts (SUBMITTING); any other move into a
    # holding state (e.g. STAGED -> BLOCKED: nothing was sent) keeps what it holds
    if after.state is DeliveryState.SUBMITTING and held is None:
        # the receiver's row is the lock every reserving transaction queues on
        cur.execute(
            d.q(
                "INSERT INTO {p}dpone_delivery_receivers (receiver, capacity_limit) "
                "VALUES (?, NULL) ON CONFLICT (receiver) DO NOTHING"
            ),
            (before.receiver,),
        )
        cur.execute(
            d.q("SELECT capacity_limit FROM {p}dpone_delivery_receivers WHERE receiver = ?")
            + d.for_update,
            (before.receiver,),
        )
        limit = cur.fetchone()[0]
        active = active_reservations(cur, d, before.receiver)
        if limit is not None and active >= limit:
            raise DeliveryCapacityFull(
                f"all {limit} capacity slots of {before.receiver} are held by active jobs",
                operation_id=before.operation_id,
                state=before.state.value,
            )
        cur.execute(
            d.q(
                "INSERT INTO {p}dpone_delivery_reservations (operation_id, receiver, "
                "reserved_at) VALUES (?, ?, ?)"
            ),
            (before.operation_id, before.receiver, now),
        )
    elif not _rules.holds_capacity(after.state) and held is not None:
        cur.execute(
            d.q(
                "UPDATE {p}dpone_delivery_reservations SET released_at = ?, released_by = ? "
                "WHERE id = ?"
            ),
            (now, f"{actor} at {after.state.value}", held[0]),
        )


def _receipt(
    cur: Any, d: Dialect, operation_id: str, step: DeliveryStep, *, attempt: int, now: float
) -> None:
    cur.execute(
        d.q("SELECT receipt FROM {p}dpone_delivery_receipts WHERE operation_id = ?"),
        (operation_id,),
    )
    row = cur.fetchone()
    if row is not None:
        if row[0] != step.receipt:
            raise RecoveryConflict(
                "the receiver returned another receipt than the one recorded for this key",
                operation_id=operation_id,
            )
        return
    cur.execute(
        d.q(
            "INSERT INTO {p}dpone_delivery_receipts (operation_id, receipt, source, attempt, "
            "recorded_at) VALUES (?, ?, ?, ?, ?)"
        ),
        (operation_id, step.receipt, step.receipt_source or "submit", attempt, now),
    )
