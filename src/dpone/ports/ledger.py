"""The run ledger port: runs, their attempts, and the idempotency key that names a run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from dpone.contracts.evidence import SafeMapping
from dpone.contracts.journal import JournalEntry
from dpone.contracts.run import AttemptRecord, RunError, RunRecord, RunStart, RunState
from dpone.contracts.states import CommitState

__all__ = [
    "BirthAnswer",
    "FindingLedgerPort",
    "FoldingLedgerPort",
    "LookupLedgerPort",
    "RunEndingLedgerPort",
    "RunLedgerPort",
    "SendingLedgerPort",
]


class RunLedgerPort(Protocol):
    """Durable record of every run and attempt, kept in the journal's store.

    Every adapter passes ``dpone.testing.ledger_conformance``. Raw driver errors never
    escape: an unreachable or locked store raises ``JournalUnavailable``.
    """

    def begin_run(self, start: RunStart) -> tuple[RunRecord, bool]:
        """Record a run in RUNNING if its idempotency key is new; else return the existing run.

        Returns:
            ``(run, created)``: ``created`` is False when the key was already recorded;
            the existing run is returned unchanged (never overwritten).

        Raises:
            UnsafeValue: provenance or access hold a secret-looking value.

        """
        ...

    def get_run(self, run_id: str) -> RunRecord | None:
        """Return the run or None."""
        ...

    def list_runs(
        self, *, states: frozenset[RunState] | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """Return runs, newest update first, optionally only in ``states``."""
        ...

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Return the run's attempts in attempt order."""
        ...

    def begin_attempt(
        self, *, run_id: str, attempt: int, owner: str, provenance: SafeMapping | None = None
    ) -> AttemptRecord:
        """Record attempt ``attempt`` (the lease epoch) as RUNNING and make it current.

        Idempotent for the same owner: recording the current attempt again returns it.

        Older attempts still RUNNING become SUPERSEDED in the same write; the run goes
        back to RUNNING and its error is cleared.

        Raises:
            LeaseLost: ``attempt`` is not above the run's current attempt (a stale
                attempt: its late write is refused and nothing changes).
            OperationNotFound: no run has this id.

        """
        ...

    def end_attempt(
        self, *, run_id: str, attempt: int, state: RunState, error: RunError | None = None
    ) -> RunRecord:
        """Record how the run's current attempt ended (``attempt`` 0: before any lease).

        The attempt's own row is updated only while it is RUNNING; the run's state and
        error only while ``attempt`` is still the run's current attempt.

        Raises:
            LeaseLost: a newer attempt is current (the stale write is refused; nothing
                changes).
            OperationNotFound: no run has this id.

        """
        ...


class LookupLedgerPort(RunLedgerPort, Protocol):
    """A ledger kept beside the journal that reads a run and its operation's entry at once.

    A replay of a finished run then costs one read (ADR 0008).
    """

    def find_run(
        self, *, idempotency_key: str, operation_id: str
    ) -> tuple[RunRecord | None, JournalEntry | None]:
        """Return the run under ``idempotency_key`` and the entry of ``operation_id``.

        Each is None when absent; both are read in one statement, and nothing is written.

        Raises:
            JournalUnavailable: the store could not be read.
        """
        ...


class FindingLedgerPort(LookupLedgerPort, Protocol):
    """A ledger that sends a new entry's birth with its lookup (forward mode, ADR 0018)."""

    def find_run_or_create_committing(
        self,
        start: RunStart,
        *,
        provenance: SafeMapping | None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> tuple[RunRecord | None, JournalEntry | None, bool]:
        """``find_run``; and when it finds neither run nor entry, the entry born COMMITTING.

        Returns ``(None, entry, True)`` for an entry born now, leased to ``actor`` at epoch
        1 with the run RUNNING at attempt 1 (as ``create_committing_with_run``); else
        ``(run, entry, False)`` as ``find_run`` read them, nothing written. ``(None,
        None, False)``: another executor wrote one of them meanwhile; read again.

        Raises:
            JournalUnavailable: the store could not be read or written.
        """
        ...


#: Reads the answer of a birth sent ahead, once: what ``find_run_or_create_committing``
#: returns, and raises what it raises.
BirthAnswer = Callable[[], "tuple[RunRecord | None, JournalEntry | None, bool]"]


class SendingLedgerPort(FindingLedgerPort, Protocol):
    """A ledger that sends that birth ahead of its answer (forward mode, ADR 0021)."""

    def send_find_run_or_create_committing(
        self,
        start: RunStart,
        *,
        provenance: SafeMapping | None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> BirthAnswer | None:
        """``find_run_or_create_committing``, sent now, its answer read by what this returns.

        None, sending nothing, when it cannot send ahead now: the caller makes the call.
        Nothing may touch the target for this operation before the answer says born.

        Raises:
            JournalUnavailable: the store could not be written (also from the answer).
        """
        ...


class FoldingLedgerPort(RunLedgerPort, Protocol):
    """A ledger that can record a run inside the target's transaction (ADR 0008).

    For the folded atomic first attempt (ADR 0003): the run, its attempt 1 and their
    COMPLETE end are written in the transaction that writes the rows, the fence and the
    journal entry, so they exist exactly when the write does.
    """

    def complete_run_writer(
        self, start: RunStart, *, owner: str, provenance: SafeMapping | None = None
    ) -> Callable[[object], None]:
        """Check the run's values now; return the writer of the run in a target transaction.

        Given the target's open ``psycopg`` transaction, the writer inserts the run
        COMPLETE at attempt 1 with that attempt COMPLETE (one statement; it never begins,
        commits or rolls back).

        The writer raises ``JournalConflict`` when the key is already recorded (the
        caller rolls back and takes the unfolded path) and ``JournalUnavailable`` when
        the statement failed.

        Raises:
            UnsafeValue: provenance or access hold a secret-looking value (checked here,
                before any write).
        """
        ...

    def create_committing_with_run(
        self,
        start: RunStart,
        *,
        provenance: SafeMapping | None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> tuple[JournalEntry, bool]:
        """Create the entry COMMITTING with the new run RUNNING at attempt 1, in one write.

        The entry as ``ForwardFoldingJournalPort.create_committing`` creates it; the run
        and its attempt 1 owned by ``actor``; one journal transaction.

        Returns:
            ``(entry, run_recorded)``: when the entry or the run already existed nothing
            of the combined write is kept, the entry is created or found alone and
            ``run_recorded`` is False (the caller records the run the ordinary way).

        Raises:
            UnsafeValue: provenance or access hold a secret-looking value.
            IntentConflict: the entry exists with another intent digest.
            JournalUnavailable: the journal could not be written.
        """
        ...


class RunEndingLedgerPort(FoldingLedgerPort, Protocol):
    """A ledger that ends a run's attempt with its operation's COMPLETE (ADR 0013).

    For forward mode's first attempt, whose run and attempt 1 were recorded with the
    entry (``create_committing_with_run``): the COMPLETE the fence proves and the end
    of that attempt are one journal write instead of two.
    """

    def complete_proven_ending_run(
        self,
        *,
        run_id: str,
        attempt: int,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> tuple[JournalEntry, bool]:
        """``complete_proven`` and ``end_attempt(run_id, attempt, COMPLETE)`` in one write.

        The run and its attempt end only if the entry moved, and only while the run is
        at ``attempt``.

        Returns:
            ``(entry, run_ended)``: the entry COMPLETE; ``run_ended`` False when the run
            was not at ``attempt`` (nothing of the ledger was written; the caller ends
            it the ordinary way).

        Raises:
            JournalConflict: the entry moved (version, state or lease epoch); nothing
                was written, the run included.
            JournalUnavailable: the journal could not be written (the outcome of a write
                whose acknowledgement was lost is unknown: never repeated).
        """
        ...
