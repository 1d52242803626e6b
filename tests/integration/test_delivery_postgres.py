"""The delivery processor end to end on the PostgreSQL control plane (production shape)."""

from __future__ import annotations

import time

import pytest

from dpone.contracts.delivery import (
    BlockReason,
    DeliveryBlocked,
    DeliveryCompleted,
    DeliveryPending,
    DeliveryState,
)
from dpone.errors import DeliveryCapacityFull
from tests.fixtures.receiver import RECEIVER_TOKEN
from tests.integration.test_delivery import (
    TOKEN_ENV,
    _payload,
    _processor,
    _receiver_id,
    _request,
)


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)


@pytest.fixture
def pg_store(pg_available, pg_schema):
    from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

    store = PostgresDeliveryStore(pg_available, schema=pg_schema)
    yield store
    store.close()


@pytest.fixture(autouse=True)
def _close_processors():
    from tests.integration.test_delivery import _OPEN

    yield
    while _OPEN:
        _OPEN.pop().close()


def test_pending_then_completed_with_capacity_on_postgres(receiver, pg_store, tmp_path):
    """Pending after a durable receipt; a second delivery waits for the slot; both complete."""
    receiver.set_faults(job_duration_s=0.3)
    proc = _processor(pg_store)
    first = _request(receiver, _payload(tmp_path), limit=1)
    assert isinstance(proc.deliver(first), DeliveryPending)
    record = pg_store.get(first.operation_id)
    assert record.state is DeliveryState.ACCEPTED
    assert record.receipt is not None
    second = _request(receiver, _payload(tmp_path), limit=1)
    with pytest.raises(DeliveryCapacityFull):
        proc.deliver(second)
    time.sleep(0.35)
    assert isinstance(proc.resume(first.operation_id), DeliveryCompleted)
    assert pg_store.active_reservations(_receiver_id(receiver)) == 0
    receiver.set_faults(job_duration_s=0.0)
    assert isinstance(proc.resume(second.operation_id), DeliveryCompleted)
    assert receiver.jobs_created(first.operation_id) == 1
    assert receiver.jobs_created(second.operation_id) == 1


def test_lost_answer_reconciled_or_blocked_on_postgres(receiver, pg_store, tmp_path):
    """A cut 202 is adopted by key lookup; without lookup the delivery blocks."""
    receiver.set_faults(drop_response_after_accept=1)
    proc = _processor(pg_store)
    found = _request(receiver, _payload(tmp_path))
    assert isinstance(proc.deliver(found), DeliveryCompleted)
    assert receiver.jobs_created(found.operation_id) == 1
    receiver.set_faults(drop_response_after_accept=1, key_lookup=False)
    lost = _request(receiver, _payload(tmp_path), limit=2)
    blocked = proc.deliver(lost)
    assert isinstance(blocked, DeliveryBlocked)
    assert blocked.reason is BlockReason.KEY_LOOKUP_UNSUPPORTED
    assert pg_store.active_reservations(_receiver_id(receiver)) == 1
    assert receiver.jobs_created(lost.operation_id) == 1
