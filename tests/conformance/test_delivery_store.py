"""The delivery control plane on SQLite and PostgreSQL: CAS, moves, capacity, receipts, races."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpone.contracts.delivery import (
    BlockReason,
    DeliveryRegistration,
    DeliveryState,
    DeliveryStep,
    JobObservation,
    PayloadRef,
    RemoteStatus,
)
from dpone.errors import (
    ConfigInvalid,
    DeliveryCapacityFull,
    IllegalTransition,
    IntentConflict,
    JournalConflict,
    JournalUnavailable,
    OperationNotFound,
    RecoveryConflict,
    RecoveryRefused,
    UnsafeValue,
)

D = DeliveryState
RECEIVER = "rest:http://127.0.0.1:1"
PAYLOAD = PayloadRef(
    path="/staged/p.jsonl", digest="sha256:" + "a" * 64, size_bytes=10, rows=2, chunk_bytes=4
)
RACER = Path(__file__).with_name("_delivery_store_race.py")


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path):
    """(name, store, racer location, schema) for each control-plane backend."""
    if request.param == "sqlite":
        from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore

        path = tmp_path / "journal.sqlite"
        store = SqliteDeliveryStore(path)
        yield "sqlite", store, str(path), "-"
    else:
        from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

        dsn = request.getfixturevalue("pg_available")
        schema = request.getfixturevalue("pg_schema")
        store = PostgresDeliveryStore(dsn, schema=schema)
        yield "postgres", store, dsn, schema
    store.close()


def _op(n: int) -> str:
    return "sha256:" + f"{n:064x}"


def _register(store, n: int, *, limit: int | None = None, intent: str = "b"):
    return store.register(
        operation_id=_op(n),
        intent_digest="sha256:" + intent * 64,
        receiver=RECEIVER,
        receiver_url="http://127.0.0.1:1",
        credential_ref="env:TOKEN_VAR",
        payload=PAYLOAD,
        capacity_limit=limit,
        actor="test",
    )


def _submit(store, record):
    return store.advance(
        operation_id=record.operation_id,
        expected_version=record.version,
        step=DeliveryStep(
            to_state=D.SUBMITTING, start_attempt=True, lease_owner="me", lease_ttl_s=30.0
        ),
        actor="test",
    )


def test_register_is_create_if_absent_and_checks_intent(backend):
    """The same registration returns the same record; another intent is refused."""
    _, store, _, _ = backend
    first = _register(store, 1)
    assert first.state is D.STAGED
    assert first.version == 1
    assert _register(store, 1) == first
    with pytest.raises(IntentConflict):
        _register(store, 1, intent="c")
    with pytest.raises(UnsafeValue):
        store.register(
            operation_id="not-a-digest",
            intent_digest="sha256:" + "b" * 64,
            receiver=RECEIVER,
            receiver_url="http://127.0.0.1:1",
            credential_ref=None,
            payload=PAYLOAD,
            capacity_limit=None,
            actor="test",
        )
    assert [h["to_state"] for h in store.history(_op(1))] == ["STAGED"]


def test_cas_rejects_stale_versions_and_illegal_moves(backend):
    """A stale version is a JournalConflict; a move off the table is IllegalTransition."""
    _, store, _, _ = backend
    record = _register(store, 2)
    submitting = _submit(store, record)
    assert submitting.version == 2
    assert submitting.lease_owner == "me"
    with pytest.raises(JournalConflict) as stale:
        _submit(store, record)
    assert stale.value.current_version == 2
    with pytest.raises(IllegalTransition):
        store.advance(
            operation_id=record.operation_id,
            expected_version=2,
            step=DeliveryStep(to_state=D.COMPLETE),
            actor="test",
        )
    with pytest.raises(OperationNotFound):
        store.advance(
            operation_id=_op(999),
            expected_version=1,
            step=DeliveryStep(to_state=D.SUBMITTING),
            actor="test",
        )
    with pytest.raises(UnsafeValue):
        store.advance(
            operation_id=record.operation_id,
            expected_version=2,
            step=DeliveryStep(to_state=D.SUBMIT_UNKNOWN, detail="token=abc123secret"),
            actor="test",
        )
    assert store.get(record.operation_id).version == 2


def test_capacity_is_reserved_with_the_attempt_and_released_at_terminal(backend):
    """Limit 2: a third reservation fails with nothing written; RETRY_WAIT and terminal free."""
    _, store, _, _ = backend
    a, b, c = (_register(store, n, limit=2) for n in (10, 11, 12))
    a = _submit(store, a)
    b = _submit(store, b)
    assert store.active_reservations(RECEIVER) == 2
    with pytest.raises(DeliveryCapacityFull):
        _submit(store, c)
    after = store.get(c.operation_id)
    assert after.version == c.version
    assert after.state is D.STAGED
    assert store.attempts(c.operation_id) == []
    b = store.advance(
        operation_id=b.operation_id,
        expected_version=b.version,
        step=DeliveryStep(to_state=D.RETRY_WAIT, attempt_outcome="refused", due_in_s=5.0),
        actor="test",
    )
    assert b.due_at is not None
    assert b.due_at > store.now() + 4
    assert store.active_reservations(RECEIVER) == 1
    c = _submit(store, c)
    accepted = store.advance(
        operation_id=a.operation_id,
        expected_version=a.version,
        step=DeliveryStep(
            to_state=D.ACCEPTED,
            attempt_outcome="accepted",
            receipt="rcpt-1",
            receipt_source="submit",
            observation=JobObservation(receipt="rcpt-1", status=RemoteStatus.RUNNING),
            next_check_in_s=1.0,
        ),
        actor="test",
    )
    assert accepted.lease_owner is None
    assert accepted.next_check_at is not None
    assert store.active_reservations(RECEIVER) == 2
    done = store.advance(
        operation_id=a.operation_id,
        expected_version=accepted.version,
        step=DeliveryStep(
            to_state=D.REMOTE_SUCCEEDED,
            observation=JobObservation(
                receipt="rcpt-1", status=RemoteStatus.SUCCEEDED, rows_processed=2
            ),
        ),
        actor="test",
    )
    assert done.rows_processed == 2
    assert store.active_reservations(RECEIVER) == 1
    assert [o.status for o in store.observations(a.operation_id)] == [
        RemoteStatus.RUNNING,
        RemoteStatus.SUCCEEDED,
    ]
    assert store.attempts(a.operation_id)[0]["outcome"] == "accepted"
    blocked = store.advance(
        operation_id=c.operation_id,
        expected_version=c.version,
        step=DeliveryStep(to_state=D.SUBMIT_UNKNOWN, attempt_outcome="inconclusive"),
        actor="test",
    )
    blocked = store.advance(
        operation_id=c.operation_id,
        expected_version=blocked.version,
        step=DeliveryStep(to_state=D.BLOCKED, block_reason=BlockReason.KEY_LOOKUP_UNSUPPORTED),
        actor="test",
    )
    assert blocked.block_reason is BlockReason.KEY_LOOKUP_UNSUPPORTED
    assert store.active_reservations(RECEIVER) == 1  # unknown work keeps its slot


def test_a_delivery_blocked_before_sending_takes_no_slot(backend):
    """STAGED or RETRY_WAIT -> BLOCKED (nothing sent) never reserves, even at full capacity."""
    _, store, _, _ = backend
    holder = _submit(store, _register(store, 15, limit=1))
    assert store.active_reservations(RECEIVER) == 1
    staged = _register(store, 16, limit=1)
    blocked = store.advance(
        operation_id=staged.operation_id,
        expected_version=staged.version,
        step=DeliveryStep(to_state=D.BLOCKED, block_reason=BlockReason.PAYLOAD_CHANGED),
        actor="test",
    )
    assert blocked.state is D.BLOCKED
    assert store.active_reservations(RECEIVER) == 1
    waiting = store.advance(
        operation_id=holder.operation_id,
        expected_version=holder.version,
        step=DeliveryStep(to_state=D.RETRY_WAIT, attempt_outcome="refused", due_in_s=0.0),
        actor="test",
    )
    assert store.active_reservations(RECEIVER) == 0
    store.advance(
        operation_id=waiting.operation_id,
        expected_version=waiting.version,
        step=DeliveryStep(to_state=D.BLOCKED, block_reason=BlockReason.PAYLOAD_CHANGED),
        actor="test",
    )
    assert store.active_reservations(RECEIVER) == 0
    with pytest.raises(RecoveryRefused):  # no slot to give back
        store.release_capacity(
            operation_id=blocked.operation_id,
            expected_version=blocked.version,
            principal="ops",
            reason="nothing was sent",
        )


def test_a_second_receipt_for_one_key_is_a_conflict(backend):
    """Recording another receipt than the one on file fails and writes nothing."""
    _, store, _, _ = backend
    record = _submit(store, _register(store, 20))
    unknown = store.advance(
        operation_id=record.operation_id,
        expected_version=record.version,
        step=DeliveryStep(to_state=D.SUBMIT_UNKNOWN, receipt="rcpt-a", receipt_source="submit"),
        actor="test",
    )
    with pytest.raises(RecoveryConflict):
        store.advance(
            operation_id=record.operation_id,
            expected_version=unknown.version,
            step=DeliveryStep(to_state=D.ACCEPTED, receipt="rcpt-b", receipt_source="lookup"),
            actor="test",
        )
    assert store.get(record.operation_id).version == unknown.version


def test_eight_processes_race_for_three_slots_on_postgres(pg_available, pg_schema):
    """8 processes reserve at once against a limit of 3 on PostgreSQL: exactly 3 win.

    (On SQLite, tests/crash/test_crash_delivery.py races 8 whole workers.)
    """
    from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

    name, location, schema = "postgres", pg_available, pg_schema
    store = PostgresDeliveryStore(location, schema=schema)  # the schema exists before racing
    start_at = f"{time.time() + 1.5:.3f}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(RACER), name, location, schema, RECEIVER, start_at],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-800:] for _, err in results]
    outcomes = sorted(out.strip() for out, _ in results)
    assert outcomes.count("reserved") == 3, outcomes
    assert outcomes.count("full") == 5
    assert store.active_reservations(RECEIVER) == 3
    store.close()


def test_children_are_registered_together_and_submitted_in_order(backend):
    """register_all is all-or-none; child 1 cannot enter SUBMITTING before child 0 is COMPLETE."""
    _, store, _, _ = backend
    parent = _op(300)
    regs = [
        DeliveryRegistration(
            operation_id=_op(301 + i),
            intent_digest="sha256:" + "d" * 64,
            receiver=RECEIVER,
            receiver_url="http://127.0.0.1:1",
            credential_ref=None,
            payload=PAYLOAD,
            parent_id=parent,
            child_index=i,
        )
        for i in range(2)
    ]
    _register(store, 399, intent="e")  # exists with another intent: fails mid-transaction
    clash = dataclasses.replace(regs[0], operation_id=_op(399), parent_id=None, child_index=None)
    with pytest.raises(IntentConflict):
        store.register_all([*regs, clash], capacity_limit=None, actor="test")
    assert store.children(parent) == []
    first, second = store.register_all(regs, capacity_limit=None, actor="test")
    assert [c.child_index for c in store.children(parent)] == [0, 1]
    with pytest.raises(IllegalTransition):
        _submit(store, second)
    record = _submit(store, first)
    for to, extra in (
        (D.ACCEPTED, {"receipt": "rcpt-c0", "receipt_source": "submit"}),
        (D.REMOTE_SUCCEEDED, {}),
    ):
        record = store.advance(
            operation_id=record.operation_id,
            expected_version=record.version,
            step=DeliveryStep(to_state=to, **extra),
            actor="test",
        )
    with pytest.raises(IllegalTransition):
        _submit(store, second)
    store.advance(
        operation_id=record.operation_id,
        expected_version=record.version,
        step=DeliveryStep(to_state=D.COMPLETE),
        actor="test",
    )
    assert _submit(store, second).state is D.SUBMITTING


def test_operator_releases_a_blocked_slot_with_an_audit_record(backend):
    """Only a BLOCKED delivery's slot is released by an operator; the audit records it."""
    _, store, _, _ = backend
    record = _submit(store, _register(store, 40, limit=1))
    with pytest.raises(RecoveryRefused):
        store.release_capacity(
            operation_id=record.operation_id,
            expected_version=record.version,
            principal="ops",
            reason="checked",
        )
    record = store.advance(
        operation_id=record.operation_id,
        expected_version=record.version,
        step=DeliveryStep(to_state=D.SUBMIT_UNKNOWN, attempt_outcome="inconclusive"),
        actor="test",
    )
    record = store.advance(
        operation_id=record.operation_id,
        expected_version=record.version,
        step=DeliveryStep(to_state=D.BLOCKED, block_reason=BlockReason.KEY_LOOKUP_UNSUPPORTED),
        actor="test",
    )
    assert store.active_reservations(RECEIVER) == 1
    with pytest.raises(UnsafeValue):
        store.release_capacity(
            operation_id=record.operation_id,
            expected_version=record.version,
            principal="ops",
            reason="password=hunter22",
        )
    with pytest.raises(JournalConflict):
        store.release_capacity(
            operation_id=record.operation_id,
            expected_version=record.version - 1,
            principal="ops",
            reason="checked at the receiver: no job",
        )
    released = store.release_capacity(
        operation_id=record.operation_id,
        expected_version=record.version,
        principal="ops",
        reason="checked at the receiver: no job",
    )
    assert released.state is D.BLOCKED
    assert released.version == record.version + 1
    assert store.active_reservations(RECEIVER) == 0
    audit = store.audit_log(record.operation_id)
    assert len(audit) == 1
    assert audit[0]["principal"] == "ops"
    assert audit[0]["action"] == "release-capacity"
    with pytest.raises(RecoveryRefused):  # nothing held any more
        store.release_capacity(
            operation_id=record.operation_id,
            expected_version=released.version,
            principal="ops",
            reason="again",
        )


def test_a_read_only_open_reads_and_creates_nothing(backend, tmp_path):
    """read_only: reads a control plane; a missing one is "no control plane at", none made."""
    name, store, locator, schema = backend
    record = _register(store, 50)
    if name == "sqlite":
        from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore

        with pytest.raises(ConfigInvalid, match="no control plane at"):
            SqliteDeliveryStore(tmp_path / "typo" / "x.db", read_only=True)
        assert not (tmp_path / "typo").exists()
        reader = SqliteDeliveryStore(locator, read_only=True)
    else:
        import psycopg

        from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

        with pytest.raises(ConfigInvalid, match="no control plane at"):
            PostgresDeliveryStore(locator, schema=f"{schema}_typo", read_only=True)
        with psycopg.connect(locator) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (f"{schema}_typo",)
            ).fetchone()
        assert found is None
        reader = PostgresDeliveryStore(locator, schema=schema, read_only=True)
    try:
        assert reader.get(record.operation_id) == record
        with pytest.raises(JournalUnavailable):
            _submit(reader, record)
        assert store.get(record.operation_id) == record
    finally:
        reader.close()


def test_a_conflicting_capacity_limit_is_refused_while_slots_are_held(backend):
    """One receiver, one limit: another limit is refused (naming both) while a slot is
    held, and nothing is registered; once idle, the new limit replaces the old one."""
    _, store, _, _ = backend
    first = _submit(store, _register(store, 60, limit=2))
    with pytest.raises(ConfigInvalid) as conflict:
        _register(store, 61, limit=3)
    assert conflict.value.field == "capacity"
    assert "capacity limit 2" in conflict.value.message
    assert "capacity 3" in conflict.value.message
    assert store.get(_op(61)) is None
    second = _register(store, 61, limit=2)  # the same limit is fine
    assert _register(store, 62) is not None  # no limit declared: the recorded one holds
    _submit(store, second)
    with pytest.raises(DeliveryCapacityFull):
        _submit(store, _register(store, 62))
    for record in (store.get(_op(60)), store.get(_op(61))):
        store.advance(
            operation_id=record.operation_id,
            expected_version=record.version,
            step=DeliveryStep(to_state=D.RETRY_WAIT, attempt_outcome="refused", due_in_s=0.0),
            actor="test",
        )
    assert first.state is D.SUBMITTING
    assert store.active_reservations(RECEIVER) == 0
    _register(store, 63, limit=1)  # idle: a configuration change takes effect
    _submit(store, store.get(_op(62)))
    with pytest.raises(DeliveryCapacityFull):
        _submit(store, store.get(_op(63)))
