"""inspect / plan / apply: read-only analysis and audited operator actions (section 9)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dpone.contracts.fence import FenceCapability, FenceObservation, FenceStatus, SealOutcome
from dpone.contracts.journal import AuditRecord, AuditRequest, JournalEntry, Transition
from dpone.contracts.states import CommitState
from dpone.errors import (
    DponeError,
    FenceUnavailable,
    JournalConflict,
    LeaseHeld,
    OperationNotFound,
    RecoveryRefused,
    Unauthorized,
)
from dpone.ports.connector import TargetConnectorPort
from dpone.ports.journal import CommitJournalPort
from dpone.runtime import failpoints
from dpone.runtime.executor import proven_dead

__all__ = ["Action", "Inspection", "RecoveryPlan", "RecoveryService"]

S = CommitState


class Action(str, enum.Enum):
    """Operator actions ``apply`` accepts."""

    COMPLETE_STATE = "complete-state"  # TARGET_COMMITTED | COMMITTED_INCOMPLETE -> COMPLETE
    MARK_COMMITTED = "mark-committed"  # COMMIT_UNKNOWN -> TARGET_COMMITTED
    MARK_NOT_COMMITTED = "mark-not-committed"  # COMMIT_UNKNOWN -> FAILED_PRE_COMMIT


_ACTION_FROM: dict[Action, frozenset[CommitState]] = {
    Action.COMPLETE_STATE: frozenset({S.TARGET_COMMITTED, S.COMMITTED_INCOMPLETE}),
    Action.MARK_COMMITTED: frozenset({S.COMMIT_UNKNOWN}),
    Action.MARK_NOT_COMMITTED: frozenset({S.COMMIT_UNKNOWN}),
}
_ACTION_TO = {
    Action.COMPLETE_STATE: S.COMPLETE,
    Action.MARK_COMMITTED: S.TARGET_COMMITTED,
    Action.MARK_NOT_COMMITTED: S.FAILED_PRE_COMMIT,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Inspection:
    """Everything known about one operation, read without writing anything."""

    entry: JournalEntry
    history: list[Transition]
    audit: list[AuditRecord]
    capability: FenceCapability
    fence: FenceObservation | None
    fence_error: str | None  # error code when the fence could not be read
    lease_live: bool  # held by an executor that may still be running
    lease_expires_in: float | None
    lease_holder_dead: bool  # the holder is a process on this host that no longer exists


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryPlan:
    """The recommended next step and the actions ``apply`` would accept now."""

    operation_id: str
    state: CommitState
    version: int
    recommended: str
    explanation: str
    allowed_actions: tuple[Action, ...]


class RecoveryService:
    """Library calls behind ``dpone recovery target-commit``; the CLI only prints."""

    def __init__(
        self,
        *,
        journal: CommitJournalPort,
        connector: TargetConnectorPort,
        authorized_principals: frozenset[str],
    ) -> None:
        self._journal = journal
        self._connector = connector
        self._authorized = authorized_principals

    # -------------------------------------------------------------- read-only
    def inspect(self, operation_id: str) -> Inspection:
        """Read journal entry, history, audit, lease and fence. Writes nothing."""
        entry = self._entry(operation_id)
        fence: FenceObservation | None = None
        fence_error: str | None = None
        try:
            fence = self._connector.observe(operation_id=operation_id)
        except DponeError as exc:
            fence_error = exc.code.value
        now = self._journal.now()
        expires = entry.lease_expires_at
        unexpired = entry.lease_owner is not None and expires is not None and expires > now
        dead = unexpired and proven_dead(entry.lease_owner)
        live = unexpired and not dead
        return Inspection(
            entry=entry,
            history=self._journal.history(operation_id),
            audit=self._journal.audit_log(operation_id),
            capability=self._connector.capability,
            fence=fence,
            fence_error=fence_error,
            lease_live=live,
            lease_expires_in=(expires - now) if live and expires is not None else None,
            lease_holder_dead=dead,
        )

    def plan(self, operation_id: str) -> RecoveryPlan:
        """Recommend the next step from the journal state and the fence. Writes nothing."""
        seen = self.inspect(operation_id)
        entry, fence = seen.entry, seen.fence
        committed = fence is not None and fence.status is FenceStatus.COMMITTED
        marker = seen.capability is not FenceCapability.NONE
        state = entry.state
        allowed: tuple[Action, ...] = tuple(a for a, frm in _ACTION_FROM.items() if state in frm)
        if state is S.COMPLETE:
            recommended, why = "nothing", "the operation is COMPLETE; reruns return its result"
        elif seen.lease_live:
            recommended = "wait"
            why = (
                f"a live executor ({entry.lease_owner}) holds the lease for "
                f"{seen.lease_expires_in:.0f}s more; let it finish or let the lease expire"
            )
        elif state is S.COMMIT_UNKNOWN and marker and seen.fence_error is None:
            action = Action.MARK_COMMITTED if committed else Action.MARK_NOT_COMMITTED
            recommended = f"apply --action {action.value}"
            why = f"the fence shows the write {'committed' if committed else 'did not commit'}"
        elif state is S.COMMIT_UNKNOWN:
            recommended = (
                "verify the target by hand, then apply mark-committed or mark-not-committed"
            )
            why = (
                "this route cannot prove the outcome (capability none); check whether the rows "
                "arrived, then apply the matching action (mark-not-committed needs "
                "--attest-no-live-writer)"
            )
        elif state in (S.TARGET_COMMITTED, S.COMMITTED_INCOMPLETE):
            recommended = "rerun dpone run (or apply --action complete-state)"
            why = "the target committed; completing only records state, nothing is written again"
        else:
            recommended = "rerun dpone run"
            why = (
                f"{state.value} is resolved automatically: the run seals the fence and "
                "either completes or writes exactly once"
            )
        return RecoveryPlan(
            operation_id=operation_id,
            state=state,
            version=entry.version,
            recommended=recommended,
            explanation=why,
            allowed_actions=allowed,
        )

    # -------------------------------------------------------------- audited writes
    def apply(
        self,
        operation_id: str,
        *,
        action: Action,
        expected_version: int,
        principal: str,
        reason: str,
        attest_no_live_writer: bool = False,
    ) -> JournalEntry:
        """Apply an operator action under CAS, with a fresh lease epoch and an audit record.

        Raises:
            Unauthorized: ``principal`` is not in the configured policy.
            RecoveryRefused: the action does not fit the state, version, lease or fence.

        """
        request = AuditRequest(
            principal=principal,
            action=action.value,
            reason=reason,
            attestation="no-live-writer" if attest_no_live_writer else None,
        )
        entry = self._entry(operation_id)
        try:
            return self._apply(entry, action, expected_version, request, attest_no_live_writer)
        except (Unauthorized, RecoveryRefused, JournalConflict, FenceUnavailable) as refused:
            try:
                # audit against what the journal holds now (the lease may have moved it)
                current = self._journal.get(operation_id) or entry
                self._journal.append_audit(
                    operation_id=operation_id, request=request, outcome="refused", entry=current
                )
            except DponeError:
                pass  # the refusal itself is the primary outcome
            if isinstance(refused, JournalConflict):
                raise RecoveryRefused(
                    "the operation moved since you looked",
                    operation_id=operation_id,
                    hint="run plan again and pass the version it shows",
                ) from None
            raise refused from None

    def _apply(
        self,
        entry: JournalEntry,
        action: Action,
        expected_version: int,
        request: AuditRequest,
        attested: bool,
    ) -> JournalEntry:
        op = entry.operation_id
        if request.principal not in self._authorized:
            raise Unauthorized(
                f"principal {request.principal!r} may not apply recovery actions",
                operation_id=op,
                hint="add the principal to recovery.authorized_principals in the workload file",
            )
        if not request.reason.strip():
            raise RecoveryRefused("an action needs --reason", operation_id=op)
        if entry.version != expected_version:
            raise RecoveryRefused(
                f"the operation is at version {entry.version}, not {expected_version}; "
                "it moved since you looked",
                operation_id=op,
                state=entry.state.value,
                journal_version=entry.version,
                hint="run plan again and pass the version it shows",
            )
        if entry.state not in _ACTION_FROM[action]:
            raise RecoveryRefused(
                f"action {action.value} does not apply to state {entry.state.value}",
                operation_id=op,
                state=entry.state.value,
                journal_version=entry.version,
                hint="run plan to see the actions that apply",
            )
        none_route = self._connector.capability is FenceCapability.NONE
        if action is Action.MARK_NOT_COMMITTED and none_route and not attested:
            raise RecoveryRefused(
                "nothing fences a paused writer on this route; confirm every earlier process "
                "has ended with --attest-no-live-writer",
                operation_id=op,
                state=entry.state.value,
            )
        if not none_route:
            # look before taking the lease: a refusal then leaves the version untouched
            self._check_observed(entry, action)
        # on a none route nothing fences a paused writer: wait out its lease (section 9)
        leased = self._lease(entry, expected_version, request.principal, break_dead=not none_route)
        try:
            self._check_fence(leased, action, none_route)
            failpoints.hit("before:recovery.apply")
            applied = self._journal.compare_and_set(
                operation_id=op,
                expected_version=leased.version,
                expected_states=frozenset({leased.state}),
                next_state=_ACTION_TO[action],
                lease_epoch=leased.lease_epoch,
                actor=f"recovery:{request.principal}",
                evidence={"action": action.value, "principal": request.principal},
                audit=request,
            )
            failpoints.hit("after:recovery.apply")
            return applied
        finally:
            try:
                self._journal.release_lease(
                    operation_id=op,
                    owner=f"recovery:{request.principal}",
                    lease_epoch=leased.lease_epoch,
                )
            except DponeError:
                pass  # secondary: the lease expires by itself; the outcome above stands

    def _lease(
        self, entry: JournalEntry, expected_version: int, principal: str, *, break_dead: bool
    ) -> JournalEntry:
        """Take the lease at a fresh epoch: it fences every earlier executor."""
        owner = f"recovery:{principal}"
        try:
            return self._journal.acquire_lease(
                operation_id=entry.operation_id,
                owner=owner,
                ttl_seconds=60.0,
                expected_version=expected_version,
            )
        except LeaseHeld as held:
            if break_dead and proven_dead(held.lease_owner):
                return self._journal.acquire_lease(
                    operation_id=entry.operation_id,
                    owner=owner,
                    ttl_seconds=60.0,
                    expected_version=expected_version,
                    break_owner=held.lease_owner,
                )
            raise RecoveryRefused(
                f"a live executor ({held.lease_owner}) holds the lease; wait for it to end "
                "or for the lease to expire",
                operation_id=entry.operation_id,
                state=entry.state.value,
            ) from None

    def _check_observed(self, entry: JournalEntry, action: Action) -> None:
        """Refuse, before any write, an action the fence already contradicts."""
        seen = self._connector.observe(operation_id=entry.operation_id)
        committed = seen.status is FenceStatus.COMMITTED
        if committed == (action is Action.MARK_NOT_COMMITTED):
            raise RecoveryRefused(
                f"the fence shows {seen.status.value}, which contradicts {action.value}",
                operation_id=entry.operation_id,
                state=entry.state.value,
                journal_version=entry.version,
                hint="run plan: the fence shows what happened",
            )

    def _check_fence(self, leased: JournalEntry, action: Action, none_route: bool) -> None:
        if none_route:
            return
        op = leased.operation_id
        if action is Action.MARK_NOT_COMMITTED:
            failpoints.hit("before:recovery.seal")
            sealed = self._connector.seal(operation_id=op, epoch=leased.lease_epoch)
            failpoints.hit("after:recovery.seal")
            if sealed.outcome is not SealOutcome.NOT_COMMITTED:
                raise RecoveryRefused(
                    f"the fence does not prove the write absent ({sealed.outcome.value})",
                    operation_id=op,
                    state=leased.state.value,
                    hint="run plan: the fence shows what happened",
                )
            return
        seen = self._connector.observe(operation_id=op)
        if seen.status is not FenceStatus.COMMITTED:
            raise RecoveryRefused(
                f"the fence shows {seen.status.value}, not committed",
                operation_id=op,
                state=leased.state.value,
                hint="run plan: the fence shows what happened",
            )

    def _entry(self, operation_id: str) -> JournalEntry:
        entry = self._journal.get(operation_id)
        if entry is None:
            raise OperationNotFound(
                "no journal entry for this operation id",
                operation_id=operation_id,
                hint="check the id and that the workload names the right journal",
            )
        return entry
