"""The run ledger around the protocol, on the in-memory journal and connector."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import stamina

from dpone.adapters.journal.memory import InMemoryCommitJournal
from dpone.contracts.journal import JournalEntry
from dpone.contracts.run import (
    AccessContext,
    AirflowProvenance,
    ApiProvenance,
    AttemptState,
    CliProvenance,
    RunStart,
    RunState,
    check_idempotency_key,
    run_id_for,
)
from dpone.errors import ConfigInvalid, FenceUnavailable, JournalUnavailable, UnsafeValue
from dpone.runtime import failpoints
from dpone.runtime.commit_protocol import CommitProtocol
from dpone.runtime.retry import RetryPolicy
from dpone.runtime.run import RunRequest, RunService
from dpone.testing.memory import InMemoryConnector, ListSource
from tests.unit.test_runtime import COLUMNS, OP, ROWS, spec

REQUEST = RunRequest(
    request_hash="sha256:" + "3" * 64,
    definition_hash="sha256:" + "4" * 64,
    provenance=AirflowProvenance(dag_id="d", run_id="r", task_id="t", try_number=2).record(),
    access=AccessContext(principal="airflow:d", connections=("journal=env:J", "target=env:T")),
)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    failpoints.configure(None)
    with stamina.set_testing(True, attempts=100, cap=True):
        yield
    failpoints.configure(None)


class FlakyLedger(InMemoryCommitJournal):
    """A journal whose ledger end write fails once (the journal went away after COMPLETE)."""

    fail_end = 1

    def end_attempt(self, **kwargs: object) -> object:  # type: ignore[override]
        if self.fail_end:
            self.fail_end -= 1
            raise JournalUnavailable("gone")
        return super().end_attempt(**kwargs)  # type: ignore[arg-type]


def _factory(
    journal: InMemoryCommitJournal, target: InMemoryConnector
) -> Callable[[Callable[[JournalEntry], None]], CommitProtocol]:
    def make(on_attempt: Callable[[JournalEntry], None]) -> CommitProtocol:
        return CommitProtocol(
            journal=journal,
            connector=target.sibling(),  # type: ignore[arg-type]
            source=ListSource(COLUMNS, ROWS),
            owner="host:1:1",
            on_attempt=on_attempt,
        )

    return make


def test_a_run_and_its_airflow_provenance_are_recorded_before_the_write() -> None:
    """The run row exists when the first attempt begins; provenance is the Airflow try."""
    journal, target = InMemoryCommitJournal(), InMemoryConnector()
    seen: list[object] = []
    make = _factory(journal, target)

    def spying(on_attempt: Callable[[JournalEntry], None]) -> CommitProtocol:
        def record(entry: JournalEntry) -> None:
            seen.append(journal.get_run(run_id_for(f"op:{OP}")))
            on_attempt(entry)

        return make(record)

    result = RunService(ledger=journal, owner="host:1:1").run(REQUEST, spec(), spying)
    assert seen
    assert seen[0] is not None
    run = journal.get_run(result.run_id or "")
    assert run is not None
    assert dict(run.provenance)["try_number"] == 2
    assert run.access_digest == REQUEST.access.digest()
    assert "secret" not in str(dict(run.access))
    assert len(target.rows()) == len(ROWS)


def test_a_ledger_failure_after_complete_never_replaces_the_result() -> None:
    """The target committed and the journal is COMPLETE: the result stands; a replay fixes it."""
    journal, target = FlakyLedger(), InMemoryConnector()
    service = RunService(ledger=journal, owner="host:1:1")
    result = service.run(REQUEST, spec(), _factory(journal, target))
    assert result.rows_written == len(ROWS)
    run = journal.get_run(result.run_id or "")
    assert run is not None
    assert run.state is RunState.RUNNING  # the end was not recorded
    again = service.run(REQUEST, spec(), _factory(journal, target))
    assert again.replayed
    run = journal.get_run(result.run_id or "")
    assert run is not None
    assert run.state is RunState.COMPLETE
    assert [a.state for a in journal.attempts(run.run_id)] == [AttemptState.COMPLETE]
    assert len(target.rows()) == len(ROWS)


def test_retries_are_new_attempts_of_one_run() -> None:
    """A transient fence failure retried twice: attempts 1, 2 FAILED, 3 COMPLETE, one write."""
    journal, target = InMemoryCommitJournal(), InMemoryConnector()
    failures = [2]

    def make(on_attempt: Callable[[JournalEntry], None]) -> CommitProtocol:
        def flaky(entry: JournalEntry) -> None:
            on_attempt(entry)
            if failures[0]:
                failures[0] -= 1
                raise FenceUnavailable("fence locked")

        return _factory(journal, target)(flaky)

    service = RunService(ledger=journal, owner="host:1:1", retry=RetryPolicy(attempts=4))
    result = service.run(REQUEST, spec(), make)
    assert result.attempt == 3
    assert [(a.attempt, a.state) for a in journal.attempts(result.run_id or "")] == [
        (1, AttemptState.FAILED),
        (2, AttemptState.FAILED),
        (3, AttemptState.COMPLETE),
    ]
    assert len(target.rows()) == len(ROWS)


def test_provenance_and_keys_refuse_secrets() -> None:
    """A secret-looking command is redacted; a secret key or connection name is refused."""
    cli = CliProvenance(user="u", host="h", command="dpone run --x postgresql://u:pw@h/db")
    assert dict(cli.record())["command"] == "dpone run <redacted>"
    with pytest.raises(UnsafeValue):
        ApiProvenance(caller="password=hunter2").record()
    with pytest.raises(ConfigInvalid):
        AccessContext(principal="p", connections=("target=postgresql://u:pw@h/db",))
    for bad in ("", "x" * 300, "token=abc", "a\nb"):
        with pytest.raises(ConfigInvalid):
            check_idempotency_key(bad)
    assert check_idempotency_key("nightly-2026-11-01") == "nightly-2026-11-01"
    assert run_id_for("k") == run_id_for("k") != run_id_for("k2")


def test_a_failure_before_any_lease_never_ends_another_executors_attempt() -> None:
    """B's attempt is in flight; A's replay fails before a lease: B's attempt stays B's."""
    journal, target = InMemoryCommitJournal(), InMemoryConnector()
    service = RunService(ledger=journal, owner="host:2:2")
    key = f"op:{OP}"
    run_b, _ = journal.begin_run(
        RunStart(
            run_id=run_id_for(key),
            idempotency_key=key,
            operation_id=OP,
            request_hash=REQUEST.request_hash,
            definition_hash=REQUEST.definition_hash,
            access_digest=REQUEST.access.digest(),
            access=REQUEST.access.record(),
            provenance=REQUEST.provenance,
        )
    )
    journal.begin_attempt(run_id=run_b.run_id, attempt=1, owner="host:1:1", provenance=None)

    class Unreachable:
        def run(self, _spec: object) -> None:
            raise JournalUnavailable("A's own connection dropped before any lease")

        def confirm_birth(self) -> None:
            """No birth was sent ahead (ADR 0021)."""

    with pytest.raises(JournalUnavailable):
        service.run(REQUEST, spec(), lambda _on_attempt: Unreachable())  # type: ignore[arg-type,return-value]
    run = journal.get_run(run_b.run_id)
    assert run is not None
    assert (run.state, run.current_attempt, run.error) == (RunState.RUNNING, 1, None)
    [attempt] = journal.attempts(run_b.run_id)
    assert (attempt.owner, attempt.state) == ("host:1:1", AttemptState.RUNNING)
    # B finishes its attempt and records it as its own
    journal.end_attempt(run_id=run_b.run_id, attempt=1, state=RunState.COMPLETE, error=None)
    assert [a.state for a in journal.attempts(run_b.run_id)] == [AttemptState.COMPLETE]
    assert target.rows() == []
