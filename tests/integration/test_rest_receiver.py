"""The reference REST receiver itself: idempotency, statuses, fault switches, restart."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

import httpx
import pytest

from dpone.testing.rest_receiver import ReceiverProcess
from tests.fixtures.receiver import RECEIVER_TOKEN

AUTH = {"Authorization": f"Bearer {RECEIVER_TOKEN}"}
PAYLOAD = b'{"id": 1}\n{"id": 2}\n{"id": 3}\n'
DIGEST = "sha256:" + hashlib.sha256(PAYLOAD).hexdigest()


def _key() -> str:
    return "sha256:" + uuid.uuid4().hex * 2


def _upload(rx: ReceiverProcess, data: bytes = PAYLOAD, chunk: int = 10) -> tuple[str, int]:
    upload_id = "u-" + uuid.uuid4().hex
    parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    for seq, part in enumerate(parts):
        response = rx.client.put(
            f"{rx.url}/uploads/{upload_id}/chunks/{seq}", content=part, headers=AUTH
        )
        assert response.status_code == 201
    return upload_id, len(parts)


def _submit(
    rx: ReceiverProcess, key: str, upload: tuple[str, int], digest: str = DIGEST
) -> httpx.Response:
    upload_id, count = upload
    return rx.client.post(
        f"{rx.url}/jobs",
        json={"upload_id": upload_id, "chunk_count": count, "payload_digest": digest},
        headers={**AUTH, "Idempotency-Key": key},
    )


def _status(rx: ReceiverProcess, receipt: str) -> dict[str, object]:
    response = rx.client.get(f"{rx.url}/jobs/{receipt}", headers=AUTH)
    assert response.status_code == 200
    body: dict[str, object] = response.json()
    return body


def test_same_key_and_digest_returns_the_same_receipt_and_one_job(receiver):
    """A repeated submission is answered with the first receipt; one remote job exists."""
    key = _key()
    upload = _upload(receiver)
    first = _submit(receiver, key, upload)
    second = _submit(receiver, key, upload)
    assert first.status_code == second.status_code == 202
    assert first.json()["receipt"] == second.json()["receipt"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert first.json()["rows_total"] == 3
    assert receiver.jobs_created(key) == 1


def test_same_key_with_another_digest_is_a_conflict(receiver):
    """A key reused for other bytes is refused with 409 and creates nothing."""
    key = _key()
    assert _submit(receiver, key, _upload(receiver)).status_code == 202
    other = b'{"id": 9}\n'
    response = _submit(
        receiver, key, _upload(receiver, other), "sha256:" + hashlib.sha256(other).hexdigest()
    )
    assert response.status_code == 409
    assert response.json()["error"] == "idempotency_key_reused"
    assert receiver.jobs_created(key) == 1


def test_uploads_are_idempotent_per_chunk_and_checked_against_the_digest(receiver):
    """Same chunk bytes again: 200; other bytes: 409; missing chunks or wrong digest: 422."""
    upload_id, count = _upload(receiver)
    url = f"{receiver.url}/uploads/{upload_id}/chunks/0"
    assert receiver.client.put(url, content=PAYLOAD[:10], headers=AUTH).status_code == 200
    assert receiver.client.put(url, content=b"x" * 10, headers=AUTH).status_code == 409
    key = _key()
    assert _submit(receiver, key, (upload_id, count + 1)).status_code == 422
    wrong = "sha256:" + "0" * 64
    assert _submit(receiver, key, (upload_id, count), wrong).status_code == 422
    assert receiver.jobs_created(key) == 0
    missing_key = receiver.client.post(
        f"{receiver.url}/jobs",
        json={"upload_id": upload_id, "chunk_count": count, "payload_digest": DIGEST},
        headers=AUTH,
    )
    assert missing_key.status_code == 400


def test_requests_without_the_bearer_token_are_refused(receiver):
    """Every non-admin endpoint answers 401 without the token and creates nothing."""
    key = _key()
    response = receiver.client.post(
        f"{receiver.url}/jobs",
        json={"upload_id": "u", "chunk_count": 0, "payload_digest": DIGEST},
        headers={"Idempotency-Key": key},
    )
    assert response.status_code == 401
    assert (
        receiver.client.get(f"{receiver.url}/jobs", params={"idempotency_key": key}).status_code
        == 401
    )
    assert receiver.jobs_created(key) == 0


def test_job_moves_accepted_running_succeeded_with_counts(receiver):
    """Status follows the job's recorded times; rows_processed reaches rows_total."""
    receiver.set_faults(accept_phase_s=0.3, job_duration_s=0.6)
    receipt = _submit(receiver, _key(), _upload(receiver)).json()["receipt"]
    seen = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        body = _status(receiver, receipt)
        if not seen or seen[-1] != body["status"]:
            seen.append(body["status"])
        if body["status"] == "succeeded":
            assert body["rows_processed"] == 3
            break
        time.sleep(0.05)
    assert seen == ["accepted", "running", "succeeded"]


def test_failed_and_externally_cancelled_jobs(receiver):
    """fail_next_jobs ends a job failed; an external cancel ends a running job cancelled."""
    receiver.set_faults(fail_next_jobs=1)
    failed = _submit(receiver, _key(), _upload(receiver)).json()
    assert _status(receiver, failed["receipt"])["status"] == "failed"
    assert _status(receiver, failed["receipt"])["rows_failed"] == 3
    receiver.set_faults(job_duration_s=30.0)
    running = _submit(receiver, _key(), _upload(receiver)).json()
    assert _status(receiver, running["receipt"])["status"] == "running"
    assert receiver.cancel(running["receipt"])["status"] == "cancelled"
    assert _status(receiver, running["receipt"])["status"] == "cancelled"
    assert receiver.client.get(f"{receiver.url}/jobs/rcpt-unknown", headers=AUTH).status_code == 404


def test_unavailable_before_accepting_creates_no_job(receiver):
    """The 503 switch answers before anything is recorded; the next submission succeeds."""
    receiver.set_faults(unavailable_before_accept=1)
    key = _key()
    upload = _upload(receiver)
    refused = _submit(receiver, key, upload)
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "1"
    assert receiver.jobs_created(key) == 0
    assert _submit(receiver, key, upload).status_code == 202
    assert receiver.jobs_created(key) == 1


def test_dropped_answer_leaves_one_job_that_key_lookup_finds(receiver):
    """After a cut answer the job exists; GET /jobs?idempotency_key finds exactly it."""
    receiver.set_faults(drop_response_after_accept=1)
    key = _key()
    with pytest.raises(httpx.RemoteProtocolError):
        _submit(receiver, key, _upload(receiver))
    found = receiver.client.get(
        f"{receiver.url}/jobs", params={"idempotency_key": key}, headers=AUTH
    )
    assert found.status_code == 200
    jobs = found.json()["jobs"]
    assert len(jobs) == 1
    assert jobs[0]["payload_digest"] == DIGEST
    assert receiver.jobs_created(key) == 1


def test_receiver_without_key_lookup_answers_501(receiver):
    """The no-lookup mode refuses GET /jobs?idempotency_key=K with 501."""
    receiver.set_faults(key_lookup=False)
    response = receiver.client.get(
        f"{receiver.url}/jobs", params={"idempotency_key": _key()}, headers=AUTH
    )
    assert response.status_code == 501
    assert response.json()["error"] == "key_lookup_unsupported"


def test_restart_after_sigkill_loses_nothing(tmp_path: Path):
    """Jobs, receipts, counts and fault switches survive a SIGKILL and restart."""
    with ReceiverProcess(tmp_path) as rx:
        rx.set_faults(job_duration_s=0.5, key_lookup=False)
        key = _key()
        upload_id = "u-restart"
        rx.client.put(f"{rx.url}/uploads/{upload_id}/chunks/0", content=PAYLOAD)
        receipt = _submit(rx, key, (upload_id, 1)).json()["receipt"]
        old_pid, old_port = rx.pid, rx.port
        rx.restart(hard=True)
        assert rx.pid != old_pid
        assert rx.port == old_port
        assert rx.jobs_created(key) == 1
        assert _submit(rx, key, (upload_id, 1)).json()["receipt"] == receipt
        assert rx.jobs_created(key) == 1
        assert rx.client.get(f"{rx.url}/admin/faults").json()["key_lookup"] is False
        time.sleep(0.5)
        assert _status(rx, receipt)["status"] == "succeeded"


def test_max_active_counts_concurrent_unfinished_jobs(receiver):
    """The receiver records the largest number of unfinished jobs it ever held."""
    before = receiver.stats()["counters"].get("max_active", 0)
    receiver.set_faults(job_duration_s=30.0)
    receipts = [_submit(receiver, _key(), _upload(receiver)).json()["receipt"] for _ in range(2)]
    assert receiver.stats()["counters"]["max_active"] >= 2
    for receipt in receipts:
        receiver.cancel(receipt)
    assert before <= receiver.stats()["counters"]["max_active"]
