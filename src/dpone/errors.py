"""The DponeError tree: stable codes, retryability as data, only safe fields.

::

    DponeError
    +-- ConfigInvalid                DPONE_CONFIG_INVALID                 TERMINAL
    +-- SourceInvalid                DPONE_SOURCE_INVALID                 TERMINAL
    +-- SourceUnavailable            DPONE_SOURCE_UNAVAILABLE             TRANSIENT
    +-- TargetSchemaMismatch         DPONE_TARGET_SCHEMA_MISMATCH         TERMINAL
    +-- TargetWriteFailed            DPONE_TARGET_WRITE_FAILED            TERMINAL
    +-- UnsafeValue                  DPONE_UNSAFE_VALUE                   TERMINAL
    +-- OperationNotFound            DPONE_OPERATION_NOT_FOUND            TERMINAL
    +-- IntentConflict               DPONE_TARGET_COMMIT_INTENT_CONFLICT  STOP
    +-- JournalUnavailable           DPONE_TARGET_COMMIT_JOURNAL_UNAVAILABLE  TRANSIENT
    +-- FenceUnavailable             DPONE_TARGET_COMMIT_FENCE_UNAVAILABLE    TRANSIENT
    +-- CommitUnknown                DPONE_TARGET_COMMIT_UNKNOWN          STOP
    +-- CommittedIncomplete          DPONE_TARGET_COMMITTED_INCOMPLETE    TRANSIENT
    +-- RecoveryConflict             DPONE_TARGET_COMMIT_RECOVERY_CONFLICT    STOP
    +-- RecoveryRefused              DPONE_RECOVERY_REFUSED               TERMINAL
    +-- Unauthorized                 DPONE_RECOVERY_UNAUTHORIZED          TERMINAL
    +-- LeaseHeld                    DPONE_LEASE_HELD                     TRANSIENT
    +-- LeaseLost                    DPONE_LEASE_LOST                     TRANSIENT
    +-- JournalConflict              DPONE_JOURNAL_CAS_CONFLICT           TRANSIENT
    +-- IllegalTransition            DPONE_JOURNAL_ILLEGAL_TRANSITION     TERMINAL
    +-- FencedOut                    DPONE_TARGET_FENCED_OUT              TRANSIENT
    +-- InjectedFault                DPONE_INJECTED_FAULT                 TRANSIENT
    +-- ReceiverUnavailable          DPONE_DELIVERY_RECEIVER_UNAVAILABLE  TRANSIENT
    +-- DeliveryCapacityFull         DPONE_DELIVERY_CAPACITY_FULL         TRANSIENT
    +-- DeliveryRejected             DPONE_DELIVERY_REJECTED              TERMINAL
    +-- DeliveryCredentialRefused    DPONE_DELIVERY_CREDENTIAL_REFUSED    TRANSIENT
    +-- AuditFailed                  DPONE_AUDIT_FAILED                   TERMINAL
    +-- RunKeyConflict               DPONE_RUN_KEY_CONFLICT               TERMINAL
    +-- ObjectStoreUnavailable       DPONE_OBJECT_STORE_UNAVAILABLE       TRANSIENT
    +-- PublicationRefused           DPONE_PUBLICATION_REFUSED            TERMINAL
    +-- PublishConflict              DPONE_PUBLICATION_CONFLICT           TERMINAL

Errors never carry SQL text, row values, credentials or URLs: only the fields
listed in ``SAFE_FIELDS``. They pickle (for multiprocessing and Airflow) and
expose :meth:`DponeError.attrs` for structured output.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

__all__ = [
    "SAFE_FIELDS",
    "AuditFailed",
    "CommitUnknown",
    "CommittedIncomplete",
    "ConfigInvalid",
    "DeliveryCapacityFull",
    "DeliveryCredentialRefused",
    "DeliveryRejected",
    "DponeError",
    "ErrorCode",
    "FenceUnavailable",
    "FencedOut",
    "IllegalTransition",
    "InjectedFault",
    "IntentConflict",
    "JournalConflict",
    "JournalUnavailable",
    "LeaseHeld",
    "LeaseLost",
    "ObjectStoreUnavailable",
    "OperationNotFound",
    "PublicationRefused",
    "PublishConflict",
    "ReceiverUnavailable",
    "RecoveryConflict",
    "RecoveryRefused",
    "Retryability",
    "RunKeyConflict",
    "SourceInvalid",
    "SourceUnavailable",
    "TargetSchemaMismatch",
    "TargetWriteFailed",
    "Unauthorized",
    "UnsafeValue",
    "recovery_ref",
]


class ErrorCode(str, enum.Enum):
    """Stable, documented error codes. Values never change once released."""

    CONFIG_INVALID = "DPONE_CONFIG_INVALID"
    SOURCE_INVALID = "DPONE_SOURCE_INVALID"
    SOURCE_UNAVAILABLE = "DPONE_SOURCE_UNAVAILABLE"
    TARGET_SCHEMA_MISMATCH = "DPONE_TARGET_SCHEMA_MISMATCH"
    TARGET_WRITE_FAILED = "DPONE_TARGET_WRITE_FAILED"
    UNSAFE_VALUE = "DPONE_UNSAFE_VALUE"
    OPERATION_NOT_FOUND = "DPONE_OPERATION_NOT_FOUND"
    INTENT_CONFLICT = "DPONE_TARGET_COMMIT_INTENT_CONFLICT"
    JOURNAL_UNAVAILABLE = "DPONE_TARGET_COMMIT_JOURNAL_UNAVAILABLE"
    FENCE_UNAVAILABLE = "DPONE_TARGET_COMMIT_FENCE_UNAVAILABLE"
    COMMIT_UNKNOWN = "DPONE_TARGET_COMMIT_UNKNOWN"
    COMMITTED_INCOMPLETE = "DPONE_TARGET_COMMITTED_INCOMPLETE"
    RECOVERY_CONFLICT = "DPONE_TARGET_COMMIT_RECOVERY_CONFLICT"
    RECOVERY_REFUSED = "DPONE_RECOVERY_REFUSED"
    UNAUTHORIZED = "DPONE_RECOVERY_UNAUTHORIZED"
    LEASE_HELD = "DPONE_LEASE_HELD"
    LEASE_LOST = "DPONE_LEASE_LOST"
    JOURNAL_CONFLICT = "DPONE_JOURNAL_CAS_CONFLICT"
    ILLEGAL_TRANSITION = "DPONE_JOURNAL_ILLEGAL_TRANSITION"
    FENCED_OUT = "DPONE_TARGET_FENCED_OUT"
    INJECTED_FAULT = "DPONE_INJECTED_FAULT"
    RECEIVER_UNAVAILABLE = "DPONE_DELIVERY_RECEIVER_UNAVAILABLE"
    DELIVERY_CAPACITY_FULL = "DPONE_DELIVERY_CAPACITY_FULL"
    DELIVERY_REJECTED = "DPONE_DELIVERY_REJECTED"
    DELIVERY_CREDENTIAL_REFUSED = "DPONE_DELIVERY_CREDENTIAL_REFUSED"
    AUDIT_FAILED = "DPONE_AUDIT_FAILED"
    RUN_KEY_CONFLICT = "DPONE_RUN_KEY_CONFLICT"
    OBJECT_STORE_UNAVAILABLE = "DPONE_OBJECT_STORE_UNAVAILABLE"
    PUBLICATION_REFUSED = "DPONE_PUBLICATION_REFUSED"
    PUBLICATION_CONFLICT = "DPONE_PUBLICATION_CONFLICT"


class Retryability(str, enum.Enum):
    """What an orchestrator may do after the error.

    TRANSIENT: retrying the same operation is safe and may succeed.
    TERMINAL: retrying without a change (config, data, permissions) fails again.
    STOP: never retry automatically; an operator must decide (COMMIT_UNKNOWN and kin).
    """

    TRANSIENT = "transient"
    TERMINAL = "terminal"
    STOP = "stop"


#: The only attributes an error may carry besides its message.
SAFE_FIELDS: tuple[str, ...] = (
    "operation_id",
    "state",
    "journal_version",
    "recovery_ref",
    "field",
    "hint",
    "current_version",
    "current_state",
    "lease_owner",
    "lease_expires_in",
)


def recovery_ref(operation_id: str) -> str:
    """Return the command an operator runs next for ``operation_id`` (read-only)."""
    return f"dpone recovery target-commit plan --operation-id {operation_id}"


class DponeError(Exception):
    """Root of every error dpone raises on purpose.

    Args:
        message: a human sentence: what is wrong and what to do. Never SQL, rows or secrets.
        operation_id: the operation concerned, when there is one.
        state: the journal state the operation was seen in.
        journal_version: the journal version the statement refers to.
        recovery_ref: the command an operator should run next.
        field: the configuration field at fault (ConfigInvalid).
        hint: how to fix it.
        current_version: the journal's current version (CAS conflicts).
        current_state: the journal's current state (CAS conflicts).
        lease_owner: the executor holding the lease (LeaseHeld), a host:pid label.
        lease_expires_in: seconds until that lease expires (LeaseHeld).

    """

    code: ClassVar[ErrorCode] = ErrorCode.TARGET_WRITE_FAILED
    retryability: ClassVar[Retryability] = Retryability.TERMINAL

    def __init__(
        self,
        message: str,
        *,
        operation_id: str | None = None,
        state: str | None = None,
        journal_version: int | None = None,
        recovery_ref: str | None = None,
        field: str | None = None,
        hint: str | None = None,
        current_version: int | None = None,
        current_state: str | None = None,
        lease_owner: str | None = None,
        lease_expires_in: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.operation_id = operation_id
        self.state = state
        self.journal_version = journal_version
        self.recovery_ref = recovery_ref
        self.field = field
        self.hint = hint
        self.current_version = current_version
        self.current_state = current_state
        self.lease_owner = lease_owner
        self.lease_expires_in = lease_expires_in

    @property
    def retryable(self) -> bool:
        """True when an automatic retry of the same operation is safe and useful."""
        return self.retryability is Retryability.TRANSIENT

    def attrs(self) -> dict[str, Any]:
        """Return the safe, structured view of the error (code, retryability, safe fields)."""
        out: dict[str, Any] = {
            "code": self.code.value,
            "retryability": self.retryability.value,
            "message": self.message,
        }
        for name in SAFE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {name: getattr(self, name) for name in SAFE_FIELDS}
        return (_rebuild, (type(self), self.message, kwargs))


def _rebuild(cls: type[DponeError], message: str, kwargs: dict[str, Any]) -> DponeError:
    return cls(message, **kwargs)


class ConfigInvalid(DponeError):
    """A workload file, URL, interval or argument is wrong; the message names the field."""

    code = ErrorCode.CONFIG_INVALID
    retryability = Retryability.TERMINAL


class SourceInvalid(DponeError):
    """The source cannot be read as declared (missing file, bad row, changed while read)."""

    code = ErrorCode.SOURCE_INVALID
    retryability = Retryability.TERMINAL


class SourceUnavailable(DponeError):
    """The source database could not be reached or dropped the read (retry later).

    Raised before anything is written: the operation ends FAILED_PRE_COMMIT and a new
    attempt reads the same fixed cut again.
    """

    code = ErrorCode.SOURCE_UNAVAILABLE
    retryability = Retryability.TRANSIENT


class TargetSchemaMismatch(DponeError):
    """The existing target table does not match what the workload would write."""

    code = ErrorCode.TARGET_SCHEMA_MISMATCH
    retryability = Retryability.TERMINAL


class TargetWriteFailed(DponeError):
    """The target rejected the write (constraint, type); the transaction rolled back."""

    code = ErrorCode.TARGET_WRITE_FAILED
    retryability = Retryability.TERMINAL


class UnsafeValue(DponeError):
    """A value looks like a secret or a per-try value and may not enter the journal."""

    code = ErrorCode.UNSAFE_VALUE
    retryability = Retryability.TERMINAL


class OperationNotFound(DponeError):
    """No journal entry exists for the operation id."""

    code = ErrorCode.OPERATION_NOT_FOUND
    retryability = Retryability.TERMINAL


class IntentConflict(DponeError):
    """The same operation id was already recorded with another intent digest."""

    code = ErrorCode.INTENT_CONFLICT
    retryability = Retryability.STOP


class JournalUnavailable(DponeError):
    """The journal could not be reached or stayed locked past its bound; nothing was decided."""

    code = ErrorCode.JOURNAL_UNAVAILABLE
    retryability = Retryability.TRANSIENT


class FenceUnavailable(DponeError):
    """The target fence could not be read or locked within its bound; never a guess."""

    code = ErrorCode.FENCE_UNAVAILABLE
    retryability = Retryability.TRANSIENT


class CommitUnknown(DponeError):
    """The target cannot prove whether the mutation committed; an operator must decide."""

    code = ErrorCode.COMMIT_UNKNOWN
    retryability = Retryability.STOP


class CommittedIncomplete(DponeError):
    """The target committed but the journal or evidence could not be completed yet."""

    code = ErrorCode.COMMITTED_INCOMPLETE
    retryability = Retryability.TRANSIENT


class RecoveryConflict(DponeError):
    """Journal and fence disagree in a way no rule resolves; an operator must look."""

    code = ErrorCode.RECOVERY_CONFLICT
    retryability = Retryability.STOP


class RecoveryRefused(DponeError):
    """A recovery action is not allowed in the operation's current situation."""

    code = ErrorCode.RECOVERY_REFUSED
    retryability = Retryability.TERMINAL


class Unauthorized(DponeError):
    """The principal is not allowed to apply recovery actions."""

    code = ErrorCode.UNAUTHORIZED
    retryability = Retryability.TERMINAL


class LeaseHeld(DponeError):
    """Another live executor holds the operation's lease."""

    code = ErrorCode.LEASE_HELD
    retryability = Retryability.TRANSIENT


class LeaseLost(DponeError):
    """The executor's lease epoch was superseded; it must stop writing and start over."""

    code = ErrorCode.LEASE_LOST
    retryability = Retryability.TRANSIENT


class JournalConflict(DponeError):
    """A compare-and-set found another version, state or epoch than expected."""

    code = ErrorCode.JOURNAL_CONFLICT
    retryability = Retryability.TRANSIENT


class IllegalTransition(DponeError):
    """The requested state change is not in the allowed transition table."""

    code = ErrorCode.ILLEGAL_TRANSITION
    retryability = Retryability.TERMINAL


class FencedOut(DponeError):
    """The target fence carries a higher epoch than the caller's: the caller is stale."""

    code = ErrorCode.FENCED_OUT
    retryability = Retryability.TRANSIENT


class InjectedFault(DponeError):
    """Raised by a failpoint configured with the action ``raise`` (tests only)."""

    code = ErrorCode.INJECTED_FAULT
    retryability = Retryability.TRANSIENT


class ReceiverUnavailable(DponeError):
    """A REST receiver could not be reached, or asked to come back later; nothing was decided."""

    code = ErrorCode.RECEIVER_UNAVAILABLE
    retryability = Retryability.TRANSIENT


class DeliveryCapacityFull(DponeError):
    """Every capacity slot of the receiver is held by an active remote job; try again later."""

    code = ErrorCode.DELIVERY_CAPACITY_FULL
    retryability = Retryability.TRANSIENT


class DeliveryRejected(DponeError):
    """The receiver refused a request (credentials, payload, key reuse); retrying cannot help."""

    code = ErrorCode.DELIVERY_REJECTED
    retryability = Retryability.TERMINAL


class DeliveryCredentialRefused(DponeError):
    """The receiver refused the credentials on a read-only status request (HTTP 401/403).

    Nothing was decided: the remote job is untouched and its receipt stays recorded, so
    the delivery keeps waiting; fix or finish rotating the credential and run it again.
    The message names the credential reference, never its value.
    """

    code = ErrorCode.DELIVERY_CREDENTIAL_REFUSED
    retryability = Retryability.TRANSIENT


class AuditFailed(DponeError):
    """A write-audit-publish audit found violations in the staged rows; nothing was published.

    ``findings`` holds counts only (never rows): the first failing audit's name and
    violation count, how many audits failed and how many ran. The journal records them
    with FAILED_PRE_COMMIT; the operation can be run again once the data is fixed.
    """

    code = ErrorCode.AUDIT_FAILED

    def __init__(self, message: str, *, findings: dict[str, str | int], **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.findings = dict(findings)

    def attrs(self) -> dict[str, Any]:
        """The safe view, with the findings (names and counts)."""
        return {**super().attrs(), "findings": dict(self.findings)}

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {name: getattr(self, name) for name in SAFE_FIELDS}
        kwargs["findings"] = self.findings
        return (_rebuild, (type(self), self.message, kwargs))


class RunKeyConflict(DponeError):
    """An idempotency key already names a run of another request (operation or interval)."""

    code = ErrorCode.RUN_KEY_CONFLICT


class ObjectStoreUnavailable(DponeError):
    """An object store could not be reached or answered with an error (retry later)."""

    code = ErrorCode.OBJECT_STORE_UNAVAILABLE
    retryability = Retryability.TRANSIENT


class PublicationRefused(DponeError):
    """Reconcile refused a generation: incomplete, mixed, corrupt or failing an audit."""

    code = ErrorCode.PUBLICATION_REFUSED
    retryability = Retryability.TERMINAL


class PublishConflict(DponeError):
    """Another publisher moved the ``current`` pointer first; this publish did not happen."""

    code = ErrorCode.PUBLICATION_CONFLICT
    retryability = Retryability.TERMINAL
