"""An atomic Runner tries the next operation as new, without a lookup (ADR 0019).

After an operation born in one atomic transaction, a Runner sends the next one's
transaction at once, with the journal's INSERT of the run and the entry ahead of the
rows. It either commits a new operation, or writes nothing and the try starts over with
the lookup, which then decides exactly as it always did: replay, refusal, resume.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.adapters.connectors.postgres import SMALL_ROWS
from dpone.api import Runner
from dpone.config.workload import Workload
from dpone.contracts.states import CommitState
from dpone.errors import IntentConflict
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
    transaction, the try looks up and loads by COPY. Its replay later opens none."""
    _csv(tmp_path / "p1.csv", first=1000, rows=SMALL_ROWS + 1)
    with Runner(atomic) as runner:
        lookups = _Calls(monkeypatch, runner._route.journal, "find_run")
        sessions = _Calls(monkeypatch, runner._route.connector, "_session")
        runner.run(interval=INTERVAL, partition="2")
        large = runner.run(interval=INTERVAL, partition="1")
        assert (large.replayed, large.rows_written, lookups.count) == (False, SMALL_ROWS + 1, 2)
        runner.run(interval=INTERVAL, partition="3")  # new: the next is tried as new
        assert lookups.count == 2
        before, opened = _state(pg_available, pg_schema), sessions.count
        again = runner.run(interval=INTERVAL, partition="1")
        assert (again.replayed, lookups.count, sessions.count) == (True, 3, opened)
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
