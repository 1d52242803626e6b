"""The retry policy on real routes: a transient fault, and a journal server that is down."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
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


def _outage(server: Any, run: Callable[[], Any]) -> Any:
    """Stop ``server``, start it again 1.5 s later, and call ``run`` meanwhile."""
    server.stop(mode="immediate")
    back = threading.Timer(1.5, server.start)
    back.start()
    try:
        return run()
    finally:
        back.join(30)


def test_source_database_briefly_down_the_run_still_completes(
    tmp_path: Path, private_pg: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The PostgreSQL *source* is down: DPONE_SOURCE_UNAVAILABLE is retried, one write.

    Day 1 declares its columns, so the outage hits the read inside the run (failed
    attempts in the ledger); day 2 discovers them from the catalog, so the outage hits
    the planning of the operation, before any run exists.
    """
    import psycopg

    with psycopg.connect(private_pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, updated_at timestamptz NOT NULL)")
        conn.execute(
            "INSERT INTO events SELECT g, timestamptz '2026-11-01 00:00+00' + g * interval '1 min'"
            f" FROM generate_series(1, {ROWS}) g"
        )
        conn.execute(  # day 2: the same ids shifted by ROWS
            f"INSERT INTO events SELECT id + {ROWS}, updated_at + interval '1 day' FROM events"
        )
    source = {"kind": "postgres_table", "url": private_pg.dsn, "table": "events"}
    declared = {**source, "columns": {"id": "integer", "updated_at": "timestamp"}}
    retry = {
        "attempts": 30,
        "budget_seconds": 45,
        "wait_initial_seconds": 0.2,
        "wait_max_seconds": 1.0,
        "wait_jitter_seconds": 0.2,
    }

    def workload(src: dict[str, Any]) -> Path:
        path = tmp_path / "w.yaml"
        path.write_text(
            json.dumps(
                {
                    "workload": "events",
                    "release": "2026.11.0",
                    "deployment": "retry",
                    "journal": "sqlite:///journal.db",
                    "source": src,
                    "target": {
                        "kind": "sqlite",
                        "url": "sqlite:///warehouse.db",
                        "table": "events",
                    },
                    "load": {"strategy": "append", "key": ["id"]},
                    "retry": retry,
                }
            ),
            encoding="utf-8",
        )
        return path

    def run(path: Path, interval: str) -> Any:
        with Runner(path) as runner:
            return runner.run(interval=interval)

    def target_rows() -> tuple[int, int]:
        with closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
            return tuple(db.execute("SELECT count(*), count(DISTINCT id) FROM events").fetchone())

    with caplog.at_level(logging.INFO, logger="dpone"):
        day1 = _outage(private_pg, lambda: run(workload(declared), INTERVAL))
    assert (day1.state, day1.rows_written) == (CommitState.COMPLETE, ROWS)
    assert target_rows() == (ROWS, ROWS)
    lines = _retry_lines(caplog)
    assert lines, "the run should have waited for the source"
    assert {line["cause"] for line in lines} == {"DPONE_SOURCE_UNAVAILABLE"}
    assert all(line["delay_s"] > 0 for line in lines)
    ledger = ledger_of(open_journal("sqlite:///journal.db", base_dir=tmp_path))
    try:
        [run1] = ledger.list_runs()
        attempts = ledger.attempts(run1.run_id)
    finally:
        ledger.close()
    assert run1.state is RunState.COMPLETE
    # every failed attempt failed on the source, before anything was written
    assert {(a.state, a.error_code) for a in attempts[:-1]} == {
        (AttemptState.FAILED, "DPONE_SOURCE_UNAVAILABLE")
    }
    assert attempts[-1].state is AttemptState.COMPLETE
    assert len(attempts) == len(lines) + 1

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dpone"):
        day2 = _outage(private_pg, lambda: run(workload(source), "2026-11-02/2026-11-03"))
    assert (day2.state, day2.rows_written) == (CommitState.COMPLETE, ROWS)
    assert target_rows() == (2 * ROWS, 2 * ROWS)
    planned = _retry_lines(caplog)
    assert planned, "planning should have waited for the source's catalog"
    assert {line["cause"] for line in planned} == {"DPONE_SOURCE_UNAVAILABLE"}
    ledger = ledger_of(open_journal("sqlite:///journal.db", base_dir=tmp_path))
    try:
        run2 = next(r for r in ledger.list_runs() if r.run_id == day2.run_id)
        # the outage was over before the run began: its first attempt completed
        assert [a.state for a in ledger.attempts(run2.run_id)] == [AttemptState.COMPLETE]
    finally:
        ledger.close()


def test_target_database_briefly_down_the_run_still_completes(
    tmp_path: Path, private_pg: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The PostgreSQL *target* (the fence) is down when the run starts: retried, one write."""
    import psycopg

    path = _workload(
        tmp_path,
        "sqlite:///journal.db",
        {
            "attempts": 30,
            "budget_seconds": 45,
            "wait_initial_seconds": 0.2,
            "wait_max_seconds": 1.0,
            "wait_jitter_seconds": 0.2,
        },
    )
    config = json.loads(path.read_text(encoding="utf-8"))
    config["target"] = {"kind": "postgres", "url": private_pg.dsn, "table": "orders"}
    path.write_text(json.dumps(config), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="dpone"), Runner(path) as runner:
        result = _outage(private_pg, lambda: runner.run(interval=INTERVAL))
    assert (result.state, result.rows_written) == (CommitState.COMPLETE, ROWS)
    with psycopg.connect(private_pg.dsn) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT order_id) FROM orders").fetchone() == (
            ROWS,
            ROWS,
        )
    lines = _retry_lines(caplog)
    assert lines, "the run should have waited for the target"
    assert {line["cause"] for line in lines} == {"DPONE_TARGET_COMMIT_FENCE_UNAVAILABLE"}
