"""Conformance suite for RunLedgerPort adapters: subclass LedgerConformance, give a ledger.

Usage, beside the journal conformance tests of an adapter::

    class TestSqliteLedger(LedgerConformance):
        @pytest.fixture
        def ledger(self, tmp_path):
            journal = SqliteCommitJournal(tmp_path / "journal.db")
            yield journal
            journal.close()

Every test uses its own idempotency keys, so a ledger shared between tests works too.
"""

from __future__ import annotations

import secrets
import threading

import pytest

from dpone.contracts.run import (
    AttemptState,
    RunError,
    RunStart,
    RunState,
    run_id_for,
)
from dpone.errors import LeaseLost, OperationNotFound, UnsafeValue
from dpone.ports.ledger import RunLedgerPort

__all__ = ["LedgerConformance", "ledger_problems", "new_start"]

OWNER_A = "executor-a:101"
OWNER_B = "executor-b:202"
FAILED = RunError(
    code="DPONE_TARGET_COMMIT_FENCE_UNAVAILABLE", retryability="transient", message="x"
)
CLI = {"kind": "cli", "user": "alice", "host": "h1", "command": "dpone run w.yaml"}


def _digest() -> str:
    return "sha256:" + secrets.token_hex(32)


def new_start(key: str | None = None, **changes: object) -> RunStart:
    """A fresh run's fields under a new (or the given) idempotency key."""
    idempotency_key = key or f"k-{secrets.token_hex(6)}"
    fields: dict[str, object] = {
        "run_id": run_id_for(idempotency_key),
        "idempotency_key": idempotency_key,
        "operation_id": _digest(),
        "request_hash": _digest(),
        "definition_hash": _digest(),
        "access_digest": _digest(),
        "access": {"principal": "alice", "connections": "journal=env:J,target=env:T"},
        "provenance": CLI,
    }
    fields.update(changes)
    return RunStart(**fields)  # type: ignore[arg-type]


class LedgerConformance:
    """The behaviour every run ledger must show; subclasses provide ``ledger``."""

    @pytest.fixture
    def ledger(self) -> RunLedgerPort:  # pragma: no cover - overridden
        raise NotImplementedError

    # ------------------------------------------------------------------ runs
    def test_begin_run_creates_once_and_returns_the_existing_run(
        self, ledger: RunLedgerPort
    ) -> None:
        """A second begin_run with the same key returns the first run unchanged."""
        start = new_start()
        run, created = ledger.begin_run(start)
        assert created
        assert (run.run_id, run.state, run.current_attempt) == (start.run_id, RunState.RUNNING, 0)
        assert dict(run.provenance) == CLI
        other = new_start(start.idempotency_key, provenance={"kind": "api", "caller": "b"})
        again, created_again = ledger.begin_run(other)
        assert not created_again
        assert again.request_hash == start.request_hash
        assert dict(again.provenance) == CLI
        assert ledger.get_run(start.run_id) == again

    def test_secret_looking_provenance_is_refused_and_nothing_is_written(
        self, ledger: RunLedgerPort
    ) -> None:
        """A DSN with a password in provenance never reaches the ledger."""
        start = new_start(provenance={"kind": "cli", "command": "postgresql://u:pw@h/db"})
        with pytest.raises(UnsafeValue):
            ledger.begin_run(start)
        assert ledger.get_run(start.run_id) is None

    def test_unknown_run_reads_as_none_and_refuses_attempts(self, ledger: RunLedgerPort) -> None:
        """No row: get_run is None, begin_attempt and end_attempt raise OperationNotFound."""
        assert ledger.get_run("run-0000000000") is None
        assert ledger.attempts("run-0000000000") == []
        with pytest.raises(OperationNotFound):
            ledger.begin_attempt(run_id="run-0000000000", attempt=1, owner=OWNER_A)
        with pytest.raises(OperationNotFound):
            ledger.end_attempt(run_id="run-0000000000", attempt=0, state=RunState.FAILED)

    def test_list_filters_by_state_newest_first(self, ledger: RunLedgerPort) -> None:
        """list_runs filters by state and lists the newest update first."""
        done, _ = ledger.begin_run(new_start())
        ledger.begin_attempt(run_id=done.run_id, attempt=1, owner=OWNER_A)
        ledger.end_attempt(run_id=done.run_id, attempt=1, state=RunState.COMPLETE)
        stuck, _ = ledger.begin_run(new_start())
        ledger.end_attempt(
            run_id=stuck.run_id,
            attempt=0,
            state=RunState.UNRESOLVED,
            error=RunError(code="DPONE_TARGET_COMMIT_UNKNOWN", retryability="stop", message="?"),
        )
        unresolved = ledger.list_runs(states=frozenset({RunState.UNRESOLVED}))
        assert stuck.run_id in {r.run_id for r in unresolved}
        assert done.run_id not in {r.run_id for r in unresolved}
        listed = [r.run_id for r in ledger.list_runs(limit=1000)]
        assert listed.index(stuck.run_id) < listed.index(done.run_id)
        assert len(ledger.list_runs(limit=1)) == 1
        assert ledger.list_runs(states=frozenset()) == []

    # ------------------------------------------------------------------ attempts
    def test_attempts_advance_and_supersede_older_ones(self, ledger: RunLedgerPort) -> None:
        """A higher attempt becomes current; the older running one is SUPERSEDED."""
        run, _ = ledger.begin_run(new_start())
        first = ledger.begin_attempt(
            run_id=run.run_id, attempt=1, owner=OWNER_A, provenance={"kind": "cli", "user": "a"}
        )
        assert (first.attempt, first.state, first.ended_at) == (1, AttemptState.RUNNING, None)
        assert dict(first.provenance) == {"kind": "cli", "user": "a"}
        ledger.begin_attempt(run_id=run.run_id, attempt=3, owner=OWNER_B)
        rows = {a.attempt: a for a in ledger.attempts(run.run_id)}
        assert rows[1].state is AttemptState.SUPERSEDED
        assert rows[1].ended_at is not None
        assert rows[3].state is AttemptState.RUNNING
        current = ledger.get_run(run.run_id)
        assert current is not None
        assert current.current_attempt == 3

    def test_a_stale_attempt_is_refused_and_changes_nothing(self, ledger: RunLedgerPort) -> None:
        """Attempt numbers are lease epochs: beginning or ending a stale one is refused."""
        run, _ = ledger.begin_run(new_start())
        ledger.begin_attempt(run_id=run.run_id, attempt=1, owner=OWNER_A)
        ledger.begin_attempt(run_id=run.run_id, attempt=2, owner=OWNER_B)
        before = (ledger.get_run(run.run_id), ledger.attempts(run.run_id))
        with pytest.raises(LeaseLost):
            ledger.end_attempt(run_id=run.run_id, attempt=1, state=RunState.COMPLETE)
        with pytest.raises(LeaseLost):
            ledger.begin_attempt(run_id=run.run_id, attempt=1, owner=OWNER_A)
        with pytest.raises(LeaseLost):
            ledger.begin_attempt(run_id=run.run_id, attempt=2, owner=OWNER_A)  # not its owner
        assert (ledger.get_run(run.run_id), ledger.attempts(run.run_id)) == before

    def test_begin_attempt_repeated_by_its_owner_is_idempotent(self, ledger: RunLedgerPort) -> None:
        """A repeated call (a lost reply) returns the same attempt, adding nothing."""
        run, _ = ledger.begin_run(new_start())
        first = ledger.begin_attempt(run_id=run.run_id, attempt=2, owner=OWNER_A)
        again = ledger.begin_attempt(run_id=run.run_id, attempt=2, owner=OWNER_A)
        assert again == first
        assert len(ledger.attempts(run.run_id)) == 1

    def test_end_attempt_records_state_and_error_then_a_new_attempt_clears_it(
        self, ledger: RunLedgerPort
    ) -> None:
        """FAILED with its error; the next attempt puts the run back to RUNNING, no error."""
        run, _ = ledger.begin_run(new_start())
        ledger.begin_attempt(run_id=run.run_id, attempt=1, owner=OWNER_A)
        failed = ledger.end_attempt(
            run_id=run.run_id, attempt=1, state=RunState.FAILED, error=FAILED
        )
        assert (failed.state, failed.error) == (RunState.FAILED, FAILED)
        [row] = ledger.attempts(run.run_id)
        assert (row.state, row.error_code) == (AttemptState.FAILED, FAILED.code)
        assert row.ended_at is not None
        ledger.begin_attempt(run_id=run.run_id, attempt=2, owner=OWNER_A)
        current = ledger.get_run(run.run_id)
        assert current is not None
        assert (current.state, current.error, current.current_attempt) == (
            RunState.RUNNING,
            None,
            2,
        )
        assert ledger.attempts(run.run_id)[0].state is AttemptState.FAILED  # stays as it ended
        done = ledger.end_attempt(run_id=run.run_id, attempt=2, state=RunState.COMPLETE)
        assert done.state is RunState.COMPLETE
        assert [a.state for a in ledger.attempts(run.run_id)] == [
            AttemptState.FAILED,
            AttemptState.COMPLETE,
        ]

    def test_failure_before_any_lease_ends_attempt_zero(self, ledger: RunLedgerPort) -> None:
        """A run that failed before any lease (attempt 0) records the failure, no attempt row."""
        run, _ = ledger.begin_run(new_start())
        ended = ledger.end_attempt(
            run_id=run.run_id, attempt=0, state=RunState.FAILED, error=FAILED
        )
        assert (ended.state, ended.current_attempt) == (RunState.FAILED, 0)
        assert ledger.attempts(run.run_id) == []

    def test_concurrent_begin_run_creates_exactly_one(self, ledger: RunLedgerPort) -> None:
        """Four threads record the same key at once: exactly one creates the run."""
        start = new_start()
        created: list[bool] = []
        errors: list[BaseException] = []
        gate = threading.Barrier(4)

        def racer() -> None:
            try:
                gate.wait()
                created.append(ledger.begin_run(start)[1])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=racer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert sorted(created) == [False, False, False, True]


def ledger_problems(ledger: RunLedgerPort, *, operation_id: str, journal_epoch: int) -> list[str]:
    """Return how the ledger disagrees with a COMPLETE operation (empty when it tells the truth).

    Truthful: one run for the operation, COMPLETE; attempt numbers strictly increase and
    never exceed the journal's lease epoch (they are epochs); no attempt is left RUNNING;
    exactly one attempt is COMPLETE and it is the run's current (last) one.
    """
    runs = [r for r in ledger.list_runs(limit=10_000) if r.operation_id == operation_id]
    if len(runs) != 1:
        return [f"expected one run of the operation, found {len(runs)}"]
    [run] = runs
    problems: list[str] = []
    if run.state is not RunState.COMPLETE:
        problems.append(f"run is {run.state.value}, the operation is COMPLETE")
    attempts = ledger.attempts(run.run_id)
    numbers = [a.attempt for a in attempts]
    if numbers != sorted(set(numbers)):
        problems.append(f"attempt numbers do not increase: {numbers}")
    if run.current_attempt > journal_epoch or any(n > journal_epoch for n in numbers):
        problems.append(f"attempt above the journal's lease epoch {journal_epoch}: {numbers}")
    if not attempts:
        problems.append("no attempt recorded")
        return problems
    if attempts[-1].attempt != run.current_attempt:
        problems.append(f"current attempt {run.current_attempt} is not the last {numbers[-1]}")
    states = [a.state for a in attempts]
    if AttemptState.RUNNING in states:
        problems.append(f"an attempt is left RUNNING: {states}")
    if states.count(AttemptState.COMPLETE) != 1 or states[-1] is not AttemptState.COMPLETE:
        problems.append(f"exactly the last attempt must be COMPLETE: {states}")
    return problems
