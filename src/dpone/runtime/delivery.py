"""The resumable delivery processor: submit once by key, observe, never resend blindly.

``ResumableDeliveryProcessor`` runs one delivery (an asynchronous job at a REST
receiver) from the durable control plane. Every call rereads the record and
dispatches on its state, so a call after any crash continues where the last one
stopped. It returns ``DeliveryCompleted | DeliveryPending | DeliveryBlocked``;
``DeliveryPending`` only once the payload authority, the attempt and the accepted
receipt are durable. Relational processing (``commit_protocol``) is untouched.

Rules (ARCHITECTURE section 14):
- capacity reservation, attempt append and the move to SUBMITTING are one write;
- a failure proven to be before acceptance (no connection, 503/429) goes to durable
  RETRY_WAIT with a due time; the same call retries it while its wait budget lasts;
- a submit without a conclusive answer goes to SUBMIT_UNKNOWN and is reconciled by
  key lookup: a job found is adopted, no job found is submitted again under the same
  key (the receiver dedupes), a receiver without lookup blocks for an operator;
- observation is GET only and idempotent; two observers race only on the CAS.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpone.contracts.delivery import (
    BlockReason,
    DeliveryBlocked,
    DeliveryCompleted,
    DeliveryPending,
    DeliveryRecord,
    DeliveryRegistration,
    DeliveryResult,
    DeliveryState,
    DeliveryStep,
    JobObservation,
    LookupAbsent,
    LookupFound,
    PayloadRef,
    RemoteStatus,
    SubmitAccepted,
    SubmitRefused,
)
from dpone.contracts.identity import derive_intent_digest, digest_of
from dpone.errors import (
    ConfigInvalid,
    DeliveryCapacityFull,
    DeliveryCredentialRefused,
    DeliveryRejected,
    IntentConflict,
    JournalConflict,
    LeaseHeld,
    OperationNotFound,
    ReceiverUnavailable,
    RecoveryRefused,
    SourceInvalid,
)
from dpone.ports.delivery import DeliverySinkPort, DeliveryStorePort
from dpone.runtime import failpoints

__all__ = [
    "DeliveryPolicy",
    "DeliveryRequest",
    "ParentDeliveryRequest",
    "ResumableDeliveryProcessor",
    "SinkFactory",
    "child_operation_id",
    "delivery_intent_digest",
    "delivery_recovery_ref",
    "split_payload",
    "stage_payload",
]

D = DeliveryState
_INSTANCES = itertools.count(1)
#: Builds a sink for (receiver URL, credential reference) in this process.
SinkFactory = Callable[[str, str | None], DeliverySinkPort]

_STATE_FOR: dict[RemoteStatus, DeliveryState] = {
    RemoteStatus.ACCEPTED: D.ACCEPTED,
    RemoteStatus.RUNNING: D.ACCEPTED,
    RemoteStatus.SUCCEEDED: D.REMOTE_SUCCEEDED,
    RemoteStatus.FAILED: D.REMOTE_FAILED,
    RemoteStatus.CANCELLED: D.REMOTE_CANCELLED,
}
_BLOCKED_STATES: dict[DeliveryState, BlockReason] = {
    D.REJECTED: BlockReason.SUBMIT_REJECTED,
    D.REMOTE_FAILED: BlockReason.REMOTE_FAILED,
    D.REMOTE_CANCELLED: BlockReason.REMOTE_CANCELLED,
}
_MESSAGES: dict[BlockReason, str] = {
    BlockReason.KEY_LOOKUP_UNSUPPORTED: (
        "the submit got no conclusive answer and the receiver cannot look up idempotency "
        "keys, so dpone cannot tell whether a remote job exists; check at the receiver for "
        "a job under this operation id as Idempotency-Key before anything is sent again"
    ),
    BlockReason.RECEIPT_CONFLICT: (
        "the receiver reports a job under this key that does not match the recorded "
        "payload (or several jobs); compare them at the receiver"
    ),
    BlockReason.PAYLOAD_CHANGED: (
        "the staged payload file changed after it was recorded; nothing was sent with it. "
        "Restore the staged file or deliver under a new operation"
    ),
    BlockReason.SUBMIT_REJECTED: (
        "the receiver refused the submission before accepting it; fix the cause "
        "(credentials, payload, key reuse) and deliver under a new operation"
    ),
    BlockReason.REMOTE_FAILED: (
        "the remote job failed at the receiver; nothing was promoted. Inspect the job at "
        "the receiver"
    ),
    BlockReason.REMOTE_CANCELLED: (
        "the remote job was cancelled at the receiver; nothing was promoted"
    ),
    BlockReason.RECEIPT_UNKNOWN: (
        "the receiver no longer answers for the recorded receipt (or refuses the "
        "credentials); capacity stays held until an operator resolves it"
    ),
}


def delivery_recovery_ref(operation_id: str) -> str:
    """The read-only command an operator runs next for a delivery."""
    return f"dpone delivery status --operation-id {operation_id}"


def stage_payload(path: Path, *, chunk_bytes: int = 1 << 20) -> PayloadRef:
    """Describe a staged payload file (JSON lines): digest, size, rows, chunking.

    Raises:
        SourceInvalid: the file cannot be read.

    """
    digest = hashlib.sha256()
    size = rows = 0
    last = b"\n"
    try:
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
                size += len(block)
                rows += block.count(b"\n")
                last = block[-1:]
    except OSError:
        raise SourceInvalid("the delivery payload file cannot be read", field="payload") from None
    if size and last != b"\n":
        rows += 1
    return PayloadRef(
        path=str(path.resolve()),
        digest="sha256:" + digest.hexdigest(),
        size_bytes=size,
        rows=rows,
        chunk_bytes=chunk_bytes,
    )


def _file_digest(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with Path(path).open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    except OSError:
        return None
    return "sha256:" + digest.hexdigest()


def delivery_intent_digest(*, payload: PayloadRef, receiver: str, pack_fingerprint: str) -> str:
    """The intent of a delivery: what is sent (payload digest) to whom, by which pack."""
    return derive_intent_digest(
        pack_fingerprint=pack_fingerprint,
        normalized_load_strategy="rest_bulk_job",
        source_snapshot_identity=payload.digest,
        target_contract=receiver,
        schema_fingerprint=f"chunk_bytes={payload.chunk_bytes}",
    )


def child_operation_id(parent_id: str, index: int) -> str:
    """The operation id of child ``index`` of the split delivery ``parent_id``."""
    return digest_of({"parent_operation_id": parent_id, "child_index": index})


def _child_intent(parent_intent: str, index: int, payload: PayloadRef) -> str:
    return digest_of(
        {"parent_intent": parent_intent, "child_index": index, "payload": payload.digest}
    )


def split_payload(payload: PayloadRef, *, rows_per_child: int) -> list[PayloadRef]:
    """Split a staged JSON-lines payload into child files of at most ``rows_per_child`` rows.

    Deterministic: the same payload and row count give the same files (written beside
    the payload, atomically, in a directory named after the payload digest), so a
    rerun reuses them.

    Raises:
        ConfigInvalid: ``rows_per_child`` is below 1.
        SourceInvalid: the payload cannot be read or no longer has its recorded digest.

    """
    if not isinstance(rows_per_child, int) or rows_per_child < 1:
        raise ConfigInvalid("rows_per_child must be an integer >= 1", field="rows_per_child")
    if _file_digest(payload.path) != payload.digest:
        raise SourceInvalid("the staged payload changed after it was staged", field="payload")
    source = Path(payload.path)
    parts_dir = source.with_name(f".{source.name}.parts-{payload.digest[7:23]}-{rows_per_child}")
    parts_dir.mkdir(parents=True, exist_ok=True)
    parts: list[PayloadRef] = []
    with source.open("rb") as handle:
        index = 0
        while True:
            lines = [line for line in (handle.readline() for _ in range(rows_per_child)) if line]
            if not lines:
                break
            part = parts_dir / f"part-{index:05d}.jsonl"
            data = b"".join(lines)
            if not part.is_file() or part.read_bytes() != data:
                tmp = part.with_suffix(f".tmp-{os.getpid()}")
                tmp.write_bytes(data)
                os.replace(tmp, part)
            parts.append(stage_payload(part, chunk_bytes=payload.chunk_bytes))
            index += 1
    return parts


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryPolicy:
    """Bounds of one processor call. Every wait is finite."""

    poll_interval_s: float = 5.0  # next check after a non-terminal observation
    poll_budget_s: float = 0.0  # how long one call keeps observing after acceptance
    wait_budget_s: float = 30.0  # how long one call waits for capacity or a due retry
    retry_base_s: float = 1.0  # first RETRY_WAIT backoff, doubled per attempt
    retry_max_s: float = 60.0  # cap of that backoff
    retry_after_max_s: float = 3600.0  # a receiver's Retry-After is honoured up to this
    submit_lease_s: float = 60.0  # must exceed the sink's request timeout


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryRequest:
    """What to deliver, to whom: all durable once registered (no secret values)."""

    operation_id: str
    intent_digest: str
    payload: PayloadRef
    receiver_url: str
    credential_ref: str | None = None
    capacity_limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ParentDeliveryRequest:
    """A large delivery split into child jobs that run strictly one after another."""

    operation_id: str
    intent_digest: str
    payload: PayloadRef
    rows_per_child: int
    receiver_url: str
    credential_ref: str | None = None
    capacity_limit: int | None = None


class _Budget:
    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + max(seconds, 0.0)

    def left(self) -> float:
        return max(self._end - time.monotonic(), 0.0)


class ResumableDeliveryProcessor:
    """Drives deliveries through the control plane; one instance per process.

    Args:
        store: the delivery control plane.
        sink_factory: builds the receiver's sink in this process (credentials resolved here).
        policy: polling, waiting and retry bounds.
        promote: called once the remote job succeeded, before COMPLETE is written (e.g. an
            absolute checkpoint write); must be idempotent: a crash may repeat it. For a
            split delivery it is called per child (a parent-level hook is not built).
        sleep: injectable for tests.

    """

    def __init__(
        self,
        *,
        store: DeliveryStorePort,
        sink_factory: SinkFactory,
        policy: DeliveryPolicy | None = None,
        promote: Callable[[DeliveryRecord], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._sink_factory = sink_factory
        self._sinks: dict[tuple[str, str | None], DeliverySinkPort] = {}
        self.policy = policy or DeliveryPolicy()
        self._promote = promote
        self._sleep = sleep
        # unique per instance, so two processors in one process never share a lease
        self.owner = f"{socket.gethostname()}:{os.getpid()}#{next(_INSTANCES)}"

    @property
    def store(self) -> DeliveryStorePort:
        """The control plane this processor writes."""
        return self._store

    def close(self) -> None:
        """Close the sinks this processor opened."""
        for sink in self._sinks.values():
            sink.close()
        self._sinks.clear()

    def _sink(self, record: DeliveryRecord) -> DeliverySinkPort:
        return self._sink_for(record.receiver_url, record.credential_ref)

    def _sink_for(self, url: str, credential_ref: str | None) -> DeliverySinkPort:
        key = (url, credential_ref)
        if key not in self._sinks:
            self._sinks[key] = self._sink_factory(url, credential_ref)
        return self._sinks[key]

    # ------------------------------------------------------------------ entry points
    def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Record the payload authority (if new) and submit, or continue an earlier call."""
        sink = self._sink_for(request.receiver_url, request.credential_ref)
        record = self._store.register(
            operation_id=request.operation_id,
            intent_digest=request.intent_digest,
            receiver=sink.receiver_identity(),
            receiver_url=request.receiver_url,
            credential_ref=request.credential_ref,
            payload=request.payload,
            capacity_limit=request.capacity_limit,
            actor=self.owner,
        )
        return self._drive(record, must_observe=False)

    def resume(self, operation_id: str) -> DeliveryResult:
        """Continue a recorded delivery (or split parent): observe now, else go on.

        Raises:
            DeliveryCredentialRefused: the receiver refused the credential on the status
                request; the delivery stays ACCEPTED (receipt and slot kept), retry later.
            ReceiverUnavailable, DeliveryCapacityFull: nothing decided now, retry later.

        """
        record = self._store.get(operation_id)
        if record is None:
            if self._store.children(operation_id):
                return self._drive_parent(operation_id, must_observe=True)
            raise self._not_found(operation_id)
        return self._drive(record, must_observe=True)

    def deliver_parent(self, request: ParentDeliveryRequest) -> DeliveryResult:
        """Split the payload into children (recorded all at once), then run them in order.

        At most one child is in flight: child ``i + 1`` is submitted only once child
        ``i`` is COMPLETE (the store refuses anything else). The result speaks for the
        parent: Pending while a child runs, Blocked when a child is, Completed when all
        children are.
        """
        if not self._store.children(request.operation_id):
            sink = self._sink_for(request.receiver_url, request.credential_ref)
            parts = split_payload(request.payload, rows_per_child=request.rows_per_child)
            if not parts:
                raise SourceInvalid("the payload has no rows to deliver", field="payload")
            self._store.register_all(
                [
                    DeliveryRegistration(
                        operation_id=child_operation_id(request.operation_id, index),
                        intent_digest=_child_intent(request.intent_digest, index, part),
                        receiver=sink.receiver_identity(),
                        receiver_url=request.receiver_url,
                        credential_ref=request.credential_ref,
                        payload=part,
                        parent_id=request.operation_id,
                        child_index=index,
                    )
                    for index, part in enumerate(parts)
                ],
                capacity_limit=request.capacity_limit,
                actor=self.owner,
            )
        first = self._store.children(request.operation_id)[0]
        if first.intent_digest != _child_intent(request.intent_digest, 0, first.payload):
            raise IntentConflict(
                "this split delivery was recorded with another intent; the same operation "
                "id may not deliver something else",
                operation_id=request.operation_id,
            )
        return self._drive_parent(request.operation_id, must_observe=False)

    def _drive_parent(self, parent_id: str, *, must_observe: bool) -> DeliveryResult:
        children = self._store.children(parent_id)
        replayed = all(child.state is D.COMPLETE for child in children)
        for child in children:
            if child.state is D.COMPLETE:
                continue
            result = self._drive(child, must_observe=must_observe)
            must_observe = False
            if isinstance(result, DeliveryPending):
                return DeliveryPending(
                    operation_id=parent_id,
                    continuation="poll_receipt",
                    next_check_at=result.next_check_at,
                )
            if isinstance(result, DeliveryBlocked):
                return DeliveryBlocked(
                    operation_id=parent_id,
                    state=result.state,
                    reason=result.reason,
                    message=f"child {child.child_index} ({child.operation_id}): {result.message}",
                    recovery_ref=result.recovery_ref,
                )
        done = self._store.children(parent_id)
        return DeliveryCompleted(
            operation_id=parent_id,
            receipt=done[-1].receipt or "",
            rows=sum(child.payload.rows for child in done),
            replayed=replayed,
        )

    def reconcile(self, operation_id: str) -> DeliveryRecord:
        """Ask the receiver what happened to an unanswered submit; never submits.

        A job found under the key is adopted (receipt recorded); no job found leaves the
        delivery in SUBMIT_UNKNOWN (``resume`` then submits again under the same key);
        a receiver without key lookup blocks it.

        Raises:
            RecoveryRefused: the delivery is not waiting for reconciliation.
            LeaseHeld: another live process is submitting it right now.
            ReceiverUnavailable: the receiver did not answer the lookup.

        """
        record = self._reread(operation_id)
        if record.state is D.SUBMITTING:
            record = self._abandoned_submit(record)
        if record.state is not D.SUBMIT_UNKNOWN:
            raise RecoveryRefused(
                f"the delivery is {record.state.value}; only an unanswered submit "
                "(SUBMIT_UNKNOWN) is reconciled",
                operation_id=operation_id,
                state=record.state.value,
                journal_version=record.version,
            )
        return self._reconcile(record, _Budget(0.0), resubmit=False)

    def _not_found(self, operation_id: str) -> OperationNotFound:
        return OperationNotFound(
            "no delivery is recorded for this operation id", operation_id=operation_id
        )

    # ------------------------------------------------------------------ dispatch
    def _drive(self, record: DeliveryRecord, *, must_observe: bool) -> DeliveryResult:
        waits = _Budget(self.policy.wait_budget_s)
        polls = _Budget(self.policy.poll_budget_s)
        progressed = False
        while True:
            state = record.state
            if state is D.COMPLETE:
                return DeliveryCompleted(
                    operation_id=record.operation_id,
                    receipt=record.receipt or "",
                    rows=record.payload.rows,
                    replayed=not progressed,
                )
            try:
                if state is D.REMOTE_SUCCEEDED:
                    record = self._complete(record)
                elif state is D.BLOCKED or state in _BLOCKED_STATES:
                    return self._blocked(record)
                elif state in (D.STAGED, D.RETRY_WAIT):
                    record = self._submit_when_due(record, waits)
                elif state is D.SUBMITTING:
                    record = self._abandoned_submit(record)
                elif state is D.SUBMIT_UNKNOWN:
                    record = self._reconcile(record, waits)
                else:  # ACCEPTED
                    now = self._store.now()
                    due = record.next_check_at or now
                    if not must_observe and due - now > polls.left():
                        return DeliveryPending(
                            operation_id=record.operation_id,
                            continuation="poll_receipt",
                            next_check_at=due,
                        )
                    if not must_observe and due > now:
                        self._sleep(due - now)
                    must_observe = False
                    record = self._observe(record)
            except JournalConflict:
                record = self._reread(record.operation_id)
            progressed = True

    def _reread(self, operation_id: str) -> DeliveryRecord:
        record = self._store.get(operation_id)
        if record is None:
            raise self._not_found(operation_id)
        return record

    def _advance(self, record: DeliveryRecord, step: DeliveryStep) -> DeliveryRecord:
        return self._store.advance(
            operation_id=record.operation_id,
            expected_version=record.version,
            step=step,
            actor=self.owner,
        )

    def _blocked(self, record: DeliveryRecord) -> DeliveryBlocked:
        reason = _BLOCKED_STATES.get(record.state) or record.block_reason
        reason = reason or BlockReason.RECEIPT_CONFLICT
        detail = f" ({record.detail})" if record.detail else ""
        return DeliveryBlocked(
            operation_id=record.operation_id,
            state=record.state,
            reason=reason,
            message=_MESSAGES[reason] + detail,
            recovery_ref=delivery_recovery_ref(record.operation_id),
        )

    # ------------------------------------------------------------------ submit
    def _submit_when_due(self, record: DeliveryRecord, waits: _Budget) -> DeliveryRecord:
        if record.state is D.RETRY_WAIT and record.due_at is not None:
            wait = record.due_at - self._store.now()
            if wait > 0:
                if wait > waits.left():
                    raise ReceiverUnavailable(
                        f"the delivery waits to retry for {wait:.1f}s more (RETRY_WAIT); "
                        "run it again later",
                        operation_id=record.operation_id,
                        state=record.state.value,
                        recovery_ref=delivery_recovery_ref(record.operation_id),
                    )
                self._sleep(wait)
                return self._reread(record.operation_id)
        try:
            return self._begin_and_submit(record, waits)
        except DeliveryCapacityFull:
            if waits.left() <= 0:
                raise
            self._sleep(min(self.policy.poll_interval_s, waits.left()))
            return self._reread(record.operation_id)

    def _begin_and_submit(self, record: DeliveryRecord, waits: _Budget) -> DeliveryRecord:
        """Check the payload authority and free capacity, upload, reserve + SUBMITTING, submit."""
        if _file_digest(record.payload.path) != record.payload.digest:
            return self._advance(
                record,
                DeliveryStep(
                    to_state=D.BLOCKED,
                    block_reason=BlockReason.PAYLOAD_CHANGED,
                    detail="staged payload digest differs from the recorded one",
                ),
            )
        if record.state in (D.STAGED, D.RETRY_WAIT) and not self._store.capacity_available(
            record.receiver
        ):
            # holding no slot and none free: fail before uploading, not after (a capacity
            # wait would otherwise re-upload the whole payload every poll interval)
            raise DeliveryCapacityFull(
                f"all capacity slots of {record.receiver} are held by active jobs",
                operation_id=record.operation_id,
                state=record.state.value,
            )
        sink = self._sink(record)
        while True:
            try:
                sink.upload(operation_id=record.operation_id, payload=record.payload)
                break
            except ReceiverUnavailable:
                if waits.left() <= 0:
                    raise
                self._sleep(min(self.policy.retry_base_s, waits.left()))
        record = self._advance(
            record,
            DeliveryStep(
                to_state=D.SUBMITTING,
                start_attempt=True,
                lease_owner=self.owner,
                lease_ttl_s=self.policy.submit_lease_s,
            ),
        )
        failpoints.hit("after:delivery.SUBMITTING")
        return self._submit(record, sink)

    def _submit(self, record: DeliveryRecord, sink: DeliverySinkPort) -> DeliveryRecord:
        failpoints.hit("before:delivery.submit")
        outcome = sink.submit(operation_id=record.operation_id, payload=record.payload)
        failpoints.hit("after:delivery.submit")
        if isinstance(outcome, SubmitAccepted):
            record = self._adopt(
                record, outcome.observation, source="submit", http_status=outcome.http_status
            )
            failpoints.hit("after:delivery.ACCEPTED")
            return record
        if isinstance(outcome, SubmitRefused):
            if outcome.transient:
                # the receiver's Retry-After when it gave one (never sooner than it asked;
                # bounded, so every wait stays finite), else capped exponential backoff
                backoff = self.policy.retry_base_s * 2 ** max(record.attempts - 1, 0)
                due = (
                    min(backoff, self.policy.retry_max_s)
                    if outcome.retry_after_s is None
                    else min(outcome.retry_after_s, self.policy.retry_after_max_s)
                )
                return self._advance(
                    record,
                    DeliveryStep(
                        to_state=D.RETRY_WAIT,
                        attempt_outcome="refused_before_accept",
                        http_status=outcome.http_status,
                        due_in_s=due,
                        detail=f"refused before acceptance: {outcome.reason}",
                    ),
                )
            return self._advance(
                record,
                DeliveryStep(
                    to_state=D.REJECTED,
                    attempt_outcome="rejected",
                    http_status=outcome.http_status,
                    block_reason=BlockReason.SUBMIT_REJECTED,
                    detail=f"HTTP {outcome.http_status} {outcome.reason}",
                ),
            )
        return self._advance(
            record,
            DeliveryStep(
                to_state=D.SUBMIT_UNKNOWN,
                attempt_outcome="inconclusive",
                detail=f"no conclusive answer to the submit: {outcome.reason}",
            ),
        )

    def _adopt(
        self,
        record: DeliveryRecord,
        observation: JobObservation,
        *,
        source: str,
        http_status: int | None = None,
    ) -> DeliveryRecord:
        """Record the receipt (and first observation) of the job under this key."""
        if observation.payload_digest not in (None, record.payload.digest):
            return self._advance(
                record,
                DeliveryStep(
                    to_state=D.BLOCKED,
                    attempt_outcome="receipt_conflict" if source == "submit" else None,
                    block_reason=BlockReason.RECEIPT_CONFLICT,
                    detail="the job under this key carries another payload digest",
                ),
            )
        to = _STATE_FOR[observation.status]
        return self._advance(
            record,
            DeliveryStep(
                to_state=to,
                attempt_outcome="accepted" if source == "submit" else None,
                http_status=http_status,
                receipt=observation.receipt,
                receipt_source="submit" if source == "submit" else "lookup",
                observation=observation,
                next_check_in_s=self.policy.poll_interval_s if to is D.ACCEPTED else None,
                detail=f"receipt from {source}",
            ),
        )

    def _abandoned_submit(self, record: DeliveryRecord) -> DeliveryRecord:
        """A SUBMITTING record whose sender is gone (or is this process after an error)."""
        now = self._store.now()
        live = record.lease_expires_at is not None and record.lease_expires_at > now
        if live and record.lease_owner != self.owner:
            raise LeaseHeld(
                "another process is submitting this delivery right now",
                operation_id=record.operation_id,
                state=record.state.value,
                lease_owner=record.lease_owner,
                lease_expires_in=(record.lease_expires_at or now) - now,
            )
        return self._advance(
            record,
            DeliveryStep(
                to_state=D.SUBMIT_UNKNOWN,
                attempt_outcome="abandoned",
                detail="the submitting process ended without a durable answer",
            ),
        )

    # ------------------------------------------------------------------ reconcile
    def _reconcile(
        self, record: DeliveryRecord, waits: _Budget, *, resubmit: bool = True
    ) -> DeliveryRecord:
        """Ask the receiver what happened to the key; adopt, resubmit or block."""
        sink = self._sink(record)
        while True:
            try:
                found = sink.lookup(operation_id=record.operation_id)
                break
            except ReceiverUnavailable:
                if waits.left() <= 0:
                    raise
                self._sleep(min(self.policy.poll_interval_s, waits.left()))
        if isinstance(found, LookupFound):
            if len(found.jobs) != 1:
                return self._advance(
                    record,
                    DeliveryStep(
                        to_state=D.BLOCKED,
                        block_reason=BlockReason.RECEIPT_CONFLICT,
                        detail=f"{len(found.jobs)} jobs exist under this key",
                    ),
                )
            return self._adopt(record, found.jobs[0], source="lookup")
        if isinstance(found, LookupAbsent):
            return self._begin_and_submit(record, waits) if resubmit else record
        return self._advance(
            record,
            DeliveryStep(
                to_state=D.BLOCKED,
                block_reason=BlockReason.KEY_LOOKUP_UNSUPPORTED,
                detail=f"key lookup answered HTTP {found.http_status}",
            ),
        )

    # ------------------------------------------------------------------ observe
    def _observe(self, record: DeliveryRecord) -> DeliveryRecord:
        failpoints.hit("before:delivery.observe")
        try:
            observation = self._sink(record).observe(receipt=record.receipt or "")
        except ReceiverUnavailable:
            # the receipt is durable: the next check simply tries again
            return self._advance(
                record,
                DeliveryStep(
                    to_state=D.ACCEPTED,
                    next_check_in_s=self.policy.poll_interval_s,
                    detail="status request unanswered",
                ),
            )
        except DeliveryCredentialRefused as exc:
            # a refused credential on a read-only GET decides nothing about the job (a
            # token rotated mid-deferral): keep the receipt and the slot, check again later
            record = self._advance(
                record,
                DeliveryStep(
                    to_state=D.ACCEPTED,
                    next_check_in_s=self.policy.poll_interval_s,
                    detail="status request refused the credential",
                ),
            )
            raise DeliveryCredentialRefused(
                exc.message,
                operation_id=record.operation_id,
                state=record.state.value,
                journal_version=record.version,
                recovery_ref=delivery_recovery_ref(record.operation_id),
            ) from None
        except DeliveryRejected as exc:
            return self._advance(
                record,
                DeliveryStep(
                    to_state=D.BLOCKED,
                    block_reason=BlockReason.RECEIPT_UNKNOWN,
                    detail=exc.message[:200],
                ),
            )
        to = _STATE_FOR[observation.status]
        return self._advance(
            record,
            DeliveryStep(
                to_state=to,
                observation=observation,
                next_check_in_s=self.policy.poll_interval_s if to is D.ACCEPTED else None,
            ),
        )

    def _complete(self, record: DeliveryRecord) -> DeliveryRecord:
        failpoints.hit("before:delivery.promote")  # terminal success durable, not promoted
        if self._promote is not None:
            self._promote(record)
        failpoints.hit("before:delivery.COMPLETE")
        return self._advance(record, DeliveryStep(to_state=D.COMPLETE, detail="promoted"))
