"""Forward mode's lookup and a new entry's birth in one statement (ADR 0018), on PostgreSQL.

The birth is guarded by the absence of both the run's key and the entry: it writes
nothing, and raises nothing, when the lookup finds either. A Runner whose target plan is
already checked sends it instead of a lookup followed by the birth.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.adapters.journal.postgres import PostgresCommitJournal
from dpone.api import Runner
from dpone.config.workload import parse_workload
from dpone.contracts.states import CommitState
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
) -> Any:
    return journal.find_run_or_create_committing(
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
    assert _counts(pg_available, pg_schema) == (1, 1, 1, 4)


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
    tmp_path: Path, pg_available: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the plan is checked (the table exists) an operation looks up, then is born;
    afterwards lookup and birth are one statement, and a replay through it writes nothing. The
    journal and the run ledger read exactly as the two-step path leaves them."""
    for i in range(3):
        (tmp_path / f"p{i}.csv").write_text(
            "order_id,customer\n" + "".join(f"{i * 10 + j},c\n" for j in range(3)),
            encoding="utf-8",
        )
    journal = pg_available.rsplit("/", 1)[0] + "/postgres"
    calls: list[str] = []
    for name in ("find_run", "find_run_or_create_committing", "send_find_run_or_create_committing"):
        real = getattr(PostgresCommitJournal, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls.append(_name)
            return _real(self, *args, **kw)

        monkeypatch.setattr(PostgresCommitJournal, name, spy)
    workload = _workload(tmp_path, pg_available, pg_schema, journal)
    try:
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
    finally:
        with psycopg.connect(journal, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
