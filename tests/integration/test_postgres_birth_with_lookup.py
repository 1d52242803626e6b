"""Forward mode's lookup and a new entry's birth in one statement (ADR 0018), on PostgreSQL.

The birth is guarded by the absence of both the run's key and the entry: it writes
nothing, and raises nothing, when the lookup finds either. A Runner whose target plan is
already checked sends it instead of a lookup followed by the birth.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.adapters.connectors.postgres import PostgresConnector
from dpone.adapters.journal._ahead import SendsAhead, SessionLost
from dpone.adapters.journal.postgres import PostgresCommitJournal
from dpone.api import Runner
from dpone.config.workload import parse_workload, replace
from dpone.contracts.states import CommitState
from dpone.errors import DponeError, ErrorCode, JournalUnavailable, LeaseHeld
from dpone.runtime import failpoints
from dpone.runtime.commit_protocol import CommitProtocol
from dpone.testing.crash import check_history
from dpone.testing.ledger_conformance import CLI, ledger_problems, new_start

INTERVAL = "2026-11-01/2026-11-02"
DIGEST = "sha256:" + "ab" * 32
OWNER = "host-a:1"


@pytest.fixture
def journal(pg_available: str, pg_schema: str) -> Iterator[PostgresCommitJournal]:
    journal = PostgresCommitJournal(pg_available, schema=pg_schema)
    yield journal
    journal.close()


def _birth(
    journal: PostgresCommitJournal,
    start: Any,
    operation_id: str | None = None,
    actor: str = OWNER,
    *,
    ahead: bool = False,
) -> Any:
    """The birth-or-lookup of ``start``; ``ahead``: sent ahead, what reads its answer."""
    call = (
        journal.send_find_run_or_create_committing
        if ahead
        else journal.find_run_or_create_committing
    )
    return call(
        start,
        provenance=CLI,
        operation_id=operation_id or start.operation_id,
        intent_digest=DIGEST,
        metadata={"workload_id": "orders"},
        actor=actor,
        lease_ttl_seconds=30,
        evidence={"fence_epoch": 1},
    )


def _counts(dsn: str, schema: str) -> tuple[int, ...]:
    s = f'"{schema}"'
    with psycopg.connect(dsn) as conn:
        return tuple(
            conn.execute(f"SELECT count(*) FROM {s}.{table}").fetchone()[0]  # type: ignore[index]
            for table in ("dpone_runs", "dpone_run_attempts", "dpone_journal", "dpone_transitions")
        )


def test_a_new_entry_is_born_with_its_run_and_found_afterwards(
    journal: PostgresCommitJournal, pg_available: str, pg_schema: str
) -> None:
    """Born: COMMITTING at epoch 1, leased, the run RUNNING at attempt 1, as the two-step
    birth leaves them. Asked again: found, as ``find_run`` reads them; nothing written."""
    start = new_start()
    run, entry, born = _birth(journal, start)
    assert (run, born) == (None, True)
    assert (entry.state, entry.version, entry.lease_owner, entry.lease_epoch) == (
        CommitState.COMMITTING,
        2,
        OWNER,
        1,
    )
    assert [(t.version, t.kind, t.to_state) for t in journal.history(entry.operation_id)] == [
        (1, "create", CommitState.PREPARING),
        (1, "lease", CommitState.PREPARING),
        (2, "fold", CommitState.PREPARED),
        (2, "fold", CommitState.COMMITTING),
    ]
    recorded = journal.get_run(start.run_id)
    assert recorded is not None
    assert (recorded.state.value, recorded.current_attempt) == ("RUNNING", 1)
    assert [a.attempt for a in journal.attempts(start.run_id)] == [1]
    before = _counts(pg_available, pg_schema)
    # asked again (another executor, or the same one's next try): found, as find_run
    # reads them, to be resumed or replayed
    assert _birth(journal, start)[2] is False
    again = _birth(journal, start, actor="host-b:2")
    assert again == (*journal.find_run(
        idempotency_key=start.idempotency_key, operation_id=start.operation_id
    ), False)  # fmt: skip
    assert again[0] is not None
    assert again[1] == journal.get(start.operation_id)
    assert _counts(pg_available, pg_schema) == before


def test_a_birth_repeated_after_its_reply_was_lost_is_its_own(
    journal: PostgresCommitJournal,
    pg_available: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The statement committed, its reply was lost and ``_run`` sent it again (a lost
    session): the repeat finds this call's own entry and run, and says born."""
    real = PostgresCommitJournal._run_now

    def lose_the_first_reply(self: Any, action: str, work: Any, **kw: Any) -> Any:
        if action == "read the run and record the intent":
            real(self, action, work, **kw)  # committed; its reply never reaches the caller
        return real(self, action, work, **kw)

    monkeypatch.setattr(PostgresCommitJournal, "_run_now", lose_the_first_reply)
    start = new_start()
    run, entry, born = _birth(journal, start)
    assert (run, born) == (None, True)
    assert (entry.state, entry.lease_owner, entry.lease_epoch) == (CommitState.COMMITTING, OWNER, 1)
    assert [a.attempt for a in journal.attempts(start.run_id)] == [1]
    # one run, one attempt, one entry, and its birth's one history row (ADR 0023)
    assert _counts(pg_available, pg_schema) == (1, 1, 1, 1)
    assert len(journal.history(entry.operation_id)) == 4


def test_nothing_is_born_when_only_the_entry_or_only_the_run_exists(
    journal: PostgresCommitJournal, pg_available: str, pg_schema: str
) -> None:
    """Another key for an operation that exists: the entry is found and no run is written
    for the new key. A key whose run exists (another operation): the run is found and no
    entry is written. Neither raises."""
    start = new_start()
    _, entry, _ = _birth(journal, start)
    before = _counts(pg_available, pg_schema)
    other_key = new_start(operation_id=start.operation_id)
    assert _birth(journal, other_key) == (None, entry, False)
    assert journal.get_run(other_key.run_id) is None
    recorded = journal.begin_run(new_start())[0]  # a run with no entry
    keyed = new_start(recorded.idempotency_key)
    run, found, born = _birth(journal, keyed, operation_id="sha256:" + "cd" * 32)
    assert (run, found, born) == (recorded, None, False)
    assert journal.get("sha256:" + "cd" * 32) is None
    assert _counts(pg_available, pg_schema) == (before[0] + 1, *before[1:])


def test_two_executors_born_at_once_leave_one_entry(
    journal: PostgresCommitJournal, pg_available: str, pg_schema: str
) -> None:
    """Both find nothing; the first's uncommitted birth holds the key, so the second's
    waits, then writes nothing and says "read again" (both None) instead of raising."""
    start = new_start()
    _birth(journal, new_start())  # the tables and statements exist
    s = f'"{pg_schema}"'
    with psycopg.connect(pg_available, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {s}.slow() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER slow AFTER INSERT ON {s}.dpone_journal "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.slow()"
        )
    second = PostgresCommitJournal(pg_available, schema=pg_schema)
    got: list[Any] = []
    try:
        threads = [
            threading.Thread(target=lambda j=j: got.append(_birth(j, start)))
            for j in (journal, second)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        second.close()
    assert sorted(born for _, _, born in got) == [False, True], got
    assert [(run, entry) for run, entry, born in got if not born] == [(None, None)]
    assert len([e for e in journal.list_entries() if e.operation_id == start.operation_id]) == 1


@pytest.fixture
def forward_journal(pg_available: str, pg_schema: str) -> Iterator[str]:
    """The journal's DSN for forward mode (another database); its schema dropped after."""
    journal = pg_available.rsplit("/", 1)[0] + "/postgres"
    yield journal
    with psycopg.connect(journal, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


def _workload(root: Path, dsn: str, schema: str, journal: str) -> Any:
    return parse_workload(
        {
            "workload": "born",
            "release": "r1",
            "deployment": "d1",
            "journal": journal,
            "journal_schema": schema,
            "source": {
                "kind": "csv",
                "path": "p{partition}.csv",
                "columns": {"order_id": "integer", "customer": "text"},
            },
            "target": {
                "kind": "postgres",
                "url": dsn,
                "table": f"{schema}.orders",
                "fence_schema": schema,
            },
            "load": {"strategy": "append"},
        },
        base_dir=root,
    )


def test_a_runner_sends_the_birth_with_the_lookup_once_the_plan_is_checked(
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    forward_journal: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Until the plan is checked (the table exists) an operation looks up, then is born;
    afterwards lookup and birth are one statement, and a replay through it writes nothing. The
    journal and the run ledger read exactly as the two-step path leaves them."""
    _partitions(tmp_path, 3)
    journal = forward_journal
    calls: list[str] = []
    for name in ("find_run", "find_run_or_create_committing", "send_find_run_or_create_committing"):
        real = getattr(PostgresCommitJournal, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls.append(_name)
            return _real(self, *args, **kw)

        monkeypatch.setattr(PostgresCommitJournal, name, spy)
    workload = _workload(tmp_path, pg_available, pg_schema, journal)
    with Runner(workload) as runner:
        results = [runner.run(interval=INTERVAL, partition=str(i)) for i in range(3)]
        writes = _counts(journal, pg_schema)
        replay = runner.run(interval=INTERVAL, partition="1")
        assert _counts(journal, pg_schema) == writes
    # the first operation creates the table, the second finds it and checks the plan
    assert calls == ["find_run", "find_run", *["send_find_run_or_create_committing"] * 2]
    assert [(r.replayed, r.journal_version, r.attempt) for r in results] == [(False, 3, 1)] * 3
    assert (replay.replayed, replay.attempt) == (True, 1)
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        histories = []
        for result in results:
            entry = store.get(result.operation_id)
            assert entry is not None
            assert entry.state is CommitState.COMPLETE
            history = store.history(result.operation_id)
            assert check_history(history) == [], history
            histories.append([(t.version, t.kind, t.to_state) for t in history])
            problems = ledger_problems(store, operation_id=result.operation_id, journal_epoch=1)
            assert problems == [], problems
        assert histories[1] == histories[0] == histories[2]
    finally:
        store.close()
    with psycopg.connect(pg_available) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{pg_schema}".orders').fetchone()
    assert count == (9,)


# ------------------------------------------------------------- a birth sent ahead (ADR 0021)
def _partitions(root: Path, count: int) -> None:
    for i in range(count):
        (root / f"p{i}.csv").write_text(
            "order_id,customer\n" + "".join(f"{i * 10 + j},c\n" for j in range(3)),
            encoding="utf-8",
        )


def _watch(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """Record each birth sent ahead, its answer read, and each use of the target."""
    real_send = SendsAhead.send
    real_session = PostgresConnector._session

    def send(self: SendsAhead, statement: Any, params: Any) -> Any:
        answer = real_send(self, statement, params)
        if answer is None:
            return None
        events.append("sent")

        def read() -> Any:
            row = answer()
            events.append("answered")
            return row

        return read

    def session(self: PostgresConnector, **kw: Any) -> Any:
        events.append("target")
        return real_session(self, **kw)

    monkeypatch.setattr(SendsAhead, "send", send)
    monkeypatch.setattr(PostgresConnector, "_session", session)


def _rows(dsn: str, schema: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f'SELECT count(*), count(DISTINCT order_id) FROM "{schema}".orders'
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_the_target_is_touched_only_once_a_birth_sent_ahead_is_answered(
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    forward_journal: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the plan is checked, a new operation's birth is sent ahead: its answer is read
    before the target's first use, every time, and the COMPLETE the write ends with is
    built while that answer is awaited (and sent as built). A replay sent ahead finds the
    entry and never touches the target."""
    _partitions(tmp_path, 4)
    journal = forward_journal
    events: list[str] = []
    real_ending = PostgresCommitJournal._ending_statement

    def ending(self: PostgresCommitJournal, **cas: Any) -> Any:
        events.append("COMPLETE built")
        return real_ending(self, **cas)

    monkeypatch.setattr(PostgresCommitJournal, "_ending_statement", ending)
    with Runner(_workload(tmp_path, pg_available, pg_schema, journal)) as runner:
        for i in range(2):  # the table is created, then its plan checked
            runner.run(interval=INTERVAL, partition=str(i))
        _watch(monkeypatch, events)
        del events[:]  # the first two COMPLETEs, built as always
        new = [runner.run(interval=INTERVAL, partition=str(i)) for i in (2, 3)]
        assert events == ["sent", "COMPLETE built", "answered", "target"] * 2
        del events[:]
        replay = runner.run(interval=INTERVAL, partition="2")
        assert events == ["sent", "COMPLETE built", "answered"]  # built, never sent
    assert [(r.replayed, r.journal_version, r.attempt) for r in new] == [(False, 3, 1)] * 2
    assert (replay.replayed, replay.rows_written) == (True, 3)
    assert _rows(pg_available, pg_schema) == (12, 12)
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        for result in new:
            assert check_history(store.history(result.operation_id)) == []
            problems = ledger_problems(store, operation_id=result.operation_id, journal_epoch=1)
            assert problems == [], problems
    finally:
        store.close()


def test_a_birth_whose_session_is_lost_is_judged_as_a_lost_reply(
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    forward_journal: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The birth's session is killed on the server once a birth committed: that answer
    was already on its way and reads born. The next birth meets the dead session as it is
    sent (maybe sent: ``SessionLost``), and is made again on a pooled session. The one
    after goes ahead on a new session. A reply lost on the way back (the statement
    committed, its answer never read) is made again too, finds the call's own birth and
    says born. Every operation lands once, with the ordinary history."""
    _partitions(tmp_path, 5)
    journal = forward_journal
    real_send = SendsAhead.send
    pids: list[int] = []
    lose: list[str] = []  # "kill": the server ends the session; "reply": the answer is lost

    def send(self: SendsAhead, statement: Any, params: Any) -> Any:
        try:
            answer = real_send(self, statement, params)
        except SessionLost:
            pids.append(-1)  # the dead session, found as the statement was sent
            raise
        assert answer is not None
        held = self.connection
        assert held is not None
        pids.append(held.info.backend_pid)
        how = lose.pop() if lose else None
        if how == "kill":
            with psycopg.connect(journal, autocommit=True) as other:
                for _ in range(500):  # until the birth has committed
                    found = other.execute(
                        f'SELECT count(*) FROM "{pg_schema}".dpone_journal WHERE operation_id = %s',
                        (params["operation_id"],),
                    ).fetchone()
                    if found == (1,):
                        break
                    time.sleep(0.01)
                assert found == (1,)
                # with a timeout the call returns once the session has ended, so the next
                # birth meets a closed session rather than racing its end
                ended = other.execute("SELECT pg_terminate_backend(%s, 10000)", (pids[-1],))
                assert ended.fetchone() == (True,)
        if how != "reply":
            return answer

        def lost_reply() -> Any:
            answer()  # committed and answered; the answer never reaches the caller
            raise SessionLost

        return lost_reply

    with Runner(_workload(tmp_path, pg_available, pg_schema, journal)) as runner:
        for i in range(2):
            runner.run(interval=INTERVAL, partition=str(i))
        monkeypatch.setattr(SendsAhead, "send", send)
        results = []
        for i, how in ((2, "kill"), (3, None), (4, "reply")):
            if how:
                lose.append(how)
            results.append(runner.run(interval=INTERVAL, partition=str(i)))
    assert pids[1] == -1  # partition 3's birth met the killed session
    assert -1 not in (pids[0], pids[2])
    assert pids[0] != pids[2]  # then a new session
    assert [(r.replayed, r.journal_version, r.attempt) for r in results] == [(False, 3, 1)] * 3
    assert _rows(pg_available, pg_schema) == (15, 15)
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        for result in results:
            history = store.history(result.operation_id)
            assert check_history(history) == [], history
            assert [a.attempt for a in store.attempts(result.run_id)] == [1]
    finally:
        store.close()


def test_a_failure_before_the_gate_is_recorded_as_without_a_birth_sent_ahead(
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    forward_journal: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows that cannot be read fail the operation after its birth was sent and before the
    target is touched: the birth is read first, then the failure is recorded exactly as on
    the path that waits for the birth (the same states and history, the lease released;
    the target is then only read, to prove nothing was written). With a failpoint armed no
    birth is sent ahead."""
    _partitions(tmp_path, 2)
    for i in (2, 3):
        (tmp_path / f"p{i}.csv").write_text(
            f"order_id,customer\n{i}0,c\n{i}1,c,extra\n", encoding="utf-8"
        )
    journal = forward_journal
    events: list[str] = []
    with Runner(_workload(tmp_path, pg_available, pg_schema, journal)) as runner:
        for i in range(2):
            runner.run(interval=INTERVAL, partition=str(i))
        _watch(monkeypatch, events)
        failed: list[DponeError] = []
        for i in (2, 3):
            if i == 3:  # the path that waits for the birth's answer
                monkeypatch.setattr(CommitProtocol, "births_ahead", property(lambda _: False))
            with pytest.raises(DponeError) as caught:
                runner.run(interval=INTERVAL, partition=str(i))
            failed.append(caught.value)
        assert events[:2] == ["sent", "answered"]  # the first only
        assert events.count("sent") == 1
        monkeypatch.undo()
        _watch(monkeypatch, events)
        del events[:]
        failpoints.configure("before:fence.seal=raise")  # armed, never reached here
        try:
            (tmp_path / "p4.csv").write_text("order_id,customer\n40,c\n", encoding="utf-8")
            runner.run(interval=INTERVAL, partition="4")
        finally:
            failpoints.configure(None)
        assert events == ["target"]
    assert [e.code for e in failed] == [ErrorCode.SOURCE_INVALID] * 2
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        recorded = []
        for entry in store.list_entries():
            if entry.state is CommitState.COMPLETE:
                continue
            history = store.history(entry.operation_id)
            recorded.append(
                (entry.state, entry.lease_owner, [(t.kind, t.to_state) for t in history])
            )
        assert len(recorded) == 2
        assert recorded[0] == recorded[1]
        assert recorded[0][0] is CommitState.FAILED_PRE_COMMIT
        assert recorded[0][1] is None
    finally:
        store.close()
    assert _rows(pg_available, pg_schema) == (7, 7)


def test_the_complete_built_while_the_birth_is_awaited_is_sent_only_for_the_same_write(
    journal: PostgresCommitJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prepare_proven_ending_run_behind`` builds the COMPLETE's statement ahead. The next
    COMPLETE with the same arguments sends that statement (nothing built again); one with
    other arguments builds and sends its own."""
    built: list[int] = []
    real = PostgresCommitJournal._ending_statement

    def counted(self: PostgresCommitJournal, **cas: Any) -> Any:
        built.append(1)
        return real(self, **cas)

    monkeypatch.setattr(PostgresCommitJournal, "_ending_statement", counted)
    results = []
    for rows_written in (3, 5):
        start = new_start()
        _, entry, born = _birth(journal, start)
        assert born
        cas: dict[str, Any] = {
            "run_id": start.run_id,
            "attempt": 1,
            "operation_id": entry.operation_id,
            "expected_version": 2,
            "expected_states": frozenset({CommitState.COMMITTING}),
            "lease_epoch": 1,
            "actor": OWNER,
            "evidence": {"fence_state": "committed", "fence_epoch": 1, "row_count": 3},
        }
        del built[:]
        journal.prepare_proven_ending_run_behind(**cas, result={"rows_written": 3})
        assert built == [1]
        failures: list[DponeError] = []
        journal.complete_proven_ending_run_behind(
            **cas, result={"rows_written": rows_written}, on_failure=failures.append
        )
        assert built == [1] * (1 if rows_written == 3 else 2)
        done = journal.get(entry.operation_id)  # settles the write behind
        assert failures == []
        assert done is not None
        assert (done.state, done.version) == (CommitState.COMPLETE, 3)
        results.append(dict(done.result or {}))
        run = journal.get_run(start.run_id)
        assert run is not None
        assert run.state.value == "COMPLETE"
    assert results == [{"rows_written": 3}, {"rows_written": 5}]


def test_a_birth_whose_answer_cannot_be_read_stops_before_the_target(
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    forward_journal: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The journal refuses to answer the birth (an error that is not a lost session):
    ``run`` raises the journal's error, as the lookup would, with nothing sent to the
    target and no run ended. Once the journal answers again and the lease has run out,
    the operation completes with every row once."""
    _partitions(tmp_path, 3)
    journal = forward_journal
    events: list[str] = []
    workload = replace(_workload(tmp_path, pg_available, pg_schema, journal), lease_ttl_seconds=1)
    with Runner(workload) as runner:
        for i in range(2):
            runner.run(interval=INTERVAL, partition=str(i))
        _watch(monkeypatch, events)
        real_send = SendsAhead.send

        def refused(self: SendsAhead, statement: Any, params: Any) -> Any:
            answer = real_send(self, statement, params)
            assert answer is not None

            def read() -> Any:
                answer()  # the birth landed; its answer is refused
                raise psycopg.errors.QueryCanceled("canceling statement due to timeout")

            return read

        monkeypatch.setattr(SendsAhead, "send", refused)
        with pytest.raises(JournalUnavailable):
            runner.run(interval=INTERVAL, partition="2")
        assert "target" not in events
        assert _rows(pg_available, pg_schema) == (6, 6)
        monkeypatch.undo()
        time.sleep(1.2)  # the lease of the entry born COMMITTING runs out
        again = runner.run(interval=INTERVAL, partition="2")
    assert (again.replayed, again.rows_written) == (False, 3)
    assert _rows(pg_available, pg_schema) == (9, 9)
    store = PostgresCommitJournal(journal, schema=pg_schema)
    try:
        entry = store.get(again.operation_id)
        assert entry is not None
        assert entry.state is CommitState.COMPLETE
        assert check_history(store.history(again.operation_id)) == []
        problems = ledger_problems(store, operation_id=again.operation_id, journal_epoch=2)
        assert problems == [], problems
    finally:
        store.close()


def test_journal_sessions_commit_durably_whatever_the_dsn_or_server_says(
    pg_available: str, pg_schema: str
) -> None:
    """A DSN (or role, database, server) with ``synchronous_commit = off`` would let the
    journal acknowledge a COMMITTING it could lose: the birth's own session, the pooled
    ones and the one session of ``pooled=False`` turn it back on."""
    dsn = pg_available + "?options=-c%20synchronous_commit%3Doff"
    with psycopg.connect(dsn) as plain:
        assert plain.execute("SHOW synchronous_commit").fetchone() == ("off",)
    show = b"SHOW synchronous_commit"
    pooled = PostgresCommitJournal(dsn, schema=pg_schema)
    single = PostgresCommitJournal(dsn, schema=pg_schema, pooled=False)
    try:
        answer = _birth(pooled, new_start(), ahead=True)
        assert answer is not None
        assert answer()[2] is True  # born, on the session sent ahead
        read = pooled._ahead.send(show, {})
        assert read is not None
        assert read() == ("on",)
        for journal in (pooled, single):
            setting = journal._run_now(
                "read a setting", lambda c: c.execute(show).fetchone(), repeatable=True
            )
            assert setting == ("on",)
    finally:
        pooled.close()
        single.close()


def test_an_operation_not_born_here_is_left_alone_even_when_its_rows_fail_before_the_gate(
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    forward_journal: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another executor holds the operation (COMMITTING, its lease live) and this try's
    rows cannot be read: the birth sent ahead finds that entry, so the row error is not
    this try's to record (nothing tries to: no lease, no settling). The try starts over
    from what the birth found and meets the other executor's lease; its entry is
    untouched and the target never used."""
    _partitions(tmp_path, 3)
    (tmp_path / "p2.csv").write_text("order_id,customer\n20,c\n21,c,extra\n", encoding="utf-8")
    journal = forward_journal
    events: list[str] = []
    with Runner(_workload(tmp_path, pg_available, pg_schema, journal)) as runner:
        for i in range(2):
            runner.run(interval=INTERVAL, partition=str(i))
        _, spec = runner._plan(INTERVAL, partition="2", context=None)
        store = PostgresCommitJournal(journal, schema=pg_schema)
        try:
            theirs = store.create_committing(
                operation_id=spec.operation_id,
                intent_digest=spec.intent_digest,
                metadata={"workload_id": "orders"},
                actor="host-b:2",
                lease_ttl_seconds=60,
                evidence={"fence_epoch": 1},
            )
            _watch(monkeypatch, events)
            with caplog.at_level(logging.INFO, logger="dpone"), pytest.raises(LeaseHeld):
                runner.run(interval=INTERVAL, partition="2")
            assert events == ["sent", "answered"]
            assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
            assert store.get(spec.operation_id) == theirs
            assert len(store.history(spec.operation_id)) == 4  # its birth's only
        finally:
            store.close()
    assert _rows(pg_available, pg_schema) == (6, 6)
