"""The run algorithm on the in-memory journal and connector: every resume path."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest

from dpone.adapters.journal.memory import InMemoryCommitJournal
from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
)
from dpone.contracts.identity import parse_interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy, MutationReport
from dpone.contracts.states import CommitState
from dpone.errors import (
    CommittedIncomplete,
    CommitUnknown,
    InjectedFault,
    IntentConflict,
    JournalUnavailable,
    LeaseHeld,
    RecoveryConflict,
)
from dpone.runtime import failpoints
from dpone.runtime.commit_protocol import CommitProtocol, OperationSpec
from dpone.testing.memory import InMemoryConnector, ListSource

S = CommitState
COLUMNS = (Column(name="id", type=ColumnType.INTEGER), Column(name="v", type=ColumnType.TEXT))
ROWS = [(i, f"v{i}") for i in range(25)]
OP = "sha256:" + "a" * 64


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    failpoints.configure(None)
    yield
    failpoints.configure(None)


def spec(intent: str = "sha256:" + "1" * 64, source: ListSource | None = None) -> OperationSpec:
    src = source or ListSource(COLUMNS, ROWS)
    return OperationSpec(
        operation_id=OP,
        intent_digest=intent,
        metadata={"workload_id": "w"},
        plan=LoadPlan(
            table="t",
            strategy=LoadStrategy.APPEND,
            columns=COLUMNS,
            interval=parse_interval("2026-11-01/2026-11-02"),
        ),
        source_identity=src.snapshot_identity(),
        batch_size=10,
        lease_ttl_seconds=30,
    )


class World:
    """One journal, one target, and a way to make executors."""

    def __init__(self) -> None:
        self.journal = InMemoryCommitJournal()
        self.target = InMemoryConnector()
        self.source = ListSource(COLUMNS, ROWS)

    def executor(self, owner: str = "host:1:1", connector: object | None = None) -> CommitProtocol:
        return CommitProtocol(
            journal=self.journal,
            connector=connector or self.target.sibling(),  # type: ignore[arg-type]
            source=self.source,
            owner=owner,
        )

    def state(self) -> CommitState:
        entry = self.journal.get(OP)
        assert entry is not None
        return entry.state


@pytest.fixture
def world() -> World:
    return World()


def test_first_run_writes_once_and_completes(world: World) -> None:
    """A first attempt walks PREPARING -> COMMITTING -> COMPLETE and writes every row."""
    result = world.executor().run(spec())
    assert result.state is S.COMPLETE
    assert result.rows_written == len(ROWS)
    assert not result.replayed
    assert len(world.target.rows()) == len(ROWS)
    steps = [(t.from_state, t.to_state) for t in world.journal.history(OP) if t.kind != "lease"]
    assert steps == [
        (None, S.PREPARING),
        (S.PREPARING, S.PREPARED),
        (S.PREPARED, S.COMMITTING),
        (S.COMMITTING, S.TARGET_COMMITTED),
        (S.TARGET_COMMITTED, S.COMPLETE),
    ]


def test_replay_returns_recorded_result_without_writing(world: World) -> None:
    """Running a COMPLETE operation again returns its result and touches nothing."""
    first = world.executor().run(spec())
    version = world.journal.get(OP).version  # type: ignore[union-attr]
    again = world.executor("host:2:2").run(spec())
    assert again.replayed
    assert again.rows_written == first.rows_written
    assert len(world.target.rows()) == len(ROWS)
    assert world.journal.get(OP).version == version  # type: ignore[union-attr]


def test_intent_conflict_before_any_target_io(world: World) -> None:
    """Another intent under the same id fails and the target is untouched."""
    world.executor().run(spec())
    with pytest.raises(IntentConflict) as caught:
        world.executor().run(spec(intent="sha256:" + "2" * 64))
    assert caught.value.operation_id == OP
    assert len(world.target.rows()) == len(ROWS)


@pytest.mark.parametrize(
    ("point", "left_in"),
    [
        ("after:journal.create", S.PREPARING),
        ("after:COMMITTING", S.COMMITTING),
        ("before:fence.mutate", S.COMMITTING),
        ("after:fence.mutate", S.COMMITTING),
        ("before:fence.observe", S.COMMITTING),
        ("before:COMPLETE", None),
    ],
)
def test_failure_at_each_point_resumes_to_exactly_once(
    world: World, point: str, left_in: CommitState | None
) -> None:
    """A fault anywhere leaves a resumable state; the retry ends COMPLETE, rows once."""
    failpoints.configure(f"{point}=raise")
    with pytest.raises((InjectedFault, CommittedIncomplete)):
        world.executor().run(spec())
    if left_in is not None:
        assert world.state() is left_in
    failpoints.configure(None)
    result = world.executor("host:2:2").run(spec())
    assert result.state is S.COMPLETE
    assert len(world.target.rows()) == len(ROWS)
    assert sorted(r["id"] for r in world.target.rows()) == list(range(len(ROWS)))


def test_failure_inside_the_transaction_is_settled_as_failed_pre_commit(world: World) -> None:
    """A write that rolls back is proven absent by seal and recorded FAILED_PRE_COMMIT."""
    failpoints.configure("fence.mutate.before_commit=raise")
    with pytest.raises(InjectedFault):
        world.executor().run(spec())
    assert world.state() is S.FAILED_PRE_COMMIT
    assert world.target.rows() == []
    failpoints.configure(None)
    assert world.executor().run(spec()).rows_written == len(ROWS)
    assert len(world.target.rows()) == len(ROWS)


def test_completion_failure_falls_back_to_target_committed(world: World) -> None:
    """If the COMPLETE fold fails once, TARGET_COMMITTED is recorded and COMPLETE follows."""
    failpoints.configure("before:COMPLETE=raise@1")
    result = world.executor().run(spec())
    assert result.state is S.COMPLETE
    kinds = [t.to_state for t in world.journal.history(OP)]
    assert S.TARGET_COMMITTED in kinds


def test_persistent_completion_failure_is_committed_incomplete(world: World) -> None:
    """If COMPLETE keeps failing the run says COMMITTED_INCOMPLETE; a rerun only completes."""
    failpoints.configure("before:COMPLETE=raise")
    with pytest.raises(CommittedIncomplete) as caught:
        world.executor().run(spec())
    assert caught.value.retryable
    assert world.state() is S.COMMITTED_INCOMPLETE
    failpoints.configure(None)
    result = world.executor().run(spec())
    assert result.state is S.COMPLETE
    assert result.resumed
    assert len(world.target.rows()) == len(ROWS)


def test_live_lease_blocks_a_second_executor(world: World) -> None:
    """While one executor holds the lease another gets LeaseHeld and writes nothing."""
    world.journal.create_intent(
        operation_id=OP, intent_digest=spec().intent_digest, metadata={}, actor="a"
    )
    world.journal.acquire_lease(operation_id=OP, owner="otherhost:1:1", ttl_seconds=30)
    with pytest.raises(LeaseHeld):
        world.executor().run(spec())
    assert world.target.rows() == []


def test_stale_executor_is_fenced_and_newer_one_wins(world: World) -> None:
    """An executor whose epoch was superseded cannot write: exactly one mutation lands."""
    s = spec()
    world.journal.create_intent(
        operation_id=OP, intent_digest=s.intent_digest, metadata={}, actor="a"
    )
    old = world.journal.acquire_lease(operation_id=OP, owner="a", ttl_seconds=30)
    world.target.prepare(operation_id=OP, intent_digest=s.intent_digest, epoch=old.lease_epoch)
    # a newer executor seals the fence at a higher epoch (e.g. after A's lease expired)
    world.target.seal(operation_id=OP, epoch=old.lease_epoch + 5)
    from dpone.errors import FencedOut

    with pytest.raises(FencedOut):
        world.target.mutate(
            operation_id=OP,
            intent_digest=s.intent_digest,
            epoch=old.lease_epoch,
            plan=s.plan,
            batches=[ROWS],
            content_digest="d",
        )
    assert world.target.rows() == []


def test_committed_fence_with_unchanged_entry_is_a_recovery_conflict(world: World) -> None:
    """A fence that says committed while the journal is pre-commit at our epoch: stop."""
    s = spec()
    # the target has a commit for this operation that the journal never heard of
    world.target.prepare(operation_id=OP, intent_digest=s.intent_digest, epoch=50)
    world.target.mutate(
        operation_id=OP,
        intent_digest=s.intent_digest,
        epoch=50,
        plan=s.plan,
        batches=[ROWS],
        content_digest="d",
    )
    with pytest.raises(RecoveryConflict) as caught:
        world.executor().run(s)
    assert caught.value.recovery_ref
    assert OP in caught.value.recovery_ref
    assert len(world.target.rows()) == len(ROWS)


class NoProofConnector(InMemoryConnector):
    """A capability-none connector: it writes but can prove nothing afterwards."""

    @property
    def capability(self) -> FenceCapability:
        return FenceCapability.NONE

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        return FenceObservation(status=FenceStatus.UNKNOWN)

    def mutate(self, **kwargs: object) -> MutationReport:  # type: ignore[override]
        batches = kwargs["batches"]
        count = sum(len(b) for b in batches)  # type: ignore[attr-defined]
        self.written = getattr(self, "written", 0) + count
        return MutationReport(row_count=count, content_digest=str(kwargs["content_digest"]))

    def observe(self, *, operation_id: str) -> FenceObservation:
        return FenceObservation(status=FenceStatus.UNKNOWN)

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        return SealResult(
            outcome=SealOutcome.UNKNOWN, observation=FenceObservation(status=FenceStatus.UNKNOWN)
        )


def test_capability_none_crash_after_committing_is_commit_unknown(world: World) -> None:
    """On a route that cannot prove anything, a retry after COMMITTING stops and writes nothing."""
    connector = NoProofConnector()
    failpoints.configure("after:fence.mutate=raise")
    with pytest.raises(InjectedFault):
        world.executor(connector=connector).run(spec())
    failpoints.configure(None)
    with pytest.raises(CommitUnknown) as caught:
        world.executor(connector=connector).run(spec())
    assert world.state() is S.COMMIT_UNKNOWN
    assert connector.written == len(ROWS)  # the retry wrote nothing
    assert not caught.value.retryable
    with pytest.raises(CommitUnknown):  # and keeps stopping
        world.executor(connector=connector).run(spec())
    assert connector.written == len(ROWS)


def test_capability_none_clean_run_completes(world: World) -> None:
    """Without a crash the in-process acknowledgement completes the operation."""
    connector = NoProofConnector()
    assert world.executor(connector=connector).run(spec()).state is S.COMPLETE


class FlakyJournal(InMemoryCommitJournal):
    """A journal that becomes unavailable for writes after the target committed."""

    broken = False

    def compare_and_set(self, **kwargs: object):  # type: ignore[no-untyped-def,override]
        if self.broken:
            raise JournalUnavailable("journal down")
        return super().compare_and_set(**kwargs)  # type: ignore[arg-type]


def test_secondary_failures_never_replace_the_primary_outcome(world: World) -> None:
    """Journal down after the commit: COMMITTED_INCOMPLETE (the truth), not the secondary error."""
    journal = FlakyJournal()
    target = InMemoryConnector()
    protocol = CommitProtocol(journal=journal, connector=target, source=world.source, owner="x")
    failpoints.configure("after:fence.mutate=sleep(0)")
    original = target.mutate

    def mutate_then_break(**kwargs: object) -> MutationReport:
        report = original(**kwargs)  # type: ignore[arg-type]
        journal.broken = True
        return report

    target.mutate = mutate_then_break  # type: ignore[method-assign]
    with pytest.raises(CommittedIncomplete) as caught:
        protocol.run(spec())
    assert isinstance(caught.value.__cause__, JournalUnavailable)
    journal.broken = False
    target.mutate = original  # type: ignore[method-assign]
    result = protocol.run(spec())
    assert result.state is S.COMPLETE
    assert len(target.rows()) == len(ROWS)


def test_source_changed_while_read_rolls_back(world: World) -> None:
    """If the source content changes under the operation the write rolls back."""
    s = spec()
    world.source.rows.append((999, "late"))
    with pytest.raises(Exception, match="changed"):
        world.executor().run(s)
    assert world.target.rows() == []


def test_stale_caller_rereads_and_never_writes_twice(world: World) -> None:
    """A overtaken mid-write by B: A's write is fenced, A re-reads, sees COMPLETE, replays."""
    s = spec()
    a_owner, calls = "host-a:1:1", []

    class Overtaken(InMemoryConnector):
        def mutate(self, **kwargs: object) -> MutationReport:  # type: ignore[override]
            if not calls:
                calls.append("b")
                # B takes the lease from A (as after A's lease expired) and finishes the job
                world.journal.acquire_lease(
                    operation_id=OP, owner="host-b:2:2", ttl_seconds=30, break_owner=a_owner
                )
                b = CommitProtocol(
                    journal=world.journal,
                    connector=world.target.sibling(),
                    source=world.source,
                    owner="host-b:2:2",
                )
                assert b.run(s).state is S.COMPLETE
            return super().mutate(**kwargs)  # type: ignore[arg-type]

    a_connector = Overtaken(store=world.target._store)
    result = world.executor(a_owner, connector=a_connector).run(s)
    assert result.state is S.COMPLETE
    assert result.replayed
    assert len(world.target.rows()) == len(ROWS)
    history = world.journal.history(OP)
    epochs = {t.lease_epoch for t in history if t.to_state is S.COMPLETE and t.kind != "lease"}
    assert epochs == {3}  # completed by B at its own epoch, never by A
    assert history[-1].to_state is S.COMPLETE
    assert history[-1].kind != "lease"  # A's restart saw COMPLETE and took no lease


def test_happy_path_writes_the_journal_three_times_and_ends_the_lease(world: World) -> None:
    """Forward mode: create+lease, COMMITTING, COMPLETE (ADR 0002); the lease ends with it."""
    world.executor().run(spec())
    entry = world.journal.get(OP)
    assert entry is not None
    assert entry.version == 3
    assert entry.lease_owner is None
    assert len({t.version for t in world.journal.history(OP)}) == 3


def test_stale_first_attempt_restarts_and_replays(world: World) -> None:
    """A first attempt overtaken between create and COMMITTING ends in a replay, not an error."""
    import threading

    s = msgspec.structs.replace(spec(), lease_ttl_seconds=0.05)
    failpoints.configure("after:journal.create=sleep(0.3)")
    results = {}

    def b() -> None:
        deadline = time.monotonic() + 10
        while world.journal.get(OP) is None:  # until A has created the entry
            if time.monotonic() > deadline:
                return  # reported below: B never ran
            time.sleep(0.005)
        time.sleep(0.1)  # A sleeps after the create; its lease (50 ms) has expired
        results["b"] = world.executor("host-b:2:2").run(s)

    other = threading.Thread(target=b)
    other.start()
    a = world.executor("host-a:1:1").run(s)
    other.join()
    assert "b" in results, "A never created the entry within 10 s"
    assert results["b"].state is S.COMPLETE
    assert not results["b"].replayed
    assert a.state is S.COMPLETE
    assert a.replayed
    assert len(world.target.rows()) == len(ROWS)


class ReportingConnector(InMemoryConnector):
    """Reports the fence row its commit left (``MutationReport.committed``); counts reads.

    ``tamper`` rewrites the reported row, to show the protocol does not take a row that
    is not the commit at its own epoch and intent as proof.
    """

    def __init__(self, world: World, tamper: dict[str, object] | None = None) -> None:
        super().__init__(store=world.target._store)  # the same target
        self.observed = 0
        self.tamper = tamper or {}

    def mutate(self, **kwargs: object) -> MutationReport:  # type: ignore[override]
        report = super().mutate(**kwargs)  # type: ignore[arg-type]
        committed = super().observe(operation_id=str(kwargs["operation_id"]))
        return msgspec.structs.replace(
            report,
            committed=msgspec.structs.replace(committed, **self.tamper),  # type: ignore[arg-type]
        )

    def observe(self, *, operation_id: str) -> FenceObservation:
        self.observed += 1
        return super().observe(operation_id=operation_id)


def test_a_reported_commit_needs_no_fence_read(world: World) -> None:
    """ADR 0013: the acknowledged commit's own fence row proves it; COMPLETE as before."""
    connector = ReportingConnector(world)
    failpoints.configure("before:fence.observe=raise")  # any read would fail the run
    result = world.executor(connector=connector).run(spec())
    assert (result.state, result.rows_written, connector.observed) == (S.COMPLETE, len(ROWS), 0)
    [*_, complete] = world.journal.history(OP)
    assert dict(complete.evidence) == {
        "fence_state": "committed",
        "fence_epoch": 1,
        "row_count": len(ROWS),
    }


@pytest.mark.parametrize(
    "tamper",
    [
        {"epoch": 7},
        {"status": FenceStatus.PREPARED},
        {"intent_digest": "sha256:" + "9" * 64},
        {"row_count": len(ROWS) + 1},
        {"content_digest": "sha256:" + "8" * 64},
    ],
)
def test_a_reported_row_that_is_not_our_commit_is_checked_by_a_read(
    world: World, tamper: dict[str, object]
) -> None:
    """Another epoch, state, intent, count or digest in the report is no proof: the
    fence is read."""
    connector = ReportingConnector(world, tamper)
    result = world.executor(connector=connector).run(spec())
    assert (result.state, connector.observed) == (S.COMPLETE, 1)
    assert len(world.target.rows()) == len(ROWS)


def test_a_failed_mutate_still_settles_by_the_fence(world: World) -> None:
    """No report (the write raised): the outcome is proven by seal, as before."""
    connector = ReportingConnector(world)
    failpoints.configure("fence.mutate.before_commit=raise")
    with pytest.raises(InjectedFault):
        world.executor(connector=connector).run(spec())
    assert world.state() is S.FAILED_PRE_COMMIT
    assert world.target.rows() == []
