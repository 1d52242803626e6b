"""One ``dpone run``: the run ledger around the commit protocol, with retries.

Before anything executes the run is recorded (idempotency key, run id, pinned
definition hash, canonical request hash, provenance, access-context digest); each
lease the protocol takes is recorded as an attempt whose number is the lease epoch,
before anything is dispatched on it. A replay of a key returns the existing run:

- COMPLETE: the recorded result (the protocol replays it: no lease, no write);
- RUNNING: in flight elsewhere -> ``LeaseHeld`` (nothing done); interrupted -> a new
  attempt resumes it (the fence proves what was written; never a second write);
- UNRESOLVED (COMMIT_UNKNOWN, recovery or intent conflict): the protocol stops again
  with the same error and writes nothing (after an operator's recovery it finishes);
- FAILED, transient: a new attempt of the same run;
- FAILED, terminal: a new attempt of the same run (nothing was written; it writes once
  when the cause is fixed, and fails the same way while it is not).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import msgspec

from dpone.contracts.evidence import SafeMapping
from dpone.contracts.identity import is_operation_id
from dpone.contracts.journal import JournalEntry
from dpone.contracts.result import OperationResult
from dpone.contracts.run import (
    AccessContext,
    RunError,
    RunRecord,
    RunStart,
    RunState,
    check_idempotency_key,
    default_idempotency_key,
    run_id_for,
)
from dpone.contracts.states import CommitState
from dpone.errors import (
    DponeError,
    IntentConflict,
    LeaseHeld,
    Retryability,
    RunKeyConflict,
    recovery_ref,
)
from dpone.ports.connector import Fused
from dpone.ports.ledger import (
    FindingLedgerPort,
    FoldingLedgerPort,
    LookupLedgerPort,
    RunLedgerPort,
    SendingLedgerPort,
)
from dpone.runtime._log import LazyLogger
from dpone.runtime.birth import BirthUnread, Found, NotBorn
from dpone.runtime.commit_protocol import (
    UNREAD,
    CommitProtocol,
    LookupFirst,
    OperationSpec,
    RunFold,
    Unread,
)
from dpone.runtime.retry import RetryPolicy, call_with_retries

__all__ = ["NewStreak", "RunRequest", "RunService", "check_replay", "run_state_for"]

_log = LazyLogger("dpone.runtime")

#: Lease entries the protocol only reports on (no work is dispatched on them).
_NOTHING_TO_DISPATCH = frozenset({CommitState.COMPLETE, CommitState.COMMIT_UNKNOWN})

#: Builds the protocol for one try; the argument records each attempt in the ledger.
ProtocolFactory = Callable[[Callable[[JournalEntry], None]], CommitProtocol]


class RunRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the caller asks for, beyond the operation: how the run is named and by whom."""

    request_hash: str
    definition_hash: str
    provenance: SafeMapping
    access: AccessContext
    idempotency_key: str | None = None  # None: derived from the operation id


@functools.lru_cache(maxsize=64)
def _access_digest(access: AccessContext) -> str:
    # a frozen value: the many runs of one Runner share it, and so its digest
    return access.digest()


@functools.lru_cache(maxsize=64)
def _access_record(access: AccessContext) -> SafeMapping:
    return access.record()  # read-only (a mapping proxy): shared safely


def run_state_for(exc: BaseException) -> RunState:
    """The run state an error leaves: STOP errors need an operator, others are failures."""
    if isinstance(exc, DponeError) and exc.retryability is Retryability.STOP:
        return RunState.UNRESOLVED
    return RunState.FAILED


class NewStreak:
    """Whether the last run of a caller bore its operation in one atomic transaction.

    A caller running many operations (a ``Runner``) keeps one and hands it to each
    ``RunService``: while operations keep being new, the next is tried as new before any
    lookup of the journal (ADR 0019).
    """

    __slots__ = ("expected",)

    def __init__(self) -> None:
        self.expected = False


class RunService:
    """Records runs and attempts in the ledger and drives the protocol under a retry policy."""

    def __init__(
        self,
        *,
        ledger: RunLedgerPort,
        retry: RetryPolicy | None = None,
        owner: str,
        streak: NewStreak | None = None,
    ) -> None:
        self._ledger = ledger
        self._retry = retry or RetryPolicy()
        self._owner = owner
        # optional abilities of a ledger kept beside the journal (ADR 0008)
        self._lookup: LookupLedgerPort | None = (
            cast(LookupLedgerPort, ledger) if callable(getattr(ledger, "find_run", None)) else None
        )
        self._folding: FoldingLedgerPort | None = (
            cast(FoldingLedgerPort, ledger)
            if callable(getattr(ledger, "complete_run_writer", None))
            else None
        )
        # ... and one that sends a new entry's birth with the lookup (ADR 0018)
        self._finds_or_creates: FindingLedgerPort | None = (
            cast(FindingLedgerPort, ledger)
            if self._lookup is not None
            and self._folding is not None
            and callable(getattr(ledger, "find_run_or_create_committing", None))
            else None
        )
        # ... and that sends it ahead of its answer, read at the target's gate (ADR 0021)
        self._sends_births: SendingLedgerPort | None = (
            cast(SendingLedgerPort, ledger)
            if self._finds_or_creates is not None
            and callable(getattr(ledger, "send_find_run_or_create_committing", None))
            else None
        )
        # ... and one that queues the run with the entry in the target transaction, so a
        # new operation may be tried before any lookup, after one that was new (ADR 0019)
        self._streak = (
            streak
            if self._lookup is not None
            and self._folding is not None
            and callable(getattr(ledger, "queue_complete_run_entry_writer", None))
            else None
        )

    def run(
        self, request: RunRequest, spec: OperationSpec, make_protocol: ProtocolFactory
    ) -> OperationResult:
        """Run, resume or replay the run ``request`` names; see the module docstring.

        Raises:
            RunKeyConflict: the key already names a run of another request.
            IntentConflict: the key's run pinned another workload definition.
            DponeError: the protocol's error.

        """
        if request.idempotency_key or not is_operation_id(spec.operation_id):
            key = check_idempotency_key(
                request.idempotency_key or default_idempotency_key(spec.operation_id)
            )
        else:
            # "op:sha256:<hex>": printable, short, and no secret pattern can match it
            key = default_idempotency_key(spec.operation_id)
        start = RunStart(
            run_id=run_id_for(key),
            idempotency_key=key,
            operation_id=spec.operation_id,
            request_hash=request.request_hash,
            definition_hash=request.definition_hash,
            access_digest=_access_digest(request.access),
            access=_access_record(request.access),
            provenance=request.provenance,
        )
        return call_with_retries(
            lambda: self._once(start, request, spec, make_protocol), policy=self._retry
        )

    # ------------------------------------------------------------------ one try
    def _once(
        self,
        start: RunStart,
        request: RunRequest,
        spec: OperationSpec,
        make_protocol: ProtocolFactory,
        *,
        look_up: bool = False,
        found: Found | None = None,
    ) -> OperationResult:
        """One try; ``look_up``: after one that learnt nothing or ``found`` (ADR 0019, 0021)."""
        tr = _Try(self, start, request)
        try:
            return self._try(tr, start, request, spec, make_protocol, look_up=look_up, found=found)
        finally:
            # A new run's fold holds ``tr.ensure_run`` and ``tr`` holds the fold: unlinked,
            # the try and all it reached are freed now, not by the cyclic collector later
            # (one such cycle per operation made a full collection every few thousand).
            tr.fold = None

    def _try(
        self,
        tr: _Try,
        start: RunStart,
        request: RunRequest,
        spec: OperationSpec,
        make_protocol: ProtocolFactory,
        *,
        look_up: bool,
        found: Found | None,
    ) -> OperationResult:
        """The body of ``_once``, on its try ``tr``."""
        protocol = make_protocol(tr.record_attempt)
        streak = self._streak
        unread = False
        if streak is not None and streak.expected:
            streak.expected = False  # until this try proves it new again
            unread = not look_up and protocol.may_skip_lookup(spec)
        if unread:
            known, born = None, None  # tried as new; ``LookupFirst`` if it is not
        else:
            known, born = tr.look_up(spec, protocol, ahead=not look_up, found=found)
        if not tr.recorded and known is None and self._folding is not None:
            tr.fold = self._new_run_fold(
                start, request, self._folding, tr.ensure_run, born=born is not None
            )
        else:
            tr.ensure_run()
        fold = tr.fold
        try:
            if known is UNREAD and fold is None:
                result = protocol.run(spec)
            else:
                result = protocol.run(
                    spec,
                    known=cast("JournalEntry | None", known),
                    run_fold=fold,
                    born=born,
                    unread=unread,
                )
        except (LookupFirst, NotBorn) as again:
            # nothing was written or recorded: this try starts over below, from what a
            # birth sent ahead found instead (ADR 0021)
            result = None
            found = again.found if isinstance(again, NotBorn) else None
        except BirthUnread as lost:
            raise lost.error from lost.error.__cause__  # as the lookup would have
        except LeaseHeld as exc:
            # in flight in another process: that attempt owns the run; record nothing
            exc.hint = exc.hint or f"run {tr.run_id} is in flight; rerun later to see it"
            raise
        except Exception as exc:
            # a birth sent ahead is read before the run is ended
            found = _found_instead(protocol)
            if found is not None:  # not born: this failure was of a try for nothing
                return self._once(start, request, spec, make_protocol, look_up=True, found=found)
            if fold is not None and fold.committed:
                raise  # the run ended COMPLETE with the operation's COMPLETE: as it is
            tr.claim_begun()
            if tr.recorded or tr.mine:  # a try that recorded nothing has nothing to end
                self._end(tr.run_id, tr.recorded, tr.mine, run_state_for(exc), RunError.of(exc))
            raise
        if result is None:  # with the lookup, whatever another thread's try taught
            return self._once(start, request, spec, make_protocol, look_up=True, found=found)
        if fold is not None and fold.committed:
            if streak is not None and protocol.born_at_once and not look_up:
                streak.expected = True  # born at one sync: the next may be too
            # the run, attempt 1 and their COMPLETE end committed with the write (atomic
            # mode), or attempt 1 ended COMPLETE with the entry's COMPLETE (forward mode)
            _log.info(
                "run %s attempt 1 (COMPLETE, recorded with the write)",
                start.run_id,
                extra={"dpone": {"event": "run", "run_id": start.run_id, "attempt": 1}},
            )
            return msgspec.structs.replace(result, run_id=start.run_id, attempt=1)
        tr.claim_begun()
        if not tr.mine:
            tr.ensure_run()
        attempt = self._end(tr.run_id, tr.recorded, tr.mine, RunState.COMPLETE, None)
        return msgspec.structs.replace(result, run_id=tr.run_id, attempt=attempt or None)

    def _new_run_fold(
        self,
        start: RunStart,
        request: RunRequest,
        folding: FoldingLedgerPort,
        decline: Callable[[], object],
        *,
        born: bool,
    ) -> RunFold:
        """The ledger's part of a new run of a new operation (ADR 0008).

        The protocol may write the run with its first write, or records it first
        (``decline``).
        """
        # a ledger that writes the run and the entry born COMPLETE as one statement
        # offers that writer (ADR 0011); it replaces the run's own writer
        both = getattr(folding, "complete_run_entry_writer", None)
        write: Callable[[object], None] = _unused_writer
        create_complete: Callable[..., JournalEntry] | None = None
        queue_complete: Callable[..., Callable[..., JournalEntry | None]] | None = None
        fuse_complete: Callable[..., Fused] | None = None
        if both is not None:
            create_complete = both(start, owner=self._owner, provenance=request.provenance)
            # ... and queued on a pipelining target, when it can (ADR 0016)
            queued = getattr(folding, "queue_complete_run_entry_writer", None)
            if queued is not None:
                queue_complete = queued(start, owner=self._owner, provenance=request.provenance)
            fused = getattr(folding, "fuse_complete_run_entry_writer", None)
            if fused is not None:
                fuse_complete = fused(start, owner=self._owner, provenance=request.provenance)
        else:
            write = folding.complete_run_writer(
                start, owner=self._owner, provenance=request.provenance
            )
        # a ledger that ends the run with the entry's COMPLETE offers that write
        # (ADR 0013); the protocol uses it only for attempt 1 recorded with the entry
        ending = getattr(folding, "complete_proven_ending_run", None)
        # ... and one that writes it behind the caller offers that too (ADR 0017)
        behind = (
            getattr(folding, "complete_proven_ending_run_behind", None)
            if getattr(folding, "completes_behind", False)
            else None
        )
        # ... and one that builds that write while the birth's answer is awaited (ADR 0021)
        prepare = (
            getattr(folding, "prepare_proven_ending_run_behind", None)
            if behind is not None
            else None
        )
        fold = RunFold(
            write=write,
            create_complete=create_complete,
            queue_complete=queue_complete,
            fuse_complete=fuse_complete,
            decline=decline,
            create_committing=lambda **entry: folding.create_committing_with_run(
                start, provenance=request.provenance, **entry
            ),
            complete_proven=None
            if ending is None
            else functools.partial(ending, run_id=start.run_id, attempt=1),
            complete_proven_behind=None
            if behind is None
            else functools.partial(behind, run_id=start.run_id, attempt=1),
            prepare_proven_behind=None
            if prepare is None
            else functools.partial(prepare, run_id=start.run_id, attempt=1),
        )
        fold.begun = born  # the run and attempt 1 were born with it
        return fold

    def _end(
        self,
        run_id: str,
        recorded: list[RunRecord],
        mine: list[int],
        state: RunState,
        error: RunError | None,
    ) -> int:
        """Record how this try ended; a ledger failure never replaces the primary outcome.

        A try that took no lease of its own has no attempt to end. It still records what
        the journal taught it (COMPLETE, UNRESOLVED) at the run's current attempt, but a
        failure of its own (its journal connection dropped before any lease) says nothing
        about another executor's attempt that may be in flight, so it is not written over
        a RUNNING run's attempt: that attempt's owner, or the next replay, records it.
        """
        if mine:
            attempt = mine[-1]
        else:
            run = recorded[0]  # read or recorded by this try (the callers make sure)
            attempt = run.current_attempt
            if run.state is state and run.error == error:
                return attempt  # a replay that learned nothing new: nothing to write
            if (
                state is RunState.FAILED
                and run.state is RunState.RUNNING
                and run.current_attempt > 0
            ):
                return attempt  # not ours to end (see above)
        try:
            self._ledger.end_attempt(run_id=run_id, attempt=attempt, state=state, error=error)
        except DponeError as secondary:
            _log.warning(
                "the run ledger did not record the end of attempt %d (%s)",
                attempt,
                secondary.code.value,
                extra={"dpone": {"event": "secondary", "run_id": run_id}},
            )
        return attempt

    def _emit(self, run: RunRecord, event: str) -> None:
        if not _log.info_enabled():
            return  # the usual case for a library caller: build no record
        _log.info(
            "%s %s attempt %d (%s)",
            event,
            run.run_id,
            run.current_attempt,
            run.state.value,
            extra={
                "dpone": {
                    "event": event,
                    "run_id": run.run_id,
                    "operation_id": run.operation_id,
                    "run_state": run.state.value,
                    "attempt": run.current_attempt,
                }
            },
        )


class _Try:
    """What one try of a run has read and recorded in the ledger so far."""

    def __init__(self, service: RunService, start: RunStart, request: RunRequest) -> None:
        self._service = service
        self._start = start
        self._request = request
        self.recorded: list[RunRecord] = []  # the run, once read or recorded by this try
        self.mine: list[int] = []  # the attempts this try recorded
        self.fold: RunFold | None = None

    @property
    def run_id(self) -> str:
        return self.recorded[0].run_id if self.recorded else self._start.run_id

    def read(self) -> JournalEntry | Unread | None:
        """Read the run and the operation's entry in one go when the ledger can (ADR 0008).

        A finished run's replay needs nothing else. Returns the entry (None: there is
        none), or ``UNREAD`` when the ledger cannot read both at once.
        """
        lookup = self._service._lookup
        if lookup is None:
            return UNREAD
        start = self._start
        found, entry = lookup.find_run(
            idempotency_key=start.idempotency_key, operation_id=start.operation_id
        )
        return self._take(found, entry)

    def look_up(
        self, spec: OperationSpec, protocol: CommitProtocol, *, ahead: bool, found: Found | None
    ) -> tuple[JournalEntry | Unread | None, JournalEntry | None]:
        """``read``, and the entry this try had born with the run when they were new.

        Where the ledger and the protocol can, the lookup and a new entry's birth are one
        statement (ADR 0018); else the run is read as always. With ``ahead``, where they
        can, that statement is sent ahead of its answer (ADR 0021): the entry returned is
        then the protocol's stand-in until its gate reads the answer. ``found``: what such
        a birth found instead (``NotBorn``), taken as this lookup's.
        """
        if found is not None:
            return self._found(*found), None
        finder = self._service._finds_or_creates
        birth = protocol.birth(spec) if finder is not None else None
        if finder is None or birth is None:
            return self.read(), None
        sender = self._service._sends_births
        if ahead and sender is not None and protocol.births_ahead:
            answer = sender.send_find_run_or_create_committing(
                self._start, provenance=self._request.provenance, **birth
            )
            if answer is not None:
                return None, protocol.birth_sent(spec, answer)
        run, entry, born = finder.find_run_or_create_committing(
            self._start, provenance=self._request.provenance, **birth
        )
        if born:
            return None, entry
        return self._found(run, entry), None

    def _found(
        self, run: RunRecord | None, entry: JournalEntry | None
    ) -> JournalEntry | Unread | None:
        """What a birth-or-lookup found instead of a birth (``_take``'s answer)."""
        if run is None and entry is None:
            return self.read()  # created meanwhile by another executor: read it
        return self._take(run, entry)

    def _take(self, found: RunRecord | None, entry: JournalEntry | None) -> JournalEntry | None:
        """What a lookup found: the run under the key (checked) and the operation's entry."""
        if found is not None:
            self._service._emit(found, "replay")
            check_replay(found, self._start)
            self.recorded.append(found)
        return entry

    def ensure_run(self) -> RunRecord:
        """The run: recorded now (or found under the key) unless this try has it already."""
        if not self.recorded:
            run, created = self._service._ledger.begin_run(self._start)
            self._service._emit(run, "run" if created else "replay")
            if not created:
                check_replay(run, self._start)
            self.recorded.append(run)
        return self.recorded[0]

    def record_attempt(self, entry: JournalEntry) -> None:
        """Record the attempt a lease granted, before anything is dispatched on it."""
        if entry.state in _NOTHING_TO_DISPATCH:
            return  # the lease only finds the recorded outcome: not an attempt
        if self.fold is not None and self.fold.begun and not self.mine and entry.lease_epoch == 1:
            self.mine.append(1)  # recorded with the entry that granted it (ADR 0008)
            return
        run = self.ensure_run()
        self._service._ledger.begin_attempt(
            run_id=run.run_id,
            attempt=entry.lease_epoch,
            owner=self._service._owner,
            provenance=self._request.provenance,
        )
        self.mine.append(entry.lease_epoch)

    def claim_begun(self) -> None:
        """Attempt 1 recorded with the entry (forward mode) is this try's, dispatched or not."""
        if self.fold is not None and self.fold.begun and not self.mine:
            self.mine.append(1)


def _unused_writer(txn: object) -> None:
    """``RunFold.write`` when ``create_complete`` writes the run (never called then)."""
    raise AssertionError("the run is written with the entry (RunFold.create_complete)")


def _found_instead(protocol: CommitProtocol) -> Found | None:
    """What a birth sent ahead found instead of bearing the entry; None: born, or none sent.

    Reads the answer if it is still unread; a journal error reading it is raised as the
    lookup would have raised it.
    """
    try:
        protocol.confirm_birth()
    except NotBorn as not_born:
        return not_born.found
    except BirthUnread as lost:
        raise lost.error from lost.error.__cause__
    return None


def check_replay(run: RunRecord, start: RunStart) -> None:
    """Refuse a key reused for another request or with another workload definition."""
    if run.request_hash != start.request_hash or run.operation_id != start.operation_id:
        raise RunKeyConflict(
            f"the idempotency key already names run {run.run_id} of another request "
            "(another operation, interval or partition); nothing was run",
            operation_id=run.operation_id,
            hint="use a new idempotency key for a new request",
        )
    if run.definition_hash != start.definition_hash:
        raise IntentConflict(
            f"run {run.run_id} pinned another workload definition than the one given now; "
            "nothing was read or written",
            operation_id=run.operation_id,
            recovery_ref=recovery_ref(run.operation_id),
            hint="restore the original workload file, or start a new run with a new "
            "idempotency key (a new operation: another release or interval)",
        )
