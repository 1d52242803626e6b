"""A workload's REST delivery: payload authority, run ledger and the checkpoint, promoted once.

``ResumableDeliveryProcessor`` drives one delivery through the control plane. This
module puts a *workload* around it:

- the source is materialized into a content-addressed JSON-lines file (the payload
  authority) before anything is recorded; a delivery already recorded is continued
  with its recorded payload, never re-read from the source;
- what the operation promotes (the workload's checkpoint advance) is bound to its
  operation id in the journal's database before anything is sent, so any process that
  later sees the remote success (``dpone delivery resume``, an Airflow
  ``execute_complete``) promotes the same interval without the workload's context;
- the promotion rereads the control plane and requires verified success evidence (the
  state, the receipt and a succeeded observation of that receipt) for the delivery or
  every child of a split one, then writes the checkpoint absolutely (ADR 0005 rules:
  recorded interval, contiguous watermark). A crash between the promotion and COMPLETE
  repeats an absolute write that finds the interval recorded and changes nothing;
- every call that does work is an attempt of the operation's run in the run ledger
  (``op:<operation id>``): COMPLETE when completed, left RUNNING while the remote job
  is pending, UNRESOLVED when blocked for an operator.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpone.contracts.checkpoint import CheckpointAdvance
from dpone.contracts.delivery import (
    DeliveryBlocked,
    DeliveryCompleted,
    DeliveryRecord,
    DeliveryResult,
    DeliveryState,
    PayloadRef,
    RemoteStatus,
)
from dpone.contracts.evidence import SafeMapping
from dpone.contracts.identity import digest_of
from dpone.contracts.run import (
    RunError,
    RunRecord,
    RunStart,
    RunState,
    default_idempotency_key,
    run_id_for,
)
from dpone.errors import (
    DponeError,
    IntentConflict,
    LeaseHeld,
    LeaseLost,
    OperationNotFound,
    RecoveryRefused,
    SourceInvalid,
)
from dpone.ports.checkpoint import DeliveryCheckpointPort
from dpone.ports.delivery import DeliveryStorePort
from dpone.ports.ledger import RunLedgerPort
from dpone.ports.source import SourcePort
from dpone.runtime._log import LazyLogger
from dpone.runtime.delivery import (
    DeliveryPolicy,
    DeliveryRequest,
    ParentDeliveryRequest,
    ResumableDeliveryProcessor,
    SinkFactory,
    delivery_intent_digest,
    delivery_recovery_ref,
    stage_payload,
)
from dpone.runtime.run import check_replay, run_state_for

__all__ = [
    "BLOCKED_CODE",
    "WorkloadDelivery",
    "WorkloadDeliveryService",
    "materialize_jsonl",
    "parent_intent_digest",
]

_log = LazyLogger("dpone.delivery")

#: The run-ledger error code of a delivery blocked for an operator.
BLOCKED_CODE = "DPONE_DELIVERY_BLOCKED"


def _scalar(value: object) -> object:
    """JSON for a value json cannot encode natively: its ISO text or ``str``."""
    iso = getattr(value, "isoformat", None)
    if callable(iso):
        return iso()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def materialize_jsonl(
    source: SourcePort, *, staging_dir: Path, batch_size: int, chunk_bytes: int
) -> PayloadRef:
    """Write the source's rows as JSON lines into a content-addressed staging file.

    Deterministic: one object per row, keys in column order, compact separators, so
    the same rows in the same order give the same bytes (and digest). The file is
    fsynced and renamed to ``<sha256>.jsonl`` before it is described, so the payload
    authority recorded afterwards always names a durable file.

    Raises:
        SourceInvalid: the source cannot be read or changed while it was read.

    """
    names = [column.name for column in source.columns()]
    identity = source.snapshot_identity()
    staging_dir.mkdir(parents=True, exist_ok=True)
    tmp = staging_dir / f".materialize-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
    try:
        with tmp.open("wb") as handle:
            for batch in source.batches(batch_size=batch_size, expected_identity=identity):
                lines = [
                    json.dumps(
                        dict(zip(names, row, strict=True)),
                        ensure_ascii=False,
                        separators=(",", ":"),
                        default=_scalar,
                    )
                    for row in batch
                ]
                if lines:
                    handle.write(("\n".join(lines) + "\n").encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        described = stage_payload(tmp, chunk_bytes=chunk_bytes)
        final = staging_dir / f"{described.digest[7:]}.jsonl"
        if final.is_file():
            tmp.unlink()
        else:
            os.replace(tmp, final)
            _fsync_dir(staging_dir)
    finally:
        tmp.unlink(missing_ok=True)
    staged = stage_payload(final, chunk_bytes=chunk_bytes)
    if staged.digest != described.digest:
        raise SourceInvalid(
            "the staged payload does not have the digest it was written with", field="payload"
        )
    return staged


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parent_intent_digest(
    *, pack_fingerprint: str, receiver: str, rows_per_child: int, chunk_bytes: int
) -> str:
    """The intent of a split delivery: the definition; each child's intent adds its payload."""
    return digest_of(
        {
            "pack_fingerprint": pack_fingerprint,
            "receiver": receiver,
            "strategy": "rest_bulk_job_split",
            "rows_per_child": rows_per_child,
            "chunk_bytes": chunk_bytes,
        }
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadDelivery:
    """One workload operation to deliver: identity, receiver, bounds and what it promotes."""

    operation_id: str
    pack_fingerprint: str
    receiver_url: str  # normalized, no credentials
    receiver_identity: str  # ``rest:<url>``: the target identity in the operation id
    credential_ref: str | None
    capacity_limit: int | None
    rows_per_child: int | None
    chunk_bytes: int
    checkpoint: CheckpointAdvance | None  # None: the workload is not incremental
    run: RunStart | None = None  # the run-ledger record (None: no ledger)


class WorkloadDeliveryService:
    """Delivers workload operations and continues them; promotes their checkpoints once.

    Args:
        store: the delivery control plane.
        sink_factory: builds the receiver's sink in this process.
        policy: polling, waiting and retry bounds (``poll_budget_s`` is per call).
        checkpoints: where bindings and checkpoints live (the journal); None: no promotion.
        ledger: the run ledger (the journal); None: runs are not recorded.
        owner: this process's name in the ledger's attempts.

    """

    def __init__(
        self,
        *,
        store: DeliveryStorePort,
        sink_factory: SinkFactory,
        policy: DeliveryPolicy,
        checkpoints: DeliveryCheckpointPort | None,
        ledger: RunLedgerPort | None,
        owner: str,
    ) -> None:
        self._store = store
        self._sink_factory = sink_factory
        self._policy = policy
        self._checkpoints = checkpoints
        self._ledger = ledger
        self._owner = owner

    @property
    def store(self) -> DeliveryStorePort:
        """The control plane."""
        return self._store

    # ------------------------------------------------------------------ entry points
    def deliver(
        self,
        spec: WorkloadDelivery,
        *,
        payload: Callable[[], PayloadRef],
        provenance: SafeMapping | None = None,
        poll_budget_s: float = 0.0,
    ) -> DeliveryResult:
        """Deliver ``spec`` (or continue its recorded delivery); see the module docstring.

        ``payload`` materializes the source; it is called only when nothing is recorded
        for the operation yet.

        Raises:
            IntentConflict: the operation was recorded with another definition (or as a
                single delivery where a split one is asked, or the reverse).
            DponeError: the processor's errors (capacity, lease, receiver unavailable).

        """
        run = self._begin_run(spec.run)
        op = spec.operation_id
        record = self._store.get(op)
        children = self._store.children(op) if record is None else []
        if self._complete(record, children):
            return self._replayed(op, run, record, children)
        self._refuse_live_submitter(record, children)
        attempt = self._begin_attempt(run, provenance)
        try:
            if spec.checkpoint is not None and self._checkpoints is not None:
                # before anything is sent: whoever sees the success later promotes this
                self._checkpoints.bind_delivery_checkpoint(
                    operation_id=op, checkpoint=spec.checkpoint
                )
            processor = self._processor(poll_budget_s)
            try:
                result = self._submit(processor, spec, record, children, payload)
            finally:
                processor.close()
            result = self._after(result)
        except LeaseHeld:
            raise  # another process drives it right now: its attempt owns the run
        except Exception as exc:
            self._end(run, attempt, run_state_for(exc), RunError.of(exc))
            raise
        self._record(run, attempt, result)
        return result

    def resume(
        self,
        operation_id: str,
        *,
        provenance: SafeMapping | None = None,
        poll_budget_s: float = 0.0,
    ) -> DeliveryResult:
        """Reread the control plane and continue: observe, promote once verified, COMPLETE.

        A COMPLETE delivery returns ``DeliveryCompleted(replayed=True)`` again; its
        checkpoint is not promoted twice (the absolute write finds it recorded).

        Raises:
            OperationNotFound: no delivery is recorded under ``operation_id``.

        """
        run = None
        if self._ledger is not None:
            run = self._ledger.get_run(run_id_for(default_idempotency_key(operation_id)))
        record = self._store.get(operation_id)
        children = self._store.children(operation_id) if record is None else []
        if record is None and not children:
            raise OperationNotFound(
                "no delivery is recorded for this operation id", operation_id=operation_id
            )
        if self._complete(record, children):
            return self._replayed(operation_id, run, record, children)
        self._refuse_live_submitter(record, children)
        attempt = self._begin_attempt(run, provenance)
        try:
            processor = self._processor(poll_budget_s)
            try:
                result = processor.resume(operation_id)
            finally:
                processor.close()
            result = self._after(result)
        except LeaseHeld:
            raise
        except Exception as exc:
            self._end(run, attempt, run_state_for(exc), RunError.of(exc))
            raise
        self._record(run, attempt, result)
        return result

    def verify_success(self, operation_id: str) -> list[DeliveryRecord]:
        """Reread the control plane; return the delivery's records if its success is proven.

        Proof, per delivery (each child of a split one): state REMOTE_SUCCEEDED or
        COMPLETE, remote status succeeded, a receipt, and the newest observation is a
        succeeded job under that receipt.

        Raises:
            RecoveryRefused: the evidence is missing or contradicts success.
            OperationNotFound: nothing is recorded under ``operation_id``.

        """
        record = self._store.get(operation_id)
        records = [record] if record is not None else self._store.children(operation_id)
        if not records:
            raise OperationNotFound(
                "no delivery is recorded for this operation id", operation_id=operation_id
            )
        for one in records:
            self._verify(one)
        return records

    # ------------------------------------------------------------------ internals
    def _processor(self, poll_budget_s: float) -> ResumableDeliveryProcessor:
        return ResumableDeliveryProcessor(
            store=self._store,
            sink_factory=self._sink_factory,
            policy=dataclasses.replace(self._policy, poll_budget_s=max(poll_budget_s, 0.0)),
            promote=self._promote_record,
        )

    def _submit(
        self,
        processor: ResumableDeliveryProcessor,
        spec: WorkloadDelivery,
        record: DeliveryRecord | None,
        children: list[DeliveryRecord],
        payload: Callable[[], PayloadRef],
    ) -> DeliveryResult:
        op = spec.operation_id
        staged: PayloadRef | None = record.payload if record is not None else None
        split = spec.rows_per_child
        if split and record is None and not children:
            staged = payload()
            if staged.rows == 0:
                split = None  # an empty interval: one empty job, nothing to split
        elif split and record is not None and record.payload.rows == 0:
            split = None  # recorded as the empty interval's single job
        if split:
            if record is not None:
                raise self._shape_conflict(op, "a single job", "split into children")
            intent = parent_intent_digest(
                pack_fingerprint=spec.pack_fingerprint,
                receiver=spec.receiver_identity,
                rows_per_child=split,
                chunk_bytes=spec.chunk_bytes,
            )
            # recorded children carry their payloads; the parent's is needed only to split
            return processor.deliver_parent(
                ParentDeliveryRequest(
                    operation_id=op,
                    intent_digest=intent,
                    payload=staged or children[0].payload,
                    rows_per_child=split,
                    receiver_url=spec.receiver_url,
                    credential_ref=spec.credential_ref,
                    capacity_limit=spec.capacity_limit,
                )
            )
        if children:
            raise self._shape_conflict(op, "split into children", "a single job")
        if staged is None:
            staged = payload()
        intent = delivery_intent_digest(
            payload=staged, receiver=spec.receiver_identity, pack_fingerprint=spec.pack_fingerprint
        )
        return processor.deliver(
            DeliveryRequest(
                operation_id=op,
                intent_digest=intent,
                payload=staged,
                receiver_url=spec.receiver_url,
                credential_ref=spec.credential_ref,
                capacity_limit=spec.capacity_limit,
            )
        )

    @staticmethod
    def _shape_conflict(op: str, recorded: str, asked: str) -> IntentConflict:
        return IntentConflict(
            f"this operation was recorded as {recorded}, and the workload now asks for it "
            f"{asked}; the same operation id may not deliver something else",
            operation_id=op,
            recovery_ref=delivery_recovery_ref(op),
            hint="restore target.rows_per_child, or deliver under a new release or interval",
        )

    def _refuse_live_submitter(
        self, record: DeliveryRecord | None, children: list[DeliveryRecord]
    ) -> None:
        """Another live process is submitting: refuse before an attempt is recorded.

        The processor refuses it too; checking first keeps the run ledger's attempts to
        calls that did work (a refused call must not supersede the live attempt).
        """
        now = self._store.now()
        for one in [record] if record is not None else children:
            live = one.lease_expires_at is not None and one.lease_expires_at > now
            if one.state is DeliveryState.SUBMITTING and live:
                raise LeaseHeld(
                    "another process is submitting this delivery right now",
                    operation_id=one.operation_id,
                    state=one.state.value,
                    lease_owner=one.lease_owner,
                    lease_expires_in=(one.lease_expires_at or now) - now,
                )

    @staticmethod
    def _complete(record: DeliveryRecord | None, children: list[DeliveryRecord]) -> bool:
        if record is not None:
            return record.state is DeliveryState.COMPLETE
        return bool(children) and all(c.state is DeliveryState.COMPLETE for c in children)

    def _replayed(
        self,
        op: str,
        run: RunRecord | None,
        record: DeliveryRecord | None,
        children: list[DeliveryRecord],
    ) -> DeliveryCompleted:
        """A COMPLETE delivery asked again: the recorded result, no new attempt."""
        self._promote_operation(op)  # finds the interval recorded: writes nothing
        done = [record] if record is not None else children
        result = DeliveryCompleted(
            operation_id=op,
            receipt=done[-1].receipt or "",
            rows=sum(one.payload.rows for one in done),
            replayed=True,
        )
        if run is not None and run.state is not RunState.COMPLETE:
            self._end(run, run.current_attempt, RunState.COMPLETE, None)
        return result

    def _after(self, result: DeliveryResult) -> DeliveryResult:
        """A completed split delivery promotes its checkpoint once every child is proven."""
        if isinstance(result, DeliveryCompleted):
            self._promote_operation(result.operation_id)
        return result

    def _promote_record(self, record: DeliveryRecord) -> None:
        """The processor's hook, before a delivery's COMPLETE; children wait for the parent."""
        if record.parent_id is None:
            self._promote_operation(record.operation_id)

    def _promote_operation(self, operation_id: str) -> bool:
        if self._checkpoints is None:
            return False
        advance = self._checkpoints.delivery_checkpoint(operation_id)
        if advance is None:
            return False  # the operation promotes nothing (not incremental, or `send`)
        self.verify_success(operation_id)
        return self._checkpoints.promote_delivered(operation_id=operation_id, checkpoint=advance)

    def _verify(self, record: DeliveryRecord) -> None:
        proven = (
            record.state in (DeliveryState.REMOTE_SUCCEEDED, DeliveryState.COMPLETE)
            and record.remote_status is RemoteStatus.SUCCEEDED
            and bool(record.receipt)
        )
        if proven:
            seen = self._store.observations(record.operation_id)
            proven = (
                bool(seen)
                and seen[-1].status is RemoteStatus.SUCCEEDED
                and seen[-1].receipt == record.receipt
            )
        if not proven:
            raise RecoveryRefused(
                "the control plane holds no verified success evidence for this delivery "
                "(a succeeded observation of its receipt); the checkpoint is not promoted",
                operation_id=record.operation_id,
                state=record.state.value,
                journal_version=record.version,
                recovery_ref=delivery_recovery_ref(record.operation_id),
            )

    # ------------------------------------------------------------------ run ledger
    def _begin_run(self, start: RunStart | None) -> RunRecord | None:
        if self._ledger is None or start is None:
            return None
        run, created = self._ledger.begin_run(start)
        if not created:
            check_replay(run, start)
        return run

    def _begin_attempt(self, run: RunRecord | None, provenance: SafeMapping | None) -> int | None:
        """Record this call as the run's next attempt; None when no run is recorded."""
        if self._ledger is None or run is None:
            return None
        for _ in range(5):
            current = self._ledger.get_run(run.run_id) or run
            try:
                self._ledger.begin_attempt(
                    run_id=run.run_id,
                    attempt=current.current_attempt + 1,
                    owner=self._owner,
                    provenance=provenance,
                )
            except LeaseLost:
                continue  # another call took that number first: take the next one
            return current.current_attempt + 1
        return None

    def _record(self, run: RunRecord | None, attempt: int | None, result: DeliveryResult) -> None:
        if isinstance(result, DeliveryCompleted):
            state, error = RunState.COMPLETE, None
        elif isinstance(result, DeliveryBlocked):
            state = RunState.UNRESOLVED
            error = RunError(
                code=BLOCKED_CODE, retryability="stop", message=f"blocked: {result.reason.value}"
            )
        else:
            return  # DeliveryPending: the attempt stays RUNNING, the remote job is in flight
        if self._end(run, attempt, state, error) or self._ledger is None or run is None:
            return
        # A concurrent call recorded a newer attempt meanwhile (and then found this call
        # submitting: LEASE_HELD leaves its attempt RUNNING). The outcome is the control
        # plane's, whoever reached it: the run's current attempt ends with it, as a
        # replay would, instead of the run staying RUNNING until the next call.
        try:
            current = self._ledger.get_run(run.run_id)
        except DponeError:
            return  # the ledger is down: the outcome stands, the next call records it
        if current is not None and current.state is RunState.RUNNING:
            self._end(current, current.current_attempt, state, error)

    def _end(
        self,
        run: RunRecord | None,
        attempt: int | None,
        state: RunState,
        error: RunError | None,
    ) -> bool:
        """Record how this call ended; a ledger failure never replaces the outcome.

        Returns:
            False when the ledger refused or failed the write (e.g. a newer attempt is
            current); True when it was recorded, or there is nothing to record.

        """
        if self._ledger is None or run is None or attempt is None:
            return True
        try:
            self._ledger.end_attempt(run_id=run.run_id, attempt=attempt, state=state, error=error)
        except DponeError as secondary:  # a newer attempt is current, or the ledger is down
            _log.warning(
                "the run ledger did not record the end of attempt %d (%s)",
                attempt,
                secondary.code.value,
                extra={"dpone": {"event": "secondary", "run_id": run.run_id}},
            )
            return False
        return True
