"""Resumable delivery against the real reference receiver, on the SQLite control plane."""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
import uuid
from pathlib import Path

import pytest

from dpone.adapters.delivery.rest import RestDeliverySink
from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore
from dpone.contracts.delivery import (
    BlockReason,
    DeliveryBlocked,
    DeliveryCompleted,
    DeliveryPending,
    DeliveryState,
    LookupAbsent,
    LookupFound,
    SubmitAccepted,
    SubmitRefused,
)
from dpone.errors import (
    ConfigInvalid,
    DeliveryCapacityFull,
    DeliveryCredentialRefused,
    DeliveryRejected,
    InjectedFault,
    IntentConflict,
    ReceiverUnavailable,
)
from dpone.runtime import failpoints
from dpone.runtime.delivery import (
    DeliveryPolicy,
    DeliveryRequest,
    ParentDeliveryRequest,
    ResumableDeliveryProcessor,
    delivery_intent_digest,
    stage_payload,
)
from tests.fixtures.receiver import RECEIVER_TOKEN

TOKEN_ENV = "DPONE_TEST_DELIVERY_TOKEN"  # noqa: S105 - a variable name
FAST = DeliveryPolicy(
    poll_interval_s=0.1, poll_budget_s=0.0, wait_budget_s=0.0, retry_base_s=0.1, retry_max_s=0.5
)


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)


@pytest.fixture(autouse=True)
def _no_failpoints():
    yield
    failpoints.configure(None)


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteDeliveryStore(tmp_path / "journal.sqlite")
    yield s
    s.close()


def _op() -> str:
    return "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def _payload(tmp_path: Path, rows: int = 5, chunk_bytes: int = 16) -> Path:
    path = tmp_path / f"payload-{uuid.uuid4().hex[:8]}.jsonl"
    path.write_text("".join(f'{{"id": {i}}}\n' for i in range(rows)))
    return path


_OPEN: list[ResumableDeliveryProcessor] = []


@pytest.fixture(autouse=True)
def _close_processors():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _processor(store, policy: DeliveryPolicy = FAST) -> ResumableDeliveryProcessor:
    def factory(url: str, ref: str | None) -> RestDeliverySink:
        return RestDeliverySink(url, credential_ref=ref, timeout_s=5.0)

    proc = ResumableDeliveryProcessor(store=store, sink_factory=factory, policy=policy)
    _OPEN.append(proc)
    return proc


def _request(
    receiver, path: Path, *, op: str | None = None, limit: int | None = None, chunk: int = 16
) -> DeliveryRequest:
    payload = stage_payload(path, chunk_bytes=chunk)
    return DeliveryRequest(
        operation_id=op or _op(),
        intent_digest=delivery_intent_digest(
            payload=payload, receiver=receiver.url, pack_fingerprint="pack-test"
        ),
        payload=payload,
        receiver_url=receiver.url,
        credential_ref=f"env:{TOKEN_ENV}",
        capacity_limit=limit,
    )


def _receiver_id(receiver) -> str:
    return f"rest:{receiver.url}"


# ---------------------------------------------------------------- connector
def test_sink_uploads_in_bounded_chunks_and_submits_by_key(receiver, tmp_path):
    """The sink sends the file in chunks of at most chunk_bytes; the job counts every row."""
    payload = stage_payload(_payload(tmp_path, rows=7), chunk_bytes=10)
    assert payload.chunk_count == -(-payload.size_bytes // 10) > 3
    sink = RestDeliverySink(receiver.url, credential_ref=f"env:{TOKEN_ENV}")
    op = _op()
    sink.upload(operation_id=op, payload=payload)
    sink.upload(operation_id=op, payload=payload)  # resumable: the same chunks again
    first = sink.submit(operation_id=op, payload=payload)
    again = sink.submit(operation_id=op, payload=payload)
    assert isinstance(first, SubmitAccepted)
    assert isinstance(again, SubmitAccepted)
    assert again.replayed
    assert first.observation.receipt == again.observation.receipt
    assert first.observation.rows_total == 7
    assert sink.observe(receipt=first.observation.receipt).status.value == "succeeded"
    found = sink.lookup(operation_id=op)
    assert isinstance(found, LookupFound)
    assert found.jobs[0].receipt == first.observation.receipt
    assert isinstance(sink.lookup(operation_id=_op()), LookupAbsent)
    assert receiver.jobs_created(op) == 1
    sink.close()


def test_sink_classifies_refusals_and_never_logs_the_token(receiver, tmp_path, caplog):
    """503 is transient, 401 terminal, no connection transient; the token never reaches logs."""
    caplog.set_level(logging.DEBUG)
    payload = stage_payload(_payload(tmp_path), chunk_bytes=64)
    sink = RestDeliverySink(receiver.url, credential_ref=f"env:{TOKEN_ENV}")
    op = _op()
    sink.upload(operation_id=op, payload=payload)
    receiver.set_faults(unavailable_before_accept=1)
    refused = sink.submit(operation_id=op, payload=payload)
    assert isinstance(refused, SubmitRefused)
    assert refused.transient
    assert refused.retry_after_s == 1.0
    bad = RestDeliverySink(receiver.url, credential_ref="env:DPONE_TEST_NO_SUCH_TOKEN_VAR")
    with pytest.raises(ConfigInvalid):
        bad.upload(operation_id=op, payload=payload)
    unsent = bad.submit(operation_id=op, payload=payload)
    assert isinstance(unsent, SubmitRefused)
    assert unsent.transient
    assert unsent.reason == "credential_unavailable"
    Path(tmp_path / "wrong").write_text("wrong-token\n")
    wrong = RestDeliverySink(receiver.url, credential_ref=f"file:{tmp_path / 'wrong'}")
    rejected = wrong.submit(operation_id=op, payload=payload)
    assert isinstance(rejected, SubmitRefused)
    assert not rejected.transient
    assert rejected.http_status == 401
    closed = RestDeliverySink("http://127.0.0.1:9", credential_ref=f"env:{TOKEN_ENV}")
    down = closed.submit(operation_id=op, payload=payload)
    assert isinstance(down, SubmitRefused)
    assert down.transient
    assert down.http_status is None
    assert receiver.jobs_created(op) == 0
    assert RECEIVER_TOKEN not in caplog.text
    for s in (sink, bad, wrong, closed):
        s.close()


def test_credentials_must_be_references(receiver):
    """A token pasted as the credential, or a URL with user info, is refused up front."""
    with pytest.raises(ConfigInvalid):
        RestDeliverySink(receiver.url, credential_ref=RECEIVER_TOKEN)
    with pytest.raises(ConfigInvalid):
        RestDeliverySink(f"http://user:pw@127.0.0.1:{receiver.port}")


# ---------------------------------------------------------------- processor
def test_pending_only_after_the_receipt_is_durable_then_completed(receiver, store, tmp_path):
    """A slow job: Pending (receipt, attempt, capacity durable), then Completed on resume."""
    receiver.set_faults(job_duration_s=0.4)
    proc = _processor(store)
    request = _request(receiver, _payload(tmp_path), limit=3)
    result = proc.deliver(request)
    assert isinstance(result, DeliveryPending)
    assert result.continuation == "poll_receipt"
    record = store.get(request.operation_id)
    assert record.state is DeliveryState.ACCEPTED
    assert record.receipt is not None
    assert record.next_check_at == result.next_check_at
    assert [a["outcome"] for a in store.attempts(request.operation_id)] == ["accepted"]
    assert store.active_reservations(_receiver_id(receiver)) == 1
    time.sleep(0.45)
    done = proc.resume(request.operation_id)
    assert isinstance(done, DeliveryCompleted)
    assert done.receipt == record.receipt
    assert store.active_reservations(_receiver_id(receiver)) == 0
    again = proc.deliver(request)
    assert isinstance(again, DeliveryCompleted)
    assert again.replayed
    assert receiver.jobs_created(request.operation_id) == 1
    states = [h["to_state"] for h in store.history(request.operation_id)]
    assert states == ["STAGED", "SUBMITTING", "ACCEPTED", "REMOTE_SUCCEEDED", "COMPLETE"]


def test_poll_budget_keeps_observing_until_terminal(receiver, store, tmp_path):
    """With a poll budget the same call observes until the job succeeds."""
    receiver.set_faults(accept_phase_s=0.1, job_duration_s=0.3)
    policy = DeliveryPolicy(poll_interval_s=0.1, poll_budget_s=5.0, wait_budget_s=0.0)
    result = _processor(store, policy).deliver(_request(receiver, _payload(tmp_path)))
    assert isinstance(result, DeliveryCompleted)
    observed = store.observations(result.operation_id)
    assert observed[-1].status.value == "succeeded"
    assert len(observed) >= 2


def test_transient_refusal_goes_to_durable_retry_wait(receiver, store, tmp_path):
    """503 before acceptance: RETRY_WAIT with a due time, capacity released, no job."""
    receiver.set_faults(unavailable_before_accept=1)
    request = _request(receiver, _payload(tmp_path), limit=2)
    proc = _processor(store)
    with pytest.raises(ReceiverUnavailable):
        proc.deliver(request)
    record = store.get(request.operation_id)
    assert record.state is DeliveryState.RETRY_WAIT
    assert record.due_at is not None
    assert record.due_at > store.now()
    # the receiver's Retry-After (1 s) is honoured although the backoff cap is 0.5 s
    assert record.due_at - record.updated_at == pytest.approx(1.0, abs=0.05)
    assert store.active_reservations(_receiver_id(receiver)) == 0
    assert receiver.jobs_created(request.operation_id) == 0
    time.sleep(max(record.due_at - store.now(), 0) + 0.01)
    assert isinstance(proc.resume(request.operation_id), DeliveryCompleted)
    outcomes = [a["outcome"] for a in store.attempts(request.operation_id)]
    assert outcomes == ["refused_before_accept", "accepted"]
    assert receiver.jobs_created(request.operation_id) == 1


def test_retry_wait_is_retried_within_the_wait_budget(receiver, store, tmp_path):
    """A live worker with a wait budget performs the due transition itself."""
    receiver.set_faults(unavailable_before_accept=2)
    policy = DeliveryPolicy(
        poll_interval_s=0.1, wait_budget_s=10.0, retry_base_s=0.05, retry_max_s=0.1
    )
    request = _request(receiver, _payload(tmp_path))
    result = _processor(store, policy).deliver(request)
    assert isinstance(result, DeliveryCompleted)
    assert len(store.attempts(request.operation_id)) == 3
    assert receiver.jobs_created(request.operation_id) == 1


def test_lost_answer_is_reconciled_by_key_without_a_second_job(receiver, store, tmp_path):
    """The 202 is cut after accepting: key lookup adopts the existing receipt."""
    receiver.set_faults(drop_response_after_accept=1)
    request = _request(receiver, _payload(tmp_path), limit=1)
    result = _processor(store).deliver(request)
    assert isinstance(result, DeliveryCompleted)
    assert receiver.jobs_created(request.operation_id) == 1
    states = [h["to_state"] for h in store.history(request.operation_id)]
    assert states[:4] == ["STAGED", "SUBMITTING", "SUBMIT_UNKNOWN", "REMOTE_SUCCEEDED"]
    assert [a["outcome"] for a in store.attempts(request.operation_id)] == ["inconclusive"]
    assert store.active_reservations(_receiver_id(receiver)) == 0


def test_lost_answer_without_key_lookup_blocks_for_an_operator(receiver, store, tmp_path):
    """No key lookup: blocked with a clear message, capacity held, nothing resent."""
    receiver.set_faults(drop_response_after_accept=1, key_lookup=False)
    request = _request(receiver, _payload(tmp_path), limit=1)
    proc = _processor(store)
    result = proc.deliver(request)
    assert isinstance(result, DeliveryBlocked)
    assert result.reason is BlockReason.KEY_LOOKUP_UNSUPPORTED
    assert "cannot look up idempotency keys" in result.message
    assert result.recovery_ref.startswith("dpone delivery status")
    assert store.active_reservations(_receiver_id(receiver)) == 1
    assert isinstance(proc.resume(request.operation_id), DeliveryBlocked)
    assert receiver.jobs_created(request.operation_id) == 1
    assert receiver.stats()["counters"]["submits"] >= 1


def test_crash_after_submit_before_receipt_is_reconciled(receiver, store, tmp_path):
    """The process dies between the 202 and the durable receipt: lookup adopts the job."""
    failpoints.configure("after:delivery.submit=raise")
    request = _request(receiver, _payload(tmp_path))
    proc = _processor(store)
    with pytest.raises(InjectedFault):
        proc.deliver(request)
    assert store.get(request.operation_id).state is DeliveryState.SUBMITTING
    failpoints.configure(None)
    assert isinstance(proc.resume(request.operation_id), DeliveryCompleted)
    assert receiver.jobs_created(request.operation_id) == 1
    assert [a["outcome"] for a in store.attempts(request.operation_id)] == ["abandoned"]


def test_crash_before_submit_resubmits_under_the_same_key(receiver, store, tmp_path):
    """The process dies in SUBMITTING before sending: lookup finds nothing, one submit."""
    failpoints.configure("before:delivery.submit=raise")
    request = _request(receiver, _payload(tmp_path))
    proc = _processor(store)
    with pytest.raises(InjectedFault):
        proc.deliver(request)
    failpoints.configure(None)
    assert isinstance(proc.resume(request.operation_id), DeliveryCompleted)
    assert receiver.jobs_created(request.operation_id) == 1
    outcomes = [a["outcome"] for a in store.attempts(request.operation_id)]
    assert outcomes == ["abandoned", "accepted"]


def test_another_live_submitter_is_not_disturbed(receiver, store, tmp_path):
    """A SUBMITTING record leased by another live process raises LeaseHeld, sends nothing."""
    failpoints.configure("before:delivery.submit=raise")
    request = _request(receiver, _payload(tmp_path))
    first = _processor(store)
    with pytest.raises(InjectedFault):
        first.deliver(request)
    failpoints.configure(None)
    other = _processor(store)
    other.owner = "other-host:1"
    from dpone.errors import LeaseHeld

    with pytest.raises(LeaseHeld):
        other.resume(request.operation_id)
    assert receiver.jobs_created(request.operation_id) == 0


def test_remote_failure_and_external_cancel_block(receiver, store, tmp_path):
    """A failed job and an externally cancelled one are observed and blocked; capacity freed."""
    receiver.set_faults(fail_next_jobs=1)
    proc = _processor(store)
    failed = proc.deliver(_request(receiver, _payload(tmp_path), limit=2))
    assert isinstance(failed, DeliveryBlocked)
    assert failed.reason is BlockReason.REMOTE_FAILED
    receiver.set_faults(job_duration_s=30.0)
    request = _request(receiver, _payload(tmp_path), limit=2)
    assert isinstance(proc.deliver(request), DeliveryPending)
    receiver.cancel(store.get(request.operation_id).receipt)
    cancelled = proc.resume(request.operation_id)
    assert isinstance(cancelled, DeliveryBlocked)
    assert cancelled.reason is BlockReason.REMOTE_CANCELLED
    assert store.active_reservations(_receiver_id(receiver)) == 0


def test_capacity_limit_is_held_until_terminal(receiver, store, tmp_path):
    """With limit 1 a second delivery waits until the first job is terminal and observed."""
    receiver.set_faults(job_duration_s=30.0)
    proc = _processor(store)
    first = _request(receiver, _payload(tmp_path), limit=1)
    assert isinstance(proc.deliver(first), DeliveryPending)
    second = _request(receiver, _payload(tmp_path), limit=1)
    with pytest.raises(DeliveryCapacityFull):
        proc.deliver(second)
    assert store.get(second.operation_id).state is DeliveryState.STAGED
    assert receiver.jobs_created(second.operation_id) == 0
    receiver.cancel(store.get(first.operation_id).receipt)
    assert isinstance(proc.resume(first.operation_id), DeliveryBlocked)
    receiver.set_faults(job_duration_s=0.0)
    assert isinstance(proc.resume(second.operation_id), DeliveryCompleted)


def test_a_capacity_wait_uploads_nothing_until_a_slot_is_free(receiver, store, tmp_path):
    """Waiting for a slot (wait budget, polling) uploads nothing; once free, one upload."""
    uploads: list[str] = []

    class Counting(RestDeliverySink):
        def upload(self, *, operation_id, payload):
            uploads.append(operation_id)
            super().upload(operation_id=operation_id, payload=payload)

    receiver.set_faults(job_duration_s=30.0)
    policy = DeliveryPolicy(poll_interval_s=0.05, wait_budget_s=0.5)
    proc = ResumableDeliveryProcessor(
        store=store,
        sink_factory=lambda url, ref: Counting(url, credential_ref=ref, timeout_s=5.0),
        policy=policy,
    )
    _OPEN.append(proc)
    first = _request(receiver, _payload(tmp_path), limit=1)
    assert isinstance(proc.deliver(first), DeliveryPending)
    second = _request(receiver, _payload(tmp_path), limit=1)
    with pytest.raises(DeliveryCapacityFull):
        proc.deliver(second)
    assert uploads.count(second.operation_id) == 0
    receiver.cancel(store.get(first.operation_id).receipt)
    assert isinstance(proc.resume(first.operation_id), DeliveryBlocked)
    receiver.set_faults(job_duration_s=0.0)
    assert isinstance(proc.resume(second.operation_id), DeliveryCompleted)
    assert uploads.count(second.operation_id) == 1
    assert uploads.count(first.operation_id) == 1


def test_a_changed_payload_blocks_without_a_slot_even_at_full_capacity(receiver, store, tmp_path):
    """Nothing was sent: the changed payload blocks (not CAPACITY_FULL) and takes no slot."""
    receiver.set_faults(job_duration_s=30.0)
    proc = _processor(store)
    first = _request(receiver, _payload(tmp_path), limit=1)
    assert isinstance(proc.deliver(first), DeliveryPending)
    path = _payload(tmp_path)
    second = _request(receiver, path, limit=1)
    with pytest.raises(DeliveryCapacityFull):
        proc.deliver(second)
    path.write_text('{"id": "changed"}\n')
    blocked = proc.resume(second.operation_id)
    assert isinstance(blocked, DeliveryBlocked)
    assert blocked.reason is BlockReason.PAYLOAD_CHANGED
    assert store.active_reservations(_receiver_id(receiver)) == 1  # the first job's only
    receiver.cancel(store.get(first.operation_id).receipt)
    assert isinstance(proc.resume(first.operation_id), DeliveryBlocked)
    assert store.active_reservations(_receiver_id(receiver)) == 0


def test_intent_conflict_and_changed_payload(receiver, store, tmp_path):
    """Another payload under the same operation: IntentConflict; a changed file: blocked."""
    proc = _processor(store)
    path = _payload(tmp_path)
    request = _request(receiver, path)
    other = _request(receiver, _payload(tmp_path, rows=2), op=request.operation_id)
    receiver.set_faults(unavailable_before_accept=1)
    with pytest.raises(ReceiverUnavailable):
        proc.deliver(request)
    with pytest.raises(IntentConflict):
        proc.deliver(other)
    path.write_text('{"id": "changed"}\n')
    time.sleep(max(store.get(request.operation_id).due_at - store.now(), 0) + 0.01)
    blocked = proc.resume(request.operation_id)
    assert isinstance(blocked, DeliveryBlocked)
    assert blocked.reason is BlockReason.PAYLOAD_CHANGED
    assert receiver.jobs_created(request.operation_id) == 0


def test_receiver_restart_while_pending(receiver, store, tmp_path):
    """A receiver down during a check keeps the delivery pending; after restart it completes."""
    receiver.set_faults(job_duration_s=0.3)
    proc = _processor(store)
    request = _request(receiver, _payload(tmp_path))
    assert isinstance(proc.deliver(request), DeliveryPending)
    receiver.kill()
    proc.close()  # drop pooled connections to the dead process
    pending = proc.resume(request.operation_id)
    assert isinstance(pending, DeliveryPending)
    receiver.start()
    time.sleep(0.3)
    assert isinstance(proc.resume(request.operation_id), DeliveryCompleted)
    assert receiver.jobs_created(request.operation_id) == 1


def test_a_stale_token_on_a_status_request_keeps_the_delivery_waiting(
    receiver, store, tmp_path, monkeypatch
):
    """401 on a status GET (token rotated mid-deferral): ACCEPTED, slot held, then completes."""
    receiver.set_faults(job_duration_s=0.3)
    proc = _processor(store)
    request = _request(receiver, _payload(tmp_path), limit=1)
    assert isinstance(proc.deliver(request), DeliveryPending)
    before = store.get(request.operation_id)
    monkeypatch.setenv(TOKEN_ENV, "stale-token")
    with pytest.raises(DeliveryCredentialRefused) as refused:
        proc.resume(request.operation_id)
    assert refused.value.retryable
    assert f"env:{TOKEN_ENV}" in refused.value.message
    assert "stale-token" not in str(refused.value)
    record = store.get(request.operation_id)
    assert record.state is DeliveryState.ACCEPTED
    assert record.receipt == before.receipt
    assert record.next_check_at is not None
    assert record.next_check_at > store.now()
    assert store.active_reservations(_receiver_id(receiver)) == 1
    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)
    time.sleep(0.35)
    assert isinstance(proc.resume(request.operation_id), DeliveryCompleted)
    assert receiver.jobs_created(request.operation_id) == 1
    assert store.active_reservations(_receiver_id(receiver)) == 0


def test_an_unknown_receipt_is_rejected_not_retried(receiver):
    """404 on the status GET is not a credential problem: it stays terminal (receipt_unknown)."""
    sink = RestDeliverySink(receiver.url, credential_ref=f"env:{TOKEN_ENV}")
    with pytest.raises(DeliveryRejected) as unknown:
        sink.observe(receipt="job_" + "0" * 32)
    assert not isinstance(unknown.value, DeliveryCredentialRefused)
    sink.close()


def test_duplicate_observers_are_harmless(receiver, store, tmp_path):
    """Two processors resuming one delivery at once: one job, both end Completed."""
    receiver.set_faults(job_duration_s=0.2)
    request = _request(receiver, _payload(tmp_path))
    assert isinstance(_processor(store).deliver(request), DeliveryPending)
    time.sleep(0.25)
    results: list[object] = []

    def observe() -> None:
        policy = DeliveryPolicy(poll_interval_s=0.05, poll_budget_s=2.0)
        results.append(_processor(store, policy).resume(request.operation_id))

    threads = [threading.Thread(target=observe) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, DeliveryCompleted) for r in results)
    assert receiver.jobs_created(request.operation_id) == 1
    states = [h["to_state"] for h in store.history(request.operation_id)]
    assert states.count("COMPLETE") == 1


def test_no_secret_reaches_the_control_plane(receiver, store, tmp_path):
    """The store file holds the credential reference, never the token."""
    request = _request(receiver, _payload(tmp_path))
    assert isinstance(_processor(store).deliver(request), DeliveryCompleted)
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("journal.sqlite*"))
    assert RECEIVER_TOKEN.encode() not in raw
    assert TOKEN_ENV.encode() in raw


# ---------------------------------------------------------------- parents and children
def _parent(receiver, path: Path, *, rows_per_child: int = 2) -> ParentDeliveryRequest:
    payload = stage_payload(path, chunk_bytes=16)
    return ParentDeliveryRequest(
        operation_id=_op(),
        intent_digest=delivery_intent_digest(
            payload=payload, receiver=receiver.url, pack_fingerprint="pack-test"
        ),
        payload=payload,
        rows_per_child=rows_per_child,
        receiver_url=receiver.url,
        credential_ref=f"env:{TOKEN_ENV}",
        capacity_limit=3,
    )


def test_split_delivery_runs_children_one_after_another(receiver, store, tmp_path):
    """5 rows in children of 2: three remote jobs, each submitted after the previous ended."""
    receiver.set_faults(job_duration_s=0.15)
    proc = _processor(store)
    request = _parent(receiver, _payload(tmp_path, rows=5))
    result = proc.deliver_parent(request)
    assert isinstance(result, DeliveryPending)
    assert result.operation_id == request.operation_id
    children = store.children(request.operation_id)
    assert [c.payload.rows for c in children] == [2, 2, 1]
    assert [c.state for c in children] == [
        DeliveryState.ACCEPTED,
        DeliveryState.STAGED,
        DeliveryState.STAGED,
    ]
    deadline = time.monotonic() + 10
    while not isinstance(result, DeliveryCompleted) and time.monotonic() < deadline:
        time.sleep(0.1)
        result = proc.resume(request.operation_id)
        in_flight = [
            c
            for c in store.children(request.operation_id)
            if c.state not in (DeliveryState.STAGED, DeliveryState.COMPLETE)
        ]
        assert len(in_flight) <= 1
    assert isinstance(result, DeliveryCompleted)
    assert result.rows == 5
    children = store.children(request.operation_id)
    assert all(receiver.jobs_created(c.operation_id) == 1 for c in children)
    for earlier, later in itertools.pairwise(children):
        completed_at = next(
            h["at"] for h in store.history(earlier.operation_id) if h["to_state"] == "COMPLETE"
        )
        submitted_at = next(
            h["at"] for h in store.history(later.operation_id) if h["to_state"] == "SUBMITTING"
        )
        assert submitted_at >= completed_at
    again = proc.deliver_parent(request)
    assert isinstance(again, DeliveryCompleted)
    assert again.replayed


def test_a_failed_child_blocks_the_parent_and_later_children_never_start(receiver, store, tmp_path):
    """Child 0 fails remotely: the parent is blocked and children 1.. are never submitted."""
    receiver.set_faults(fail_next_jobs=1)
    proc = _processor(store)
    request = _parent(receiver, _payload(tmp_path, rows=4))
    blocked = proc.deliver_parent(request)
    assert isinstance(blocked, DeliveryBlocked)
    assert blocked.reason is BlockReason.REMOTE_FAILED
    assert "child 0" in blocked.message
    later = store.children(request.operation_id)[1]
    assert later.state is DeliveryState.STAGED
    assert receiver.jobs_created(later.operation_id) == 0
    assert isinstance(proc.resume(request.operation_id), DeliveryBlocked)
