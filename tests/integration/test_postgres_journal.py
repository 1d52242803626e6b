"""PostgreSQL journal beyond the port: migrations, triggers, atomic mode, outages, clock, scale."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from dpone.adapters.journal import _rules
from dpone.adapters.journal.postgres import SCHEMA_VERSION, PostgresCommitJournal
from dpone.contracts.journal import JournalEntry
from dpone.contracts.run import AttemptState, RunState
from dpone.contracts.states import CommitState as S
from dpone.errors import (
    ConfigInvalid,
    IntentConflict,
    JournalConflict,
    JournalUnavailable,
    LeaseHeld,
)
from dpone.testing.journal_conformance import (
    ACTOR,
    AUDIT,
    DIGEST,
    OWNER_A,
    OWNER_B,
    create,
    drive_to,
    leased,
    new_operation_id,
)
from dpone.testing.ledger_conformance import CLI, new_start
from dpone.testing.pg_probe import wait_until

SQL_WORDS = ("SELECT", "INSERT", "UPDATE", "DELETE", "WHERE", "RETURNING")
CANARY = "Canary-Pw-7f3a9c"  # a password that must never surface
MIGRATORS = 4


@pytest.fixture
def journal(pg_available: str, pg_schema: str) -> Iterator[PostgresCommitJournal]:
    journal = PostgresCommitJournal(pg_available, schema=pg_schema)
    yield journal
    journal.close()


@pytest.fixture
def admin(pg_available: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit connection for inspecting and provoking the server."""
    with psycopg.connect(pg_available, autocommit=True) as conn:
        yield conn


@pytest.fixture
def unborn_schema(pg_available: str) -> Iterator[str]:
    """A schema name that does not exist yet (the journal must create it); dropped after."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_available, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _prepared(journal: PostgresCommitJournal) -> JournalEntry:
    return drive_to(journal, leased(journal), S.PREPARED)


def _within(
    journal: PostgresCommitJournal, txn: object, entry: JournalEntry, *, version: int | None = None
) -> JournalEntry:
    return journal.compare_and_set_within(
        txn,
        operation_id=entry.operation_id,
        expected_version=entry.version if version is None else version,
        expected_states=frozenset({entry.state}),
        next_state=S.COMPLETE,
        lease_epoch=entry.lease_epoch,
        actor=ACTOR,
        result={"rows_written": 2},
        evidence={"mode": "atomic"},
    )


def _with_password(dsn: str, password: str) -> str:
    """The test DSN with a user:password, as an operator's DSN would carry."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["password"] = password
    params.setdefault("user", "postgres")
    return psycopg.conninfo.make_conninfo(**params)


def _assert_safe(err: BaseException, *secrets: str) -> None:
    assert isinstance(err, JournalUnavailable), type(err)
    assert not isinstance(err, psycopg.Error)
    assert err.retryable
    text = str(err) + repr(err.attrs())
    for secret in secrets:
        assert secret not in text, text
    assert not any(word in text for word in SQL_WORDS), text
    assert pickle.loads(pickle.dumps(err)).attrs() == err.attrs()  # noqa: S301 - our own error


# ---------------------------------------------------------------------- migrations
def _migrate_worker(dsn: str, schema: str, barrier: Any, results: Any) -> None:
    """Child process: open a journal on a schema nobody created yet and migrate at once."""
    journal = PostgresCommitJournal(dsn, schema=schema)
    try:
        barrier.wait(timeout=60)
        results.put(journal.migrate())
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put(f"error: {exc!r}")
    finally:
        journal.close()


def test_migrate_from_four_processes_applies_once(
    pg_available: str, unborn_schema: str, admin: psycopg.Connection[Any]
) -> None:
    """Four processes migrate a missing schema at once: one applies, the others find it done."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(MIGRATORS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_migrate_worker, args=(pg_available, unborn_schema, barrier, results))
        for _ in range(MIGRATORS)
    ]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=60) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=60)
            proc.close()
        results.close()
        results.join_thread()
    everything = list(range(1, SCHEMA_VERSION + 1))
    assert sorted(outcomes, key=len) == [[]] * (MIGRATORS - 1) + [everything], outcomes
    rows = admin.execute(
        f'SELECT version FROM "{unborn_schema}".dpone_schema_version ORDER BY version'
    ).fetchall()
    assert [r[0] for r in rows] == everything


def test_first_use_migrates_and_migrate_is_idempotent(
    pg_available: str, unborn_schema: str, admin: psycopg.Connection[Any]
) -> None:
    """No I/O in the constructor; the first call creates schema and tables; migrate() is a no-op."""
    journal = PostgresCommitJournal(pg_available, schema=unborn_schema)
    try:
        assert admin.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (unborn_schema,)
        ).fetchone() == (0,)
        assert journal.get(new_operation_id()) is None
        tables = admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (unborn_schema,)
        ).fetchall()
        # every migration's tables (later migrations add theirs)
        assert {t[0] for t in tables} >= {
            "dpone_audit",
            "dpone_journal",
            "dpone_schema_version",
            "dpone_transitions",
            "dpone_checkpoints",
            "dpone_checkpoint_intervals",
            "dpone_runs",
            "dpone_run_attempts",
        }
        assert journal.migrate() == []
        with PostgresCommitJournal(pg_available, schema=unborn_schema) as again:
            assert again.migrate() == []
    finally:
        journal.close()


def test_newer_schema_version_is_refused(
    pg_available: str, pg_schema: str, admin: psycopg.Connection[Any]
) -> None:
    """A schema migrated by a newer dpone is ConfigInvalid, not silently used."""
    with PostgresCommitJournal(pg_available, schema=pg_schema) as journal:
        journal.migrate()
    admin.execute(
        f'INSERT INTO "{pg_schema}".dpone_schema_version (version) VALUES (%s)',
        (SCHEMA_VERSION + 1,),
    )
    with (
        PostgresCommitJournal(pg_available, schema=pg_schema) as newer,
        pytest.raises(ConfigInvalid, match="newer"),
    ):
        newer.get(new_operation_id())


@pytest.mark.parametrize("schema", ["", "1abc", 'x"; DROP TABLE y; --', "a" * 64, "sch ema"])
def test_hostile_schema_names_are_refused_without_io(pg_available: str, schema: str) -> None:
    """A schema that is not a plain identifier is ConfigInvalid at construction."""
    with pytest.raises(ConfigInvalid):
        PostgresCommitJournal(pg_available, schema=schema)


# ---------------------------------------------------------------------- append-only
@pytest.mark.parametrize("table", ["dpone_transitions", "dpone_audit"])
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {t} SET actor = 'mallory' WHERE true",
        "DELETE FROM {t} WHERE true",
        "TRUNCATE {t}",
    ],
    ids=["update", "delete", "truncate"],
)
def test_history_and_audit_are_append_only(
    journal: PostgresCommitJournal,
    admin: psycopg.Connection[Any],
    pg_schema: str,
    table: str,
    statement: str,
) -> None:
    """The database refuses to rewrite history or audit rows, whoever asks."""
    entry = drive_to(journal, leased(journal), S.COMMIT_UNKNOWN)
    journal.compare_and_set(
        operation_id=entry.operation_id,
        expected_version=entry.version,
        expected_states=frozenset({S.COMMIT_UNKNOWN}),
        next_state=S.TARGET_COMMITTED,
        lease_epoch=entry.lease_epoch,
        actor=ACTOR,
        audit=AUDIT,
    )
    history = journal.history(entry.operation_id)
    audit = journal.audit_log(entry.operation_id)
    column = "principal" if table == "dpone_audit" else "actor"
    sql = statement.format(t=f'"{pg_schema}".{table}').replace("actor", column)
    with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
        admin.execute(sql)
    assert journal.history(entry.operation_id) == history
    assert journal.audit_log(entry.operation_id) == audit


@pytest.mark.parametrize(
    ("table", "key"), [("dpone_journal", "operation_id"), ("dpone_runs", "run_id")]
)
@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM {t} WHERE {k} = %(id)s",
        "UPDATE {t} SET {k} = {k} || '-moved' WHERE {k} = %(id)s",
        "TRUNCATE {t}",
    ],
    ids=["delete", "re-key", "truncate"],
)
def test_entries_and_runs_that_history_refers_to_are_kept(
    journal: PostgresCommitJournal,
    admin: psycopg.Connection[Any],
    pg_schema: str,
    table: str,
    key: str,
    statement: str,
) -> None:
    """ADR 0020: with no foreign key left, triggers refuse to remove or re-key a parent row."""
    entry = drive_to(journal, leased(journal), S.COMPLETE)
    start = new_start()
    run, _ = journal.begin_run(start)
    journal.begin_attempt(run_id=run.run_id, attempt=1, owner=OWNER_A, provenance=CLI)
    history = journal.history(entry.operation_id)
    recorded = journal.get_run(run.run_id)
    assert recorded is not None
    wanted = entry.operation_id if table == "dpone_journal" else run.run_id
    sql = statement.format(t=f'"{pg_schema}".{table}', k=key)
    with pytest.raises(psycopg.errors.RestrictViolation, match=f"{table} rows are kept"):
        admin.execute(sql, {"id": wanted} if "%(id)s" in sql else None)
    assert journal.get(entry.operation_id) == entry
    assert journal.history(entry.operation_id) == history
    assert journal.get_run(run.run_id) == recorded
    assert [a.attempt for a in journal.attempts(run.run_id)] == [1]


def test_a_version_4_schema_trades_its_foreign_keys_for_triggers(
    pg_available: str,
    pg_schema: str,
    admin: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Migration 5 drops the two foreign keys and keeps every row; the guards then hold."""
    from dpone.adapters.journal import postgres as pg_journal

    def foreign_keys() -> list[str]:
        rows = admin.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint "
            "WHERE contype = 'f' AND connamespace = %s::regnamespace ORDER BY 1",
            (pg_schema,),
        )
        return [r[0].rpartition(".")[2] for r in rows.fetchall()]

    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", 4)
    with PostgresCommitJournal(pg_available, schema=pg_schema) as old:
        assert old.migrate() == [1, 2, 3, 4]
        entry = drive_to(old, leased(old), S.COMPLETE)
        history = old.history(entry.operation_id)
    assert foreign_keys() == [
        "dpone_checkpoint_intervals",
        "dpone_run_attempts",
        "dpone_transitions",
    ]
    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", 5)
    with PostgresCommitJournal(pg_available, schema=pg_schema, read_only=True) as look:
        assert look.get(entry.operation_id) == entry  # read as it is, never migrated
        assert look.migrate() == []
    assert len(foreign_keys()) == 3
    with PostgresCommitJournal(pg_available, schema=pg_schema) as new:
        assert new.migrate() == [5]
        assert new.get(entry.operation_id) == entry
        assert new.history(entry.operation_id) == history
        assert new.migrate() == []
    assert foreign_keys() == ["dpone_checkpoint_intervals"]
    with pytest.raises(psycopg.errors.RestrictViolation, match="dpone_journal rows are kept"):
        admin.execute(f'DELETE FROM "{pg_schema}".dpone_journal')


def test_version_6_marks_born_rows_and_an_older_dpone_refuses_it(
    pg_available: str,
    pg_schema: str,
    admin: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Migration 6 (ADR 0023) changes no table; after it, a dpone that would read a 'born'
    history row as it is (schema 5) refuses the schema instead."""
    from dpone.adapters.journal import postgres as pg_journal

    def columns() -> list[tuple[str, str]]:
        rows = admin.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s ORDER BY 1, 2",
            (pg_schema,),
        )
        return rows.fetchall()

    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", 5)
    with PostgresCommitJournal(pg_available, schema=pg_schema) as old:
        assert old.migrate() == [1, 2, 3, 4, 5]
    before = columns()
    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", 6)
    with PostgresCommitJournal(pg_available, schema=pg_schema) as new:
        assert new.migrate() == [6]
    assert columns() == before
    [(comment,)] = admin.execute(
        "SELECT col_description(%s::regclass, "
        "(SELECT attnum FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'kind'))",
        (f'"{pg_schema}".dpone_transitions', f'"{pg_schema}".dpone_transitions'),
    ).fetchall()
    assert "born" in comment
    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", 5)
    with (
        PostgresCommitJournal(pg_available, schema=pg_schema) as old,
        pytest.raises(ConfigInvalid, match="newer than this dpone supports"),
    ):
        old.get(new_operation_id())


# ---------------------------------------------------------------------- atomic mode
def test_within_commits_with_the_foreign_transaction(
    journal: PostgresCommitJournal, pg_available: str, pg_schema: str
) -> None:
    """An atomic fold written in a foreign psycopg transaction appears with its COMMIT."""
    entry = _prepared(journal)
    rows_before = journal.history(entry.operation_id)
    # the connector's own connection; a dict row factory must not confuse the journal
    with psycopg.connect(pg_available, autocommit=True, row_factory=dict_row) as target:
        target.execute(f'CREATE TABLE "{pg_schema}".orders (id int PRIMARY KEY, amount int)')
        with target.transaction():
            target.execute(f'INSERT INTO "{pg_schema}".orders VALUES (1, 10), (2, 20)')
            done = _within(journal, target, entry)
            assert (done.state, done.version) == (S.COMPLETE, entry.version + 1)
            assert journal.get(entry.operation_id) == entry, "invisible before the commit"
        assert journal.get(entry.operation_id) == done
        count = target.execute(f'SELECT count(*) AS n FROM "{pg_schema}".orders').fetchone()
        assert count == {"n": 2}
    assert done.result is not None
    assert dict(done.result) == {"rows_written": 2}
    new_rows = journal.history(entry.operation_id)[len(rows_before) :]
    assert [(r.from_state, r.to_state) for r in new_rows] == [
        (S.PREPARED, S.COMMITTING),
        (S.COMMITTING, S.TARGET_COMMITTED),
        (S.TARGET_COMMITTED, S.COMPLETE),
    ]
    assert {(r.version, r.kind, r.at) for r in new_rows} == {
        (done.version, "fold", done.updated_at)
    }


def test_within_vanishes_on_rollback(
    journal: PostgresCommitJournal, pg_available: str, pg_schema: str
) -> None:
    """When the foreign transaction rolls back, the journal write and its history vanish."""
    entry = _prepared(journal)
    rows_before = journal.history(entry.operation_id)
    with psycopg.connect(pg_available, autocommit=True) as target:
        target.execute(f'CREATE TABLE "{pg_schema}".orders (id int PRIMARY KEY)')

        def load_then_fail() -> None:
            with target.transaction():
                target.execute(f'INSERT INTO "{pg_schema}".orders VALUES (1)')
                _within(journal, target, entry)
                raise RuntimeError("target failed after the journal write")

        with pytest.raises(RuntimeError, match="target failed"):
            load_then_fail()
        count = target.execute(f'SELECT count(*) FROM "{pg_schema}".orders').fetchone()
        assert count == (0,)
    assert journal.get(entry.operation_id) == entry
    assert journal.history(entry.operation_id) == rows_before


def test_within_conflict_raises_and_the_caller_rolls_back(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """A stale version inside the foreign transaction is JournalConflict with the current one."""
    entry = _prepared(journal)
    with psycopg.connect(pg_available, autocommit=True) as target:
        with pytest.raises(JournalConflict) as info, target.transaction():
            _within(journal, target, entry, version=entry.version - 1)
        assert info.value.current_version == entry.version
        assert info.value.current_state == S.PREPARED.value
    assert journal.get(entry.operation_id) == entry


def test_within_refuses_wrong_connections(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """Not a psycopg connection, no open transaction, another database: refused, nothing written."""
    entry = _prepared(journal)
    with pytest.raises(TypeError):
        _within(journal, object(), entry)
    with psycopg.connect(pg_available, autocommit=True) as idle, pytest.raises(ValueError):
        _within(journal, idle, entry)  # autocommit outside a transaction would commit alone
    other_db = psycopg.conninfo.make_conninfo(pg_available, dbname="postgres")
    with (
        psycopg.connect(other_db, autocommit=True) as elsewhere,
        pytest.raises(ValueError, match="another database"),
        elsewhere.transaction(),
    ):
        _within(journal, elsewhere, entry)
    assert journal.get(entry.operation_id) == entry


def test_within_lock_wait_is_bounded_by_the_target_transaction(
    journal: PostgresCommitJournal, pg_available: str, pg_schema: str
) -> None:
    """A journal row locked elsewhere makes the in-transaction CAS JournalUnavailable, not raw."""
    entry = _prepared(journal)
    with (
        psycopg.connect(pg_available, autocommit=True) as holder,
        psycopg.connect(pg_available, autocommit=True) as target,
    ):
        with holder.transaction():
            holder.execute(
                f'SELECT 1 FROM "{pg_schema}".dpone_journal WHERE operation_id = %s FOR UPDATE',
                (entry.operation_id,),
            )

            def cas_in_target() -> None:
                with target.transaction():
                    target.execute("SET LOCAL lock_timeout = '150ms'")
                    _within(journal, target, entry)

            with pytest.raises(JournalUnavailable) as info:
                cas_in_target()
        _assert_safe(info.value, pg_available)
        assert "lock" in str(info.value)
    assert journal.get(entry.operation_id) == entry


# ---------------------------------------------------------------------- atomic first attempt
def _born_complete(
    journal: PostgresCommitJournal, txn: object, operation_id: str, *, rows: int = 2
) -> JournalEntry:
    return journal.create_complete_within(
        txn,
        operation_id=operation_id,
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=OWNER_A,
        result={"rows_written": rows},
        evidence={"mode": "atomic"},
    )


def test_create_complete_within_writes_the_unfolded_history(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """Born COMPLETE in the target transaction: the same entry and history as create+lease+CAS."""
    folded_id, unfolded_id = new_operation_id(), new_operation_id()
    with psycopg.connect(pg_available, autocommit=True) as target:
        with target.transaction():
            born = _born_complete(journal, target, folded_id)
            assert journal.get(folded_id) is None, "invisible before the commit"
        with target.transaction():
            leased_entry = journal.create_intent(
                operation_id=unfolded_id,
                intent_digest=DIGEST,
                metadata={"workload_id": "orders"},
                actor=OWNER_A,
                lease_owner=OWNER_A,
                lease_ttl_seconds=30,
            )
            unfolded = journal.compare_and_set_within(
                target,
                operation_id=unfolded_id,
                expected_version=leased_entry.version,
                expected_states=frozenset({S.PREPARING}),
                next_state=S.COMPLETE,
                lease_epoch=leased_entry.lease_epoch,
                actor=OWNER_A,
                result={"rows_written": 2},
                evidence={"mode": "atomic"},
                release_lease=True,
            )
    assert journal.get(folded_id) == born
    assert (born.state, born.version, born.lease_epoch, born.lease_owner) == (
        S.COMPLETE,
        2,
        1,
        None,
    )
    assert born.lease_expires_at is not None
    assert born.lease_expires_at <= journal.now()
    assert (born.metadata, born.result) == (unfolded.metadata, unfolded.result)
    assert (born.state, born.version, born.lease_epoch, born.lease_owner) == (
        unfolded.state,
        unfolded.version,
        unfolded.lease_epoch,
        unfolded.lease_owner,
    )

    def shape(operation_id: str) -> list[tuple[object, ...]]:
        return [
            (
                t.version,
                t.seq,
                t.from_state,
                t.to_state,
                t.kind,
                t.actor,
                t.lease_epoch,
                dict(t.evidence),
            )
            for t in journal.history(operation_id)
        ]

    assert shape(folded_id) == shape(unfolded_id)
    assert [t.kind for t in journal.history(folded_id)][:2] == ["create", "lease"]


def test_create_complete_within_vanishes_on_rollback(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """Rolled back with the target transaction: no entry, no history (a crash leaves nothing)."""
    operation_id = new_operation_id()

    def write_then_fail(target: psycopg.Connection[Any]) -> None:
        with target.transaction():
            _born_complete(journal, target, operation_id)
            raise RuntimeError("target failed after the journal write")

    with psycopg.connect(pg_available, autocommit=True) as target:
        with pytest.raises(RuntimeError, match="target failed"):
            write_then_fail(target)
        assert target.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert journal.get(operation_id) is None
    assert journal.history(operation_id) == []


def test_create_complete_within_an_existing_entry_is_a_conflict(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """An entry committed by another executor: JournalConflict, and that entry is untouched."""
    entry = leased(journal)
    with (
        psycopg.connect(pg_available, autocommit=True) as target,
        pytest.raises(JournalConflict),
        target.transaction(),
    ):
        _born_complete(journal, target, entry.operation_id)
    assert journal.get(entry.operation_id) == entry


def test_create_complete_within_waits_for_an_in_flight_creator(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """Two first attempts at once: the second waits on the key, then conflicts; one entry."""
    operation_id = new_operation_id()
    with (
        psycopg.connect(pg_available, autocommit=True) as first,
        psycopg.connect(pg_available, autocommit=True) as second,
    ):
        outcome: dict[str, BaseException] = {}
        with first.transaction():
            _born_complete(journal, first, operation_id, rows=1)

            def racer() -> None:
                try:
                    with second.transaction():
                        _born_complete(journal, second, operation_id, rows=9)
                except BaseException as exc:  # judged in the main thread
                    outcome["error"] = exc

            thread = threading.Thread(target=racer)
            waiter = second.info.backend_pid
            thread.start()

            def second_waits() -> bool:
                assert thread.is_alive(), "the second creator must wait for the first"
                with psycopg.connect(pg_available, autocommit=True) as probe:
                    row = probe.execute(
                        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        (waiter,),
                    ).fetchone()
                return row is not None and row[0] is True

            wait_until("the second creator to wait on the first's key", second_waits)
        thread.join(30)
    assert isinstance(outcome.get("error"), JournalConflict)
    done = journal.get(operation_id)
    assert done is not None
    assert done.result is not None
    assert dict(done.result) == {"rows_written": 1}


def _history_shape(journal: PostgresCommitJournal, operation_id: str) -> list[tuple[object, ...]]:
    return [
        (t.version, t.seq, t.from_state, t.to_state, t.kind, t.actor, t.lease_epoch, t.evidence)
        for t in journal.history(operation_id)
    ]


def test_the_run_and_the_entry_born_complete_are_one_statement(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """ADR 0011: run, attempt 1 and the entry born COMPLETE commit together, as one INSERT."""
    start = new_start()
    alone = new_operation_id()
    writer = journal.complete_run_entry_writer(start, owner=OWNER_A, provenance=CLI)
    with psycopg.connect(pg_available, autocommit=True) as target:
        with target.transaction():
            born = writer(
                target,
                operation_id=start.operation_id,
                intent_digest=DIGEST,
                metadata={"workload_id": "orders"},
                actor=OWNER_A,
                result={"rows_written": 2},
                evidence={"mode": "atomic"},
            )
            assert journal.get(start.operation_id) is None, "invisible before the commit"
            assert journal.get_run(start.run_id) is None
        with target.transaction():
            _born_complete(journal, target, alone)
    assert journal.get(start.operation_id) == born
    assert _history_shape(journal, start.operation_id) == _history_shape(journal, alone)
    run = journal.get_run(start.run_id)
    assert run is not None
    assert (run.state, run.current_attempt, run.idempotency_key) == (
        RunState.COMPLETE,
        1,
        start.idempotency_key,
    )
    [attempt] = journal.attempts(start.run_id)
    assert (attempt.attempt, attempt.owner, attempt.state, dict(attempt.provenance)) == (
        1,
        OWNER_A,
        AttemptState.COMPLETE,
        CLI,
    )


def test_a_recorded_run_key_refuses_the_entry_born_with_it(
    journal: PostgresCommitJournal, pg_available: str
) -> None:
    """The run's key recorded by another executor: JournalConflict, and no entry is left."""
    start = new_start()
    journal.begin_run(start)
    writer = journal.complete_run_entry_writer(start, owner=OWNER_A, provenance=CLI)
    with (
        psycopg.connect(pg_available, autocommit=True) as target,
        pytest.raises(JournalConflict),
        target.transaction(),
    ):
        writer(
            target,
            operation_id=start.operation_id,
            intent_digest=DIGEST,
            metadata={"workload_id": "orders"},
            actor=OWNER_A,
            result={"rows_written": 2},
        )
    assert journal.get(start.operation_id) is None
    assert journal.history(start.operation_id) == []
    assert journal.attempts(start.run_id) == []


def test_forward_birth_with_a_recorded_run_creates_the_entry_alone(
    journal: PostgresCommitJournal,
) -> None:
    """Forward: the run's key exists, so nothing of the joint write is kept; the entry is
    then created alone (born COMMITTING, ours) and the run is left as it was."""
    start = new_start()
    before, _ = journal.begin_run(start)
    entry, recorded = journal.create_committing_with_run(
        start,
        provenance=CLI,
        operation_id=start.operation_id,
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=OWNER_A,
        lease_ttl_seconds=30,
        evidence={"fence_epoch": 1},
    )
    assert recorded is False
    assert (entry.state, entry.version, entry.lease_owner, entry.lease_epoch) == (
        S.COMMITTING,
        2,
        OWNER_A,
        1,
    )
    assert journal.get_run(start.run_id) == before
    assert journal.attempts(start.run_id) == []
    # an entry that exists is returned as it is, and the new run of the joint write,
    # inserted before the entry's unique violation, is not kept either
    other = new_start()
    again, recorded = journal.create_committing_with_run(
        other,
        provenance=CLI,
        operation_id=start.operation_id,
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=OWNER_B,
        lease_ttl_seconds=30,
    )
    assert (again, recorded) == (entry, False)
    assert journal.get_run(other.run_id) is None


def test_create_committing_writes_the_unfolded_history(journal: PostgresCommitJournal) -> None:
    """Born COMMITTING (forward first attempt): the entry and history of create+lease+CAS."""
    folded_id, unfolded_id = new_operation_id(), new_operation_id()
    born = journal.create_committing(
        operation_id=folded_id,
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=OWNER_A,
        lease_ttl_seconds=30,
        evidence={"fence_epoch": 1},
    )
    first = journal.create_intent(
        operation_id=unfolded_id,
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=OWNER_A,
        lease_owner=OWNER_A,
        lease_ttl_seconds=30,
    )
    unfolded = journal.compare_and_set(
        operation_id=unfolded_id,
        expected_version=first.version,
        expected_states=frozenset({S.PREPARING}),
        next_state=S.COMMITTING,
        lease_epoch=first.lease_epoch,
        actor=OWNER_A,
        evidence={"fence_epoch": 1},
    )
    assert journal.get(folded_id) == born
    fields = ("state", "version", "lease_owner", "lease_epoch", "metadata", "result")
    assert [getattr(born, f) for f in fields] == [getattr(unfolded, f) for f in fields]
    assert born.lease_expires_at is not None
    assert born.lease_expires_at > journal.now() + 20

    def shape(operation_id: str) -> list[tuple[object, ...]]:
        return [
            (
                t.version,
                t.seq,
                t.from_state,
                t.to_state,
                t.kind,
                t.actor,
                t.lease_epoch,
                dict(t.evidence),
            )
            for t in journal.history(operation_id)
        ]

    assert shape(folded_id) == shape(unfolded_id)


def test_create_committing_returns_an_existing_entry_untouched(
    journal: PostgresCommitJournal,
) -> None:
    """An entry that exists is answered as it is (the caller sees it is not its own)."""
    entry = leased(journal)
    again = journal.create_committing(
        operation_id=entry.operation_id,
        intent_digest=DIGEST,
        metadata={},
        actor=OWNER_B,
        lease_ttl_seconds=30,
    )
    assert again == entry
    with pytest.raises(IntentConflict):
        journal.create_committing(
            operation_id=entry.operation_id,
            intent_digest="sha256:" + "9" * 64,
            metadata={},
            actor=OWNER_B,
            lease_ttl_seconds=30,
        )


# ---------------------------------------------------------------------- outages
def test_unreachable_server_is_journal_unavailable_quickly(pg_schema: str) -> None:
    """A closed port fails each call fast: JournalUnavailable, no secret, SQL or driver error."""
    dsn = f"postgresql://dpone:{CANARY}@127.0.0.1:1/test"
    journal = PostgresCommitJournal(dsn, schema=pg_schema, connect_timeout_s=2.0)  # no I/O
    try:
        assert CANARY not in repr(journal)
        assert journal.locator == "postgresql://127.0.0.1:1/test"
        calls = [
            lambda: journal.get(new_operation_id()),
            lambda: create(journal),
            journal.list_entries,
            journal.now,
            journal.migrate,
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(JournalUnavailable) as info:
                call()
            assert time.monotonic() - started < 2.0
            _assert_safe(info.value, CANARY, dsn, "dpone:")
            assert "refused" in str(info.value) or "unreachable" in str(info.value)
    finally:
        journal.close()


def test_silent_server_is_bounded_by_the_connect_timeout(pg_schema: str) -> None:
    """A server that accepts TCP but never answers fails after the connect timeout, not later."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        dsn = f"postgresql://dpone:{CANARY}@127.0.0.1:{port}/test"
        with PostgresCommitJournal(dsn, schema=pg_schema, connect_timeout_s=2.0) as journal:
            started = time.monotonic()
            with pytest.raises(JournalUnavailable) as info:
                journal.get(new_operation_id())
            elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 4.0, elapsed
    _assert_safe(info.value, CANARY, dsn)


def test_locked_row_is_journal_unavailable_after_lock_timeout(
    pg_available: str, pg_schema: str, admin: psycopg.Connection[Any]
) -> None:
    """A row held by another transaction makes CAS wait lock_timeout_s, then JournalUnavailable."""
    with PostgresCommitJournal(pg_available, schema=pg_schema, lock_timeout_s=0.3) as journal:
        entry = leased(journal)
        with admin.transaction():
            admin.execute(
                f'SELECT 1 FROM "{pg_schema}".dpone_journal WHERE operation_id = %s FOR UPDATE',
                (entry.operation_id,),
            )
            started = time.monotonic()
            with pytest.raises(JournalUnavailable) as info:
                journal.compare_and_set(
                    operation_id=entry.operation_id,
                    expected_version=entry.version,
                    expected_states=frozenset({S.PREPARING}),
                    next_state=S.PREPARED,
                    lease_epoch=entry.lease_epoch,
                    actor=ACTOR,
                )
            elapsed = time.monotonic() - started
        assert 0.25 <= elapsed < 2.0, elapsed
        _assert_safe(info.value, pg_available)
        assert "lock_timeout" in str(info.value)
        assert journal.get(entry.operation_id) == entry  # nothing decided, the pool is fine


@pytest.mark.parametrize("pooled", [True, False], ids=["pool", "one-session"])
def test_terminated_pooled_connection_is_replaced(
    pg_available: str, pg_schema: str, admin: psycopg.Connection[Any], pooled: bool
) -> None:
    """Sessions killed server-side: a read repeats on a fresh one; a CAS is never resent."""
    app = f"dpone-test-{uuid.uuid4().hex[:8]}"
    dsn = psycopg.conninfo.make_conninfo(pg_available, application_name=app)
    with PostgresCommitJournal(dsn, schema=pg_schema, pooled=pooled) as journal:
        entry = leased(journal)

        def kill() -> int:
            row = admin.execute(
                # the timeout makes the call wait until each backend has ended
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) "
                "FROM pg_stat_activity WHERE application_name = %s",
                (app,),
            ).fetchone()
            return int(row[0]) if row else 0

        assert kill() >= 1
        assert journal.get(entry.operation_id) == entry  # repeated on a new connection
        assert kill() >= 1
        with pytest.raises(JournalUnavailable) as info:
            journal.compare_and_set(
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset({S.PREPARING}),
                next_state=S.PREPARED,
                lease_epoch=entry.lease_epoch,
                actor=ACTOR,
            )
        _assert_safe(info.value, pg_available)
        assert journal.get(entry.operation_id) == entry, "the lost CAS did not commit"
        moved = journal.compare_and_set(
            operation_id=entry.operation_id,
            expected_version=entry.version,
            expected_states=frozenset({S.PREPARING}),
            next_state=S.PREPARED,
            lease_epoch=entry.lease_epoch,
            actor=ACTOR,
        )
        assert moved.version == entry.version + 1


def test_one_session_ledger_writes_skip_the_flush_for_themselves_only(
    pg_available: str, pg_schema: str
) -> None:
    """pooled=False: a ledger write commits asynchronously; the session's journal writes do not."""
    with PostgresCommitJournal(pg_available, schema=pg_schema, pooled=False) as journal:
        entry = create(journal)

        def setting(conn: psycopg.Connection[Any]) -> str:
            row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
            assert row is not None
            return str(row[0])

        assert journal._run_on_session("probe", setting, repeatable=True, ledger=True) == "off"
        assert journal._run_on_session("probe", setting, repeatable=True, ledger=False) == "on"
        run, _ = journal.find_run(idempotency_key="k", operation_id=entry.operation_id)
        assert run is None
        assert journal._session is not None
        assert setting(journal._session) == "on"  # after ledger writes, still synchronous
        assert journal.get(entry.operation_id) == entry


def test_one_session_has_the_journal_bounds_with_or_without_a_journal_before(
    pg_available: str, pg_schema: str
) -> None:
    """The bounds are set with the version read; a missing journal's failed read loses none."""
    for _ in ("fresh schema", "migrated schema"):
        with PostgresCommitJournal(
            pg_available, schema=pg_schema, pooled=False, lock_timeout_s=0.75
        ) as journal:
            create(journal)
            assert journal._session is not None
            row = journal._session.execute(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
            ).fetchone()
            assert row == ("750ms", "30750ms")


def test_one_session_is_the_only_connection(
    pg_available: str, pg_schema: str, admin: psycopg.Connection[Any]
) -> None:
    """pooled=False: journal and ledger calls, from several threads, share one backend."""
    app = f"dpone-test-{uuid.uuid4().hex[:8]}"
    dsn = psycopg.conninfo.make_conninfo(pg_available, application_name=app)
    with PostgresCommitJournal(dsn, schema=pg_schema, pooled=False) as journal:
        entry = leased(journal, ttl=30.0)
        errors: list[BaseException] = []

        def beat() -> None:
            try:
                for _ in range(10):
                    journal.renew_lease(
                        operation_id=entry.operation_id,
                        owner=OWNER_A,
                        lease_epoch=entry.lease_epoch,
                        ttl_seconds=30.0,
                    )
                    journal.find_run(idempotency_key="k", operation_id=entry.operation_id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=beat) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
        assert row is not None
        assert row[0] == 1


def test_forked_child_opens_its_own_session(pg_available: str, pg_schema: str) -> None:
    """pooled=False: a forked child connects anew; the parent's session keeps working."""
    with PostgresCommitJournal(pg_available, schema=pg_schema, pooled=False) as journal:
        entry = create(journal)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            code = 1
            try:
                child = create(journal)
                ok = journal.get(entry.operation_id) == entry and child.version == 1
                os.write(write, json.dumps({"ok": ok, "op": child.operation_id}).encode())
                journal.close()
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            report = json.loads(pipe.read() or "{}")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert report["ok"] is True
        assert journal.get(entry.operation_id) == entry  # the child never closed it
        assert journal.get(report["op"]) is not None


def test_closed_journal_is_unavailable(journal: PostgresCommitJournal) -> None:
    """After close(), calls raise JournalUnavailable; close() stays idempotent."""
    create(journal)
    journal.close()
    journal.close()
    with pytest.raises(JournalUnavailable, match="closed"):
        journal.get(new_operation_id())


# ---------------------------------------------------------------------- server clock
def test_lease_expiry_is_judged_by_the_server_clock(
    journal: PostgresCommitJournal, admin: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases follow PostgreSQL's clock: a wildly wrong local clock changes no decision."""
    server = admin.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert server is not None
    assert abs(journal.now() - float(server[0])) < 1.0
    real = time.time
    live = leased(journal, ttl=60.0)
    short = leased(journal, ttl=0.3)
    assert live.lease_expires_at == pytest.approx(live.updated_at + 60.0, abs=1e-5)

    # The local clock runs an hour ahead: the live lease still holds.
    monkeypatch.setattr(time, "time", lambda: real() + 3600.0)
    with pytest.raises(LeaseHeld) as info:
        journal.acquire_lease(operation_id=live.operation_id, owner=OWNER_B, ttl_seconds=60.0)
    assert info.value.lease_expires_in is not None
    assert 55.0 < info.value.lease_expires_in <= 60.0

    # The local clock runs an hour behind: the short lease still expires on time.
    monkeypatch.setattr(time, "time", lambda: real() - 3600.0)
    with pytest.raises(LeaseHeld):
        journal.acquire_lease(operation_id=short.operation_id, owner=OWNER_B, ttl_seconds=60.0)
    time.sleep(0.45)
    taken = journal.acquire_lease(operation_id=short.operation_id, owner=OWNER_B, ttl_seconds=60.0)
    assert (taken.lease_owner, taken.lease_epoch) == (OWNER_B, short.lease_epoch + 1)
    assert taken.lease_expires_at is not None
    assert abs(taken.lease_expires_at - real() - 60.0) < 2.0


# ---------------------------------------------------------------------- history rows
def test_history_rows_match_the_shared_rules(journal: PostgresCommitJournal) -> None:
    """Create and lease rows written by SQL equal _rules.create_row / _rules.lease_row exactly."""
    entry = create(journal)
    [created] = journal.history(entry.operation_id)
    assert created == _rules.create_row(entry, actor=ACTOR)
    granted = journal.acquire_lease(
        operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=30.0
    )
    assert journal.history(entry.operation_id)[-1] == _rules.lease_row(granted)

    born = journal.create_intent(
        operation_id=new_operation_id(),
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=ACTOR,
        lease_owner=OWNER_A,
        lease_ttl_seconds=30.0,
    )
    assert (born.version, born.lease_owner, born.lease_epoch) == (1, OWNER_A, 1)
    assert born.lease_expires_at == pytest.approx(born.created_at + 30.0, abs=1e-5)
    assert journal.history(born.operation_id) == [
        _rules.create_row(born, actor=ACTOR),
        _rules.lease_row(born, seq=1),
    ]


def test_cas_can_release_the_lease_in_the_same_write(journal: PostgresCommitJournal) -> None:
    """release_lease=True ends the lease with the state change; another owner may then acquire."""
    entry = drive_to(journal, leased(journal), S.COMMITTING)
    done = journal.compare_and_set(
        operation_id=entry.operation_id,
        expected_version=entry.version,
        expected_states=frozenset({S.COMMITTING}),
        next_state=S.TARGET_COMMITTED,
        lease_epoch=entry.lease_epoch,
        actor=ACTOR,
        release_lease=True,
    )
    assert (done.lease_owner, done.lease_expires_at) == (None, done.updated_at)
    assert done.lease_epoch == entry.lease_epoch
    assert journal.get(entry.operation_id) == done
    other = journal.acquire_lease(operation_id=entry.operation_id, owner=OWNER_B, ttl_seconds=5)
    assert other.lease_epoch == entry.lease_epoch + 1


# ---------------------------------------------------------------------- locators
@pytest.mark.parametrize(
    ("dsn", "locator"),
    [
        ("postgres://u:secret@LocalHost/test", "postgresql://localhost:5432/test"),
        ("postgresql://db.example.COM:6543/orders", "postgresql://db.example.com:6543/orders"),
        (
            "host=127.0.0.1 port=5432 dbname=test user=u password=x",
            "postgresql://127.0.0.1:5432/test",
        ),
    ],
)
def test_locator_has_no_credentials_and_is_normalized(dsn: str, locator: str) -> None:
    """The locator is postgresql://host:port/db for any DSN form; shares_database_with agrees."""
    journal = PostgresCommitJournal(dsn)  # no I/O
    assert journal.locator == locator
    assert journal.shares_database_with(locator)
    assert journal.shares_database_with(locator.replace("postgresql://", "postgres://"))
    assert not journal.shares_database_with(locator + "_other")
    assert not journal.shares_database_with("sqlite:/tmp/x.db")
    assert "secret" not in repr(journal)
    journal.close()


# ---------------------------------------------------------------------- fork
def test_forked_child_opens_its_own_pool(journal: PostgresCommitJournal) -> None:
    """A forked child uses new connections and leaves the parent's sessions working."""
    entry = create(journal)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            seen = journal.get(entry.operation_id)
            child = create(journal)
            ok = seen == entry and journal.get(child.operation_id) == child
            os.write(write, json.dumps({"ok": ok, "op": child.operation_id}).encode())
            journal.close()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report["ok"] is True
    # the parent's pooled session survived the child (nothing closed it from there)
    assert journal.get(entry.operation_id) == entry
    assert journal.get(report["op"]) is not None


def test_heartbeat_threads_share_the_pool(journal: PostgresCommitJournal) -> None:
    """Many threads at once stay within pool_max connections and all succeed."""
    entry = leased(journal, ttl=30.0)
    errors: list[BaseException] = []

    def beat() -> None:
        try:
            for _ in range(20):
                journal.renew_lease(
                    operation_id=entry.operation_id,
                    owner=OWNER_A,
                    lease_epoch=entry.lease_epoch,
                    ttl_seconds=30.0,
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=beat) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []


# ---------------------------------------------------------------------- scale
def _plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        yield plan
        for child in plan.get("Plans", []):
            yield from _plan_nodes(child)
    elif isinstance(plan, list):
        for item in plan:
            yield from _plan_nodes(item.get("Plan", item))


def test_list_by_state_stays_fast_with_a_million_entries(
    journal: PostgresCommitJournal, admin: psycopg.Connection[Any], pg_schema: str
) -> None:
    """1M entries: list_entries by state uses (state, updated_at DESC) and answers in < 50 ms."""
    journal.migrate()
    states = [s.value for s in S]
    with admin.transaction():
        admin.execute("SET LOCAL synchronous_commit = off")
        # 1% COMMITTING, 1% COMMIT_UNKNOWN, the rest COMPLETE: a realistic skew.
        admin.execute(
            f"""
            INSERT INTO "{pg_schema}".dpone_journal (operation_id, intent_digest, state,
                version, lease_epoch, metadata, created_at, updated_at)
            SELECT 'sha256:' || lpad(to_hex(g), 64, '0'), %(digest)s,
                   CASE WHEN g % 100 = 0 THEN 'COMMITTING'
                        WHEN g % 100 = 1 THEN 'COMMIT_UNKNOWN'
                        ELSE 'COMPLETE' END,
                   3, 1, '{{}}', ts, ts
            FROM generate_series(1, 1000000) AS g,
                 LATERAL (SELECT now() - make_interval(secs => g / 100.0) AS ts) AS x
            """.replace("%", "%%").replace("%%(digest)s", "%(digest)s"),
            {"digest": DIGEST},
        )
    admin.execute(f'ANALYZE "{pg_schema}".dpone_journal')
    cases: list[frozenset[S] | None] = [
        frozenset({S.COMMITTING}),
        frozenset({S.COMMITTING, S.COMMIT_UNKNOWN}),
        None,
    ]
    for wanted in cases:
        params = {
            "states": states if wanted is None else sorted(s.value for s in wanted),
            "before": None,
            "limit": 100,
        }
        row = admin.execute("EXPLAIN (FORMAT JSON) " + journal._sql.list_entries, params).fetchone()
        assert row is not None
        plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        nodes = list(_plan_nodes(plan))
        assert any(n.get("Index Name") == "dpone_journal_state_updated" for n in nodes), plan
        assert not any(
            n.get("Node Type") == "Seq Scan" and n.get("Relation Name") == "dpone_journal"
            for n in nodes
        ), plan
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            found = journal.list_entries(states=wanted, limit=100)
            timings.append(time.perf_counter() - started)
        assert len(found) == 100
        assert [e.updated_at for e in found] == sorted((e.updated_at for e in found), reverse=True)
        assert wanted is None or {e.state for e in found} <= wanted
        assert statistics.median(timings) < 0.050, timings
    # an old cutoff is a range condition on the index too, not a scan from the newest row
    cutoff = journal.now() - 5000.0
    started = time.perf_counter()
    old = journal.list_entries(states=frozenset({S.COMPLETE}), updated_before=cutoff, limit=10)
    assert time.perf_counter() - started < 0.050
    assert len(old) == 10
    assert all(e.updated_at < cutoff for e in old)


# ---------------------------------------------------------------------- the run's end (ADR 0013)
def _born_with_run(journal: PostgresCommitJournal) -> tuple[Any, JournalEntry]:
    """A new run at attempt 1 and its entry born COMMITTING (forward first attempt)."""
    start = new_start()
    entry, recorded = journal.create_committing_with_run(
        start,
        provenance=CLI,
        operation_id=start.operation_id,
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=OWNER_A,
        lease_ttl_seconds=30,
        evidence={"fence_epoch": 1},
    )
    assert recorded
    return start, entry


def _completion(entry: JournalEntry) -> dict[str, Any]:
    return {
        "operation_id": entry.operation_id,
        "expected_version": entry.version,
        "expected_states": frozenset({entry.state}),
        "lease_epoch": entry.lease_epoch,
        "actor": OWNER_A,
        "result": {"rows_written": 3, "fence_epoch": 1},
        "evidence": {"fence_state": "committed", "fence_epoch": 1, "row_count": 3},
    }


def _ledger_shape(journal: PostgresCommitJournal, run_id: str) -> tuple[object, ...]:
    run = journal.get_run(run_id)
    assert run is not None
    return (
        run.state,
        run.current_attempt,
        run.error,
        [(a.attempt, a.owner, a.state, a.error_code, a.ended_at is None) for a in
         journal.attempts(run_id)],
    )  # fmt: skip


def test_the_complete_and_the_run_end_are_one_statement(
    journal: PostgresCommitJournal, pg_available: str, pg_schema: str
) -> None:
    """ADR 0013: the entry, its history, the run and attempt 1 as complete_proven and
    end_attempt leave them, all in one transaction (one xmin)."""
    folded, folded_entry = _born_with_run(journal)
    unfolded, unfolded_entry = _born_with_run(journal)
    done, ended = journal.complete_proven_ending_run(
        run_id=folded.run_id, attempt=1, **_completion(folded_entry)
    )
    assert ended is True
    plain = journal.complete_proven(**_completion(unfolded_entry))
    journal.end_attempt(run_id=unfolded.run_id, attempt=1, state=RunState.COMPLETE)
    same = ("state", "version", "lease_owner", "lease_epoch", "result", "intent_digest")
    assert [getattr(done, f) for f in same] == [getattr(plain, f) for f in same]
    assert done.state is S.COMPLETE
    assert journal.get(folded.operation_id) == done
    assert _history_shape(journal, folded.operation_id) == _history_shape(
        journal, unfolded.operation_id
    )
    assert _ledger_shape(journal, folded.run_id) == _ledger_shape(journal, unfolded.run_id)
    assert _ledger_shape(journal, folded.run_id) == (
        RunState.COMPLETE,
        1,
        None,
        [(1, OWNER_A, AttemptState.COMPLETE, None, False)],
    )
    s = f'"{pg_schema}"'
    with psycopg.connect(pg_available) as conn:
        xids = {
            conn.execute(query, (value,)).fetchone()[0]  # type: ignore[index]
            for query, value in (
                (f"SELECT xmin::text FROM {s}.dpone_journal WHERE operation_id = %s",
                 folded.operation_id),
                (f"SELECT xmin::text FROM {s}.dpone_runs WHERE run_id = %s", folded.run_id),
                (f"SELECT xmin::text FROM {s}.dpone_run_attempts WHERE run_id = %s",
                 folded.run_id),
            )
        }  # fmt: skip
    assert len(xids) == 1, xids


def test_a_refused_complete_ends_no_run(journal: PostgresCommitJournal) -> None:
    """The entry did not move (stale version, or another epoch): nothing of the run moves."""
    start, entry = _born_with_run(journal)
    before = _ledger_shape(journal, start.run_id)
    for stale in (
        {"expected_version": entry.version - 1},
        {"lease_epoch": entry.lease_epoch + 1},
        {"expected_states": frozenset({S.TARGET_COMMITTED})},
    ):
        with pytest.raises(JournalConflict):
            journal.complete_proven_ending_run(
                run_id=start.run_id, attempt=1, **{**_completion(entry), **stale}
            )
    assert journal.get(start.operation_id) == entry
    assert _ledger_shape(journal, start.run_id) == before
    assert before[0] is RunState.RUNNING


def test_a_run_at_another_attempt_is_not_ended_by_the_complete(
    journal: PostgresCommitJournal,
) -> None:
    """The run moved on to attempt 2: the entry completes, the run is left to its owner."""
    start, entry = _born_with_run(journal)
    journal.begin_attempt(run_id=start.run_id, attempt=2, owner=OWNER_B, provenance=CLI)
    before = _ledger_shape(journal, start.run_id)
    done, ended = journal.complete_proven_ending_run(
        run_id=start.run_id, attempt=1, **_completion(entry)
    )
    assert (done.state, ended) == (S.COMPLETE, False)
    assert _ledger_shape(journal, start.run_id) == before
    assert before[:2] == (RunState.RUNNING, 2)


def _stored_history(admin: psycopg.Connection[Any], schema: str, operation_id: str) -> list[Any]:
    return admin.execute(
        f"SELECT version, seq, from_state, to_state, kind, actor, lease_epoch, evidence::text "
        f'FROM "{schema}".dpone_transitions WHERE operation_id = %s ORDER BY version, seq',
        (operation_id,),
    ).fetchall()


@pytest.mark.parametrize("state", [S.COMPLETE, S.COMMITTING])
def test_a_birth_is_stored_as_one_history_row_and_read_as_its_steps(
    journal: PostgresCommitJournal,
    admin: psycopg.Connection[Any],
    pg_available: str,
    pg_schema: str,
    state: S,
) -> None:
    """ADR 0023: one stored row of kind 'born'; history() returns the create, lease and
    fold rows (6 born COMPLETE, 4 born COMMITTING), the rows the unfolded path writes."""
    op = new_operation_id()
    if state is S.COMPLETE:
        with psycopg.connect(pg_available, autocommit=True) as target, target.transaction():
            born = _born_complete(journal, target, op)
        evidence = {"mode": "atomic"}
    else:
        evidence = {"fence_epoch": 1}
        born = journal.create_committing(
            operation_id=op,
            intent_digest=DIGEST,
            metadata={"workload_id": "orders"},
            actor=OWNER_A,
            lease_ttl_seconds=30,
            evidence=evidence,
        )
    assert _stored_history(admin, pg_schema, op) == [
        (1, 0, None, state.value, _rules.BORN_KIND, OWNER_A, 1, json.dumps(evidence))
    ]
    history = journal.history(op)
    assert [(t.version, t.seq, t.from_state, t.to_state, t.kind) for t in history] == [
        (1, 0, None, S.PREPARING, "create"),
        (1, 1, S.PREPARING, S.PREPARING, "lease"),
        *[
            (2, seq, frm, to, "fold")
            for seq, (frm, to) in enumerate(
                [(S.PREPARING, S.PREPARED), (S.PREPARED, S.COMMITTING)]
                + (
                    [(S.COMMITTING, S.TARGET_COMMITTED), (S.TARGET_COMMITTED, S.COMPLETE)]
                    if state is S.COMPLETE
                    else []
                )
            )
        ],
    ]
    assert {t.actor for t in history} == {OWNER_A}
    assert {t.lease_epoch for t in history} == {1}
    assert {t.at for t in history} == {born.created_at}
    assert [dict(t.evidence) for t in history] == [
        {},
        {"owner": OWNER_A, "lease_epoch": 1},
        *[evidence] * (len(history) - 2),
    ]


def test_history_stored_a_row_per_step_reads_as_it_was(
    journal: PostgresCommitJournal, admin: psycopg.Connection[Any], pg_schema: str
) -> None:
    """A birth written before ADR 0023 (schema 5: the six rows its SQL wrote, written here
    by hand) reads unchanged, row for row, and as a stored 'born' row of it reads."""
    op = new_operation_id()
    at = journal.now()
    lease = json.dumps({"owner": OWNER_A, "lease_epoch": 1})
    fold = json.dumps({"mode": "atomic"})
    stored = [
        (1, 0, None, "PREPARING", "create", "{}"),
        (1, 1, "PREPARING", "PREPARING", "lease", lease),
        (2, 0, "PREPARING", "PREPARED", "fold", fold),
        (2, 1, "PREPARED", "COMMITTING", "fold", fold),
        (2, 2, "COMMITTING", "TARGET_COMMITTED", "fold", fold),
        (2, 3, "TARGET_COMMITTED", "COMPLETE", "fold", fold),
    ]
    for version, seq, frm, to, kind, evidence in stored:
        admin.execute(
            f'INSERT INTO "{pg_schema}".dpone_transitions (operation_id, version, seq, '
            "from_state, to_state, kind, actor, lease_epoch, evidence, at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, 1, %s::jsonb, to_timestamp(%s))",
            (op, version, seq, frm, to, kind, OWNER_A, evidence, at),
        )
    read = journal.history(op)
    assert [
        (
            t.operation_id,
            t.version,
            t.seq,
            None if t.from_state is None else t.from_state.value,
            t.to_state.value,
            t.kind,
            t.actor,
            t.lease_epoch,
            json.dumps(dict(t.evidence)),
        )
        for t in read
    ] == [(op, v, q, f, t, k, OWNER_A, 1, e) for v, q, f, t, k, e in stored]
    assert [t.at for t in read] == pytest.approx([at] * 6, abs=1e-5)
    # the same birth as ONE stored row reads as the same rows
    other = new_operation_id()
    admin.execute(
        f'INSERT INTO "{pg_schema}".dpone_transitions (operation_id, version, seq, '
        "from_state, to_state, kind, actor, lease_epoch, evidence, at) "
        "VALUES (%s, 1, 0, NULL, 'COMPLETE', 'born', %s, 1, %s::jsonb, to_timestamp(%s))",
        (other, OWNER_A, fold, at),
    )
    born = journal.history(other)
    assert [(t.version, t.seq, t.from_state, t.to_state, t.kind) for t in born] == [
        (t.version, t.seq, t.from_state, t.to_state, t.kind) for t in read
    ]
    assert [dict(t.evidence) for t in born] == [dict(t.evidence) for t in read]
    assert [(t.actor, t.lease_epoch) for t in born] == [(t.actor, t.lease_epoch) for t in read]
