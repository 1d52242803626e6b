"""An atomic Runner tries the next operation as new, without a lookup (ADR 0019).

After an operation born in one atomic transaction, a Runner sends the next one's
transaction at once, with the journal's INSERT of the run and the entry ahead of the
rows. It either commits a new operation, or writes nothing and the try starts over with
the lookup, which then decides exactly as it always did: replay, refusal, resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.adapters.connectors.postgres import SMALL_ROWS
from dpone.api import Runner
from dpone.config.workload import Workload, replace
from dpone.contracts.states import CommitState
from dpone.errors import IntentConflict, RecoveryConflict, RunKeyConflict, TargetWriteFailed
from dpone.runtime import failpoints
from tests.integration.test_postgres_small_ops import (
    INTERVAL,
    _csv,
    _entries,
    _ledger,
    _rows,
    _workload,
)


@pytest.fixture
def atomic(tmp_path: Path, pg_available: str, pg_schema: str) -> Workload:
    """Partitions 0-6; partition 0 is loaded (by a Runner of its own), so the table exists."""
    for i in range(7):
        _csv(tmp_path / f"p{i}.csv", first=i * 10)
    workload = _workload(tmp_path, pg_available, pg_schema, journal=pg_available)
    with Runner(workload) as runner:
        runner.run(interval=INTERVAL, partition="0")
    return workload


class _Calls:
    """Counts the calls of one method of a real adapter instance (it still runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, obj: object, name: str) -> None:
        self.count = 0
        real: Callable[..., Any] = getattr(obj, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(obj, name, counted)


def _state(dsn: str, schema: str) -> tuple[Any, ...]:
    return _ledger(dsn, schema), _entries(dsn, schema), _rows(dsn, schema)


def test_new_operations_in_a_row_skip_the_lookup_and_a_replay_still_writes_nothing(
    atomic: Workload, pg_available: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Runner's first operation is looked up; the next new ones are not. A replay among
    them is found by the lookup its refused try falls back to, and changes nothing; the
    operation after it is looked up again."""
    with Runner(atomic) as runner:
        lookups = _Calls(monkeypatch, runner._route.journal, "find_run")
        seen = []
        for partition in ("1", "2", "3"):
            result = runner.run(interval=INTERVAL, partition=partition)
            seen.append((result.replayed, result.attempt, lookups.count))
        assert seen == [(False, 1, 1), (False, 1, 1), (False, 1, 1)]
        before = _state(pg_available, pg_schema)
        replay = runner.run(interval=INTERVAL, partition="2")
        assert (replay.replayed, replay.rows_written, lookups.count) == (True, 3, 2)
        assert _state(pg_available, pg_schema) == before  # no row, run or entry written
        assert runner.run(interval=INTERVAL, partition="4").replayed is False
        assert lookups.count == 3  # after a replay: looked up first
        assert runner.run(interval=INTERVAL, partition="5").replayed is False
        assert lookups.count == 3
    assert [r[0] for r in _rows(pg_available, pg_schema)] == [
        i * 10 + j for i in range(6) for j in range(3)
    ]
    entries = _entries(pg_available, pg_schema)
    assert len(entries) == 6
    assert {(e.state, e.version) for e, _ in entries} == {(CommitState.COMPLETE, 2)}


def test_an_operation_too_large_to_send_ahead_is_looked_up_then_copied_once(
    atomic: Workload,
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More rows than the pipelined path takes: the connector refuses before opening a
    transaction, the try looks up and loads by COPY, and starts no streak (its journal
    statements followed the rows). Its replay later opens no transaction either."""
    _csv(tmp_path / "p1.csv", first=1000, rows=SMALL_ROWS + 1)
    with Runner(atomic) as runner:
        lookups = _Calls(monkeypatch, runner._route.journal, "find_run")
        sessions = _Calls(monkeypatch, runner._route.connector, "_session")
        runner.run(interval=INTERVAL, partition="2")
        large = runner.run(interval=INTERVAL, partition="1")
        assert (large.replayed, large.rows_written, lookups.count) == (False, SMALL_ROWS + 1, 2)
        runner.run(interval=INTERVAL, partition="3")  # after a COPY: looked up
        assert lookups.count == 3  # born at one sync: the next is tried as new
        before, opened = _state(pg_available, pg_schema), sessions.count
        again = runner.run(interval=INTERVAL, partition="1")
        assert (again.replayed, lookups.count, sessions.count) == (True, 4, opened)
        assert _state(pg_available, pg_schema) == before
    assert len(_rows(pg_available, pg_schema)) == 3 * 3 + SMALL_ROWS + 1


def test_an_operation_whose_source_changed_is_refused_as_after_a_lookup(
    atomic: Workload,
    tmp_path: Path,
    pg_available: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its INSERT meets the recorded run, nothing is kept, and the lookup that follows
    refuses the changed intent before any target write, as it always did."""
    with Runner(atomic) as runner:
        lookups = _Calls(monkeypatch, runner._route.journal, "find_run")
        runner.run(interval=INTERVAL, partition="1")
        _csv(tmp_path / "p0.csv", first=500)
        before = _entries(pg_available, pg_schema), _rows(pg_available, pg_schema)
        with pytest.raises(IntentConflict):
            runner.run(interval=INTERVAL, partition="0")
        assert lookups.count == 2  # tried as new, then looked up
        assert (_entries(pg_available, pg_schema), _rows(pg_available, pg_schema)) == before
        # the ledger records the refusal as the lookup's try always did
        assert sorted(run[1] for run in _ledger(pg_available, pg_schema)) == [
            "COMPLETE",
            "UNRESOLVED",
        ]
        assert runner.run(interval=INTERVAL, partition="2").replayed is False
    assert [r[0] for r in _rows(pg_available, pg_schema)] == [0, 1, 2, 10, 11, 12, 20, 21, 22]


def test_an_armed_failpoint_keeps_every_lookup(
    atomic: Workload, pg_available: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a crash test the protocol's steps stay where the failpoints expect them."""
    try:
        with Runner(atomic) as runner:  # (a Runner arms what DPONE_FAILPOINTS names)
            failpoints.configure("before:recovery.seal=raise")  # armed, never reached here
            lookups = _Calls(monkeypatch, runner._route.journal, "find_run")
            for partition in ("1", "2", "3"):
                runner.run(interval=INTERVAL, partition=partition)
            assert lookups.count == 3
    finally:
        failpoints.configure(None)
    assert len(_rows(pg_available, pg_schema)) == 12


def _inserted(dsn: str, schema: str, table: str) -> int:
    """Tuples ever inserted into ``table`` (rolled back ones too), once the counts settle.

    A session reports its table statistics when it ends or has idled a moment: wait
    until the count has stayed the same for 1.5 s.
    """
    last, stable_since = -1, time.monotonic()
    deadline = time.monotonic() + 15
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT n_tup_ins FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
                (schema, table),
            ).fetchone()
            count = int(row[0]) if row else 0
            if count != last:
                last, stable_since = count, time.monotonic()
            elif time.monotonic() - stable_since > 1.5:
                return count
            time.sleep(0.2)
    return last


def test_a_retry_after_new_ones_sends_the_insert_ahead_and_reports_no_rows(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    """The refused try's INSERT goes before the rows, so not even a rolled-back row is
    inserted for an entry that has no fence row yet (FAILED_PRE_COMMIT, retried once
    the target takes the rows); progress is reported for rows written, never twice."""
    table = f'"{pg_schema}".orders'
    progress: list[int] = []
    with Runner(atomic) as runner:
        with psycopg.connect(pg_available, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT below_20 CHECK (order_id < 20)")
        with pytest.raises(TargetWriteFailed):
            runner.run(interval=INTERVAL, partition="2")
        with psycopg.connect(pg_available, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT below_20")
        runner.run(interval=INTERVAL, partition="1")
        runner.run(interval=INTERVAL, partition="3", on_rows=progress.append)
        assert progress == [3]  # an unread try: reported once written
        retried = runner.run(interval=INTERVAL, partition="2", on_rows=progress.append)
        assert (retried.replayed, retried.rows_written) == (False, 3)
        assert progress == [3, 3]
        replay = runner.run(interval=INTERVAL, partition="3", on_rows=progress.append)
        assert replay.replayed
        assert progress == [3, 3]
    # partitions 0-3 once each; a retry that sent its rows before its INSERT would
    # have inserted (and rolled back) partition 2's rows once more
    assert _inserted(pg_available, pg_schema, "orders") == 12
    assert len(_rows(pg_available, pg_schema)) == 12


def test_a_failure_after_the_insert_is_the_new_operations_own(
    atomic: Workload, tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """A row the target rejects: the operation is new (the queued INSERT was seen to
    succeed, or the fused statement's unread try looked it up), so it is recorded
    FAILED_PRE_COMMIT, its run FAILED, nothing of it written."""
    _csv(tmp_path / "p2.csv", first=20, bad=True)
    with Runner(atomic) as runner:
        runner.run(interval=INTERVAL, partition="1")
        with pytest.raises(TargetWriteFailed):
            runner.run(interval=INTERVAL, partition="2")
    states = sorted(e.state.value for e, _ in _entries(pg_available, pg_schema))
    assert states == ["COMPLETE", "COMPLETE", "FAILED_PRE_COMMIT"]
    assert sorted(run[1] for run in _ledger(pg_available, pg_schema)) == [
        "COMPLETE",
        "COMPLETE",
        "FAILED",
    ]
    assert [r[0] for r in _rows(pg_available, pg_schema)] == [0, 1, 2, 10, 11, 12]


def test_a_key_naming_another_operations_run_is_refused_with_nothing_written(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    with Runner(atomic) as runner:
        first = runner.run(interval=INTERVAL, partition="1")
        key = f"op:{first.operation_id}"  # the default key of partition 1's run
        assert key in [run[0] for run in _ledger(pg_available, pg_schema)]
        before = _state(pg_available, pg_schema)
        with pytest.raises(RunKeyConflict):
            runner.run(interval=INTERVAL, partition="2", idempotency_key=key)
        assert _state(pg_available, pg_schema) == before


def test_a_fence_row_without_its_journal_is_judged_as_after_a_lookup(
    atomic: Workload, pg_available: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal was replaced, the target's fence row stayed: the INSERT succeeds, the
    fence row refuses the first attempt's fence, and the try starts over with the lookup.
    The lookup's path finds the journal and target in disagreement and stops, as a fresh
    Runner does: nothing written twice, and the refused try recorded nothing of its own
    (the entry stays where the lookup's try left it, not FAILED_PRE_COMMIT)."""
    with Runner(atomic) as runner:
        lost = runner.run(interval=INTERVAL, partition="1")
    other = f"{pg_schema}_j2"
    with psycopg.connect(pg_available, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{other}"')
    try:
        fresh_journal = replace(atomic, journal_schema=other)
        with Runner(fresh_journal) as runner:
            lookups = _Calls(monkeypatch, runner._route.journal, "find_run")
            runner.run(interval=INTERVAL, partition="2")
            with pytest.raises(RecoveryConflict):
                runner.run(interval=INTERVAL, partition="1")
            assert lookups.count == 2  # tried unread, then looked up
        entries = {e.operation_id: (e.state, e.version) for e, _ in _entries(pg_available, other)}
        assert entries[lost.operation_id] == (CommitState.PREPARING, 1)
        assert [r[0] for r in _rows(pg_available, pg_schema)] == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    finally:
        with psycopg.connect(pg_available, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{other}" CASCADE')


def test_a_progress_callback_that_raises_after_an_unread_commit_leaves_it_complete(
    atomic: Workload, pg_available: str, pg_schema: str
) -> None:
    """An unread try reports its rows once they are committed: a callback that raises
    then reaches the caller, and the run and the entry are COMPLETE, as committed."""

    def refuse(rows: int) -> None:
        raise RuntimeError(f"callback refused {rows} rows")

    with Runner(atomic) as runner:
        runner.run(interval=INTERVAL, partition="1")
        with pytest.raises(RuntimeError, match="refused 3 rows"):
            runner.run(interval=INTERVAL, partition="2", on_rows=refuse)
        assert runner.run(interval=INTERVAL, partition="2").replayed
    assert {run[1] for run in _ledger(pg_available, pg_schema)} == {"COMPLETE"}
    assert {e.state for e, _ in _entries(pg_available, pg_schema)} == {CommitState.COMPLETE}
    assert len(_rows(pg_available, pg_schema)) == 9
