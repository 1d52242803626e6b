"""Forward mode's proven COMPLETE, written behind the caller (ADR 0017), on real PostgreSQL.

A Runner's forward first attempt sends its COMPLETE and returns; the journal reads the
answer before anything that could depend on it. A COMPLETE that does not land leaves the
entry COMMITTING, a warning names the operation, and the next run of that operation
completes it from the fence: every row exactly once, the run ledger as the journal says.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.adapters.journal.postgres import PostgresCommitJournal
from dpone.api import Runner
from dpone.config.workload import replace
from dpone.contracts.states import CommitState
from dpone.testing.crash import check_history
from dpone.testing.ledger_conformance import ledger_problems
from tests.integration.test_postgres_small_ops import _csv, _workload

INTERVAL = "2026-11-01/2026-11-02"


@pytest.fixture
def forward(tmp_path: Path, pg_available: str, pg_schema: str) -> Any:
    for i in range(4):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    journal = pg_available.rsplit("/", 1)[0] + "/postgres"
    workload = _workload(tmp_path, pg_available, pg_schema, journal=journal)
    yield replace(workload, lease_ttl_seconds=1.0), journal
    with psycopg.connect(journal, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


def _rows(dsn: str, schema: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT order_id FROM "{schema}".orders ORDER BY 1').fetchall()
    return [r[0] for r in rows]


def _states(journal: str, schema: str, results: list[Any]) -> list[str]:
    store = PostgresCommitJournal(journal, schema=schema)
    try:
        return [store.get(r.operation_id).state.value for r in results]  # type: ignore[union-attr]
    finally:
        store.close()


def _slow_complete(journal: str, schema: str, seconds: float) -> None:
    """Make every COMPLETE take ``seconds`` on the journal's server (a trigger)."""
    s = f'"{schema}"'
    with psycopg.connect(journal, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {s}.slow_complete() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN IF NEW.state = 'COMPLETE' THEN PERFORM pg_sleep({seconds}); END IF; "
            "RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER slow_complete BEFORE UPDATE ON {s}.dpone_journal "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.slow_complete()"
        )


def _journal_of(runner: Runner) -> PostgresCommitJournal:
    journal = runner._relational.journal  # type: ignore[union-attr]
    assert isinstance(journal, PostgresCommitJournal)
    return journal


def test_a_pending_complete_is_read_before_the_same_operation_is_looked_up(
    forward: Any, pg_available: str, pg_schema: str
) -> None:
    """run() returns while its COMPLETE still runs on the server (held there 0.8 s); a
    replay right behind it waits for that answer and finds COMPLETE, never its own
    COMMITTING (which would be LeaseHeld: the lease is the finished attempt's)."""
    workload, journal = forward
    with Runner(workload) as runner:
        runner.run(interval=INTERVAL, partition="2")  # the tables; the plan is checked
        assert _journal_of(runner).completes_behind
        _slow_complete(journal, pg_schema, 0.8)
        started = time.monotonic()
        first = runner.run(interval=INTERVAL, partition="0")
        returned = time.monotonic() - started
        again = runner.run(interval=INTERVAL, partition="0")  # the COMPLETE is still unread
        replayed = time.monotonic() - started
        other = runner.run(interval=INTERVAL, partition="1")
    assert returned < 0.6, returned  # not waiting for its COMPLETE
    assert replayed > 0.75, replayed  # the replay waited for it
    assert (first.replayed, first.journal_version, first.state) == (False, 3, CommitState.COMPLETE)
    assert (again.replayed, again.journal_version) == (True, 3)
    assert not other.replayed
    assert _states(journal, pg_schema, [first, other]) == ["COMPLETE", "COMPLETE"]
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        for result in (first, other):
            entry = store.get(result.operation_id)
            assert entry is not None
            assert entry.result is not None
            assert entry.result["rows_written"] == 3
            assert entry.lease_owner is None
            assert check_history(store.history(result.operation_id)) == []
            problems = ledger_problems(store, operation_id=result.operation_id, journal_epoch=1)
            assert problems == [], problems
    finally:
        store.close()
    assert _rows(pg_available, pg_schema) == [0, 1, 2, 10, 11, 12, 20, 21, 22]


def test_a_complete_sent_on_a_lost_session_is_made_again(
    forward: Any, pg_available: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends the session a COMPLETE was sent on while it runs there (held by a
    slow trigger), so neither the write nor its answer survives: reading the answer finds
    the session lost and makes the same COMPLETE again on a pooled session. No warning,
    every entry COMPLETE, every row once, a run ledger that agrees."""
    workload, journal = forward
    with caplog.at_level(logging.WARNING, logger="dpone"):
        with Runner(workload) as runner:
            done = [runner.run(interval=INTERVAL, partition="0")]
            _slow_complete(journal, pg_schema, 30)
            done.append(runner.run(interval=INTERVAL, partition="1"))  # its COMPLETE waits
            behind = _journal_of(runner)._behind_pipe.connection
            assert behind is not None
            pid = behind.info.backend_pid
            with psycopg.connect(journal, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                while admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone() != (0,):
                    time.sleep(0.05)
                admin.execute(f'DROP TRIGGER slow_complete ON "{pg_schema}".dpone_journal')
            assert _states(journal, pg_schema, done) == ["COMPLETE", "COMMITTING"]
        # closing the Runner read the lost answer and made the COMPLETE again
        assert [r.getMessage() for r in caplog.records if "COMPLETE" in r.getMessage()] == []
    assert _states(journal, pg_schema, done) == ["COMPLETE", "COMPLETE"]
    assert len(_rows(pg_available, pg_schema)) == 6
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        for result in done:
            problems = ledger_problems(store, operation_id=result.operation_id, journal_epoch=1)
            assert problems == [], problems
    finally:
        store.close()


def test_a_complete_that_does_not_land_is_finished_by_the_next_run(
    forward: Any, pg_available: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal refuses COMPLETE (a trigger): the runs still return their committed rows,
    the refusal is a warning naming the operation and no later call fails; the entries stay
    COMMITTING, and rerunning them completes each from its fence with nothing written twice.
    """
    workload, journal = forward
    s = f'"{pg_schema}"'
    with Runner(workload) as runner:
        runner.run(interval=INTERVAL, partition="0")  # the journal's tables exist
        with psycopg.connect(journal, autocommit=True) as conn:
            conn.execute(
                f"CREATE FUNCTION {s}.refuse_complete() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN IF NEW.state = 'COMPLETE' THEN RAISE EXCEPTION 'no COMPLETE today'; "
                "END IF; RETURN NEW; END $$"
            )
            conn.execute(
                f"CREATE TRIGGER refuse_complete BEFORE UPDATE ON {s}.dpone_journal "
                f"FOR EACH ROW EXECUTE FUNCTION {s}.refuse_complete()"
            )
        with caplog.at_level(logging.WARNING, logger="dpone"):
            lost = [runner.run(interval=INTERVAL, partition=str(i)) for i in (1, 2)]
            assert [r.rows_written for r in lost] == [3, 3]
            warned = [
                r.getMessage()
                for r in caplog.records
                if "did not record COMPLETE" in r.getMessage()
            ]
            # the first's answer was read before the second's COMPLETE was sent
            assert len(warned) == 1, warned
            assert lost[0].operation_id in warned[0], warned
        with caplog.at_level(logging.WARNING, logger="dpone"):
            runner.close()  # reads the second's answer
        warned = [
            r.getMessage() for r in caplog.records if "did not record COMPLETE" in r.getMessage()
        ]
        assert len(warned) == 2, warned
        assert lost[1].operation_id in warned[1], warned
    assert _states(journal, pg_schema, lost) == ["COMMITTING", "COMMITTING"]
    with psycopg.connect(journal, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER refuse_complete ON {s}.dpone_journal")
    time.sleep(1.2)  # the dead attempts' leases (1 s) run out
    with Runner(workload) as runner:
        redone = [runner.run(interval=INTERVAL, partition=str(i)) for i in (1, 2)]
    assert [(r.resumed, r.rows_written) for r in redone] == [(True, 3), (True, 3)]
    assert _states(journal, pg_schema, lost) == ["COMPLETE", "COMPLETE"]
    assert _rows(pg_available, pg_schema) == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        for result in redone:
            entry = store.get(result.operation_id)
            assert entry is not None
            assert check_history(store.history(result.operation_id)) == []
            problems = ledger_problems(
                store, operation_id=result.operation_id, journal_epoch=entry.lease_epoch
            )
            assert problems == [], problems
    finally:
        store.close()
