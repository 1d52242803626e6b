"""Small operations on PostgreSQL through one Runner: the folded atomic path (ADR 0003).

Atomic mode (journal in the target database): a new operation is one transaction with
its journal entry; forward mode keeps its durable steps. Both reuse one connection and
the connector's cached table check, which must not hide a table that changed.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.adapters.journal.postgres import PostgresCommitJournal
from dpone.api import Runner
from dpone.config.workload import Workload, parse_workload, replace
from dpone.contracts.states import CommitState
from dpone.errors import (
    CommittedIncomplete,
    FenceUnavailable,
    InjectedFault,
    IntentConflict,
    TargetSchemaMismatch,
    TargetWriteFailed,
)
from dpone.runtime import failpoints
from dpone.testing.crash import check_history
from dpone.testing.ledger_conformance import ledger_problems
from dpone.testing.pg_probe import fence_holders, wait_until

INTERVAL = "2026-11-01/2026-11-02"
HEADER = "order_id,customer,amount,ordered_at\n"


def _csv(path: Path, first: int, rows: int = 3, *, bad: bool = False) -> None:
    lines = [
        f"{i},c{i},{'x' if bad else i}.5,2026-11-01T0{i % 10}:00:00Z"
        for i in range(first, first + rows)
    ]
    path.write_text(HEADER + "\n".join(lines) + "\n", encoding="utf-8")


def _workload(root: Path, dsn: str, schema: str, *, journal: str, lock: float = 10) -> Workload:
    return parse_workload(
        {
            "workload": "small",
            "release": "r1",
            "deployment": "d1",
            "journal": journal,
            "journal_schema": schema,
            "source": {
                "kind": "csv",
                "path": "p{partition}.csv",
                "columns": {
                    "order_id": "integer",
                    "customer": "text",
                    "amount": "real",
                    "ordered_at": "timestamp",
                },
            },
            "target": {
                "kind": "postgres",
                "url": dsn,
                "table": f"{schema}.orders",
                "fence_schema": schema,
                "lock_timeout_seconds": lock,
            },
            "load": {"strategy": "append"},
        },
        base_dir=root,
    )


@pytest.fixture
def atomic(tmp_path: Path, pg_available: str, pg_schema: str) -> Workload:
    for i in range(4):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    return _workload(tmp_path, pg_available, pg_schema, journal=pg_available)


def _rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT order_id FROM "{schema}".orders ORDER BY 1').fetchall()


def _entries(dsn: str, schema: str) -> list[Any]:
    journal = PostgresCommitJournal(dsn, schema=schema)
    try:
        return [(e, journal.history(e.operation_id)) for e in journal.list_entries()]
    finally:
        journal.close()


def test_atomic_small_operations_are_one_transaction_each(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    """Each new operation: COMPLETE at version 2 with the full history; a rerun replays."""
    with Runner(atomic) as runner:
        results = [runner.run(interval=INTERVAL, partition=str(i)) for i in range(3)]
        again = runner.run(interval=INTERVAL, partition="1")
    assert [r.mode.value for r in results] == ["atomic"] * 3
    assert [r.journal_version for r in results] == [2, 2, 2]
    assert [r.rows_written for r in results] == [3, 3, 3]
    assert again.replayed
    assert again.rows_written == 3
    assert len(_rows(pg_available, pg_schema)) == 9
    for entry, history in _entries(pg_available, pg_schema):
        assert entry.state is CommitState.COMPLETE
        assert entry.lease_owner is None
        assert check_history(history) == [], history
        assert [t.kind for t in history][:2] == ["create", "lease"]


def test_atomic_failed_write_is_recorded_failed_pre_commit_and_writes_nothing(
    atomic: Workload, tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """A row the target rejects rolls everything back; the journal still records the try."""
    with Runner(atomic) as runner:
        runner.run(interval=INTERVAL, partition="0")  # the table exists and is checked
        _csv(tmp_path / "p1.csv", first=10, bad=True)
        with pytest.raises(TargetWriteFailed):
            runner.run(interval=INTERVAL, partition="1")
        runner.run(interval=INTERVAL, partition="2")  # the connection is still usable
    assert [r[0] for r in _rows(pg_available, pg_schema)] == [0, 1, 2, 20, 21, 22]
    states = sorted(e.state.value for e, _ in _entries(pg_available, pg_schema))
    assert states == ["COMPLETE", "COMPLETE", "FAILED_PRE_COMMIT"]


def test_a_column_dropped_between_operations_is_refused_clearly(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    """The cached table check never hides a changed table: refused, nothing written."""
    with Runner(atomic) as runner:
        runner.run(interval=INTERVAL, partition="0")
        runner.run(interval=INTERVAL, partition="1")  # cached: the pipelined path
        with psycopg.connect(pg_available, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{pg_schema}".orders DROP COLUMN customer')
        with pytest.raises(TargetSchemaMismatch) as caught:
            runner.run(interval=INTERVAL, partition="2")
        assert "customer" in caught.value.message
        # checked again (not from the cache): still refused, before any write
        with pytest.raises(TargetSchemaMismatch, match="customer"):
            runner.run(interval=INTERVAL, partition="3")
        with psycopg.connect(pg_available, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{pg_schema}".orders ADD COLUMN customer text')
        runner.run(interval=INTERVAL, partition="3")
    assert len(_rows(pg_available, pg_schema)) == 9


def test_two_executors_racing_one_new_atomic_operation_write_once(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    """The second waits on the fence row, then finds the first's COMPLETE and replays."""
    with Runner(atomic) as warm:
        warm.run(interval=INTERVAL, partition="0")
    results: list[Any] = []
    failpoints.configure("fence.mutate.before_commit=sleep(0.6)@1")
    try:
        runners = [Runner(atomic), Runner(atomic)]
        threads = [
            threading.Thread(
                target=lambda r=r: results.append(r.run(interval=INTERVAL, partition="1"))
            )
            for r in runners
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        failpoints.configure(None)
        for r in runners:
            r.close()
    assert sorted(r.replayed for r in results) == [False, True]
    assert len(_rows(pg_available, pg_schema)) == 6


def test_a_waiter_past_its_lock_bound_is_unavailable_and_records_nothing(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """An in-flight atomic operation holds the fence row: a waiter gets FENCE_UNAVAILABLE."""
    for i in range(2):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    slow = _workload(tmp_path, pg_available, pg_schema, journal=pg_available)
    quick = _workload(tmp_path, pg_available, pg_schema, journal=pg_available, lock=0.3)
    with Runner(slow) as first, Runner(quick) as second:
        first.run(interval=INTERVAL, partition="0")
        second.run(interval=INTERVAL, partition="0")  # warm: replay
        failpoints.configure("fence.mutate.before_commit=sleep(1.5)@1")
        try:
            done: list[Any] = []
            thread = threading.Thread(
                target=lambda: done.append(first.run(interval=INTERVAL, partition="1"))
            )
            thread.start()

            def first_holds_the_fence() -> bool:
                assert thread.is_alive(), "the first run ended before it held the fence"
                return bool(fence_holders(pg_available, pg_schema))

            # paused in its one transaction, the fence row locked: the waiter must wait
            wait_until("the first run to hold the fence row", first_holds_the_fence)
            with pytest.raises(FenceUnavailable):
                second.run(interval=INTERVAL, partition="1")
            assert len(_entries(pg_available, pg_schema)) == 1, "nothing recorded meanwhile"
            thread.join(30)
        finally:
            failpoints.configure(None)
        assert not done[0].replayed
        assert second.run(interval=INTERVAL, partition="1").replayed
    assert len(_rows(pg_available, pg_schema)) == 6


def test_forward_small_operations_are_born_committing(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """Forward mode (journal in another database): create+lease+COMMITTING is one write."""
    for i in range(3):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    journal = pg_available.rsplit("/", 1)[0] + "/postgres"
    workload = _workload(tmp_path, pg_available, pg_schema, journal=journal)
    try:
        with Runner(workload) as runner:
            results = [runner.run(interval=INTERVAL, partition=str(i)) for i in range(3)]
            assert runner.run(interval=INTERVAL, partition="2").replayed
        assert [r.mode.value for r in results] == ["forward_recovery"] * 3
        assert [r.journal_version for r in results] == [3, 3, 3]
        assert len(_rows(pg_available, pg_schema)) == 9
        for entry, history in _entries(journal, pg_schema):
            assert entry.state is CommitState.COMPLETE
            assert check_history(history) == [], history
            assert [(t.version, t.kind) for t in history][:4] == [
                (1, "create"),
                (1, "lease"),
                (2, "fold"),
                (2, "fold"),
            ]
    finally:
        with psycopg.connect(journal, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


@pytest.mark.parametrize("mode", ["atomic", "forward"])
def test_an_empty_partition_after_small_ones_completes_with_no_rows(
    tmp_path: Path, pg_available: str, pg_schema: str, mode: str
) -> None:
    """A load with no rows on a table already checked: written by the general path (the
    small path's one statement needs a row), COMPLETE with 0 rows, replayed after."""
    for i in range(3):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    (tmp_path / "p3.csv").write_text(HEADER, encoding="utf-8")
    journal = pg_available if mode == "atomic" else pg_available.rsplit("/", 1)[0] + "/postgres"
    workload = _workload(tmp_path, pg_available, pg_schema, journal=journal)
    try:
        with Runner(workload) as runner:
            for partition in ("0", "1", "2"):
                runner.run(interval=INTERVAL, partition=partition)
            empty = runner.run(interval=INTERVAL, partition="3")
            assert (empty.replayed, empty.rows_written) == (False, 0)
            again = runner.run(interval=INTERVAL, partition="3")
            assert (again.replayed, again.rows_written) == (True, 0)
        assert len(_rows(pg_available, pg_schema)) == 9
        states = {e.operation_id: e.state for e, _ in _entries(journal, pg_schema)}
        assert states[empty.operation_id] is CommitState.COMPLETE
    finally:
        if mode == "forward":
            with psycopg.connect(journal, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


# ---------------------------------------------------------------------- the run ledger (ADR 0008)
def _ledger(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    """Every run with its attempts: (key, state, current attempt, [(n, state, owner)])."""
    journal = PostgresCommitJournal(dsn, schema=schema)
    try:
        return [
            (
                run.idempotency_key,
                run.state.value,
                run.current_attempt,
                [(a.attempt, a.state.value, a.owner) for a in journal.attempts(run.run_id)],
            )
            for run in sorted(journal.list_runs(limit=1000), key=lambda r: r.idempotency_key)
        ]
    finally:
        journal.close()


def test_atomic_first_attempt_records_its_run_in_the_same_transaction(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    """Run, attempt 1, journal entry and rows share one transaction id: all or nothing."""
    with Runner(atomic) as runner:
        runner.run(interval=INTERVAL, partition="0")  # creates and checks the table
        result = runner.run(interval=INTERVAL, partition="1")
        again = runner.run(interval=INTERVAL, partition="1")
    assert (result.attempt, again.replayed, again.run_id) == (1, True, result.run_id)
    runs = {key: rest for key, *rest in _ledger(pg_available, pg_schema)}
    state, current, attempts = runs[f"op:{result.operation_id}"]
    assert (state, current, [(n, s) for n, s, _ in attempts]) == ("COMPLETE", 1, [(1, "COMPLETE")])
    s, op = f'"{pg_schema}"', result.operation_id
    with psycopg.connect(pg_available) as conn:
        xids = [
            {r[0] for r in conn.execute(query, (value,)).fetchall()}
            for query, value in (
                (f"SELECT xmin::text FROM {s}.orders WHERE order_id >= %s", 10),
                (f"SELECT xmin::text FROM {s}.dpone_journal WHERE operation_id = %s", op),
                (f"SELECT xmin::text FROM {s}.dpone_runs WHERE run_id = %s", result.run_id),
                (f"SELECT xmin::text FROM {s}.dpone_run_attempts WHERE run_id = %s", result.run_id),
            )
        ]
    assert all(len(x) == 1 for x in xids), xids
    assert len(set().union(*xids)) == 1, xids


def test_a_failed_atomic_first_attempt_is_recorded_in_the_ledger_afterwards(
    atomic: Workload, tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """The folded transaction rolled back: run and attempt 1 FAILED, recorded afterwards.

    The journal records FAILED_PRE_COMMIT as before (ADR 0003), so another content under
    the same operation is still refused as an intent conflict.
    """
    _csv(tmp_path / "p1.csv", first=10, bad=True)
    with Runner(atomic) as runner:
        runner.run(interval=INTERVAL, partition="0")
        with pytest.raises(TargetWriteFailed):
            runner.run(interval=INTERVAL, partition="1")
        [(_, state, current, attempts)] = [
            run for run in _ledger(pg_available, pg_schema) if run[1] != "COMPLETE"
        ]
        assert (state, current, [(n, s) for n, s, _ in attempts]) == ("FAILED", 1, [(1, "FAILED")])
        _csv(tmp_path / "p1.csv", first=10)  # another content: another intent, refused
        with pytest.raises(IntentConflict):
            runner.run(interval=INTERVAL, partition="1")
    assert len(_rows(pg_available, pg_schema)) == 3


def test_a_replay_reads_the_run_and_writes_nothing(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    """A replay of a finished run: the recorded result, no ledger or journal write."""
    with Runner(atomic) as runner:
        first = runner.run(interval=INTERVAL, partition="0")
    before = _ledger(pg_available, pg_schema), _entries(pg_available, pg_schema)
    journal = PostgresCommitJournal(pg_available, schema=pg_schema)
    try:
        [run] = journal.list_runs()
        stamp = run.updated_at
        found, entry = journal.find_run(
            idempotency_key=run.idempotency_key, operation_id=first.operation_id
        )
        assert found == run
        assert entry is not None
        assert entry.state is CommitState.COMPLETE
        assert journal.find_run(idempotency_key="op:none", operation_id="sha256:0") == (None, None)
        with Runner(atomic) as runner:
            replay = runner.run(interval=INTERVAL, partition="0")
        assert (replay.replayed, replay.run_id, replay.rows_written) == (True, run.run_id, 3)
        [after] = journal.list_runs()
        assert after.updated_at == stamp
    finally:
        journal.close()
    assert (_ledger(pg_available, pg_schema), _entries(pg_available, pg_schema)) == before


def test_forward_first_attempt_records_its_run_with_the_entry(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """Forward: the run and attempt 1 are born with the COMMITTING entry, then end COMPLETE.

    An injected fault right after that write shows them recorded by it (attempt 1 is
    ended FAILED by this try); the rerun resumes as attempt 2.
    """
    for i in range(2):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    journal = pg_available.rsplit("/", 1)[0] + "/postgres"
    workload = _workload(tmp_path, pg_available, pg_schema, journal=journal)
    try:
        with Runner(workload) as runner:
            done = runner.run(interval=INTERVAL, partition="0")
            failpoints.configure("after:journal.create=raise")
            try:
                with pytest.raises(InjectedFault):
                    runner.run(interval=INTERVAL, partition="1")
            finally:
                failpoints.configure(None)
            # the other run than the first one's (keys are digests: their order is random)
            [(_, state, current, attempts)] = [
                run for run in _ledger(journal, pg_schema) if run[0] != f"op:{done.operation_id}"
            ]
            assert (state, current) == ("FAILED", 1)
            assert [(n, s) for n, s, _ in attempts] == [(1, "FAILED")]
            resumed = runner.run(interval=INTERVAL, partition="1")
        assert (done.attempt, resumed.attempt, resumed.resumed) == (1, 2, True)
        runs = {key: rest for key, *rest in _ledger(journal, pg_schema)}
        assert runs[f"op:{done.operation_id}"][:2] == ["COMPLETE", 1]
        assert [(n, s) for n, s, _ in runs[f"op:{done.operation_id}"][2]] == [(1, "COMPLETE")]
        assert runs[f"op:{resumed.operation_id}"][:2] == ["COMPLETE", 2]
        assert [(n, s) for n, s, _ in runs[f"op:{resumed.operation_id}"][2]] == [
            (1, "FAILED"),
            (2, "COMPLETE"),
        ]
        assert len(_rows(pg_available, pg_schema)) == 6
    finally:
        with psycopg.connect(journal, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


@pytest.fixture
def private_journal() -> Iterator[Any]:
    """A throwaway PostgreSQL server for the journal (never the shared one)."""
    from dpone.testing.pg_instance import PrivatePostgres

    server = PrivatePostgres()
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.destroy()


def _wal_syncs(dsn: str) -> int:
    """The server's WAL syncs, once every other session has ended.

    A session reports its WAL statistics when it ends (before it leaves
    pg_stat_activity), and a closed client's backend ends a moment after the close.
    """
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "other sessions still open after 30 s"
            time.sleep(0.05)
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


def test_forward_complete_needs_no_flush_and_survives_a_journal_crash(
    tmp_path: Path, pg_available: str, pg_schema: str, private_journal: Any
) -> None:
    """Forward mode: one WAL flush per operation on the journal's server (the entry born
    COMMITTING); the proven COMPLETE is not flushed by itself (ADR 0008). The journal's
    server then crashes right after the last COMPLETE: whatever it kept, rerunning every
    operation writes each row exactly once and the run ledger tells the truth.
    """
    ops = 22
    for i in range(ops):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    journal = private_journal.dsn
    workload = replace(
        _workload(tmp_path, pg_available, pg_schema, journal=journal), lease_ttl_seconds=1.0
    )
    with Runner(workload) as runner:
        runner.run(interval=INTERVAL, partition="0")  # migrations
    # sessions report their WAL statistics when they end: count between two Runners
    before = _wal_syncs(journal)
    with Runner(workload) as runner:
        for i in range(1, ops - 1):
            runner.run(interval=INTERVAL, partition=str(i))
    per_op = (_wal_syncs(journal) - before) / (ops - 2)
    with Runner(workload) as runner:
        runner.run(interval=INTERVAL, partition=str(ops - 1))
        private_journal.stop(mode="immediate")  # right after the last COMPLETE
    # before ADR 0008: 2 per operation (COMMITTING and COMPLETE); background flushes of
    # the server (the WAL writer, checkpoints) may add a few over the whole loop
    assert per_op < 1.5, per_op
    private_journal.start()
    private_journal.wait_ready()
    time.sleep(1.5)  # an entry back in COMMITTING is still leased to this very process
    with Runner(workload) as runner:
        results = [runner.run(interval=INTERVAL, partition=str(i)) for i in range(ops)]
    assert all(r.replayed or r.resumed for r in results), results
    assert len(_rows(pg_available, pg_schema)) == ops * 3
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        for result in results:
            entry = store.get(result.operation_id)
            assert entry is not None
            assert entry.state is CommitState.COMPLETE
            assert entry.result is not None
            assert entry.result["rows_written"] == 3
            problems = ledger_problems(
                store, operation_id=entry.operation_id, journal_epoch=entry.lease_epoch
            )
            assert problems == [], problems
    finally:
        store.close()
    with psycopg.connect(pg_available, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


def test_forward_first_attempt_ends_its_run_with_the_complete(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """ADR 0013: the entry's COMPLETE and the end of attempt 1 are one journal transaction.

    The ledger reads as before (run COMPLETE at attempt 1, attempt 1 COMPLETE and ended);
    a fault raised right after that write leaves the run COMPLETE, as the journal says.
    """
    for i in range(3):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    journal = pg_available.rsplit("/", 1)[0] + "/postgres"
    workload = _workload(tmp_path, pg_available, pg_schema, journal=journal)
    try:
        with Runner(workload) as runner:
            done = [runner.run(interval=INTERVAL, partition=str(i)) for i in range(2)]
            failpoints.configure("after:COMPLETE=raise")
            try:
                # the protocol reports a fault after its COMPLETE as an incomplete commit
                with pytest.raises(CommittedIncomplete):
                    runner.run(interval=INTERVAL, partition="2")
            finally:
                failpoints.configure(None)
            replay = runner.run(interval=INTERVAL, partition="2")
        assert [(r.attempt, r.resumed, r.replayed) for r in done] == [(1, False, False)] * 2
        assert (replay.replayed, replay.attempt) == (True, 1)
        ledger = _ledger(journal, pg_schema)
        assert [(state, current, [(n, s) for n, s, _ in attempts])
                for _, state, current, attempts in ledger] == [
            ("COMPLETE", 1, [(1, "COMPLETE")])
        ] * 3  # fmt: skip
        s = f'"{pg_schema}"'
        with psycopg.connect(journal) as conn:
            for result in done:
                xids = {
                    row[0]
                    for query, value in (
                        (f"SELECT xmin::text FROM {s}.dpone_journal WHERE operation_id = %s",
                         result.operation_id),
                        (f"SELECT xmin::text FROM {s}.dpone_runs WHERE run_id = %s",
                         result.run_id),
                        (f"SELECT xmin::text FROM {s}.dpone_run_attempts WHERE run_id = %s",
                         result.run_id),
                    )
                    for row in conn.execute(query, (value,)).fetchall()
                }  # fmt: skip
                assert len(xids) == 1, xids
        reader = PostgresCommitJournal(journal, schema=pg_schema)
        try:
            for result in (*done, replay):
                assert (
                    ledger_problems(reader, operation_id=result.operation_id, journal_epoch=1) == []
                ), result.operation_id
        finally:
            reader.close()
        assert len(_rows(pg_available, pg_schema)) == 9
    finally:
        with psycopg.connect(journal, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


@pytest.mark.parametrize("mode", ["atomic", "forward"])
def test_operations_leave_no_cyclic_garbage(
    tmp_path: Path, pg_available: str, pg_schema: str, mode: str
) -> None:
    """New operations and replays through one Runner free what they built by reference
    counting: none leaves a reference cycle for the cyclic collector (one per operation
    used to, and made a full collection of every object every few thousand operations)."""
    ops = 20
    for i in range(ops + 2):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    journal = pg_available if mode == "atomic" else pg_available.rsplit("/", 1)[0] + "/postgres"
    workload = _workload(tmp_path, pg_available, pg_schema, journal=journal)
    try:
        with Runner(workload) as runner:
            for i in range(2):  # the DDL, then the table's shape checked: as every Runner
                runner.run(interval=INTERVAL, partition=str(i))
            gc.collect()
            gc.disable()
            try:
                new = [runner.run(interval=INTERVAL, partition=str(i)) for i in range(2, ops + 2)]
                again = [runner.run(interval=INTERVAL, partition=str(i)) for i in range(2, 6)]
                found = gc.collect()
            finally:
                gc.enable()
        assert not any(r.replayed for r in new)
        assert all(r.replayed for r in again)
        # fewer unreachable objects than operations: not one cycle per operation (a
        # thread of the pool may still leave one now and then)
        assert found < ops, found
        assert len(_rows(pg_available, pg_schema)) == 3 * (ops + 2)
    finally:
        if mode == "forward":
            with psycopg.connect(journal, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
