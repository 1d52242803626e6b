"""The typed result of running one operation."""

from __future__ import annotations

import enum

import msgspec

from dpone.contracts.states import CommitState

__all__ = ["OperationResult", "RunMode"]


class RunMode(str, enum.Enum):
    """How an operation's commit is made durable."""

    ATOMIC = "atomic"  # journal lives in the target database: one transaction
    FORWARD_RECOVERY = "forward_recovery"  # separate systems: fence + journal + resume


class OperationResult(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run_operation`` returns when the operation is COMPLETE."""

    operation_id: str
    state: CommitState
    journal_version: int
    mode: RunMode
    rows_written: int | None  # None: not known (a none-route commit an operator confirmed)
    content_digest: str | None
    replayed: bool  # True: already COMPLETE before this call; nothing was written
    resumed: bool  # True: this call finished work an earlier attempt started
    lease_epoch: int
    run_id: str | None = None  # the run ledger's run (None outside a recorded run)
    attempt: int | None = None  # the run's attempt that produced this result (a lease epoch)

    def summary(self) -> dict[str, object]:
        """Return a safe, JSON-ready summary (no rows, no SQL, no secrets)."""
        return {
            "operation_id": self.operation_id,
            "state": self.state.value,
            "journal_version": self.journal_version,
            "mode": self.mode.value,
            "rows_written": self.rows_written,
            "content_digest": self.content_digest,
            "replayed": self.replayed,
            "resumed": self.resumed,
            "lease_epoch": self.lease_epoch,
            "run_id": self.run_id,
            "attempt": self.attempt,
        }
