"""Conformance suite for CommitJournalPort adapters: subclass JournalConformance, give a journal.

Usage, in a test module of the adapter (psycopg ``dbapi20`` style)::

    from dpone.testing.journal_conformance import JournalConformance, JournalFactory

    class TestSqliteJournal(JournalConformance):
        @pytest.fixture
        def journal(self, tmp_path):
            journal = SqliteCommitJournal(tmp_path / "journal.db")
            yield journal
            journal.close()

        @pytest.fixture
        def race_factory(self, tmp_path):  # optional: enables the multi-process races
            return JournalFactory(SqliteCommitJournal, (str(tmp_path / "journal.db"),))

        @pytest.fixture
        def atomic_txn(self, tmp_path):  # optional: TransactionalJournalPort adapters
            return open_target_transaction  # () -> context manager yielding the txn

The class name shows the backend in test ids. Every test creates its own operations, so
a journal shared between tests works too. Lease tests sleep past short TTLs (0.3 s):
the journal judges expiry by its own clock, which a test cannot wind forward.
"""

from __future__ import annotations

import multiprocessing
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar, cast

import pytest

from dpone.contracts.journal import AuditRequest, JournalEntry, Transition
from dpone.contracts.states import (
    ALLOWED_TRANSITIONS,
    ATOMIC_FOLDS,
    FOLD_PATHS,
    RECOVERY_ONLY_TRANSITIONS,
    CommitState,
    is_allowed,
)
from dpone.errors import (
    IllegalTransition,
    IntentConflict,
    JournalConflict,
    LeaseHeld,
    LeaseLost,
    OperationNotFound,
    UnsafeValue,
)
from dpone.ports.journal import CommitJournalPort, TransactionalJournalPort

__all__ = ["AtomicTxn", "JournalConformance", "JournalFactory"]

S = CommitState

#: Opens a target transaction on the journal's database: ``with atomic_txn() as txn:``.
#: Leaving the block normally commits; an exception rolls back.
AtomicTxn = Callable[[], AbstractContextManager[object]]

ACTOR = "conformance-host:1"
OWNER_A = "executor-a:101"
OWNER_B = "executor-b:202"
DIGEST = "sha256:" + "1" * 64
OTHER_DIGEST = "sha256:" + "2" * 64
AUDIT = AuditRequest(principal="alice", action="mark_committed", reason="fence shows committed")
SECRET_DSN = "postgresql://u:pw@h/db"  # noqa: S105 - a canary the journal must refuse
SHORT_TTL = 0.3
LONG_TTL = 60.0
RACERS = 4
RACE_ROUNDS = 5
RACE_TIMEOUT = 120.0

ALL_PAIRS = [(frm, to) for frm in CommitState for to in CommitState]
# Single steps of the state machine: allowed moves that are not folds.
_STEPS = {
    frm: frozenset(to for to in tos if (frm, to) not in FOLD_PATHS)
    for frm, tos in ALLOWED_TRANSITIONS.items()
}


@dataclass(frozen=True, slots=True)
class JournalFactory:
    """A picklable recipe that opens the journal under test again, in another process.

    Args:
        build: a top-level callable (a class or module function) returning a journal.
        args: positional arguments for ``build``; picklable, without secrets.
    """

    build: Callable[..., CommitJournalPort]
    args: tuple[Any, ...] = ()

    def __call__(self) -> CommitJournalPort:
        """Open a fresh journal on the same store."""
        return self.build(*self.args)


# ---------------------------------------------------------------------- helpers
def new_operation_id() -> str:
    """Return a fresh operation id of the canonical form."""
    return "sha256:" + secrets.token_hex(32)


def create(journal: CommitJournalPort, operation_id: str | None = None) -> JournalEntry:
    """Create a fresh entry with harmless metadata."""
    return journal.create_intent(
        operation_id=operation_id or new_operation_id(),
        intent_digest=DIGEST,
        metadata={"workload_id": "orders", "row_count": 3},
        actor=ACTOR,
    )


def leased(journal: CommitJournalPort, *, ttl: float = LONG_TTL) -> JournalEntry:
    """Create a fresh entry and lease it to OWNER_A."""
    entry = create(journal)
    return journal.acquire_lease(operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=ttl)


def cas(
    journal: CommitJournalPort,
    entry: JournalEntry,
    to: CommitState,
    **kwargs: Any,
) -> JournalEntry:
    """CAS ``entry`` to ``to`` from exactly what the caller last saw."""
    return journal.compare_and_set(
        operation_id=entry.operation_id,
        expected_version=entry.version,
        expected_states=frozenset({entry.state}),
        next_state=to,
        lease_epoch=entry.lease_epoch,
        actor=ACTOR,
        **kwargs,
    )


def path_to(target: CommitState) -> list[CommitState]:
    """Return the shortest chain of single steps from PREPARING to ``target``."""
    parents: dict[CommitState, CommitState | None] = {S.PREPARING: None}
    todo = deque([S.PREPARING])
    while todo:
        state = todo.popleft()
        for nxt in sorted(_STEPS[state], key=lambda s: s.value):
            if nxt not in parents:
                parents[nxt] = state
                todo.append(nxt)
    chain: list[CommitState] = []
    at: CommitState | None = target
    while at is not None:
        chain.append(at)
        at = parents[at]
    return chain[::-1]


def drive_to(journal: CommitJournalPort, entry: JournalEntry, target: CommitState) -> JournalEntry:
    """Move ``entry`` to ``target`` through legal single steps, audited where required."""
    for nxt in path_to(target)[1:]:
        audit = AUDIT if (entry.state, nxt) in RECOVERY_ONLY_TRANSITIONS else None
        entry = cas(journal, entry, nxt, audit=audit)
    assert entry.state is target
    return entry


def _cycle(round_no: int) -> tuple[CommitState, CommitState]:
    # PREPARING <-> FAILED_PRE_COMMIT is a legal cycle, so rounds can go on forever.
    if round_no % 2 == 0:
        return S.PREPARING, S.FAILED_PRE_COMMIT
    return S.FAILED_PRE_COMMIT, S.PREPARING


def _race_worker(
    factory: JournalFactory,
    kind: str,
    index: int,
    operation_id: str,
    first_version: int,
    lease_epoch: int,
    rounds: int,
    barrier: Any,
    results: Any,
) -> None:
    """Child process body of the races: open the journal, then race once per round."""
    try:
        journal = factory()
    except BaseException as exc:  # noqa: BLE001 - any failure is reported to the parent
        results.put((index, -1, f"error: cannot open journal: {exc!r}"))
        barrier.abort()
        return
    try:
        for round_no in range(rounds):
            barrier.wait(timeout=RACE_TIMEOUT)
            outcome = "won"
            try:
                if kind == "cas":
                    frm, to = _cycle(round_no)
                    journal.compare_and_set(
                        operation_id=operation_id,
                        expected_version=first_version + round_no,
                        expected_states=frozenset({frm}),
                        next_state=to,
                        lease_epoch=lease_epoch,
                        actor=f"racer-{index}",
                    )
                else:
                    journal.acquire_lease(
                        operation_id=operation_id, owner=f"racer-{index}", ttl_seconds=LONG_TTL
                    )
            except (JournalConflict, LeaseHeld):
                outcome = "lost"
            except Exception as exc:  # noqa: BLE001 - reported, the parent shows it
                outcome = f"error: {exc!r}"
            results.put((index, round_no, outcome))
    except threading.BrokenBarrierError:
        results.put((index, -1, "error: barrier broken"))
    finally:
        journal.close()


def _race_processes(
    factory: JournalFactory,
    *,
    kind: str,
    operation_id: str,
    first_version: int,
    lease_epoch: int,
    rounds: int,
) -> list[tuple[int, int, str]]:
    """Run RACERS spawned processes through ``rounds`` barrier-started races."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(RACERS)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_race_worker,
            args=(
                factory,
                kind,
                i,
                operation_id,
                first_version,
                lease_epoch,
                rounds,
                barrier,
                results,
            ),
            name=f"dpone-journal-racer-{i}",
        )
        for i in range(RACERS)
    ]
    out: list[tuple[int, int, str]] = []
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + RACE_TIMEOUT
        while len(out) < RACERS * rounds:
            try:
                item = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            out.append(item)
            if item[1] == -1:
                break
    finally:
        for proc in procs:
            proc.join(timeout=RACE_TIMEOUT)
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()
        results.close()
        results.join_thread()
    return out


def _assert_history_contiguous(history: list[Transition], *, last_version: int) -> None:
    versions = sorted({t.version for t in history})
    assert versions == list(range(1, last_version + 1)), "every version has history rows"
    keys = [(t.version, t.seq) for t in history]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys), "no (version, seq) row twice"


# ---------------------------------------------------------------------- the suite
class JournalConformance:
    """The behaviour every CommitJournalPort adapter must show; subclass it per adapter."""

    #: False for an in-process adapter: the multi-process races are then not collected.
    multiprocess: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.multiprocess:
            for name in (
                "test_process_race_has_exactly_one_winner_per_version",
                "test_process_race_for_a_free_lease_has_one_holder",
            ):
                setattr(cls, name, None)  # pytest collects nothing for a None attribute

    # ------------------------------------------------------------------ hooks
    @pytest.fixture
    def journal(self) -> CommitJournalPort:
        """Provide a journal (override in the subclass; close it in teardown)."""
        raise NotImplementedError(f"{type(self).__name__} must define a `journal` fixture")

    @pytest.fixture
    def race_factory(self) -> JournalFactory | None:
        """Reopen the ``journal`` fixture's store in another process, or None if impossible."""
        return None

    @pytest.fixture
    def atomic_txn(self) -> AtomicTxn | None:
        """Open a target transaction on the journal's database, or None without atomic mode."""
        return None

    # ------------------------------------------------------------------ create
    def test_create_intent_starts_in_preparing_at_version_one(
        self, journal: CommitJournalPort
    ) -> None:
        """A new entry is PREPARING, version 1, no lease, with its metadata and a create row."""
        op = new_operation_id()
        entry = create(journal, op)
        assert entry.operation_id == op
        assert entry.intent_digest == DIGEST
        assert entry.state is S.PREPARING
        assert entry.version == 1
        assert (entry.lease_owner, entry.lease_epoch, entry.lease_expires_at) == (None, 0, None)
        assert dict(entry.metadata) == {"workload_id": "orders", "row_count": 3}
        assert entry.result is None
        assert entry.created_at == entry.updated_at
        assert journal.get(op) == entry
        [row] = journal.history(op)
        assert (row.from_state, row.to_state, row.kind, row.version, row.seq) == (
            None,
            S.PREPARING,
            "create",
            1,
            0,
        )
        assert row.actor == ACTOR

    def test_create_intent_returns_existing_entry_unchanged(
        self, journal: CommitJournalPort
    ) -> None:
        """create_intent on an existing entry returns it as stored and writes nothing."""
        first = leased(journal)
        again = journal.create_intent(
            operation_id=first.operation_id,
            intent_digest=DIGEST,
            metadata={"workload_id": "other"},
            actor="someone-else:9",
        )
        assert again == first
        assert journal.get(first.operation_id) == first
        assert len(journal.history(first.operation_id)) == 2

    def test_create_intent_with_other_digest_raises_intent_conflict(
        self, journal: CommitJournalPort
    ) -> None:
        """The same operation id with another intent digest is IntentConflict; nothing changes."""
        first = create(journal)
        with pytest.raises(IntentConflict) as info:
            journal.create_intent(
                operation_id=first.operation_id,
                intent_digest=OTHER_DIGEST,
                metadata={},
                actor=ACTOR,
            )
        assert info.value.operation_id == first.operation_id
        assert journal.get(first.operation_id) == first

    def test_get_unknown_operation_returns_none(self, journal: CommitJournalPort) -> None:
        """get() of an id never created is None."""
        assert journal.get(new_operation_id()) is None

    # ------------------------------------------------------------------ CAS
    def test_cas_moves_state_and_bumps_version_once(self, journal: CommitJournalPort) -> None:
        """A CAS sets the state, adds exactly one to the version and records one row."""
        entry = leased(journal)
        new = cas(journal, entry, S.PREPARED, evidence={"fence_state": "prepared"})
        assert new.state is S.PREPARED
        assert new.version == entry.version + 1
        assert new.lease_epoch == entry.lease_epoch
        assert new.updated_at >= entry.updated_at
        assert journal.get(entry.operation_id) == new
        last = journal.history(entry.operation_id)[-1]
        assert (last.from_state, last.to_state, last.kind) == (
            S.PREPARING,
            S.PREPARED,
            "transition",
        )
        assert (last.version, last.seq, last.lease_epoch) == (new.version, 0, entry.lease_epoch)
        assert dict(last.evidence) == {"fence_state": "prepared"}

    def test_cas_stale_version_raises_conflict_with_current(
        self, journal: CommitJournalPort
    ) -> None:
        """A CAS from an old version is JournalConflict carrying the current version and state."""
        entry = leased(journal)
        moved = cas(journal, entry, S.PREPARED)
        with pytest.raises(JournalConflict) as info:
            cas(journal, entry, S.FAILED_PRE_COMMIT)
        assert info.value.current_version == moved.version
        assert info.value.current_state == S.PREPARED.value
        assert info.value.operation_id == entry.operation_id
        assert journal.get(entry.operation_id) == moved

    def test_cas_wrong_expected_state_raises_conflict(self, journal: CommitJournalPort) -> None:
        """A CAS whose expected states miss the current one is JournalConflict."""
        entry = leased(journal)
        with pytest.raises(JournalConflict) as info:
            journal.compare_and_set(
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset({S.PREPARED}),
                next_state=S.COMMITTING,
                lease_epoch=entry.lease_epoch,
                actor=ACTOR,
            )
        assert info.value.current_version == entry.version
        assert info.value.current_state == S.PREPARING.value
        assert journal.get(entry.operation_id) == entry

    def test_cas_stale_lease_epoch_raises_conflict(self, journal: CommitJournalPort) -> None:
        """A CAS with another lease epoch than the entry's is JournalConflict."""
        entry = leased(journal)
        with pytest.raises(JournalConflict) as info:
            journal.compare_and_set(
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset({S.PREPARING}),
                next_state=S.PREPARED,
                lease_epoch=entry.lease_epoch - 1,
                actor=ACTOR,
            )
        assert info.value.current_version == entry.version
        assert journal.get(entry.operation_id) == entry

    def test_cas_accepts_any_of_several_expected_states(self, journal: CommitJournalPort) -> None:
        """With several expected states, the CAS applies from whichever one holds."""
        entry = drive_to(journal, leased(journal), S.PREPARED)
        new = journal.compare_and_set(
            operation_id=entry.operation_id,
            expected_version=entry.version,
            expected_states=frozenset({S.PREPARING, S.PREPARED}),
            next_state=S.FAILED_PRE_COMMIT,
            lease_epoch=entry.lease_epoch,
            actor=ACTOR,
        )
        assert new.state is S.FAILED_PRE_COMMIT
        last = journal.history(entry.operation_id)[-1]
        assert (last.from_state, last.to_state) == (S.PREPARED, S.FAILED_PRE_COMMIT)

    def test_cas_unknown_operation_raises_not_found(self, journal: CommitJournalPort) -> None:
        """A CAS on an id never created is OperationNotFound."""
        with pytest.raises(OperationNotFound):
            journal.compare_and_set(
                operation_id=new_operation_id(),
                expected_version=1,
                expected_states=frozenset({S.PREPARING}),
                next_state=S.PREPARED,
                lease_epoch=0,
                actor=ACTOR,
            )

    def test_cas_without_expected_states_is_illegal(self, journal: CommitJournalPort) -> None:
        """An empty expected-state set can never match and is refused as IllegalTransition."""
        entry = leased(journal)
        with pytest.raises(IllegalTransition):
            journal.compare_and_set(
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset(),
                next_state=S.PREPARED,
                lease_epoch=entry.lease_epoch,
                actor=ACTOR,
            )
        assert journal.get(entry.operation_id) == entry

    def test_cas_refuses_if_any_expected_state_is_illegal(self, journal: CommitJournalPort) -> None:
        """An expected-state set with one illegal source is refused even if the entry is legal."""
        entry = leased(journal)
        with pytest.raises(IllegalTransition):
            journal.compare_and_set(
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset({S.PREPARING, S.COMPLETE}),
                next_state=S.PREPARED,
                lease_epoch=entry.lease_epoch,
                actor=ACTOR,
            )
        assert journal.get(entry.operation_id) == entry

    @pytest.mark.parametrize(
        ("frm", "to"), ALL_PAIRS, ids=[f"{a.value}-to-{b.value}" for a, b in ALL_PAIRS]
    )
    def test_transition_table(
        self,
        journal: CommitJournalPort,
        atomic_txn: AtomicTxn | None,
        frm: CommitState,
        to: CommitState,
    ) -> None:
        """Pairs outside ALLOWED_TRANSITIONS are refused; allowed ones succeed in their mode."""
        entry = drive_to(journal, leased(journal), frm)
        rows = journal.history(entry.operation_id)

        def within_cas(txn: object) -> JournalEntry:
            return cast(TransactionalJournalPort, journal).compare_and_set_within(
                txn,
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset({frm}),
                next_state=to,
                lease_epoch=entry.lease_epoch,
                actor=ACTOR,
            )

        def unchanged() -> None:
            assert journal.get(entry.operation_id) == entry
            assert journal.history(entry.operation_id) == rows

        accepted: JournalEntry | None = None
        if not is_allowed(frm, to):
            with pytest.raises(IllegalTransition):
                cas(journal, entry, to)
            with pytest.raises(IllegalTransition):
                cas(journal, entry, to, audit=AUDIT)
            if atomic_txn is not None:
                with pytest.raises(IllegalTransition), atomic_txn() as txn:
                    within_cas(txn)
            unchanged()
        elif (frm, to) in ATOMIC_FOLDS:
            with pytest.raises(IllegalTransition):
                cas(journal, entry, to)
            unchanged()
            if atomic_txn is not None:
                with atomic_txn() as txn:
                    accepted = within_cas(txn)
        elif (frm, to) in RECOVERY_ONLY_TRANSITIONS:
            with pytest.raises(IllegalTransition):
                cas(journal, entry, to)
            if atomic_txn is not None:
                with pytest.raises(IllegalTransition), atomic_txn() as txn:
                    within_cas(txn)
            unchanged()
            accepted = cas(journal, entry, to, audit=AUDIT)
        else:
            accepted = cas(journal, entry, to)
        if accepted is not None:
            assert (accepted.state, accepted.version) == (to, entry.version + 1)
            assert journal.get(entry.operation_id) == accepted
            steps = len(FOLD_PATHS.get((frm, to), (frm, to))) - 1
            assert len(journal.history(entry.operation_id)) == len(rows) + steps

    @pytest.mark.parametrize(
        ("frm", "to"),
        sorted(ATOMIC_FOLDS),
        ids=[f"{a.value}-to-{b.value}" for a, b in sorted(ATOMIC_FOLDS)],
    )
    def test_atomic_only_fold_refused_by_plain_cas(
        self, journal: CommitJournalPort, frm: CommitState, to: CommitState
    ) -> None:
        """An atomic-mode fold through compare_and_set is IllegalTransition and writes nothing."""
        entry = drive_to(journal, leased(journal), frm)
        with pytest.raises(IllegalTransition):
            cas(journal, entry, to, evidence={"mode": "atomic"})
        assert journal.get(entry.operation_id) == entry

    @pytest.mark.parametrize("to", [S.TARGET_COMMITTED, S.FAILED_PRE_COMMIT], ids=lambda s: s.value)
    def test_recovery_move_without_audit_is_refused(
        self, journal: CommitJournalPort, to: CommitState
    ) -> None:
        """COMMIT_UNKNOWN -> TARGET_COMMITTED | FAILED_PRE_COMMIT without audit is refused."""
        entry = drive_to(journal, leased(journal), S.COMMIT_UNKNOWN)
        with pytest.raises(IllegalTransition) as info:
            cas(journal, entry, to)
        assert info.value.recovery_ref
        assert journal.get(entry.operation_id) == entry
        assert journal.audit_log(entry.operation_id) == []

    @pytest.mark.parametrize("to", [S.TARGET_COMMITTED, S.FAILED_PRE_COMMIT], ids=lambda s: s.value)
    def test_recovery_move_with_audit_writes_audit_record(
        self, journal: CommitJournalPort, to: CommitState
    ) -> None:
        """An audited recovery move applies and records who, what, before and after."""
        entry = drive_to(journal, leased(journal), S.COMMIT_UNKNOWN)
        new = cas(journal, entry, to, audit=AUDIT)
        assert (new.state, new.version) == (to, entry.version + 1)
        [record] = journal.audit_log(entry.operation_id)
        assert (record.principal, record.action, record.reason) == (
            AUDIT.principal,
            AUDIT.action,
            AUDIT.reason,
        )
        assert (record.before_state, record.after_state) == (S.COMMIT_UNKNOWN, to)
        assert (record.before_version, record.after_version) == (entry.version, new.version)
        assert record.outcome == "applied"
        assert journal.history(entry.operation_id)[-1].version == record.after_version

    @pytest.mark.parametrize(
        ("frm", "to"),
        sorted(set(FOLD_PATHS) - ATOMIC_FOLDS),
        ids=[f"{a.value}-to-{b.value}" for a, b in sorted(set(FOLD_PATHS) - ATOMIC_FOLDS)],
    )
    def test_fold_writes_one_history_row_per_step(
        self, journal: CommitJournalPort, frm: CommitState, to: CommitState
    ) -> None:
        """A fold is one write (version + 1) and one history row per step, seq 0..n-1."""
        entry = drive_to(journal, leased(journal), frm)
        before = journal.history(entry.operation_id)
        new = cas(journal, entry, to, evidence={"row_count": 7})
        assert new.version == entry.version + 1
        rows = journal.history(entry.operation_id)[len(before) :]
        path = FOLD_PATHS[(frm, to)]
        assert [(r.from_state, r.to_state) for r in rows] == list(pairwise(path))
        assert [r.seq for r in rows] == list(range(len(path) - 1))
        assert {r.version for r in rows} == {new.version}
        assert {r.kind for r in rows} == {"fold"}
        assert all(dict(r.evidence) == {"row_count": 7} for r in rows)

    def test_result_is_recorded_and_kept_by_later_writes(self, journal: CommitJournalPort) -> None:
        """A CAS result is stored on the entry and survives a later CAS without one."""
        entry = drive_to(journal, leased(journal), S.COMMITTING)
        committed = cas(journal, entry, S.TARGET_COMMITTED, result={"rows_written": 42})
        assert committed.result is not None
        assert dict(committed.result) == {"rows_written": 42}
        done = cas(journal, committed, S.COMPLETE)
        assert done.result is not None
        assert dict(done.result) == {"rows_written": 42}
        stored = journal.get(entry.operation_id)
        assert stored is not None
        assert stored.result is not None
        assert dict(stored.result) == {"rows_written": 42}

    def test_version_grows_by_one_per_write(self, journal: CommitJournalPort) -> None:
        """State writes and lease grants add one to the version; renew and release add none."""
        op = new_operation_id()
        entry = create(journal, op)
        seen = [entry.version]
        entry = journal.acquire_lease(operation_id=op, owner=OWNER_A, ttl_seconds=LONG_TTL)
        seen.append(entry.version)
        entry = cas(journal, entry, S.PREPARED)
        seen.append(entry.version)
        entry = journal.renew_lease(
            operation_id=op, owner=OWNER_A, lease_epoch=entry.lease_epoch, ttl_seconds=LONG_TTL
        )
        seen.append(entry.version)
        entry = journal.acquire_lease(operation_id=op, owner=OWNER_A, ttl_seconds=LONG_TTL)
        seen.append(entry.version)
        journal.release_lease(operation_id=op, owner=OWNER_A, lease_epoch=entry.lease_epoch)
        after = journal.get(op)
        assert after is not None
        seen.append(after.version)
        assert seen == [1, 2, 3, 3, 4, 4]

    def test_history_is_append_only_and_ordered(self, journal: CommitJournalPort) -> None:
        """Later writes only append rows; earlier rows stay identical; order is (version, seq)."""
        entry = drive_to(journal, leased(journal), S.COMMITTING)
        snapshot = journal.history(entry.operation_id)
        entry = cas(journal, entry, S.COMPLETE)
        history = journal.history(entry.operation_id)
        assert history[: len(snapshot)] == snapshot
        assert len(history) == len(snapshot) + 2
        _assert_history_contiguous(history, last_version=entry.version)
        times = [row.at for row in history]
        assert times == sorted(times)

    def test_history_of_unknown_operation_is_empty(self, journal: CommitJournalPort) -> None:
        """history() of an id never created is an empty list."""
        assert journal.history(new_operation_id()) == []

    # ------------------------------------------------------------------ leases
    def test_acquire_grants_next_epoch_even_to_current_owner(
        self, journal: CommitJournalPort
    ) -> None:
        """Every acquire grants epoch + 1 and version + 1, also to the owner holding it."""
        entry = create(journal)
        first = journal.acquire_lease(
            operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=LONG_TTL
        )
        assert (first.lease_owner, first.lease_epoch, first.version) == (OWNER_A, 1, 2)
        again = journal.acquire_lease(
            operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=LONG_TTL
        )
        assert (again.lease_owner, again.lease_epoch, again.version) == (OWNER_A, 2, 3)
        assert again.state is entry.state
        rows = journal.history(entry.operation_id)[-2:]
        assert [(r.kind, r.from_state, r.to_state) for r in rows] == [
            ("lease", S.PREPARING, S.PREPARING),
            ("lease", S.PREPARING, S.PREPARING),
        ]
        assert [(r.version, r.lease_epoch, r.actor) for r in rows] == [
            (2, 1, OWNER_A),
            (3, 2, OWNER_A),
        ]

    def test_acquire_sets_expiry_by_journal_clock(self, journal: CommitJournalPort) -> None:
        """The granted expiry is the journal's now plus the TTL."""
        entry = create(journal)
        before = journal.now()
        granted = journal.acquire_lease(
            operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=30.0
        )
        after = journal.now()
        assert granted.lease_expires_at is not None
        assert before + 30.0 - 0.01 <= granted.lease_expires_at <= after + 30.0 + 0.01

    def test_live_lease_of_another_owner_raises_lease_held(
        self, journal: CommitJournalPort
    ) -> None:
        """A live lease held by someone else is LeaseHeld with owner and time left."""
        entry = leased(journal, ttl=LONG_TTL)
        with pytest.raises(LeaseHeld) as info:
            journal.acquire_lease(
                operation_id=entry.operation_id, owner=OWNER_B, ttl_seconds=LONG_TTL
            )
        assert info.value.lease_owner == OWNER_A
        assert info.value.lease_expires_in is not None
        assert 0 < info.value.lease_expires_in <= LONG_TTL
        assert journal.get(entry.operation_id) == entry

    def test_acquire_with_stale_expected_version_raises_conflict(
        self, journal: CommitJournalPort
    ) -> None:
        """acquire_lease with an expected version that moved is JournalConflict."""
        entry = leased(journal)
        moved = cas(journal, entry, S.PREPARED)
        with pytest.raises(JournalConflict) as info:
            journal.acquire_lease(
                operation_id=entry.operation_id,
                owner=OWNER_A,
                ttl_seconds=LONG_TTL,
                expected_version=entry.version,
            )
        assert info.value.current_version == moved.version
        assert journal.get(entry.operation_id) == moved
        granted = journal.acquire_lease(
            operation_id=entry.operation_id,
            owner=OWNER_A,
            ttl_seconds=LONG_TTL,
            expected_version=moved.version,
        )
        assert granted.version == moved.version + 1

    def test_acquire_unknown_operation_raises_not_found(self, journal: CommitJournalPort) -> None:
        """acquire_lease on an id never created is OperationNotFound."""
        with pytest.raises(OperationNotFound):
            journal.acquire_lease(
                operation_id=new_operation_id(), owner=OWNER_A, ttl_seconds=LONG_TTL
            )

    def test_takeover_after_expiry_fences_the_old_owner(self, journal: CommitJournalPort) -> None:
        """After expiry another owner gets epoch + 1 and the old epoch's CAS fails."""
        old = leased(journal, ttl=SHORT_TTL)
        time.sleep(SHORT_TTL + 0.15)
        new = journal.acquire_lease(
            operation_id=old.operation_id, owner=OWNER_B, ttl_seconds=LONG_TTL
        )
        assert (new.lease_owner, new.lease_epoch) == (OWNER_B, old.lease_epoch + 1)
        with pytest.raises(JournalConflict):
            journal.compare_and_set(
                operation_id=old.operation_id,
                expected_version=new.version,  # even with the current version
                expected_states=frozenset({S.PREPARING}),
                next_state=S.PREPARED,
                lease_epoch=old.lease_epoch,
                actor=OWNER_A,
            )
        assert journal.get(old.operation_id) == new
        assert cas(journal, new, S.PREPARED).lease_epoch == new.lease_epoch

    def test_create_with_lease_grants_epoch_one_in_the_same_write(
        self, journal: CommitJournalPort
    ) -> None:
        """A new entry born leased: version 1, epoch 1, history create then lease."""
        entry = journal.create_intent(
            operation_id=new_operation_id(),
            intent_digest=DIGEST,
            metadata={},
            actor=ACTOR,
            lease_owner=OWNER_A,
            lease_ttl_seconds=LONG_TTL,
        )
        assert (entry.version, entry.lease_epoch, entry.lease_owner) == (1, 1, OWNER_A)
        assert entry.lease_expires_at is not None
        assert entry.lease_expires_at > journal.now() + LONG_TTL / 2
        kinds = [(t.kind, t.version, t.seq) for t in journal.history(entry.operation_id)]
        assert kinds == [("create", 1, 0), ("lease", 1, 1)]
        with pytest.raises(LeaseHeld):
            journal.acquire_lease(
                operation_id=entry.operation_id, owner=OWNER_B, ttl_seconds=LONG_TTL
            )
        moved = cas(journal, entry, S.PREPARED)
        assert moved.version == 2

    def test_create_with_lease_leaves_an_existing_entry_alone(
        self, journal: CommitJournalPort
    ) -> None:
        """On an existing entry the lease arguments change nothing."""
        entry = create(journal)
        again = journal.create_intent(
            operation_id=entry.operation_id,
            intent_digest=DIGEST,
            metadata={},
            actor=ACTOR,
            lease_owner=OWNER_A,
            lease_ttl_seconds=LONG_TTL,
        )
        assert again == entry
        assert again.lease_owner is None

    def test_lease_arguments_of_create_go_together(self, journal: CommitJournalPort) -> None:
        """An owner without a TTL (or the reverse) is refused before any write."""
        operation_id = new_operation_id()
        with pytest.raises(ValueError, match="together"):
            journal.create_intent(
                operation_id=operation_id,
                intent_digest=DIGEST,
                metadata={},
                actor=ACTOR,
                lease_owner=OWNER_A,
            )
        assert journal.get(operation_id) is None

    def test_cas_can_release_the_lease_in_the_same_write(self, journal: CommitJournalPort) -> None:
        """release_lease ends the lease with the state change; another owner may acquire."""
        entry = leased(journal)
        done = cas(journal, entry, S.PREPARED, release_lease=True)
        assert done.version == entry.version + 1
        assert done.lease_owner is None
        assert done.lease_epoch == entry.lease_epoch
        taken = journal.acquire_lease(
            operation_id=entry.operation_id, owner=OWNER_B, ttl_seconds=LONG_TTL
        )
        assert taken.lease_epoch == entry.lease_epoch + 1

    def test_renew_keeps_version_and_extends_expiry(self, journal: CommitJournalPort) -> None:
        """renew_lease moves the expiry forward and leaves version and epoch alone."""
        entry = leased(journal, ttl=5.0)
        renewed = journal.renew_lease(
            operation_id=entry.operation_id,
            owner=OWNER_A,
            lease_epoch=entry.lease_epoch,
            ttl_seconds=LONG_TTL,
        )
        assert (renewed.version, renewed.lease_epoch, renewed.state) == (
            entry.version,
            entry.lease_epoch,
            entry.state,
        )
        assert entry.lease_expires_at is not None
        assert renewed.lease_expires_at is not None
        assert renewed.lease_expires_at > entry.lease_expires_at + 50
        assert journal.get(entry.operation_id) == renewed
        assert len(journal.history(entry.operation_id)) == 2

    def test_renew_after_takeover_raises_lease_lost(self, journal: CommitJournalPort) -> None:
        """The old owner's renewal after a takeover is LeaseLost and changes nothing."""
        old = leased(journal, ttl=SHORT_TTL)
        time.sleep(SHORT_TTL + 0.15)
        new = journal.acquire_lease(
            operation_id=old.operation_id, owner=OWNER_B, ttl_seconds=LONG_TTL
        )
        with pytest.raises(LeaseLost):
            journal.renew_lease(
                operation_id=old.operation_id,
                owner=OWNER_A,
                lease_epoch=old.lease_epoch,
                ttl_seconds=LONG_TTL,
            )
        assert journal.get(old.operation_id) == new

    def test_renew_with_wrong_epoch_raises_lease_lost(self, journal: CommitJournalPort) -> None:
        """A renewal naming the owner but an old epoch is LeaseLost."""
        entry = leased(journal)
        again = journal.acquire_lease(
            operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=LONG_TTL
        )
        with pytest.raises(LeaseLost):
            journal.renew_lease(
                operation_id=entry.operation_id,
                owner=OWNER_A,
                lease_epoch=entry.lease_epoch,
                ttl_seconds=LONG_TTL,
            )
        assert journal.get(entry.operation_id) == again

    def test_release_lets_another_owner_acquire_at_once(self, journal: CommitJournalPort) -> None:
        """After release_lease another owner acquires immediately, at the next epoch."""
        entry = leased(journal, ttl=LONG_TTL)
        journal.release_lease(
            operation_id=entry.operation_id, owner=OWNER_A, lease_epoch=entry.lease_epoch
        )
        released = journal.get(entry.operation_id)
        assert released is not None
        assert released.version == entry.version
        new = journal.acquire_lease(
            operation_id=entry.operation_id, owner=OWNER_B, ttl_seconds=LONG_TTL
        )
        assert (new.lease_owner, new.lease_epoch) == (OWNER_B, entry.lease_epoch + 1)

    def test_release_by_a_non_holder_does_nothing(self, journal: CommitJournalPort) -> None:
        """release_lease with another owner or an old epoch leaves the live lease in place."""
        entry = leased(journal, ttl=LONG_TTL)
        journal.release_lease(
            operation_id=entry.operation_id, owner=OWNER_B, lease_epoch=entry.lease_epoch
        )
        journal.release_lease(
            operation_id=entry.operation_id, owner=OWNER_A, lease_epoch=entry.lease_epoch - 1
        )
        journal.release_lease(operation_id=new_operation_id(), owner=OWNER_A, lease_epoch=1)
        assert journal.get(entry.operation_id) == entry
        with pytest.raises(LeaseHeld):
            journal.acquire_lease(
                operation_id=entry.operation_id, owner=OWNER_B, ttl_seconds=LONG_TTL
            )

    def test_break_owner_takes_a_live_lease_from_that_holder_only(
        self, journal: CommitJournalPort
    ) -> None:
        """break_owner naming the live holder takes the lease; naming anyone else does not."""
        entry = leased(journal, ttl=LONG_TTL)
        with pytest.raises(LeaseHeld):
            journal.acquire_lease(
                operation_id=entry.operation_id,
                owner=OWNER_B,
                ttl_seconds=LONG_TTL,
                break_owner="somebody-else:1",
            )
        taken = journal.acquire_lease(
            operation_id=entry.operation_id,
            owner=OWNER_B,
            ttl_seconds=LONG_TTL,
            break_owner=OWNER_A,
        )
        assert (taken.lease_owner, taken.lease_epoch) == (OWNER_B, entry.lease_epoch + 1)
        with pytest.raises(LeaseLost):
            journal.renew_lease(
                operation_id=entry.operation_id,
                owner=OWNER_A,
                lease_epoch=entry.lease_epoch,
                ttl_seconds=LONG_TTL,
            )

    def test_renew_from_a_heartbeat_thread(self, journal: CommitJournalPort) -> None:
        """A lease renewed from another thread is visible to the caller's thread."""
        entry = leased(journal, ttl=5.0)
        out: list[JournalEntry | BaseException] = []

        def beat() -> None:
            try:
                out.append(
                    journal.renew_lease(
                        operation_id=entry.operation_id,
                        owner=OWNER_A,
                        lease_epoch=entry.lease_epoch,
                        ttl_seconds=LONG_TTL,
                    )
                )
            except BaseException as exc:  # noqa: BLE001 - the test asserts on it
                out.append(exc)

        thread = threading.Thread(target=beat)
        thread.start()
        thread.join(timeout=30)
        [renewed] = out
        assert isinstance(renewed, JournalEntry)
        assert journal.get(entry.operation_id) == renewed
        assert entry.lease_expires_at is not None
        assert renewed.lease_expires_at is not None
        assert renewed.lease_expires_at > entry.lease_expires_at

    # ------------------------------------------------------------------ listing
    def test_list_by_state_newest_update_first(self, journal: CommitJournalPort) -> None:
        """list_entries filters by state and orders by last update, newest first."""
        a, b, c = (leased(journal) for _ in range(3))
        time.sleep(0.02)
        a = cas(journal, a, S.PREPARED)
        time.sleep(0.02)
        c = cas(journal, c, S.PREPARED)
        mine = {a.operation_id, b.operation_id, c.operation_id}
        prepared = [
            e.operation_id
            for e in journal.list_entries(states=frozenset({S.PREPARED}))
            if e.operation_id in mine
        ]
        assert prepared == [c.operation_id, a.operation_id]
        everything = [e.operation_id for e in journal.list_entries() if e.operation_id in mine]
        assert everything == [c.operation_id, a.operation_id, b.operation_id]
        both = journal.list_entries(states=frozenset({S.PREPARING, S.PREPARED}))
        assert mine <= {e.operation_id for e in both}
        assert journal.list_entries(states=frozenset()) == []

    def test_list_updated_before(self, journal: CommitJournalPort) -> None:
        """list_entries(updated_before=t) returns only entries last written before t."""
        old = create(journal)
        time.sleep(0.02)
        cutoff = journal.now()
        time.sleep(0.02)
        young = create(journal)
        found = {e.operation_id for e in journal.list_entries(updated_before=cutoff)}
        assert old.operation_id in found
        assert young.operation_id not in found
        later = {e.operation_id for e in journal.list_entries(updated_before=journal.now() + 1)}
        assert {old.operation_id, young.operation_id} <= later

    def test_list_limit(self, journal: CommitJournalPort) -> None:
        """list_entries returns at most ``limit`` entries, the newest ones."""
        made = []
        for _ in range(3):
            made.append(create(journal))
            time.sleep(0.005)
        newest = journal.list_entries(limit=2)
        assert [e.operation_id for e in newest] == [made[2].operation_id, made[1].operation_id]

    # ------------------------------------------------------------------ safety of values
    @pytest.mark.parametrize(
        "metadata",
        [
            {"reason": SECRET_DSN},
            {"dsn": "orders"},
            {"row_count": [1, 2]},
            {"reason": "password=hunter2"},
        ],
        ids=["secret-dsn", "unknown-key", "not-a-scalar", "password"],
    )
    def test_unsafe_metadata_is_refused_and_nothing_stored(
        self, journal: CommitJournalPort, metadata: dict[str, object]
    ) -> None:
        """Metadata with a secret, an unknown key or a non-scalar is UnsafeValue; no entry."""
        op = new_operation_id()
        with pytest.raises(UnsafeValue):
            journal.create_intent(
                operation_id=op, intent_digest=DIGEST, metadata=metadata, actor=ACTOR
            )
        assert journal.get(op) is None
        assert journal.history(op) == []

    def test_unsafe_evidence_or_result_is_refused_and_nothing_stored(
        self, journal: CommitJournalPort
    ) -> None:
        """A CAS with secret evidence or result is UnsafeValue and writes nothing."""
        entry = leased(journal)
        rows = journal.history(entry.operation_id)
        with pytest.raises(UnsafeValue):
            cas(journal, entry, S.PREPARED, evidence={"reason": SECRET_DSN})
        with pytest.raises(UnsafeValue):
            cas(journal, entry, S.PREPARED, result={"connection": "orders"})
        with pytest.raises(UnsafeValue):
            cas(journal, entry, S.PREPARED, evidence={"duration_ms": float("nan")})
        assert journal.get(entry.operation_id) == entry
        assert journal.history(entry.operation_id) == rows
        assert not any(SECRET_DSN in repr(row) for row in rows)

    def test_unsafe_audit_request_is_refused(self, journal: CommitJournalPort) -> None:
        """An audit request with a secret in its text is UnsafeValue and nothing is written."""
        entry = drive_to(journal, leased(journal), S.COMMIT_UNKNOWN)
        leaky = AuditRequest(principal="alice", action="mark_committed", reason=SECRET_DSN)
        with pytest.raises(UnsafeValue):
            cas(journal, entry, S.TARGET_COMMITTED, audit=leaky)
        with pytest.raises(UnsafeValue):
            journal.append_audit(
                operation_id=entry.operation_id, request=leaky, outcome="refused", entry=entry
            )
        assert journal.get(entry.operation_id) == entry
        assert journal.audit_log(entry.operation_id) == []

    # ------------------------------------------------------------------ audit
    def test_append_audit_and_audit_log(self, journal: CommitJournalPort) -> None:
        """append_audit records a no-change action; audit_log lists records in order."""
        entry = leased(journal)
        other = leased(journal)
        refused = journal.append_audit(
            operation_id=entry.operation_id,
            request=AuditRequest(
                principal="bob", action="mark_failed", reason="not allowed", attestation="yes"
            ),
            outcome="refused",
            entry=entry,
        )
        assert (refused.before_state, refused.after_state) == (entry.state, entry.state)
        assert (refused.before_version, refused.after_version) == (entry.version, entry.version)
        assert (refused.outcome, refused.attestation) == ("refused", "yes")
        unknown = journal.append_audit(
            operation_id=other.operation_id, request=AUDIT, outcome="refused", entry=None
        )
        assert unknown.before_state is None
        assert unknown.after_version is None
        assert journal.audit_log(entry.operation_id) == [refused]
        everything = journal.audit_log()
        assert [r for r in everything if r in (refused, unknown)] == [refused, unknown]
        assert journal.get(entry.operation_id) == entry
        with pytest.raises(UnsafeValue):
            journal.append_audit(
                operation_id=entry.operation_id, request=AUDIT, outcome="maybe", entry=entry
            )

    def test_now_moves_forward(self, journal: CommitJournalPort) -> None:
        """The journal clock is in epoch seconds and does not go backwards."""
        first = journal.now()
        time.sleep(0.01)
        second = journal.now()
        assert 1.5e9 < first <= second

    def test_close_is_idempotent(self, journal: CommitJournalPort) -> None:
        """close() may be called twice."""
        journal.close()
        journal.close()

    # ------------------------------------------------------------------ races
    def test_thread_race_has_exactly_one_winner_per_version(
        self, journal: CommitJournalPort
    ) -> None:
        """Eight threads CAS from the same version: one wins, the rest get JournalConflict."""
        entry = leased(journal)
        threads = 8
        rounds = 3
        barrier = threading.Barrier(threads)
        outcomes: list[tuple[int, str]] = []
        lock = threading.Lock()

        def racer() -> None:
            for round_no in range(rounds):
                barrier.wait(timeout=RACE_TIMEOUT)
                frm, to = _cycle(round_no)
                try:
                    journal.compare_and_set(
                        operation_id=entry.operation_id,
                        expected_version=entry.version + round_no,
                        expected_states=frozenset({frm}),
                        next_state=to,
                        lease_epoch=entry.lease_epoch,
                        actor=ACTOR,
                    )
                    outcome = "won"
                except JournalConflict:
                    outcome = "lost"
                except Exception as exc:  # noqa: BLE001 - the assertion shows it
                    outcome = f"error: {exc!r}"
                with lock:
                    outcomes.append((round_no, outcome))

        workers = [threading.Thread(target=racer) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=RACE_TIMEOUT)
        for round_no in range(rounds):
            got = sorted(o for r, o in outcomes if r == round_no)
            assert got == ["lost"] * (threads - 1) + ["won"], got
        final = journal.get(entry.operation_id)
        assert final is not None
        assert final.version == entry.version + rounds

    def test_process_race_has_exactly_one_winner_per_version(
        self, journal: CommitJournalPort, race_factory: JournalFactory | None
    ) -> None:
        """Four OS processes CAS from the same version, round after round: one winner each."""
        if race_factory is None:
            pytest.skip("in-process adapter: no other process can open this journal")
        entry = leased(journal)
        outcomes = _race_processes(
            race_factory,
            kind="cas",
            operation_id=entry.operation_id,
            first_version=entry.version,
            lease_epoch=entry.lease_epoch,
            rounds=RACE_ROUNDS,
        )
        assert len(outcomes) == RACERS * RACE_ROUNDS, outcomes
        for round_no in range(RACE_ROUNDS):
            got = sorted(o for _, r, o in outcomes if r == round_no)
            assert got == ["lost"] * (RACERS - 1) + ["won"], (round_no, got)
        final = journal.get(entry.operation_id)
        assert final is not None
        assert final.version == entry.version + RACE_ROUNDS
        assert final.state is _cycle(RACE_ROUNDS - 1)[1]
        history = journal.history(entry.operation_id)
        _assert_history_contiguous(history, last_version=final.version)
        assert len(history) == final.version  # exactly one row per version here

    def test_process_race_for_a_free_lease_has_one_holder(
        self, journal: CommitJournalPort, race_factory: JournalFactory | None
    ) -> None:
        """Four OS processes acquire a free lease at once: one gets it, three get LeaseHeld."""
        if race_factory is None:
            pytest.skip("in-process adapter: no other process can open this journal")
        entry = create(journal)
        outcomes = _race_processes(
            race_factory,
            kind="lease",
            operation_id=entry.operation_id,
            first_version=entry.version,
            lease_epoch=0,
            rounds=1,
        )
        assert sorted(o for _, _, o in outcomes) == ["lost"] * (RACERS - 1) + ["won"], outcomes
        [winner] = [i for i, _, o in outcomes if o == "won"]
        final = journal.get(entry.operation_id)
        assert final is not None
        assert (final.lease_owner, final.lease_epoch, final.version) == (
            f"racer-{winner}",
            1,
            entry.version + 1,
        )
