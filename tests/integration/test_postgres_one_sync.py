"""The PostgreSQL small path of a first attempt: one sync for the whole transaction (ADR 0016).

BEGIN, the rows with the fence row INSERTed committed, the journal's queued statement and
COMMIT go out together. What must hold: a fence row that already exists commits nothing
and is then judged as before; every error is attributed to the statement that raised it
(the connector's, the queued statement's, or COMMIT's); nothing half-written commits.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dpone.adapters.connectors.postgres import PostgresConnector
from dpone.adapters.journal.postgres import PostgresCommitJournal
from dpone.contracts.fence import FenceStatus
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy
from dpone.contracts.run import RunStart
from dpone.errors import (
    DponeError,
    FencedOut,
    FenceUnavailable,
    JournalConflict,
    JournalUnavailable,
    TargetWriteFailed,
)
from dpone.ports.connector import Collector, QueuedWithin
from dpone.testing.ledger_conformance import new_start
from dpone.testing.pg_probe import wait_until

COLUMNS = (
    Column(name="id", type=ColumnType.INTEGER),
    Column(name="name", type=ColumnType.TEXT),
)
_ids = count(1)


class _Mine(DponeError):
    """The queued statement's own error, as a journal would translate it."""


def _op() -> tuple[str, str]:
    n = next(_ids)
    return (
        "sha256:" + hashlib.sha256(f"one-sync-op{n}".encode()).hexdigest(),
        "sha256:" + hashlib.sha256(f"one-sync-intent{n}".encode()).hexdigest(),
    )


class Target:
    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.connector = PostgresConnector(dsn, table=f"{schema}.items", fence_schema=schema)
        self.plan = LoadPlan(table=f"{schema}.items", strategy=LoadStrategy.APPEND, columns=COLUMNS)

    def query(self, statement: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def mutate(self, op: str, intent: str, rows: list[tuple[object, ...]], **kw: Any) -> Any:
        return self.connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=kw.pop("epoch", 1),
            plan=self.plan,
            batches=[rows],
            content_digest="sha256:" + "c" * 64,
            prepare=kw.pop("prepare", True),
            **kw,
        )

    def ids(self) -> list[int]:
        return [int(r[0]) for r in self.query("SELECT id FROM items ORDER BY id")]


@pytest.fixture
def target(pg_available: str, pg_schema: str) -> Iterator[Target]:
    target = Target(pg_available, pg_schema)
    target.mutate(*_op(), [(0, "warm")])  # creates the table
    target.mutate(*_op(), [(-1, "warm")])  # checks it: from here on, the small path
    yield target
    target.connector.close()


def _queued(schema: str, statement: str, seen: list[BaseException | None]) -> QueuedWithin:
    """A QueuedWithin that queues ``statement`` and reports what its collector was given."""

    def queue(txn: object) -> Collector:
        assert isinstance(txn, psycopg.Connection)
        cur = txn.cursor()
        try:  # queued first, after BEGIN: an error its execute reads is its own
            cur.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))
        except psycopg.Error as exc:
            raise _Mine("the queued statement failed") from exc

        def collect(error: BaseException | None) -> None:
            seen.append(error)
            if error is not None and cur.pgresult is None:
                raise _Mine("the queued statement failed") from error

        return collect

    return QueuedWithin(queue)


class _Trace:
    """libpq's protocol trace of the connector's connection: count the syncs answered."""

    def __init__(self, connector: PostgresConnector) -> None:
        conn = connector._conn
        assert conn is not None
        self._pgconn = conn.pgconn
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in count()
        self._pgconn.trace(self._file.fileno())

    def ready_for_query(self) -> int:
        self._pgconn.untrace()
        self._file.seek(0)
        text = self._file.read().decode()
        self._file.close()
        return sum(1 for line in text.splitlines() if "\tB\t" in line and "ReadyForQuery" in line)


def test_a_first_attempt_is_one_round_trip_with_the_queued_statement(target: Target) -> None:
    """Rows, fence, the queued statement and COMMIT: one ReadyForQuery, all committed."""
    target.query("CREATE TABLE side (n int)")
    seen: list[BaseException | None] = []
    op, intent = _op()
    trace = _Trace(target.connector)
    report = target.mutate(
        op,
        intent,
        [(1, "a"), (2, "b")],
        within=_queued(target.schema, "INSERT INTO {s}.side VALUES (7)", seen),
    )
    assert trace.ready_for_query() == 1
    assert seen == [None]
    assert report.row_count == 2
    assert report.committed is not None
    assert report.committed.status is FenceStatus.COMMITTED
    assert target.ids() == [-1, 0, 1, 2]
    assert target.query("SELECT n FROM side") == [(7,)]
    assert target.connector.observe(operation_id=op).status is FenceStatus.COMMITTED


def test_a_prepared_fence_row_is_judged_after_the_insert_met_it(target: Target) -> None:
    """A row prepare() left at epoch 1: the INSERT rolls back, the upsert admits it, once."""
    op, intent = _op()
    target.connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    target.query("CREATE TABLE side (n int)")
    seen: list[BaseException | None] = []
    target.mutate(
        op,
        intent,
        [(1, "a")],
        within=_queued(target.schema, "INSERT INTO {s}.side VALUES (1)", seen),
    )
    assert target.ids() == [-1, 0, 1]
    assert target.query("SELECT count(*) FROM side") == [(1,)]  # the retried queue only
    assert target.connector.observe(operation_id=op).status is FenceStatus.COMMITTED


def test_a_committed_fence_row_refuses_and_commits_nothing(target: Target) -> None:
    """Another executor's committed row: FencedOut, no row, no queued write kept."""
    op, intent = _op()
    target.mutate(op, intent, [(1, "a")])
    target.query("CREATE TABLE side (n int)")
    seen: list[BaseException | None] = []
    with pytest.raises(FencedOut):
        target.mutate(
            op,
            intent,
            [(2, "b")],
            within=_queued(target.schema, "INSERT INTO {s}.side VALUES (1)", seen),
        )
    assert target.ids() == [-1, 0, 1]
    assert target.query("SELECT count(*) FROM side") == [(0,)]


def test_the_queued_statement_s_error_is_its_own(target: Target) -> None:
    """The queued statement fails: its collector raises its error; rows and fence roll back."""
    seen: list[BaseException | None] = []
    op, intent = _op()
    with pytest.raises(_Mine) as caught:
        target.mutate(op, intent, [(1, "a")], within=_queued(target.schema, "SELECT 1/0", seen))
    # read at its own execute (nothing seen) or at a later one (offered to the collector)
    assert isinstance(caught.value.__cause__, psycopg.errors.DivisionByZero)
    assert len(seen) <= 1
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT
    target.mutate(*_op(), [(3, "c")])  # the connection is usable again
    assert target.ids() == [-1, 0, 3]


def test_a_rejected_row_is_offered_to_the_queue_which_declines_it(target: Target) -> None:
    """A value the table refuses: the collector (its statement succeeded) declines it, and
    the connector reports it as its own, TargetWriteFailed."""
    seen: list[BaseException | None] = []
    op, intent = _op()
    with pytest.raises(TargetWriteFailed):
        target.mutate(
            op,
            intent,
            [(1, "a"), ("not-a-number", "b")],
            within=_queued(target.schema, "SELECT 1", seen),
        )
    assert len(seen) == 1
    assert isinstance(seen[0], psycopg.errors.InvalidTextRepresentation)
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT


def test_an_error_at_commit_is_offered_to_the_queue_then_the_connector_s(
    target: Target,
) -> None:
    """A deferred unique constraint fails at COMMIT: the collector declines it, nothing kept."""
    target.query(
        "ALTER TABLE items ADD CONSTRAINT items_once UNIQUE (id) DEFERRABLE INITIALLY DEFERRED"
    )
    seen: list[BaseException | None] = []
    op, intent = _op()
    with pytest.raises(TargetWriteFailed, match="items_once"):
        target.mutate(op, intent, [(0, "again")], within=_queued(target.schema, "SELECT 1", seen))
    assert len(seen) == 1
    assert isinstance(seen[0], psycopg.errors.UniqueViolation)
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT


def test_a_resumed_epoch_keeps_judging_under_the_lock(target: Target) -> None:
    """Epoch 2 after a seal is no first attempt: the upsert path, two syncs, as before."""
    op, intent = _op()
    target.connector.seal(operation_id=op, epoch=2)
    trace = _Trace(target.connector)
    target.mutate(op, intent, [(5, "e")], epoch=2)
    assert trace.ready_for_query() == 2
    assert target.ids() == [-1, 0, 5]


def test_without_a_queued_within_the_old_path_runs(target: Target) -> None:
    """A plain ``within`` may read results itself: the connector syncs before calling it."""
    op, intent = _op()
    calls: list[int] = []

    def plain(txn: object) -> None:
        assert isinstance(txn, psycopg.Connection)
        calls.append(len(txn.execute("SELECT 1").fetchall()))

    target.mutate(op, intent, [(6, "f")], within=plain)
    assert calls == [1]
    assert target.ids() == [-1, 0, 6]


def _journal_within(journal: PostgresCommitJournal, op: str, intent: str) -> QueuedWithin:
    """The real journal's entry born COMPLETE, queued as the atomic first attempt does."""

    def queue(txn: object) -> Collector:
        pending = journal.queue_complete_within(
            txn,
            operation_id=op,
            intent_digest=intent,
            metadata={},
            actor="tester",
            result={"rows_written": 1},
            evidence={"mode": "atomic"},
        )

        def collect(error: BaseException | None) -> None:
            pending(error)

        return collect

    return QueuedWithin(queue)


@pytest.fixture
def journal(target: Target) -> Iterator[PostgresCommitJournal]:
    journal = PostgresCommitJournal(target.dsn, schema=target.schema)
    yield journal
    journal.close()


def test_the_real_journal_s_entry_commits_with_the_rows_at_one_sync(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """The journal's queued INSERT, the rows and the fence: one round trip, all kept."""
    op, intent = _op()
    trace = _Trace(target.connector)
    target.mutate(op, intent, [(1, "a")], within=_journal_within(journal, op, intent))
    assert trace.ready_for_query() == 1
    entry = journal.get(op)
    assert entry is not None
    assert entry.state.value == "COMPLETE"
    assert target.ids() == [-1, 0, 1]


def test_an_existing_entry_is_journal_conflict_and_nothing_is_written(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """Another executor's entry (no fence row yet): JournalConflict, no row, no fence."""
    op, intent = _op()
    journal.create_intent(operation_id=op, intent_digest=intent, metadata={}, actor="other")
    with pytest.raises(JournalConflict):
        target.mutate(op, intent, [(1, "a")], within=_journal_within(journal, op, intent))
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT
    entry = journal.get(op)
    assert entry is not None
    assert entry.state.value == "PREPARING"  # the other executor's, untouched


def test_a_rejected_row_after_the_real_journal_s_insert_is_the_connector_s(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """The journal's INSERT went first and succeeded; the row fails: TargetWriteFailed."""
    op, intent = _op()
    with pytest.raises(TargetWriteFailed):
        target.mutate(
            op, intent, [("not-a-number", "a")], within=_journal_within(journal, op, intent)
        )
    assert journal.get(op) is None
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT


def test_a_warm_and_a_cold_writer_of_one_operation_never_deadlock(target: Target) -> None:
    """The one-sync path writes its queued statements before the fence row, the general
    path (a connector's first load of a table) the fence row first: both take the
    operation's advisory lock first, so they queue instead of deadlocking."""
    target.query("CREATE TABLE side (k text PRIMARY KEY)")
    op, intent = _op()
    side = sql.Identifier(target.schema, "side")

    def slow_queue(txn: object) -> Collector:
        assert isinstance(txn, psycopg.Connection)
        cur = txn.cursor()
        cur.execute(sql.SQL("INSERT INTO {} VALUES ('k')").format(side))
        cur.execute("SELECT pg_sleep(0.8)")  # holds 'k' while the other writer starts

        def collect(error: BaseException | None) -> None:
            cur.close()

        return collect

    def cold_within(txn: object) -> None:
        assert isinstance(txn, psycopg.Connection)
        txn.execute(sql.SQL("INSERT INTO {} VALUES ('k')").format(side))

    done: list[object] = []
    warm = threading.Thread(
        target=lambda: done.append(
            target.mutate(op, intent, [(1, "a")], within=QueuedWithin(slow_queue))
        )
    )
    cold = PostgresConnector(target.dsn, table=target.plan.table, fence_schema=target.schema)
    try:
        warm.start()
        wait_until(
            "the warm writer to sleep inside its transaction",
            lambda: bool(
                target.query("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            ),
        )
        with pytest.raises(FencedOut):  # waited for the warm commit, then refused
            cold.mutate(
                operation_id=op,
                intent_digest=intent,
                epoch=1,
                plan=target.plan,
                batches=[[(1, "a")]],
                content_digest="sha256:" + "c" * 64,
                within=cold_within,
                prepare=True,
            )
        warm.join(30)
    finally:
        cold.close()
    assert len(done) == 1
    assert target.ids() == [-1, 0, 1]
    assert target.query("SELECT k FROM side") == [("k",)]


def _failing_behind(conn: psycopg.Connection[Any]) -> None:
    """In a pipeline: a statement that fails a second later is sent, and the block fails
    at once with an error of its own, so the pipeline ends aborted while one is raised."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1 / 0 FROM pg_sleep(1)")
        raise psycopg.errors.QueryCanceled("the block's own error")


def test_a_pipeline_ends_quietly_before_its_statement_error_is_raised(
    pg_available: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An error raised inside a pipeline block (as a later execute raises an earlier
    statement's error) while the pipeline is aborted: psycopg's own pipeline logs a
    second error ending it ("error ignored terminating"); ``pipeline_quietly`` ends the
    pipeline first and raises the first error alone. The connection is usable after."""
    from dpone.adapters._pg import pipeline_quietly

    canceled = psycopg.errors.QueryCanceled
    with psycopg.connect(pg_available, autocommit=True) as conn:
        warnings = caplog.at_level("WARNING", logger="psycopg")
        with warnings, pytest.raises(canceled), conn.pipeline():
            _failing_behind(conn)
        logged = [r.getMessage() for r in caplog.records]
        assert [m[:25] for m in logged] == ["error ignored terminating"], logged
        caplog.clear()
        warnings = caplog.at_level("WARNING", logger="psycopg")
        with warnings, pytest.raises(canceled, match="own error"), pipeline_quietly(conn):
            _failing_behind(conn)
        assert caplog.records == []
        assert conn.execute("SELECT 3").fetchone() == (3,)


# ------------------------------------------------ fused: one autocommit statement (ADR 0022)


def _entry_fields(op: str, intent: str) -> dict[str, Any]:
    """An atomic entry born COMPLETE, as the fused and queued writers take it."""
    return {
        "operation_id": op,
        "intent_digest": intent,
        "metadata": {},
        "actor": "tester",
        "result": {"rows_written": 1},
        "evidence": {"mode": "atomic"},
    }


def _fused_within(journal: PostgresCommitJournal, op: str, intent: str) -> QueuedWithin:
    """``_journal_within`` that also offers the entry's INSERT as a ``Fused`` part."""
    fields = _entry_fields(op, intent)
    queued = _journal_within(journal, op, intent)
    return QueuedWithin(queued.queue, fuse=lambda txn: journal.fuse_complete_within(txn, **fields))


def _waits_for_advisory(target: Target) -> bool:
    """True once the connector's own session waits for an advisory lock (the gate)."""
    conn = target.connector._conn
    assert conn is not None
    return bool(
        target.query(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock' "
            "AND wait_event = 'advisory'",
            (conn.info.backend_pid,),
        )
    )


def _messages(trace_text: str, kind: str) -> int:
    return sum(1 for line in trace_text.splitlines() if "\tF\t" in line and f"\t{kind}" in line)


def test_a_fused_first_attempt_is_one_statement_with_no_begin_or_commit(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """Entry, rows and fence: ONE Bind/Execute, one ReadyForQuery, no BEGIN nor COMMIT."""
    op, intent = _op()
    conn = target.connector._conn
    assert conn is not None
    with tempfile.TemporaryFile() as file:
        conn.pgconn.trace(file.fileno())
        report = target.mutate(
            op, intent, [(1, "a"), (2, "b")], within=_fused_within(journal, op, intent)
        )
        conn.pgconn.untrace()
        file.seek(0)
        text = file.read().decode()
    assert _messages(text, "Execute") == 1
    assert _messages(text, "Query") == 0  # BEGIN and COMMIT would be simple queries
    assert "BEGIN ISOLATION" not in text
    assert sum(1 for line in text.splitlines() if "ReadyForQuery" in line) == 1
    assert report.row_count == 2
    assert report.committed is not None
    assert report.committed.status is FenceStatus.COMMITTED
    entry = journal.get(op)
    assert entry is not None
    assert entry.state.value == "COMPLETE"
    assert [t.to_state.value for t in journal.history(op)][-1] == "COMPLETE"
    assert len(journal.history(op)) == 6
    # its history is ONE stored row (ADR 0023)
    assert target.query(
        f'SELECT kind FROM "{journal.schema}".dpone_transitions WHERE operation_id = %s', (op,)
    ) == [("born",)]
    assert target.ids() == [-1, 0, 1, 2]


def test_a_fused_insert_meeting_an_entry_is_journal_conflict_and_writes_nothing(
    target: Target, journal: PostgresCommitJournal
) -> None:
    op, intent = _op()
    journal.create_intent(operation_id=op, intent_digest=intent, metadata={}, actor="other")
    with pytest.raises(JournalConflict):
        target.mutate(op, intent, [(1, "a")], within=_fused_within(journal, op, intent))
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT
    entry = journal.get(op)
    assert entry is not None
    assert entry.state.value == "PREPARING"  # the other's, untouched


def test_a_rejected_row_in_a_fused_statement_is_the_connector_s_and_keeps_no_entry(
    target: Target, journal: PostgresCommitJournal
) -> None:
    op, intent = _op()
    with pytest.raises(TargetWriteFailed):
        target.mutate(
            op, intent, [("not-a-number", "a")], within=_fused_within(journal, op, intent)
        )
    assert journal.get(op) is None
    assert journal.history(op) == []
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT
    target.mutate(*_op(), [(3, "c")])  # the connection is usable again
    assert target.ids() == [-1, 0, 3]


def test_a_fused_statement_meeting_a_committed_fence_row_is_refused_with_no_entry(
    target: Target, journal: PostgresCommitJournal
) -> None:
    op, intent = _op()
    target.mutate(op, intent, [(1, "a")])  # another executor's committed row, no entry
    with pytest.raises(FencedOut):
        target.mutate(op, intent, [(2, "b")], within=_fused_within(journal, op, intent))
    assert target.ids() == [-1, 0, 1]
    assert journal.get(op) is None


def _fused_behind_the_lock(
    target: Target,
    journal: PostgresCommitJournal,
    rows: list[tuple[object, ...]],
    then: Callable[[psycopg.Connection[Any], str, str], None],
) -> tuple[str, BaseException | None]:
    """Hold a new operation's lock, start its fused write, wait until that write waits
    for the lock, run ``then(holder, op, intent)`` (a deadlock fails it within 2 s, never
    hangs), commit; return the operation and what the write raised (None: it wrote)."""
    from dpone.adapters.connectors.postgres import _operation_key

    op, intent = _op()
    done: list[BaseException | None] = []

    def fused() -> None:
        try:
            target.mutate(op, intent, rows, within=_fused_within(journal, op, intent))
            done.append(None)
        except BaseException as exc:  # handed to the test
            done.append(exc)

    with psycopg.connect(target.dsn) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (_operation_key(op),))
        writer = threading.Thread(target=fused)
        writer.start()
        wait_until(
            "the fused statement to wait for the operation's lock",
            lambda: _waits_for_advisory(target),
        )
        holder.execute("SET lock_timeout = '2s'")
        then(holder, op, intent)
        holder.commit()
    writer.join(30)
    assert len(done) == 1
    return op, done[0]


def test_a_fused_statement_takes_the_operation_lock_before_any_write(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """Another writer holds the operation's lock: the fused statement waits for it before
    writing its fence row (else that writer's own fence INSERT would wait on ours and
    deadlock), then meets the row that writer committed and is refused."""
    from dpone.adapters.connectors.postgres import FENCE_TABLE

    def commit_the_fence_row(holder: psycopg.Connection[Any], op: str, intent: str) -> None:
        holder.execute(
            sql.SQL(
                "INSERT INTO {} (operation_id, intent_digest, epoch, state, row_count, "
                "content_digest, committed_at) VALUES (%s, %s, 1, 'committed', 0, %s, now())"
            ).format(sql.Identifier(target.schema, FENCE_TABLE)),
            (op, intent, "sha256:" + "d" * 64),
        )

    op, raised = _fused_behind_the_lock(target, journal, [(1, "a")], commit_the_fence_row)
    assert isinstance(raised, FencedOut), raised
    assert target.ids() == [-1, 0]
    assert journal.get(op) is None


def test_a_journal_error_naming_no_table_is_the_journal_s_not_the_connector_s(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """A trigger on the journal's table RAISEs (an error that names no table): the fused
    statement cannot tell whose it is, so the writes go again pipelined, where the
    statement order says it is the journal's: JournalUnavailable, nothing written."""
    op, intent = _op()
    journal.migrate()  # the tables the trigger is on
    schema = sql.Identifier(target.schema)
    target.query(
        sql.SQL(
            "CREATE FUNCTION {}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'the journal refuses'; END $$"
        )
        .format(schema)
        .as_string(None)
    )
    target.query(
        sql.SQL(
            "CREATE TRIGGER refuse BEFORE INSERT ON {}.dpone_journal "
            "FOR EACH ROW EXECUTE FUNCTION {}.refuse()"
        )
        .format(schema, schema)
        .as_string(None)
    )
    with pytest.raises(JournalUnavailable, match="RaiseException P0001"):
        target.mutate(op, intent, [(1, "a")], within=_fused_within(journal, op, intent))
    assert target.ids() == [-1, 0]
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT
    target.query(sql.SQL("DROP TRIGGER refuse ON {}.dpone_journal").format(schema).as_string(None))
    target.mutate(op, intent, [(1, "a")], within=_fused_within(journal, op, intent))
    assert target.ids() == [-1, 0, 1]  # the same connection writes the next try once


def _fused_run_within(
    journal: PostgresCommitJournal, start: RunStart, op: str, intent: str
) -> QueuedWithin:
    """The atomic first attempt of a new run: entry, run and attempt 1, queued or fused."""
    fields = _entry_fields(op, intent)
    queued = journal.queue_complete_run_entry_writer(start, owner="tester")
    fused = journal.fuse_complete_run_entry_writer(start, owner="tester")

    def queue(txn: object) -> Collector:
        pending = queued(txn, **fields)

        def collect(error: BaseException | None) -> None:
            pending(error)

        return collect

    return QueuedWithin(queue, fuse=lambda txn: fused(txn, **fields))


def test_a_run_key_taken_is_journal_conflict_even_with_a_row_the_target_rejects(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """The run's INSERT goes before the rows' (the entry reads ``run``): a key another
    executor recorded is JournalConflict, not the rejected row's TargetWriteFailed, as
    the queued form reports it (its statements come first)."""
    target.query("ALTER TABLE items ADD CONSTRAINT above CHECK (id > -100)")
    start = new_start()
    journal.begin_run(start)  # another executor's run under the key
    op, intent = _op()
    with pytest.raises(JournalConflict):
        target.mutate(
            op, intent, [(-500, "x")], within=_fused_run_within(journal, start, op, intent)
        )
    assert journal.get(op) is None
    assert target.ids() == [-1, 0]
    fresh, op2 = new_start(), _op()
    with pytest.raises(TargetWriteFailed, match="rejected a row"):
        target.mutate(*op2, [(-500, "x")], within=_fused_run_within(journal, fresh, *op2))
    assert journal.get_run(fresh.run_id) is None  # the row's error: no run either


def test_a_fused_write_on_a_connection_in_a_transaction_is_refused_unsent(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """One statement commits by succeeding only in autocommit: anything else is refused
    before a byte is sent, and nothing is written."""
    op, intent = _op()
    conn = target.connector._conn
    assert conn is not None
    conn.autocommit = False
    try:
        with pytest.raises(RuntimeError, match="idle autocommit"):
            target.mutate(op, intent, [(1, "a")], within=_fused_within(journal, op, intent))
    finally:
        conn.rollback()
        conn.autocommit = True
    assert target.ids() == [-1, 0]
    assert journal.get(op) is None


def test_a_fused_write_whose_row_cannot_be_read_is_unconfirmed_not_failed(
    target: Target, journal: PostgresCommitJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement succeeded (it committed) but its row is missing: FenceUnavailable,
    which the protocol never records as a failure; the entry and rows did commit, so
    the next try finds them in the journal."""
    op, intent = _op()
    monkeypatch.setattr(psycopg.RawCursor, "fetchone", lambda self: None)
    with pytest.raises(FenceUnavailable, match="reads the journal before writing"):
        target.mutate(op, intent, [(1, "a")], within=_fused_within(journal, op, intent))
    monkeypatch.undo()
    entry = journal.get(op)
    assert entry is not None
    assert entry.state.value == "COMPLETE"
    assert target.ids() == [-1, 0, 1]


def test_a_fused_statement_writes_its_rows_only_past_the_operation_lock(
    target: Target, journal: PostgresCommitJournal
) -> None:
    """Another writer holds the operation's lock and writes a row under a key the fused
    statement also writes: it never waits (the fused rows are not written yet, else it
    would wait on them while they wait on its lock: a deadlock), commits, and the fused
    statement then meets that key: the connector's error, nothing of it written."""
    target.query("CREATE UNIQUE INDEX ON items (id)")

    def write_the_key(holder: psycopg.Connection[Any], op: str, intent: str) -> None:
        # rows written before the lock would make this wait on them: lock_timeout
        holder.execute(
            sql.SQL("INSERT INTO {} (id, name) VALUES (7, 'holder')").format(
                sql.Identifier(target.schema, "items")
            )
        )

    op, raised = _fused_behind_the_lock(target, journal, [(7, "a")], write_the_key)
    assert isinstance(raised, TargetWriteFailed), raised
    assert target.ids() == [-1, 0, 7]
    assert target.query("SELECT name FROM items WHERE id = 7") == [("holder",)]
    assert journal.get(op) is None
    assert target.connector.observe(operation_id=op).status is FenceStatus.ABSENT


def test_a_fused_statement_timing_out_on_the_gate_waits_once_and_is_fence_unavailable(
    pg_available: str, pg_schema: str
) -> None:
    """A lock wait past ``lock_timeout_s`` names no table, yet it is no one's statement:
    FenceUnavailable after ONE wait (never written again to wait twice), nothing written."""
    import time

    from dpone.adapters.connectors.postgres import _operation_key

    target = Target(pg_available, pg_schema)
    target.connector.close()
    target.connector = PostgresConnector(
        pg_available, table=f"{pg_schema}.items", fence_schema=pg_schema, lock_timeout_s=0.5
    )
    journal = PostgresCommitJournal(pg_available, schema=pg_schema)
    try:
        target.mutate(*_op(), [(0, "warm")])
        target.mutate(*_op(), [(-1, "warm")])
        op, intent = _op()
        with psycopg.connect(pg_available) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (_operation_key(op),))
            started = time.monotonic()
            with pytest.raises(FenceUnavailable):
                target.mutate(op, intent, [(1, "a")], within=_fused_within(journal, op, intent))
            waited = time.monotonic() - started
        assert 0.5 <= waited < 0.95, waited  # one lock_timeout, not two
        assert target.ids() == [-1, 0]
        assert journal.get(op) is None
    finally:
        journal.close()
        target.connector.close()
