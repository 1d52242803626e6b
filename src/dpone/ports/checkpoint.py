"""The checkpoint store port: watermarks promoted with COMPLETE, in the journal's storage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from dpone.contracts.checkpoint import Checkpoint, CheckpointAdvance
from dpone.contracts.journal import JournalEntry
from dpone.contracts.states import CommitState

__all__ = ["CheckpointStorePort", "DeliveryCheckpointPort", "TransactionalCheckpointStorePort"]


class CheckpointStorePort(Protocol):
    """Checkpoints of incremental streams, kept beside the journal entries.

    The journal adapters (memory, SQLite, PostgreSQL) implement it; the watermark is
    only ever moved by :meth:`complete_with_checkpoint` (or its atomic twin), so it can
    never pass an interval whose operation is not COMPLETE.
    """

    def complete_with_checkpoint(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        checkpoint: CheckpointAdvance,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """CAS the entry to COMPLETE (lease released) and promote the checkpoint, one transaction.

        The interval is recorded as complete; the watermark then chains over every
        completed interval that touches it (``advance_watermark``). Completing twice
        cannot move it twice (absolute writes).

        Raises:
            IllegalTransition, JournalConflict, OperationNotFound: as ``compare_and_set``;
                nothing is written, the checkpoint included.

        """
        ...

    def promote_completed(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Promote the checkpoint for an operation that is already COMPLETE.

        For an operation completed without its checkpoint (an operator's recovery
        ``complete-state``); the state is checked in the same transaction. Idempotent.

        Returns:
            False (and writes nothing) when the operation is not COMPLETE.

        """
        ...

    def get_checkpoint(self, stream_id: str) -> Checkpoint | None:
        """Return the stream's checkpoint, or None before its first completion or claim."""
        ...

    def list_checkpoints(self) -> list[Checkpoint]:
        """Return every stream's checkpoint, ordered by workload, partition and stream."""
        ...

    def claim_interval(
        self,
        *,
        stream_id: str,
        workload_id: str,
        partition: str,
        target_identity: str,
        origin: int,
        proposed_end: int,
    ) -> tuple[int, int] | None:
        """Return the stream's next interval ``(start, end)`` and record it as the claim.

        A claim that still starts at the watermark is returned unchanged (a retry after a
        crash loads exactly the same interval, whatever the clock says now); otherwise
        the claim becomes ``[watermark, proposed_end)``. None when nothing is due yet.
        """
        ...


class TransactionalCheckpointStorePort(CheckpointStorePort, Protocol):
    """A checkpoint store that can also promote inside a target transaction (atomic mode)."""

    def complete_with_checkpoint_within(
        self,
        txn: object,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        checkpoint: CheckpointAdvance,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """Like ``complete_with_checkpoint`` on the target's open transaction ``txn``.

        Atomic folds (PREPARING | PREPARED | FAILED_PRE_COMMIT -> COMPLETE) are allowed;
        a conflict raises and the caller rolls the whole transaction back.
        """
        ...


class DeliveryCheckpointPort(Protocol):
    """Checkpoint promotion for deliveries, whose COMPLETE lives in the delivery control plane.

    A delivery's success is proven by the receiver, possibly in another process than
    the submitter, so what it promotes is *bound* to its operation id before anything
    is sent, and promoted by an absolute write once the control plane holds verified
    success evidence (``dpone.runtime.workload_delivery``). The journal adapters
    implement it in the journal's database.
    """

    def bind_delivery_checkpoint(
        self, *, operation_id: str, checkpoint: CheckpointAdvance
    ) -> CheckpointAdvance:
        """Record what ``operation_id`` promotes (create-if-absent); return the recorded one."""
        ...

    def delivery_checkpoint(self, operation_id: str) -> CheckpointAdvance | None:
        """Return what ``operation_id`` promotes, or None (it promotes nothing)."""
        ...

    def promote_delivered(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Record the interval complete and chain the watermark over it (ADR 0005 rules).

        Absolute and idempotent: a repeated call (a crash between the promotion and
        the delivery's COMPLETE) finds the interval recorded and writes nothing.

        Returns:
            True when this call recorded the interval, False when it was already recorded.

        """
        ...
