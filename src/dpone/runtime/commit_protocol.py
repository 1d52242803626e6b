"""The run algorithm: first attempt and resume, atomic and forward-recovery modes (section 8)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import msgspec

from dpone.contracts.checkpoint import CheckpointAdvance
from dpone.contracts.evidence import safe_mapping
from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
)
from dpone.contracts.journal import JournalEntry
from dpone.contracts.load import LoadPlan, MutationReport
from dpone.contracts.result import OperationResult, RunMode
from dpone.contracts.states import CommitState
from dpone.errors import (
    CommittedIncomplete,
    CommitUnknown,
    ConfigInvalid,
    DponeError,
    FencedOut,
    FenceUnavailable,
    IntentConflict,
    JournalConflict,
    JournalUnavailable,
    LeaseLost,
    RecoveryConflict,
    recovery_ref,
)
from dpone.ports.checkpoint import CheckpointStorePort, TransactionalCheckpointStorePort
from dpone.ports.connector import (
    CannotQueueAhead,
    Collector,
    Fused,
    GatedConnectorPort,
    QueuedWithin,
    TargetConnectorPort,
    WithinTransaction,
)
from dpone.ports.journal import (
    CommitJournalPort,
    FoldingJournalPort,
    ForwardFoldingJournalPort,
    ProvenCompletionJournalPort,
    TransactionalJournalPort,
)
from dpone.ports.ledger import BirthAnswer
from dpone.ports.source import SourcePort
from dpone.runtime import failpoints
from dpone.runtime._log import LazyLogger
from dpone.runtime.birth import BirthUnread, NotBorn, SentBirth
from dpone.runtime.lease import LeaseKeeper, acquire
from dpone.runtime.rows import RowTally, counted, within_interval

__all__ = ["UNREAD", "CommitProtocol", "LookupFirst", "OperationSpec", "RunFold", "Unread"]

S = CommitState
_log = LazyLogger("dpone.runtime")
_MAX_RESTARTS = 5
_FIRST_EPOCH = 1  # the lease epoch an entry is born with (create + lease, ADR 0002)
_BORN_COMMITTING = 2  # the version of an entry created COMMITTING (ADR 0003)


class Unread:
    """The journal entry was not read yet (``CommitProtocol.run(known=...)``)."""

    __slots__ = ()


#: ``CommitProtocol.run(known=UNREAD)``: read the entry first (the default).
UNREAD = Unread()


class OperationSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the protocol needs to run one operation; identity already derived."""

    operation_id: str
    intent_digest: str
    metadata: Mapping[str, object]
    plan: LoadPlan
    source_identity: str
    batch_size: int = 10_000
    lease_ttl_seconds: float = 60.0
    #: the stream watermark this operation's COMPLETE promotes (incremental workloads)
    checkpoint: CheckpointAdvance | None = None


class RunFold(msgspec.Struct, kw_only=True):
    """The run ledger's part of a folded atomic first attempt (ADR 0008).

    Offered by the run service when the run is new. ``write`` records the run COMPLETE
    at attempt 1 inside the target transaction of the folded first attempt, so the run
    exists exactly when the write does. Whenever the protocol does anything else (no
    fold possible, another executor was first, the transaction failed) it first calls
    ``decline``, which records the run the ordinary way. ``committed`` is set once the
    folded transaction committed: the run is then complete and nothing is left to write.
    In forward mode ``create_committing`` records the run RUNNING at attempt 1 in the
    journal write that creates the entry leased at epoch 1 (``begun``). A ledger that
    can write the run and the entry born COMPLETE as one statement offers
    ``create_complete`` (ADR 0011): called instead of ``write`` and the journal's
    ``create_complete_within``, with the same arguments as the latter. A ledger that
    can end attempt 1 COMPLETE in the journal write that completes the entry offers
    ``complete_proven`` (ADR 0013): called instead of the journal's ``complete_proven``
    for the COMPLETE of attempt 1 (``begun``) that the fence proves; ``committed`` is
    set when it ended the run.
    """

    write: Callable[[object], None]
    decline: Callable[[], object]
    #: atomic mode: the run and the entry born COMPLETE in one statement (ADR 0011)
    create_complete: Callable[..., JournalEntry] | None = None
    #: ``create_complete`` queued on a pipelining target: returns the statement's
    #: collector instead of the entry (ADR 0016)
    queue_complete: Callable[..., Callable[[BaseException | None], JournalEntry | None]] | None = (
        None
    )
    #: ``queue_complete`` as a ``Fused`` part of the target's statement (ADR 0022)
    fuse_complete: Callable[..., Fused] | None = None
    #: forward mode: create the entry COMMITTING together with the run RUNNING at
    #: attempt 1; returns ``(entry, run_recorded)`` (``FoldingLedgerPort``)
    create_committing: Callable[..., tuple[JournalEntry, bool]] | None = None
    #: forward mode: ``complete_proven`` plus the end of attempt 1 COMPLETE, one write;
    #: returns ``(entry, run_ended)`` (``RunEndingLedgerPort``)
    complete_proven: Callable[..., tuple[JournalEntry, bool]] | None = None
    #: ``complete_proven`` written behind the caller: returns at once, and hands a
    #: failure to its ``on_failure`` when the journal settles it (ADR 0017)
    complete_proven_behind: Callable[..., None] | None = None
    #: builds ``complete_proven_behind``'s write ahead, for a call with the same
    #: arguments; settles the write behind the last caller (ADR 0021)
    prepare_proven_behind: Callable[..., None] | None = None
    #: the run's COMPLETE end is committed with the write: nothing is left to record
    committed: bool = False
    #: the run and attempt 1 were recorded with the entry (forward mode)
    begun: bool = False


class LookupFirst(Exception):  # a signal to the run service, never a user error
    """A first attempt made without a lookup (``run(unread=True)``) wrote nothing: look up.

    Raised when its journal INSERT was not seen to succeed (the run or the entry exists,
    or the attempt failed before that was known), or when the target could not send that
    INSERT ahead of the rows (ADR 0019). The caller reads the journal and runs again.
    """


class CommitProtocol:
    """Drives one operation to COMPLETE, or stops with a typed error.

    The journal decides who may act (leases, CAS); the fence decides what happened in the
    target. Every journal write and target call is surrounded by failpoints.
    """

    def __init__(
        self,
        *,
        journal: CommitJournalPort,
        connector: TargetConnectorPort,
        source: SourcePort,
        owner: str,
        atomic_journal: TransactionalJournalPort | None = None,
        on_rows: Callable[[int], None] | None = None,
        auto_recover: bool = True,
        on_attempt: Callable[[JournalEntry], None] | None = None,
    ) -> None:
        self._journal = journal
        self._connector = connector
        self._source = source
        self._owner = owner
        self._atomic = atomic_journal
        self._on_rows = on_rows
        # False: policy requires a certified route and this one has no valid evidence, so
        # an unproven write is never settled automatically (it becomes COMMIT_UNKNOWN)
        self._auto_recover = auto_recover and connector.capability is not FenceCapability.NONE
        self._ended: set[tuple[str, int]] = set()  # (operation, epoch) leases ended by COMPLETE
        # called with the entry each lease returned, before anything is dispatched on it:
        # the run ledger records the attempt (its number is the lease epoch) there
        self._on_attempt = on_attempt
        # A journal that can create the entry inside the target transaction: an atomic
        # first attempt is then one commit (ADR 0003)
        self._fold: FoldingJournalPort | None = (
            cast(FoldingJournalPort, atomic_journal)
            if getattr(atomic_journal, "create_complete_within", None) is not None
            else None
        )
        # A journal that can record a COMPLETE the fence proves without flushing it
        self._proven: ProvenCompletionJournalPort | None = (
            cast(ProvenCompletionJournalPort, journal)
            if callable(getattr(journal, "complete_proven", None))
            else None
        )
        # Forward mode with a journal that can create an entry already COMMITTING
        self._forward_fold: ForwardFoldingJournalPort | None = (
            cast(ForwardFoldingJournalPort, journal)
            if atomic_journal is None and getattr(journal, "create_committing", None) is not None
            else None
        )
        # the run ledger's part of the run in progress (``run(run_fold=...)``)
        self._run_fold: RunFold | None = None
        #: the new operation was born at one sync, the journal's INSERT ahead of its
        #: rows: the caller may try its next operation without a lookup (ADR 0019)
        self.born_at_once = False
        # the birth the caller sent ahead of its answer (``birth_sent``, ADR 0021)
        self._sent: SentBirth | None = None
        # a connector that calls a gate before it touches the target (ADR 0021)
        self._gated: GatedConnectorPort | None = (
            cast(GatedConnectorPort, connector)
            if getattr(connector, "gates_writes", False)
            else None
        )

    @property
    def mode(self) -> RunMode:
        """The route's mode: atomic when the journal shares the target's database."""
        return RunMode.ATOMIC if self._atomic is not None else RunMode.FORWARD_RECOVERY

    # ------------------------------------------------------------------ entry point
    def birth(self, spec: OperationSpec) -> dict[str, Any] | None:
        """How a new entry of ``spec`` would be born, when the caller may write it first.

        Forward mode with a journal that births entries COMMITTING, a target whose plan
        check needs no read (it passed before) and none of the birth's failpoints armed:
        the caller may send this birth with its lookup of the run (ADR 0018), then pass
        the entry in as ``born``. Otherwise None: the caller reads, and ``run`` creates.
        """
        if self._forward_fold is None or failpoints.armed(*_BIRTH_POINTS):
            return None
        checked = getattr(self._connector, "plan_checked", None)
        if checked is None or not checked(spec.plan):
            return None
        return self._committing_birth(spec)

    @property
    def births_ahead(self) -> bool:
        """Whether a ``birth`` may be sent ahead of its answer (``birth_sent``, ADR 0021).

        The target must call a gate before it is touched, and no failpoint may be armed:
        the answer is then read at the gate, after the protocol's own steps, so the
        order failpoints mark would not be the order of the writes.
        """
        return self._gated is not None and not failpoints.any_armed()

    def birth_sent(self, spec: OperationSpec, answer: BirthAnswer) -> JournalEntry:
        """Take a ``birth`` sent ahead of ``answer``; the entry to pass to ``run`` as ``born``.

        The answer is read at the connector's gate, before the target is touched, or
        before anything else depends on it; ``run`` then raises ``NotBorn`` when the
        operation was not born (nothing was written), or ``BirthUnread`` with the
        journal's error.
        """
        self._sent = SentBirth(
            answer,
            operation_id=spec.operation_id,
            intent_digest=spec.intent_digest,
            owner=self._owner,
            # not a closure over self: self holds the birth, and a cycle would leave the
            # protocol to the cyclic collector after every operation
            on_born=functools.partial(CommitProtocol._emit, event="intent"),
        )
        return self._sent.expected

    def confirm_birth(self) -> None:
        """Read a birth sent ahead, if still unread; raises as ``run`` does when not born."""
        if self._sent is not None:
            self._sent.confirm()

    def _sent_for(self, entry: JournalEntry) -> SentBirth | None:
        """The birth sent ahead when ``entry`` is its stand-in, else None."""
        sent = self._sent
        return sent if sent is not None and entry is sent.expected else None

    def _born(self, entry: JournalEntry) -> JournalEntry:
        """``entry``, or for the birth sent ahead, the entry its answer bore (the gate)."""
        sent = self._sent_for(entry)
        return entry if sent is None else sent.confirm()

    def may_skip_lookup(self, spec: OperationSpec) -> bool:
        """Whether ``run(unread=True)`` may try ``spec`` as new without reading the journal.

        Atomic mode, a target that sends the entry's INSERT ahead of the rows and whose
        plan check needs no read (it passed before), a non-incremental operation and no
        failpoint armed (ADR 0019). The attempt is then the one-sync transaction of ADR
        0016 with the INSERT first: it commits the new operation, or writes nothing and
        raises ``LookupFirst`` (also when the run ledger cannot queue that INSERT).
        """
        if self._fold is None or spec.checkpoint is not None or failpoints.any_armed():
            return False
        if not getattr(self._connector, "queues_ahead", False):
            return False
        checked = getattr(self._connector, "plan_checked", None)
        return checked is not None and bool(checked(spec.plan))

    def _committing_birth(self, spec: OperationSpec) -> dict[str, Any]:
        """The arguments of an entry born COMMITTING, leased to us at epoch 1 (ADR 0003)."""
        return {
            "operation_id": spec.operation_id,
            "intent_digest": spec.intent_digest,
            "metadata": spec.metadata,
            "actor": self._owner,
            "lease_ttl_seconds": spec.lease_ttl_seconds,
            "evidence": {"fence_epoch": _FIRST_EPOCH},
        }

    def run(
        self,
        spec: OperationSpec,
        *,
        known: JournalEntry | Unread | None = UNREAD,
        run_fold: RunFold | None = None,
        born: JournalEntry | None = None,
        unread: bool = False,
    ) -> OperationResult:
        """Run or resume ``spec`` until COMPLETE.

        ``known``: the entry as the caller just read it (None: no entry), saving the
        protocol's own read; every write still re-checks what it assumes. ``run_fold``:
        the run ledger's rows for a folded atomic first attempt (ADR 0008). ``born``:
        the entry the caller just created as ``birth`` said, with the run at attempt 1
        (``run_fold.begun``, ADR 0018): it is taken as ``_create`` would have returned it.
        ``unread``: nobody read the journal, as ``may_skip_lookup`` allowed (ADR 0019);
        the operation is tried as new, and ``LookupFirst`` says it was not.

        Raises:
            IntentConflict: the operation exists with another intent (before target I/O).
            CommitUnknown: the target cannot prove the outcome; an operator must decide.
            LeaseHeld: another live executor is working on the operation.
            CommittedIncomplete: the target committed; completing the journal failed.
            LookupFirst: ``unread`` only: nothing was written; read the journal first.
            DponeError: any other failure, typed, with the primary cause preserved.

        """
        self._run_fold = run_fold
        if unread:
            assert self._fold is not None  # noqa: S101 - may_skip_lookup said so
            folded = self._atomic_first(spec, self._fold, run_fold, unread=True)
            assert folded is not None  # noqa: S101 - unread: LookupFirst instead of None
            return folded
        if born is not None:  # the plan check passed before the birth (``birth``)
            return self._attempts(spec, born, self._after_birth(spec, born))
        existing = self._journal.get(spec.operation_id) if isinstance(known, Unread) else known
        if existing is None and self._fold is not None and self._may_fold(spec, run_fold):
            folded = self._atomic_first(spec, self._fold, run_fold)
            if folded is not None:
                return folded
            existing = self._journal.get(spec.operation_id)  # another executor was first
        elif run_fold is not None and (existing is not None or run_fold.create_committing is None):
            run_fold.decline()  # the run is recorded before anything else happens
        if existing is not None:
            self._check_intent(existing, spec)
            if existing.state is S.COMPLETE:
                self._catch_up_checkpoint(spec)
                return self._recorded(existing, replayed=True)
            if existing.state is S.COMMIT_UNKNOWN:
                raise self._unknown(existing)
        else:
            # read-only: a target that cannot take the rows fails before any write
            try:
                self._connector.check_plan(spec.plan)
            except DponeError:
                if run_fold is not None and not run_fold.begun:
                    self._decline_quietly(spec, run_fold)
                raise
            existing = self._create(spec, run_fold)
            # an entry born with our lease (one write, not two)
            return self._attempts(spec, existing, self._after_birth(spec, existing))
        return self._attempts(spec, existing, None)

    def _after_birth(self, spec: OperationSpec, existing: JournalEntry) -> JournalEntry | None:
        """The entry ``_create`` returned (or the caller's ``born``): ours when leased to us."""
        self._check_intent(existing, spec)
        held: JournalEntry | None = None
        # only this executor leases with its owner label: ours means born just now
        if existing.lease_owner == self._owner and existing.lease_epoch == _FIRST_EPOCH:
            held = existing
        if self._sent_for(existing) is None:
            self._emit(existing, "intent")  # else once the gate has read the birth
        try:
            failpoints.hit("after:journal.create")
            if held is not None and held.state is S.COMMITTING:
                failpoints.hit("after:COMMITTING")
        except DponeError:
            if held is not None:
                self._release(held)
            raise
        return held

    def _attempts(
        self, spec: OperationSpec, existing: JournalEntry, held: JournalEntry | None
    ) -> OperationResult:
        """Attempt until COMPLETE, starting over from the journal after a lost lease."""
        resumed = held is None and existing.lease_epoch > 0
        for restart in range(_MAX_RESTARTS):
            try:
                return self._attempt(spec, resumed=resumed, held=held)
            except LeaseLost:
                if restart == _MAX_RESTARTS - 1:
                    raise
                _log.info(
                    "lease lost; starting over from the journal",
                    extra={"dpone": {"operation_id": spec.operation_id, "event": "restart"}},
                )
                resumed = True
                held = None
                current = self._journal.get(spec.operation_id)
                if current is not None and current.state is S.COMPLETE:
                    return self._recorded(current, replayed=True)
        raise AssertionError("unreachable")  # pragma: no cover

    def _create(self, spec: OperationSpec, run_fold: RunFold | None) -> JournalEntry:
        """Create the entry leased to us (or return the one that exists).

        Forward mode with a journal that can: born COMMITTING, one write for create,
        lease and COMMITTING (ADR 0003); COMMITTING is durable before the target is
        touched, as always. Otherwise born PREPARING (create + lease, ADR 0002).
        """
        failpoints.hit("before:journal.create")
        if self._forward_fold is not None:
            failpoints.hit("before:COMMITTING")
            if run_fold is not None and run_fold.create_committing is not None:
                # the new run and its attempt 1 in the same journal write (ADR 0008)
                entry, recorded = run_fold.create_committing(**self._committing_birth(spec))
                if recorded:
                    run_fold.begun = True
                else:
                    run_fold.decline()
                return entry
            return self._forward_fold.create_committing(**self._committing_birth(spec))
        if run_fold is not None:
            run_fold.decline()
        return self._journal.create_intent(
            operation_id=spec.operation_id,
            intent_digest=spec.intent_digest,
            metadata=spec.metadata,
            actor=self._owner,
            lease_owner=self._owner,
            lease_ttl_seconds=spec.lease_ttl_seconds,
        )

    # ------------------------------------------------------------------ one attempt
    def _attempt(
        self, spec: OperationSpec, *, resumed: bool, held: JournalEntry | None
    ) -> OperationResult:
        if held is not None:
            entry = held
        else:
            entry = acquire(
                self._journal,
                operation_id=spec.operation_id,
                owner=self._owner,
                ttl_seconds=spec.lease_ttl_seconds,
            )
            self._emit(entry, "lease")
        try:
            if self._on_attempt is not None:
                self._on_attempt(entry)
            with LeaseKeeper(
                self._journal,
                operation_id=spec.operation_id,
                owner=self._owner,
                lease_epoch=entry.lease_epoch,
                ttl_seconds=spec.lease_ttl_seconds,
            ):
                return self._dispatch(spec, entry, resumed=resumed)
        except JournalConflict:
            # someone moved the entry since our lease: we are stale, start over (section 8)
            raise self._stale_or_conflict(entry, "the journal entry moved") from None
        finally:
            self._release(entry)

    def _dispatch(
        self, spec: OperationSpec, entry: JournalEntry, *, resumed: bool
    ) -> OperationResult:
        state = entry.state
        if state is S.COMPLETE:
            return self._recorded(entry, replayed=True)
        if state is S.COMMIT_UNKNOWN:
            raise self._unknown(entry)
        if state in (S.TARGET_COMMITTED, S.COMMITTED_INCOMPLETE):
            return self._finish_committed(spec, entry, resumed=True)
        if state is S.COMMITTING:
            if not resumed and entry.version == _BORN_COMMITTING:
                # born COMMITTING by us a moment ago: nothing can have been written yet
                return self._mutate_and_complete(spec, entry, resumed=False)
            return self._resume_committing(spec, entry)
        if state is S.FAILED_PRE_COMMIT:
            entry = self._cas(entry, S.PREPARING, evidence={"reason": "retry"})
        if self._atomic is not None:
            return self._atomic_commit(spec, entry, resumed=resumed)
        # COMMITTING is durable before the target is touched; the fence is raised to our
        # epoch inside the write transaction itself (mutate(prepare=True), ADR 0002)
        entry = self._cas(entry, S.COMMITTING, evidence={"fence_epoch": entry.lease_epoch})
        return self._mutate_and_complete(spec, entry, resumed=resumed)

    # ------------------------------------------------------------------ forward recovery
    def _mutate_and_complete(
        self, spec: OperationSpec, entry: JournalEntry, *, resumed: bool
    ) -> OperationResult:
        """Write the data with the fence, prove it, and complete the journal."""
        failpoints.hit("before:fence.mutate")
        tally = RowTally()
        sent = self._sent_for(entry)
        mutate: Callable[..., MutationReport] = self._connector.mutate
        if sent is not None:
            if self._gated is not None:
                # the birth's answer is read at the gate, before the target is touched
                mutate = functools.partial(
                    self._gated.mutate, gate=self._gate(spec, entry, tally, sent)
                )
            else:
                sent()  # never (``births_ahead``): read before the target is touched
        try:
            report = mutate(
                operation_id=spec.operation_id,
                intent_digest=spec.intent_digest,
                epoch=entry.lease_epoch,
                plan=spec.plan,
                batches=self._rows(spec, tally),
                content_digest=spec.source_identity,
                within=_before_commit(),
                prepare=True,
            )
        except (NotBorn, BirthUnread):
            raise  # nothing was sent to the target: the run service starts over
        except FencedOut:
            entry = self._born(entry)
            raise self._stale_or_conflict(entry, "the fence refused the write") from None
        except Exception as exc:
            entry = self._born(entry)  # read before anything is recorded of this failure
            settled = self._settle_failed_mutation(spec, entry, exc)
            if settled is None:
                raise
            return settled
        entry = self._born(entry)
        failpoints.hit("after:fence.mutate")
        if self._connector.capability is FenceCapability.NONE:
            # the in-process acknowledgement is the only proof this route has
            observation = FenceObservation(
                status=FenceStatus.COMMITTED,
                epoch=entry.lease_epoch,
                intent_digest=spec.intent_digest,
                row_count=report.row_count,
                content_digest=report.content_digest,
            )
        else:
            # the connector's word for the row its acknowledged commit left, else a read
            observation = self._committed_by(spec, entry, report) or self._observe(spec)
            if observation.status is not FenceStatus.COMMITTED:
                raise RecoveryConflict(
                    "the target acknowledged the write but its fence does not show it committed",
                    operation_id=spec.operation_id,
                    state=entry.state.value,
                    journal_version=entry.version,
                    recovery_ref=recovery_ref(spec.operation_id),
                )
        return self._complete(spec, entry, observation, tally=tally, resumed=resumed)

    def _gate(
        self, spec: OperationSpec, entry: JournalEntry, tally: RowTally, sent: SentBirth
    ) -> Callable[[], None]:
        """The gate for a birth sent ahead: builds the COMPLETE, then reads the answer.

        The COMPLETE the write is expected to end with is built while the birth's answer
        is awaited (ADR 0021); it is sent only if the real one turns out the same.
        """
        fold = self._run_fold
        prepare = None if fold is None else fold.prepare_proven_behind
        if prepare is None:
            return sent

        def gate() -> None:
            # what the fence row committed by this write will say (``_committed_by``):
            # the COMPLETE built from it is sent only if the real one is the same
            expected = FenceObservation(
                status=FenceStatus.COMMITTED,
                epoch=entry.lease_epoch,
                intent_digest=spec.intent_digest,
                row_count=tally.rows,
                content_digest=spec.source_identity,
            )
            prepare(
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset({entry.state}),
                lease_epoch=entry.lease_epoch,
                actor=self._owner,
                result=self._result_fields(spec, expected, tally),
                evidence=_proof(expected),
            )
            sent()

        return gate

    @staticmethod
    def _committed_by(
        spec: OperationSpec, entry: JournalEntry, report: MutationReport
    ) -> FenceObservation | None:
        """The fence row the acknowledged mutation committed, when its connector says so.

        Reading the fence again would prove nothing new: the transaction that set it
        ``committed`` at our epoch committed, and ``committed`` is terminal (section 7;
        ADR 0013). Anything but that row at our epoch and intent, with the count and
        digest the mutation reports, is not taken as proof:
        the protocol then observes, as for a connector that reports nothing.
        """
        committed = report.committed
        if (
            committed is None
            or committed.status is not FenceStatus.COMMITTED
            or committed.epoch != entry.lease_epoch
            or committed.intent_digest not in (None, spec.intent_digest)
            or committed.row_count != report.row_count
            or committed.content_digest != report.content_digest
        ):
            return None
        return committed

    def _settle_failed_mutation(
        self, spec: OperationSpec, entry: JournalEntry, primary: Exception
    ) -> OperationResult | None:
        """After a failed mutate, prove the outcome now instead of leaving COMMITTING.

        Returns a result if the write did commit after all; None when the primary error
        stands (the journal then says FAILED_PRE_COMMIT, COMMIT_UNKNOWN or COMMITTING).
        Secondary failures are logged and never replace ``primary``.
        """
        code = primary.code.value if isinstance(primary, DponeError) else "unexpected"
        if not self._auto_recover:
            try:
                entry = self._cas(entry, S.COMMIT_UNKNOWN, evidence={"error_code": code})
            except DponeError as secondary:
                self._secondary("could not record COMMIT_UNKNOWN", secondary, entry)
            raise self._unknown(entry, cause=primary) from primary
        fresh: JournalEntry | None = None
        try:
            fresh = acquire(
                self._journal,
                operation_id=spec.operation_id,
                owner=self._owner,
                ttl_seconds=spec.lease_ttl_seconds,
            )
            if fresh.state is not S.COMMITTING:
                return None
            sealed = self._seal(spec, fresh)
            if sealed.outcome is SealOutcome.COMMITTED:
                return self._complete(spec, fresh, sealed.observation, tally=None, resumed=True)
            if sealed.outcome is SealOutcome.NOT_COMMITTED:
                back = self._cas(fresh, S.PREPARED, evidence={"outcome": "not_committed"})
                self._cas(back, S.FAILED_PRE_COMMIT, evidence=_failure_evidence(primary))
        except DponeError as secondary:
            self._secondary("could not settle the failed write now; a retry will", secondary, entry)
        finally:
            if fresh is not None:
                self._release(fresh)
        return None

    def _resume_committing(self, spec: OperationSpec, entry: JournalEntry) -> OperationResult:
        """A previous attempt may have written: observe, seal, then decide."""
        if not self._auto_recover and self._connector.capability is not FenceCapability.NONE:
            unknown = self._cas(entry, S.COMMIT_UNKNOWN, evidence={"reason": "not certified"})
            raise CommitUnknown(
                "this deployment requires certified routes (require_certified: true) and this "
                "route has no valid certification evidence, so an interrupted write is not "
                "recovered automatically",
                operation_id=unknown.operation_id,
                state=unknown.state.value,
                journal_version=unknown.version,
                recovery_ref=recovery_ref(unknown.operation_id),
                hint="run `dpone certify WORKLOAD` for this route, then resolve this operation "
                "with `dpone recovery target-commit plan`",
            )
        observation = self._observe(spec)
        if observation.status is FenceStatus.COMMITTED:
            return self._complete(spec, entry, observation, tally=None, resumed=True)
        sealed = self._seal(spec, entry)
        if sealed.outcome is SealOutcome.COMMITTED:
            return self._complete(spec, entry, sealed.observation, tally=None, resumed=True)
        if sealed.outcome is SealOutcome.FENCED:
            raise self._stale_or_conflict(entry, "the fence holds an epoch at or above ours")
        if sealed.outcome is SealOutcome.UNKNOWN:
            unknown = self._cas(entry, S.COMMIT_UNKNOWN, evidence={"fence_state": "unknown"})
            raise self._unknown(unknown)
        # proven not committed, and no earlier writer can commit any more
        entry = self._cas(entry, S.PREPARED, evidence={"outcome": "not_committed"})
        entry = self._cas(entry, S.COMMITTING, evidence={"fence_epoch": entry.lease_epoch})
        return self._mutate_and_complete(spec, entry, resumed=True)

    def _finish_committed(
        self, spec: OperationSpec, entry: JournalEntry, *, resumed: bool
    ) -> OperationResult:
        observation = self._observe(spec)
        if (
            self._connector.capability is not FenceCapability.NONE
            and observation.status is not FenceStatus.COMMITTED
        ):
            raise RecoveryConflict(
                f"the journal says {entry.state.value} but the fence does not show a commit",
                operation_id=spec.operation_id,
                state=entry.state.value,
                journal_version=entry.version,
                recovery_ref=recovery_ref(spec.operation_id),
            )
        return self._complete(spec, entry, observation, tally=None, resumed=resumed)

    def _complete(
        self,
        spec: OperationSpec,
        entry: JournalEntry,
        observation: FenceObservation,
        *,
        tally: RowTally | None,
        resumed: bool,
    ) -> OperationResult:
        """CAS to COMPLETE (fold from COMMITTING); fall back to TARGET_COMMITTED on failure."""
        result = self._result_fields(spec, observation, tally)
        try:
            done = self._cas(
                entry,
                S.COMPLETE,
                result=result,
                evidence=_proof(observation),
                checkpoint=spec.checkpoint,
                # the fence shows the commit: COMPLETE needs no flush of its own (ADR 0008)
                proven=self._connector.capability is not FenceCapability.NONE
                and observation.status is FenceStatus.COMMITTED,
            )
        except JournalConflict:
            current = self._journal.get(spec.operation_id)
            if current is not None and current.state is S.COMPLETE:
                return self._recorded(current, replayed=True)
            raise LeaseLost(
                "the journal entry moved while completing; starting over",
                operation_id=spec.operation_id,
            ) from None
        except DponeError as primary:
            done = self._complete_slowly(spec, entry, result, observation, primary)
        return self._recorded(done, replayed=False, resumed=resumed)

    def _complete_slowly(
        self,
        spec: OperationSpec,
        entry: JournalEntry,
        result: Mapping[str, object],
        observation: FenceObservation,
        primary: DponeError,
    ) -> JournalEntry:
        """Completion failed: record TARGET_COMMITTED, retry COMPLETE once, else INCOMPLETE."""
        incomplete = CommittedIncomplete(
            "the target committed but the journal could not be completed; rerun to finish "
            "(nothing will be written again)",
            operation_id=spec.operation_id,
            state=entry.state.value,
            journal_version=entry.version,
            recovery_ref=recovery_ref(spec.operation_id),
        )
        try:
            if entry.state is S.COMMITTING:
                entry = self._cas(entry, S.TARGET_COMMITTED, evidence=_proof(observation))
            if entry.state is S.TARGET_COMMITTED:
                try:
                    return self._cas(entry, S.COMPLETE, result=result, checkpoint=spec.checkpoint)
                except DponeError:
                    entry = self._cas(
                        entry, S.COMMITTED_INCOMPLETE, evidence={"error_code": primary.code.value}
                    )
            incomplete.state = entry.state.value
            incomplete.journal_version = entry.version
        except DponeError as secondary:
            self._secondary("could not record the committed state", secondary, entry)
        raise incomplete from primary

    # ------------------------------------------------------------------ atomic mode
    def _atomic_commit(
        self, spec: OperationSpec, entry: JournalEntry, *, resumed: bool
    ) -> OperationResult:
        """Data, fence and the journal's COMPLETE in one target transaction."""
        journal = self._atomic
        assert journal is not None  # noqa: S101 - guarded by the caller
        tally = RowTally()
        written: list[JournalEntry] = []
        fence = FenceObservation(
            status=FenceStatus.COMMITTED,
            epoch=entry.lease_epoch,
            intent_digest=spec.intent_digest,
            content_digest=spec.source_identity,
        )

        def within(txn: object) -> None:
            failpoints.hit("fence.mutate.before_commit")
            failpoints.hit("before:COMPLETE")
            if spec.checkpoint is not None:
                written.append(self._complete_within(txn, spec, entry, fence, tally))
                return
            written.append(
                journal.compare_and_set_within(
                    txn,
                    operation_id=spec.operation_id,
                    expected_version=entry.version,
                    expected_states=frozenset({entry.state}),
                    next_state=S.COMPLETE,
                    lease_epoch=entry.lease_epoch,
                    actor=self._owner,
                    result=self._result_fields(spec, fence, tally),
                    evidence={"mode": RunMode.ATOMIC.value},
                    release_lease=True,
                )
            )

        failpoints.hit("before:fence.mutate")
        try:
            self._connector.mutate(
                operation_id=spec.operation_id,
                intent_digest=spec.intent_digest,
                epoch=entry.lease_epoch,
                plan=spec.plan,
                batches=self._rows(spec, tally),
                content_digest=spec.source_identity,
                within=within,
                prepare=True,
            )
        except (FencedOut, JournalConflict):
            raise self._stale_or_conflict(entry, "the atomic commit was refused") from None
        except DponeError as exc:
            # the whole transaction rolled back: nothing was written
            self._fail_pre_commit(entry, exc)
            raise
        failpoints.hit("after:fence.mutate")
        failpoints.hit("after:COMPLETE")
        done = written[-1]
        self._ended.add((done.operation_id, done.lease_epoch))
        self._emit(done, "transition")
        return self._recorded(done, replayed=False, resumed=resumed)

    def _complete_within(
        self,
        txn: object,
        spec: OperationSpec,
        entry: JournalEntry,
        fence: FenceObservation,
        tally: RowTally,
    ) -> JournalEntry:
        """Atomic COMPLETE plus the checkpoint promotion, on the target's transaction."""
        assert spec.checkpoint is not None  # noqa: S101 - guarded by the caller
        store = cast(TransactionalCheckpointStorePort, self._checkpoints(self._atomic))
        return store.complete_with_checkpoint_within(
            txn,
            operation_id=spec.operation_id,
            expected_version=entry.version,
            expected_states=frozenset({entry.state}),
            lease_epoch=entry.lease_epoch,
            actor=self._owner,
            checkpoint=spec.checkpoint,
            result=self._result_fields(spec, fence, tally),
            evidence={"mode": RunMode.ATOMIC.value},
        )

    def _catch_up_checkpoint(self, spec: OperationSpec) -> None:
        """A replayed COMPLETE operation whose interval the watermark has not reached yet.

        Normally a no-op read. It matters when an operator completed the operation with
        ``recovery apply`` (no checkpoint in that write): promoting now is safe, the
        operation is COMPLETE. A failure here is secondary and never hides the result.
        """
        advance = spec.checkpoint
        if advance is None:
            return
        try:
            store = self._checkpoints(self._journal)
            current = store.get_checkpoint(advance.stream_id)
            if current is None or current.watermark < advance.end:
                store.promote_completed(operation_id=spec.operation_id, checkpoint=advance)
        except DponeError as secondary:
            _log.warning(
                "could not bring the checkpoint up to this COMPLETE operation (%s)",
                secondary.code.value,
                extra={"dpone": {"operation_id": spec.operation_id, "event": "secondary"}},
            )

    @staticmethod
    def _checkpoints(journal: object) -> CheckpointStorePort:
        """The journal as a checkpoint store, or a clear error when it cannot be one."""
        if not callable(getattr(journal, "complete_with_checkpoint", None)):
            raise ConfigInvalid(
                "this journal cannot store checkpoints, which incremental workloads need",
                field="journal",
                hint="use the SQLite or PostgreSQL journal",
            )
        return cast(CheckpointStorePort, journal)

    def _may_fold(self, spec: OperationSpec, run_fold: RunFold | None) -> bool:
        """Whether the atomic first attempt may run as one transaction (ADR 0003).

        Not for an incremental operation: its checkpoint is promoted by the COMPLETE
        write of the unfolded path (ADR 0005). With a run ledger, the first attempt
        (lease epoch 1) is recorded before the transaction, as every attempt is. When
        the ledger refuses it (another executor of the same run recorded attempt 1 and
        is in its own transaction now), this one still folds without a ledger record:
        the fence row lock and the journal's primary key decide between the two, and
        the loser records nothing (FENCE_UNAVAILABLE, or the unfolded path after a
        JournalConflict). With a ``run_fold`` (a new run, ADR 0008) the run and attempt 1
        are written inside the transaction instead, so nothing is recorded before it.
        """
        if spec.checkpoint is not None:
            return False
        if run_fold is None:
            self._record_first_attempt(spec)
        return True

    def _record_first_attempt(self, spec: OperationSpec) -> None:
        """Record attempt 1 (the lease epoch a folded first attempt writes at)."""
        if self._on_attempt is None:
            return
        first = JournalEntry(
            operation_id=spec.operation_id,
            intent_digest=spec.intent_digest,
            state=S.PREPARING,
            version=0,
            lease_owner=self._owner,
            lease_epoch=_FIRST_EPOCH,
            lease_expires_at=None,
            metadata=safe_mapping(spec.metadata),
            result=None,
            created_at=0.0,
            updated_at=0.0,
        )
        try:
            self._on_attempt(first)
        except LeaseLost:
            pass  # attempt 1 is another executor's: the fence and the primary key decide

    def _unfold_failed(self, spec: OperationSpec, run_fold: RunFold, primary: DponeError) -> None:
        """The folded transaction (with the run in it) failed: record run and attempt 1 now.

        As before ADR 0008, when attempt 1 was recorded before the transaction. Not for a
        lock or connection failure: another executor (or the server) is busy, maybe with
        this very run inside its own transaction, and a run row written now would only
        wait for it or make its commit fail; the ledger then records nothing, as the
        journal does (ADR 0003). A ledger failure here never replaces ``primary``.
        """
        if isinstance(primary, FenceUnavailable | JournalUnavailable):
            return
        if self._decline_quietly(spec, run_fold):
            try:
                self._record_first_attempt(spec)
            except DponeError as secondary:
                self._ledger_secondary(spec, secondary)

    def _decline_quietly(self, spec: OperationSpec, run_fold: RunFold) -> bool:
        """Record the run after a failure; False (logged) when the ledger refused."""
        try:
            run_fold.decline()
        except DponeError as secondary:
            self._ledger_secondary(spec, secondary)
            return False
        return True

    def _ledger_secondary(self, spec: OperationSpec, secondary: DponeError) -> None:
        _log.warning(
            "could not record the failed attempt in the run ledger (%s)",
            secondary.code.value,
            extra={"dpone": {"operation_id": spec.operation_id, "event": "secondary"}},
        )

    def _atomic_first(
        self,
        spec: OperationSpec,
        journal: FoldingJournalPort,
        run_fold: RunFold | None,
        *,
        unread: bool = False,
    ) -> OperationResult | None:
        """A new operation in atomic mode: entry, data and fence in ONE target transaction.

        The entry is born COMPLETE inside the transaction that writes the rows and
        commits the fence (ADR 0003): create, lease and COMPLETE need no durability
        point of their own, and a crash anywhere before the commit leaves nothing at all.
        Returns None when another executor got there first (its fence or its entry
        refused ours, and everything rolled back): the caller reads the journal. With a
        ``run_fold`` the run ledger's rows are written in the same transaction (ADR 0008).
        ``unread`` (ADR 0019): the entry's INSERT goes ahead of the rows; unless it is
        seen to succeed, nothing of this attempt is kept or recorded: ``LookupFirst``.
        """
        tally = RowTally()
        written: list[JournalEntry] = []
        fence = FenceObservation(
            status=FenceStatus.COMMITTED,
            epoch=_FIRST_EPOCH,
            intent_digest=spec.intent_digest,
            content_digest=spec.source_identity,
        )

        def entry_fields() -> dict[str, Any]:
            return {
                "operation_id": spec.operation_id,
                "intent_digest": spec.intent_digest,
                "metadata": spec.metadata,
                "actor": self._owner,
                "result": self._result_fields(spec, fence, tally),
                "evidence": {"mode": RunMode.ATOMIC.value},
            }

        def within(txn: object) -> None:
            failpoints.hit("fence.mutate.before_commit")
            failpoints.hit("before:journal.create")
            create = journal.create_complete_within
            if run_fold is not None and run_fold.create_complete is not None:
                create = run_fold.create_complete  # the run and the entry: one statement
            elif run_fold is not None:
                run_fold.write(txn)  # queued: the entry's INSERT below reads both results
            written.append(create(txn, **entry_fields()))
            failpoints.hit("after:journal.create")
            failpoints.hit("before:COMPLETE")

        # A journal that can queue the entry's INSERT lets a pipelining target send it
        # with the rows, the fence and COMMIT at one sync (ADR 0016).
        queue_create = getattr(journal, "queue_complete_within", None)
        # ... and one that can also hand it over as CTEs lets the target write it inside
        # its own one statement, with no BEGIN or COMMIT (ADR 0022)
        fuse_create = getattr(journal, "fuse_complete_within", None)
        if run_fold is not None:
            queue_create = run_fold.queue_complete  # None: the run is written apart
            fuse_create = run_fold.fuse_complete
        # An armed failpoint keeps the plain within: it then fires where it always did,
        # after the rows and fence statement and the entry's INSERT were read.
        chosen: WithinTransaction = within
        accepted: list[bool] = []  # the entry's INSERT had a result: the operation is new
        if queue_create is not None and not failpoints.armed(*_WITHIN_POINTS):
            chosen = _queued_create(
                queue_create,
                entry_fields,
                written,
                accepted,
                ahead=unread,
                fuse_create=fuse_create,
            )
        elif unread:
            raise LookupFirst  # the run is written apart: nothing sent yet

        if not self._fold_mutate(spec, chosen, tally, run_fold, accepted, unread=unread):
            return None
        # born at one sync, its INSERT ahead of the rows: the next may be tried unread
        self.born_at_once = isinstance(chosen, _FoldWithin) and not chosen.called_plainly
        if run_fold is not None:
            run_fold.committed = True
        if unread and self._on_rows is not None:
            # written now, in one batch by one statement; committed whatever the callback does
            self._on_rows(tally.rows)
        failpoints.hit("after:fence.mutate")
        failpoints.hit("after:COMPLETE")
        done = written[-1]
        self._emit(done, "intent")
        self._emit(done, "transition")
        return self._recorded(done, replayed=False)

    def _fold_mutate(
        self,
        spec: OperationSpec,
        within: WithinTransaction,
        tally: RowTally,
        run_fold: RunFold | None,
        accepted: list[bool],
        *,
        unread: bool,
    ) -> bool:
        """``_atomic_first``'s transaction; False when another executor was first.

        ``unread``: ``LookupFirst`` unless the entry's INSERT was seen to succeed
        (``accepted``) before a failure; nothing of the attempt is recorded then.
        """
        try:
            self._connector.check_plan(spec.plan)  # read-only: fail before any write
            failpoints.hit("before:fence.mutate")
        except DponeError as exc:
            if unread:
                raise LookupFirst from None
            if run_fold is not None:
                self._unfold_failed(spec, run_fold, exc)
            raise
        try:
            self._connector.mutate(
                operation_id=spec.operation_id,
                intent_digest=spec.intent_digest,
                epoch=_FIRST_EPOCH,
                plan=spec.plan,
                # an unread try reports its rows once they are written (``_atomic_first``)
                batches=self._rows(spec, tally, report=not unread),
                content_digest=spec.source_identity,
                within=within,
                prepare=True,
            )
        except CannotQueueAhead:
            raise LookupFirst from None  # sent nothing: the rows would have gone first
        except (FencedOut, JournalConflict):
            # rolled back: the fence, the entry or the run belongs to another executor
            if unread:
                raise LookupFirst from None
            if run_fold is not None:
                run_fold.decline()
            return False
        except DponeError as exc:
            lost = isinstance(exc, FenceUnavailable | JournalUnavailable)
            if unread and not accepted and not lost:
                # rolled back before the INSERT was seen to succeed: maybe not new at all.
                # A lost connection or lock wait is raised as the lookup's try raises it
                # (the retry policy decides; the next try looks up first).
                raise LookupFirst from None
            if run_fold is not None:
                self._unfold_failed(spec, run_fold, exc)
            self._record_failed_first(spec, exc)
            raise
        return True

    def _record_failed_first(self, spec: OperationSpec, primary: DponeError) -> None:
        """The folded transaction rolled back: record why, as the unfolded path would.

        Creates the entry (leased) and moves it to FAILED_PRE_COMMIT, so the journal
        tells an operator that this operation was tried. A lock or connection failure
        is not recorded: it says another executor (or the server) is busy, not that this
        operation failed, and a journal write now would only get in that executor's way.
        """
        if isinstance(primary, FenceUnavailable | JournalUnavailable):
            return
        try:
            entry = self._journal.create_intent(
                operation_id=spec.operation_id,
                intent_digest=spec.intent_digest,
                metadata=spec.metadata,
                actor=self._owner,
                lease_owner=self._owner,
                lease_ttl_seconds=spec.lease_ttl_seconds,
            )
        except DponeError as secondary:
            _log.warning(
                "could not record the failed attempt (%s)",
                secondary.code.value,
                extra={"dpone": {"operation_id": spec.operation_id, "event": "secondary"}},
            )
            return
        if entry.lease_owner != self._owner or entry.version != 1:
            return  # another executor's entry: not ours to write
        self._emit(entry, "intent")
        try:
            self._fail_pre_commit(entry, primary)
        finally:
            self._release(entry)

    # ------------------------------------------------------------------ helpers
    def _rows(
        self, spec: OperationSpec, tally: RowTally, *, report: bool = True
    ) -> Iterator[list[tuple[object, ...]]]:
        batches: Iterator[list[tuple[object, ...]]] = self._source.batches(
            batch_size=spec.batch_size, expected_identity=spec.source_identity
        )
        plan = spec.plan
        if plan.interval_column is not None and plan.interval is not None:
            names = [c.name for c in plan.columns]
            batches = within_interval(
                batches,
                index=names.index(plan.interval_column),
                column=plan.interval_column,
                interval=plan.interval,
                tally=tally,
            )
        return counted(batches, tally, self._on_rows if report else None)

    def _observe(self, spec: OperationSpec) -> FenceObservation:
        failpoints.hit("before:fence.observe")
        observation = self._connector.observe(operation_id=spec.operation_id)
        failpoints.hit("after:fence.observe")
        if observation.status is FenceStatus.COMMITTED and observation.intent_digest not in (
            None,
            spec.intent_digest,
        ):
            raise RecoveryConflict(
                "the fence records a commit of another intent for this operation",
                operation_id=spec.operation_id,
                recovery_ref=recovery_ref(spec.operation_id),
            )
        return observation

    def _seal(self, spec: OperationSpec, entry: JournalEntry) -> SealResult:
        failpoints.hit("before:fence.seal")
        sealed = self._connector.seal(operation_id=spec.operation_id, epoch=entry.lease_epoch)
        failpoints.hit("after:fence.seal")
        return sealed

    def _cas(
        self,
        entry: JournalEntry,
        next_state: CommitState,
        *,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
        checkpoint: CheckpointAdvance | None = None,
        proven: bool = False,
    ) -> JournalEntry:
        failpoints.hit(f"before:{next_state.value}")
        final = next_state is S.COMPLETE  # the lease ends with the operation, same write
        ending = self._run_fold
        # the move every branch writes: this entry, as read, at its epoch, by us
        moved: dict[str, Any] = {
            "operation_id": entry.operation_id,
            "expected_version": entry.version,
            "expected_states": frozenset({entry.state}),
            "lease_epoch": entry.lease_epoch,
            "actor": self._owner,
        }
        if (
            final
            and proven
            and checkpoint is None
            and ending is not None
            and ending.begun
            and ending.complete_proven is not None
            and self._proven is not None
            and entry.lease_epoch == _FIRST_EPOCH
        ):
            # attempt 1, recorded with the entry, ends COMPLETE in this write (ADR 0013)
            if ending.complete_proven_behind is not None:
                new = self._complete_behind(
                    ending.complete_proven_behind, entry, moved, result=result, evidence=evidence
                )
                ending.committed = True
            else:
                new, ending.committed = ending.complete_proven(
                    **moved, result=result or {}, evidence=evidence
                )
        elif final and proven and checkpoint is None and self._proven is not None:
            new = self._proven.complete_proven(**moved, result=result or {}, evidence=evidence)
        elif final and checkpoint is not None:
            # the watermark moves in the same journal transaction as COMPLETE
            new = self._checkpoints(self._journal).complete_with_checkpoint(
                **moved, checkpoint=checkpoint, evidence=evidence, result=result
            )
        else:
            new = self._journal.compare_and_set(
                **moved,
                next_state=next_state,
                evidence=evidence,
                result=result,
                release_lease=final,
            )
        if final:
            self._ended.add((new.operation_id, new.lease_epoch))
        self._emit(new, "transition")
        failpoints.hit(f"after:{next_state.value}")
        return new

    def _complete_behind(
        self,
        write: Callable[..., None],
        entry: JournalEntry,
        moved: dict[str, Any],
        *,
        result: Mapping[str, object] | None,
        evidence: Mapping[str, object] | None,
    ) -> JournalEntry:
        """COMPLETE written behind this call (ADR 0017); the entry as it will read.

        Only for a COMPLETE the fence proves: the rows are committed exactly once whether
        or not this write lands. If it does not (the journal went away, or another
        executor moved the entry on), the entry stays COMMITTING and the next run of the
        operation completes it from the fence; that is logged, and no later call fails.
        """
        operation_id = entry.operation_id

        def failed(exc: DponeError) -> None:
            _log.warning(
                "the journal did not record COMPLETE of operation %s (%s); its rows are "
                "committed and its fence proves it: the next run of the operation "
                "completes the entry",
                operation_id,
                exc.code.value,
                extra={"dpone": {"operation_id": operation_id, "event": "secondary"}},
            )

        write(**moved, on_failure=failed, result=result or {}, evidence=evidence)
        return msgspec.structs.replace(
            entry,
            state=S.COMPLETE,
            version=entry.version + 1,
            lease_owner=None,
            result=safe_mapping(result),
        )

    def _fail_pre_commit(self, entry: JournalEntry, primary: DponeError) -> None:
        """Record that nothing was written and why; never replaces the primary error."""
        if entry.state not in (S.PREPARING, S.PREPARED):
            return
        try:
            self._cas(entry, S.FAILED_PRE_COMMIT, evidence=_failure_evidence(primary))
        except DponeError as secondary:
            self._secondary("could not record FAILED_PRE_COMMIT", secondary, entry)

    def _stale_or_conflict(self, entry: JournalEntry, what: str) -> DponeError:
        """Decide whether a surprising fence means we are stale or the systems disagree."""
        current = self._journal.get(entry.operation_id)
        if current is None or (
            current.version == entry.version and current.lease_epoch == entry.lease_epoch
        ):
            return RecoveryConflict(
                f"{what}, but the journal entry is unchanged at our epoch; "
                "journal and target disagree",
                operation_id=entry.operation_id,
                state=entry.state.value,
                journal_version=entry.version,
                recovery_ref=recovery_ref(entry.operation_id),
            )
        return LeaseLost(
            f"{what}: another executor moved the operation on (epoch "
            f"{entry.lease_epoch} -> {current.lease_epoch})",
            operation_id=entry.operation_id,
            state=current.state.value,
            journal_version=current.version,
        )

    def _secondary(self, what: str, exc: DponeError, entry: JournalEntry) -> None:
        """Log a failure of secondary work; the primary outcome is raised by the caller."""
        _log.warning(
            "%s (%s)",
            what,
            exc.code.value,
            extra={"dpone": {"operation_id": entry.operation_id, "event": "secondary"}},
        )

    def _release(self, entry: JournalEntry) -> None:
        entry = self._born(entry)  # a birth never read is not released: not born, or unknown
        if (entry.operation_id, entry.lease_epoch) in self._ended:
            return  # the COMPLETE write already ended this lease
        try:
            failpoints.hit("before:lease.release")
            self._journal.release_lease(
                operation_id=entry.operation_id, owner=self._owner, lease_epoch=entry.lease_epoch
            )
            failpoints.hit("after:lease.release")
        except DponeError as secondary:
            self._secondary("could not release the lease; it expires by itself", secondary, entry)

    def _check_intent(self, entry: JournalEntry, spec: OperationSpec) -> None:
        if entry.intent_digest != spec.intent_digest:
            raise IntentConflict(
                "this operation was already started with another intent (source content, "
                "strategy, schema or workload definition changed); nothing was read or written",
                operation_id=spec.operation_id,
                state=entry.state.value,
                journal_version=entry.version,
                recovery_ref=recovery_ref(spec.operation_id),
                hint="restore the original input, or run it as a new operation "
                "(another interval, partition or release)",
            )

    def _result_fields(
        self, spec: OperationSpec, observation: FenceObservation, tally: RowTally | None
    ) -> dict[str, object]:
        rows = tally.rows if tally is not None else observation.row_count
        fields: dict[str, object] = {
            "content_digest": observation.content_digest or spec.source_identity,
            "mode": self.mode.value,
            "fence_epoch": observation.epoch,
            "capability": self._connector.capability.value,
        }
        if rows is not None:  # unknown after an operator's mark-committed on a none route
            fields["rows_written"] = rows
        if tally is not None and tally.skipped:
            fields["rows_skipped"] = tally.skipped
        return fields

    def _recorded(
        self, entry: JournalEntry, *, replayed: bool, resumed: bool = False
    ) -> OperationResult:
        result = entry.result or {}
        rows = result.get("rows_written")
        digest = result.get("content_digest")
        mode = result.get("mode")
        return OperationResult(
            operation_id=entry.operation_id,
            state=entry.state,
            journal_version=entry.version,
            mode=RunMode(mode) if isinstance(mode, str) else self.mode,
            rows_written=rows if isinstance(rows, int) else None,
            content_digest=digest if isinstance(digest, str) else None,
            replayed=replayed,
            resumed=resumed,
            lease_epoch=entry.lease_epoch,
        )

    def _unknown(self, entry: JournalEntry, *, cause: Exception | None = None) -> CommitUnknown:
        why = ""
        if isinstance(cause, DponeError):
            why = f" (the write failed with {cause.code.value}: {cause.message})"
        elif cause is not None:
            why = f" (the write failed with {type(cause).__name__})"
        return CommitUnknown(
            "the target cannot prove whether this operation's write committed"
            f"{why}; automatic retry is stopped so nothing is written twice",
            operation_id=entry.operation_id,
            state=entry.state.value,
            journal_version=entry.version,
            recovery_ref=recovery_ref(entry.operation_id),
        )

    @staticmethod
    def _emit(entry: JournalEntry, event: str) -> None:
        if not _log.info_enabled():
            return  # the usual case for a library caller: build no record
        _log.info(
            "%s %s v%d",
            event,
            entry.state.value,
            entry.version,
            extra={
                "dpone": {
                    "event": event,
                    "operation_id": entry.operation_id,
                    "state": entry.state.value,
                    "version": entry.version,
                    "lease_epoch": entry.lease_epoch,
                }
            },
        )


def _failure_evidence(primary: Exception) -> dict[str, object]:
    """Why nothing was written: the error code, plus an audit's findings (counts only)."""
    if not isinstance(primary, DponeError):
        return {"error_code": "unexpected"}
    findings = getattr(primary, "findings", None)
    return {"error_code": primary.code.value, **(findings if isinstance(findings, dict) else {})}


def _queued_create(
    create: Callable[..., Callable[[BaseException | None], JournalEntry | None]],
    fields: Callable[[], dict[str, Any]],
    written: list[JournalEntry],
    accepted: list[bool],
    *,
    ahead: bool = False,
    fuse_create: Callable[..., Fused] | None = None,
) -> QueuedWithin:
    """The folded first attempt's ``within``, queued (ADR 0016).

    Only offered while none of ``_WITHIN_POINTS`` is armed (an armed one keeps the plain
    ``within``), so it fires none of them. Its collector keeps the entry the INSERT
    returned, and notes in ``accepted`` that the INSERT succeeded (also when another
    statement's error rolled it back). ``ahead``: it must go before the rows (ADR 0019).
    ``fuse_create``: ``create`` as a ``Fused`` part, which a connector may write inside
    its own statement (ADR 0022); its collector notes the INSERT as accepted only with
    the row that statement returned.
    """

    def queue(txn: object) -> Collector:
        pending = create(txn, **fields())

        def collect(error: BaseException | None) -> None:
            entry = pending(error)  # raises the INSERT's own error
            accepted.append(True)
            if entry is not None:
                written.append(entry)

        return collect

    def fuse(txn: object) -> Fused:
        assert fuse_create is not None  # noqa: S101 - offered only with it
        part = fuse_create(txn, **fields())
        collect_part = part.collect

        def collect(columns: Sequence[object] | None, error: BaseException | None) -> object:
            entry = collect_part(columns, error)  # raises the INSERT's own error
            if error is None:
                accepted.append(True)
                written.append(cast(JournalEntry, entry))
            return entry

        part.collect = collect
        return part

    return _FoldWithin(queue, ahead=ahead, fuse=None if fuse_create is None else fuse)


class _FoldWithin(QueuedWithin):
    """``_queued_create``'s within, which notes a call as a plain within.

    A connector calls it so after its rows, not pipelined with them (a COPY, say).
    """

    __slots__ = ("called_plainly",)

    def __init__(
        self,
        queue: Callable[[object], Collector],
        *,
        ahead: bool,
        fuse: Callable[[object], Fused] | None,
    ) -> None:
        super().__init__(queue, ahead=ahead, fuse=fuse)
        self.called_plainly = False

    def __call__(self, txn: object) -> None:
        self.called_plainly = True
        super().__call__(txn)


def _collected(_error: BaseException | None) -> None:
    """The collector of a ``within`` that queued nothing."""


def _queue_nothing(_txn: object) -> Collector:
    """Forward mode's queued ``within`` (its failpoint is not armed): nothing to send."""
    return _collected


#: the failpoints of an entry's birth: with one armed, the protocol births it itself
_BIRTH_POINTS = (
    "before:journal.create",
    "before:COMMITTING",
    "after:journal.create",
    "after:COMMITTING",
)

#: the failpoints a folded first attempt's ``within`` fires
_WITHIN_POINTS = (
    "fence.mutate.before_commit",
    "before:journal.create",
    "after:journal.create",
    "before:COMPLETE",
)


def _before_commit() -> WithinTransaction:
    """Forward mode's ``within``: only the failpoint.

    Queued, so a pipelining target may send its COMMIT with its statements at one sync
    (ADR 0016); with the failpoint armed it stays a plain ``within``, which the target
    calls after reading its statements' results, so the failpoint finds them executed.
    """
    if failpoints.armed("fence.mutate.before_commit"):
        return _plain_before_commit
    return QueuedWithin(_queue_nothing)


def _plain_before_commit(_txn: object) -> None:
    failpoints.hit("fence.mutate.before_commit")


def _proof(observation: FenceObservation) -> dict[str, object]:
    return {
        "fence_state": observation.status.value,
        "fence_epoch": observation.epoch,
        "row_count": observation.row_count,
    }
