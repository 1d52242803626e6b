"""The retry policy on real routes: a transient fault, and a journal server that is down."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from dpone.api import Runner
from dpone.config.bootstrap import ledger_of, open_journal
from dpone.contracts.run import AttemptState, RunState
from dpone.contracts.states import CommitState
from dpone.testing.crash import write_orders_csv

ROWS = 100
INTERVAL = "2026-11-01/2026-11-02"


def _workload(root: Path, journal: str, retry: dict[str, Any]) -> Path:
    write_orders_csv(root / "orders.csv", ROWS)
    path = root / "w.yaml"
    path.write_text(
        json.dumps(
            {
                "workload": "orders",
                "release": "2026.11.0",
                "deployment": "retry",
                "journal": journal,
                "source": {"kind": "csv", "path": "orders.csv"},
                "target": {"kind": "sqlite", "url": "sqlite:///warehouse.db", "table": "orders"},
                "load": {"strategy": "append", "key": ["order_id"]},
                "retry": retry,
            }
        ),
        encoding="utf-8",
    )
    return path


def _rows(root: Path) -> int:
    with closing(sqlite3.connect(root / "warehouse.db")) as db:
        return int(db.execute("SELECT count(*) FROM orders").fetchone()[0])


def _retry_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        r.dpone  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "dpone", {}).get("event") == "retry"
    ]


def test_a_transient_fault_is_retried_as_a_new_attempt_and_writes_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An injected transient fault before COMMITTING: the policy retries, one write, 2 attempts."""
    path = _workload(
        tmp_path,
        "sqlite:///journal.db",
        {"attempts": 3, "wait_initial_seconds": 0.05, "wait_jitter_seconds": 0.05},
    )
    with (
        caplog.at_level(logging.INFO, logger="dpone"),
        Runner(path, environ={"DPONE_FAILPOINTS": "before:COMMITTING=raise@1"}) as runner,
    ):
        result = runner.run(interval=INTERVAL)
    assert (result.state, result.rows_written, result.attempt) == (CommitState.COMPLETE, ROWS, 2)
    assert _rows(tmp_path) == ROWS
    [line] = _retry_lines(caplog)
    assert line["cause"] == "DPONE_INJECTED_FAULT"
    assert 0.05 <= line["delay_s"] <= 0.1
    ledger = ledger_of(open_journal("sqlite:///journal.db", base_dir=tmp_path))
    try:
        [run] = ledger.list_runs()
        assert run.state is RunState.COMPLETE
        assert [(a.attempt, a.state, a.error_code) for a in ledger.attempts(run.run_id)] == [
            (1, AttemptState.FAILED, "DPONE_INJECTED_FAULT"),
            (2, AttemptState.COMPLETE, None),
        ]
    finally:
        ledger.close()


@pytest.fixture
def private_pg(pg_available: str) -> Iterator[Any]:
    """A throwaway PostgreSQL server of the test's own (never the shared one)."""
    from dpone.testing.pg_instance import PrivatePostgres

    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def test_journal_briefly_down_the_run_still_completes(
    tmp_path: Path, private_pg: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal's server is down when the run starts and back within the budget."""
    path = _workload(
        tmp_path,
        private_pg.dsn,
        {
            "attempts": 30,
            "budget_seconds": 45,
            "wait_initial_seconds": 0.2,
            "wait_max_seconds": 1.0,
            "wait_jitter_seconds": 0.2,
        },
    )
    private_pg.stop(mode="immediate")
    back = threading.Timer(1.5, private_pg.start)
    started = time.monotonic()
    back.start()
    try:
        with caplog.at_level(logging.INFO, logger="dpone"), Runner(path) as runner:
            result = runner.run(interval=INTERVAL)
    finally:
        back.join(30)
    assert result.state is CommitState.COMPLETE
    assert result.rows_written == ROWS
    assert _rows(tmp_path) == ROWS  # exactly once
    lines = _retry_lines(caplog)
    assert lines, "the run should have waited for the journal"
    assert {line["cause"] for line in lines} == {"DPONE_TARGET_COMMIT_JOURNAL_UNAVAILABLE"}
    assert [line["retry"] for line in lines] == list(range(1, len(lines) + 1))
    assert time.monotonic() - started < 45
    ledger = ledger_of(open_journal(private_pg.dsn, base_dir=tmp_path))
    try:
        [run] = ledger.list_runs()
        assert run.state is RunState.COMPLETE
        assert [a.state for a in ledger.attempts(run.run_id)] == [AttemptState.COMPLETE]
    finally:
        ledger.close()


def test_source_database_briefly_down_the_run_still_completes(
    tmp_path: Path, private_pg: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The PostgreSQL *source* is down when the read starts: DPONE_SOURCE_UNAVAILABLE is retried."""
    import psycopg

    with psycopg.connect(private_pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, updated_at timestamptz NOT NULL)")
        conn.execute(
            "INSERT INTO events SELECT g, timestamptz '2026-11-01 00:00+00' + g * interval '1 min'"
            f" FROM generate_series(1, {ROWS}) g"
        )
    path = tmp_path / "w.yaml"
    path.write_text(
        json.dumps(
            {
                "workload": "events",
                "release": "2026.11.0",
                "deployment": "retry",
                "journal": "sqlite:///journal.db",
                # declared columns: the operation is defined without reading the source
                "source": {
                    "kind": "postgres_table",
                    "url": private_pg.dsn,
                    "table": "events",
                    "columns": {"id": "integer", "updated_at": "timestamp"},
                },
                "target": {"kind": "sqlite", "url": "sqlite:///warehouse.db", "table": "events"},
                "load": {"strategy": "append", "key": ["id"]},
                "retry": {
                    "attempts": 30,
                    "budget_seconds": 45,
                    "wait_initial_seconds": 0.2,
                    "wait_max_seconds": 1.0,
                    "wait_jitter_seconds": 0.2,
                },
            }
        ),
        encoding="utf-8",
    )
    private_pg.stop(mode="immediate")
    back = threading.Timer(1.5, private_pg.start)
    back.start()
    try:
        with caplog.at_level(logging.INFO, logger="dpone"), Runner(path) as runner:
            result = runner.run(interval=INTERVAL)
    finally:
        back.join(30)
    assert (result.state, result.rows_written) == (CommitState.COMPLETE, ROWS)
    with closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
        assert db.execute("SELECT count(*), count(DISTINCT id) FROM events").fetchone() == (
            ROWS,
            ROWS,
        )
    lines = _retry_lines(caplog)
    assert lines, "the run should have waited for the source"
    assert {line["cause"] for line in lines} == {"DPONE_SOURCE_UNAVAILABLE"}
    assert all(line["delay_s"] > 0 for line in lines)
    ledger = ledger_of(open_journal("sqlite:///journal.db", base_dir=tmp_path))
    try:
        [run] = ledger.list_runs()
        attempts = ledger.attempts(run.run_id)
    finally:
        ledger.close()
    assert run.state is RunState.COMPLETE
    # every failed attempt failed on the source, before anything was written
    assert {(a.state, a.error_code) for a in attempts[:-1]} == {
        (AttemptState.FAILED, "DPONE_SOURCE_UNAVAILABLE")
    }
    assert attempts[-1].state is AttemptState.COMPLETE
    assert len(attempts) == len(lines) + 1
