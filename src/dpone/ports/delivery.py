"""Ports of resumable delivery: the REST sink and the delivery control plane (section 14)."""

from __future__ import annotations

from typing import Protocol

from dpone.contracts.delivery import (
    DeliveryRecord,
    DeliveryRegistration,
    DeliveryStep,
    JobObservation,
    KeyLookup,
    PayloadRef,
    SubmitOutcome,
)
from dpone.contracts.fence import FenceCapability

__all__ = ["DeliverySinkPort", "DeliveryStorePort"]


class DeliverySinkPort(Protocol):
    """A receiver that runs bulk jobs asynchronously and dedupes submissions by key.

    Credentials are resolved by the adapter in its own process, per request, from a
    reference (never a value); tokens, bodies and signed URLs are never logged.
    """

    @property
    def capability(self) -> FenceCapability:
        """``IDEMPOTENCY_KEY`` for a receiver that dedupes and answers key lookups."""
        ...

    def receiver_identity(self) -> str:
        """Return kind + normalized base URL, never credentials (the capacity key)."""
        ...

    def upload(self, *, operation_id: str, payload: PayloadRef) -> None:
        """Send the payload in chunks of at most ``payload.chunk_bytes``; idempotent.

        Raises:
            ReceiverUnavailable: the receiver could not be reached or asked to wait.
            DeliveryRejected: the receiver refused a chunk (e.g. other bytes than before).
            SourceInvalid: the staged file cannot be read.

        """
        ...

    def submit(self, *, operation_id: str, payload: PayloadRef) -> SubmitOutcome:
        """Ask for the job with ``Idempotency-Key: <operation_id>``; never raises for HTTP.

        Returns ``SubmitRefused(transient=True)`` only when the failure is proven to be
        before acceptance (no connection, or a 503/429 the receiver answers before
        recording anything); anything without a conclusive answer is
        ``SubmitInconclusive``.
        """
        ...

    def observe(self, *, receipt: str) -> JobObservation:
        """Read the job's status (GET); no side effects.

        Raises:
            ReceiverUnavailable: no answer now.
            DeliveryRejected: the receiver does not know the receipt.
            DeliveryCredentialRefused: the receiver refused the credential (retryable).

        """
        ...

    def lookup(self, *, operation_id: str) -> KeyLookup:
        """Ask which jobs exist under the key (GET); no side effects.

        Raises:
            ReceiverUnavailable: no answer now.

        """
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


class DeliveryStorePort(Protocol):
    """The delivery control plane: records, attempts, receipts, observations, capacity.

    Every write is one transaction: the CAS on ``version`` and the allowed move, the
    attempt, receipt or observation it records, and the capacity reservation or
    release that the target state implies.
    """

    def register(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        receiver: str,
        receiver_url: str,
        credential_ref: str | None,
        payload: PayloadRef,
        capacity_limit: int | None,
        actor: str,
    ) -> DeliveryRecord:
        """Create the record in STAGED if absent (the payload authority), else return it.

        ``capacity_limit`` (when given) sets the receiver's limit of active remote jobs.

        Raises:
            IntentConflict: the operation exists with another intent digest.

        """
        ...

    def register_all(
        self, registrations: list[DeliveryRegistration], *, capacity_limit: int | None, actor: str
    ) -> list[DeliveryRecord]:
        """Like ``register`` for several deliveries, in one transaction (all or none).

        A split delivery registers all its children at once, so a reader never sees a
        prefix of them.
        """
        ...

    def children(self, parent_id: str) -> list[DeliveryRecord]:
        """Return the children of a split delivery, ordered by ``child_index``."""
        ...

    def get(self, operation_id: str) -> DeliveryRecord | None:
        """Return the record or None."""
        ...

    def advance(
        self, *, operation_id: str, expected_version: int, step: DeliveryStep, actor: str
    ) -> DeliveryRecord:
        """Apply ``step`` in one transaction; version + 1.

        Entering a capacity-holding state reserves a slot if the delivery holds none
        (checked against the receiver's limit under the transaction's lock); leaving
        them releases it. A child of a split delivery enters SUBMITTING only when every
        earlier sibling is COMPLETE.

        Raises:
            IllegalTransition: the move is not in DELIVERY_TRANSITIONS.
            JournalConflict: the version moved on (current version and state attached).
            DeliveryCapacityFull: no slot is free; nothing was written.
            OperationNotFound: no such record.

        """
        ...

    def release_capacity(
        self, *, operation_id: str, expected_version: int, principal: str, reason: str
    ) -> DeliveryRecord:
        """An operator frees the slot of a BLOCKED delivery: release + audit + version + 1.

        The delivery stays BLOCKED. The operator states (and the audit records) that no
        remote job of it is active any more.

        Raises:
            RecoveryRefused: the delivery is not BLOCKED or holds no slot.
            JournalConflict: the version moved on.

        """
        ...

    def audit_log(self, operation_id: str) -> list[dict[str, object]]:
        """Return the operator actions on one delivery, in order."""
        ...

    def list_records(self, *, limit: int = 100) -> list[DeliveryRecord]:
        """Return records, newest update first."""
        ...

    def history(self, operation_id: str) -> list[dict[str, object]]:
        """Return the append-only transitions of one delivery, in order."""
        ...

    def attempts(self, operation_id: str) -> list[dict[str, object]]:
        """Return the submit attempts of one delivery, in order."""
        ...

    def observations(self, operation_id: str) -> list[JobObservation]:
        """Return the recorded observations of one delivery, in order."""
        ...

    def active_reservations(self, receiver: str) -> int:
        """Return how many capacity slots of ``receiver`` are held now."""
        ...

    def capacity_available(self, receiver: str) -> bool:
        """Return True when ``receiver`` has no limit or a free slot now (a hint, no lock).

        The reservation on the move to SUBMITTING stays the authority; this read only
        lets a caller skip work (an upload) that a full receiver would waste.
        """
        ...

    def now(self) -> float:
        """Return the store's clock, seconds since the epoch."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...
