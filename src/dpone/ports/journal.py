"""The commit journal port (ARCHITECTURE section 5)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from dpone.contracts.journal import AuditRecord, AuditRequest, JournalEntry, Transition
from dpone.contracts.states import CommitState

__all__ = [
    "CommitJournalPort",
    "FoldingJournalPort",
    "ForwardFoldingJournalPort",
    "ProvenCompletionJournalPort",
    "TransactionalJournalPort",
]


class CommitJournalPort(Protocol):
    """Durable store of operation entries, transitions, leases and audit records.

    Every adapter passes ``dpone.testing.journal_conformance``. Raw driver errors never
    escape: an unreachable or locked store raises ``JournalUnavailable``.
    """

    def create_intent(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_owner: str | None = None,
        lease_ttl_seconds: float | None = None,
    ) -> JournalEntry:
        """Create the entry in PREPARING if absent; otherwise return the existing entry.

        With ``lease_owner`` and ``lease_ttl_seconds`` a newly created entry is born with
        the lease granted at epoch 1, in the same write (one durability point instead of
        two; history records a create row and a lease row). An existing entry is returned
        unchanged and its lease is not touched: acquire it separately.

        Raises:
            IntentConflict: the entry exists with another intent digest.
            UnsafeValue: metadata has a key off the allow-list or a secret-looking value.

        """
        ...

    def get(self, operation_id: str) -> JournalEntry | None:
        """Return the entry, read after any write this process made, or None."""
        ...

    def compare_and_set(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        next_state: CommitState,
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
        audit: AuditRequest | None = None,
        release_lease: bool = False,
    ) -> JournalEntry:
        """Move the entry to ``next_state`` in one conditional write; version + 1.

        ``release_lease`` also lets the caller's lease expire now, in the same write.

        Preconditions: the entry's version, state and lease epoch equal the expected ones.
        Postconditions: one history row per step (several for a fold); the audit record,
        when given, is written in the same transaction.

        Raises:
            IllegalTransition: the move is not in ALLOWED_TRANSITIONS, an atomic-only fold
                outside ``compare_and_set_within``, or a recovery-only move without ``audit``.
            JournalConflict: version, state or epoch differ (current ones are attached).
            OperationNotFound: no such entry.

        """
        ...

    def acquire_lease(
        self,
        *,
        operation_id: str,
        owner: str,
        ttl_seconds: float,
        expected_version: int | None = None,
        break_owner: str | None = None,
    ) -> JournalEntry:
        """Grant the lease to ``owner`` at ``epoch + 1`` (also to the current owner); version + 1.

        The lease is free when it has no owner, is expired by the journal's clock, or its
        owner equals ``break_owner`` (a holder the caller proved dead).

        Raises:
            LeaseHeld: another owner's lease is live.
            JournalConflict: ``expected_version`` was given and differs.

        """
        ...

    def renew_lease(
        self, *, operation_id: str, owner: str, lease_epoch: int, ttl_seconds: float
    ) -> JournalEntry:
        """Extend the expiry of the caller's lease. The version does not change.

        Raises:
            LeaseLost: the lease epoch or owner moved on.

        """
        ...

    def release_lease(self, *, operation_id: str, owner: str, lease_epoch: int) -> None:
        """Let the lease expire now if the caller still holds it; otherwise do nothing."""
        ...

    def list_entries(
        self,
        *,
        states: frozenset[CommitState] | None = None,
        updated_before: float | None = None,
        limit: int = 100,
    ) -> list[JournalEntry]:
        """Return entries, newest update first, optionally filtered by state and age."""
        ...

    def history(self, operation_id: str) -> list[Transition]:
        """Return the append-only transition history in order."""
        ...

    def append_audit(
        self,
        *,
        operation_id: str,
        request: AuditRequest,
        outcome: str,
        entry: JournalEntry | None,
    ) -> AuditRecord:
        """Record an operator action that changed no state (e.g. a refused one)."""
        ...

    def audit_log(self, operation_id: str | None = None) -> list[AuditRecord]:
        """Return audit records in order, for one operation or all."""
        ...

    def now(self) -> float:
        """Return the journal's clock, seconds since the epoch."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


class TransactionalJournalPort(CommitJournalPort, Protocol):
    """A journal that can write inside a target transaction (atomic mode)."""

    def compare_and_set_within(
        self,
        txn: object,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        next_state: CommitState,
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
        release_lease: bool = False,
    ) -> JournalEntry:
        """Like ``compare_and_set`` but on the target's open transaction ``txn``.

        Atomic-only folds are allowed here. A conflict raises and the caller rolls the
        whole target transaction back, data included.
        """
        ...

    def shares_database_with(self, locator: str) -> bool:
        """Return True when ``locator`` (a target's database identity) is this journal's."""
        ...


class FoldingJournalPort(TransactionalJournalPort, Protocol):
    """A transactional journal that can also create an entry inside the target transaction.

    Used for the first attempt of an atomic operation (ADR 0003): the entry is born
    COMPLETE in the same transaction as the data and the fence, so creation, lease and
    completion need no durability point of their own.
    """

    def create_complete_within(
        self,
        txn: object,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """Insert the entry already COMPLETE (version 2, lease epoch 1, lease ended).

        History: ``create`` and ``lease`` at version 1, then the atomic fold
        PREPARING -> ... -> COMPLETE at version 2, exactly as the unfolded path writes it.

        Raises:
            JournalConflict: the entry already exists; the caller rolls ``txn`` back and
                reads the journal.
            JournalUnavailable: the statement failed (the transaction is then aborted).
        """
        ...


class ForwardFoldingJournalPort(CommitJournalPort, Protocol):
    """A journal that can create an entry already COMMITTING (forward mode, ADR 0003).

    On a first attempt nothing happens between the lease and COMMITTING (the fence is
    raised inside the data transaction, ADR 0002), so create, lease and COMMITTING are
    one durable write; COMMITTING is still durable before the target is touched.
    """

    def create_committing(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """Create the entry COMMITTING at version 2, leased to ``actor`` at epoch 1.

        History: ``create`` and ``lease`` at version 1, then PREPARING -> PREPARED ->
        COMMITTING at version 2. An existing entry is returned unchanged.

        Raises:
            IntentConflict: the entry exists with another intent digest.
        """
        ...


class ProvenCompletionJournalPort(CommitJournalPort, Protocol):
    """A journal that can record a proven COMPLETE without a durability point of its own.

    ADR 0008: once the target's fence shows the operation committed, COMPLETE only
    records what the fence already proves durably. If a crash of the journal's server
    loses it, the entry is back in COMMITTING (durable before the target was touched)
    and the next run observes the committed fence and completes, writing nothing.
    """

    def complete_proven(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """``compare_and_set`` to COMPLETE ending the lease, without waiting for its flush.

        Visible to every reader at once and durable with the store's next flush.

        Raises:
            JournalConflict: the entry moved (same as ``compare_and_set``).
            JournalUnavailable: the store could not be written.
        """
        ...
