"""Replay by idempotency key on real SQLite and PostgreSQL targets: counted in the target.

Each scenario runs the documented replay rule (docs/runs-and-retries.md) and counts the
target's rows after every call, so a second mutation could not hide.
"""

from __future__ import annotations

import getpass
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dpone.api import Runner
from dpone.contracts.run import AttemptState, RunState
from dpone.contracts.states import CommitState
from dpone.errors import (
    CommitUnknown,
    InjectedFault,
    IntentConflict,
    LeaseHeld,
    RunKeyConflict,
    TargetWriteFailed,
)
from dpone.testing.crash import run_dpone, write_orders_csv

ROWS = 100
INTERVAL = "2026-11-01/2026-11-02"


@dataclass
class Target:
    """One real target (and its journal) for the replay scenarios."""

    kind: str
    root: Path
    workload: dict[str, Any]
    count: Callable[[], int]
    execute: Callable[[str], None]
    table: str

    def write(self, **changes: Any) -> Path:
        path = self.root / "w.yaml"
        path.write_text(json.dumps({**self.workload, **changes}), encoding="utf-8")
        return path

    def run(self, key: str | None = "K", failpoints: str | None = None, **changes: Any) -> Any:
        env = {k: v for k, v in os.environ.items() if k != "DPONE_FAILPOINTS"}
        if failpoints:
            env["DPONE_FAILPOINTS"] = failpoints
        with Runner(self.write(**changes), environ=env) as runner:
            return runner.run(interval=INTERVAL, idempotency_key=key)

    def ledger(self) -> Any:
        from dpone.config.bootstrap import ledger_of, open_journal

        url = self.workload["journal"]
        schema = self.workload.get("journal_schema", "dpone")
        return ledger_of(open_journal(url, base_dir=self.root, schema=schema))

    def reject_all_rows(self) -> None:
        self.execute(
            f"CREATE TABLE {self.table} (order_id BIGINT, customer TEXT, "
            "amount DOUBLE PRECISION CHECK (amount < 0), ordered_at "
            f"{'TEXT' if self.kind == 'sqlite' else 'TIMESTAMPTZ'})"
        )

    def accept_rows_again(self) -> None:
        self.execute(f"DROP TABLE {self.table}")


def _base(journal: str, target: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "ledger",
        "journal": journal,
        "source": {"kind": "csv", "path": "orders.csv"},
        "target": target,
        "load": {"strategy": "append", "key": ["order_id"], "interval_column": "ordered_at"},
    }


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A SQLite target with a SQLite journal, or a PostgreSQL target with a PostgreSQL journal."""
    write_orders_csv(tmp_path / "orders.csv", ROWS)
    if request.param == "sqlite":
        db = tmp_path / "warehouse.db"

        def sqlite_execute(sql: str) -> None:
            with closing(sqlite3.connect(db)) as conn:
                conn.execute(sql)
                conn.commit()

        def sqlite_count() -> int:
            if not db.exists():
                return 0
            with closing(sqlite3.connect(db)) as conn:
                found = conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'orders'"
                ).fetchone()[0]
                if not found:
                    return 0
                return int(conn.execute("SELECT count(*) FROM orders").fetchone()[0])

        yield Target(
            kind="sqlite",
            root=tmp_path,
            workload=_base(
                "sqlite:///journal.db",
                {"kind": "sqlite", "url": "sqlite:///warehouse.db", "table": "orders"},
            ),
            count=sqlite_count,
            execute=sqlite_execute,
            table="orders",
        )
        return
    psycopg = pytest.importorskip("psycopg")
    dsn: str = request.getfixturevalue("pg_available")
    schema = f"l_{uuid.uuid4().hex[:10]}"
    journal_dsn = dsn.rsplit("/", 1)[0] + "/postgres"  # another database: forward recovery
    table = f'"{schema}".orders'

    def pg_execute(sql: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql)

    def pg_count() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if not found or found[0] is None:
                return 0
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    pg_execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield Target(
            kind="postgres",
            root=tmp_path,
            workload={
                **_base(
                    journal_dsn,
                    {
                        "kind": "postgres",
                        "url": dsn,
                        "table": f"{schema}.orders",
                        "fence_schema": schema,
                    },
                ),
                "journal_schema": schema,
            },
            count=pg_count,
            execute=pg_execute,
            table=table,
        )
    finally:
        for where in (dsn, journal_dsn):
            with psycopg.connect(where, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _run_and_attempts(target: Target, run_id: str) -> tuple[Any, list[Any]]:
    ledger = target.ledger()
    try:
        return ledger.get_run(run_id), ledger.attempts(run_id)
    finally:
        ledger.close()


def test_replay_of_a_complete_run_returns_it_and_writes_nothing(target: Target) -> None:
    """COMPLETE: the replay returns the same run's recorded result; the target keeps 100 rows."""
    first = target.run()
    assert (first.state, first.rows_written, first.replayed) == (CommitState.COMPLETE, ROWS, False)
    assert target.count() == ROWS
    again = target.run()
    assert (again.run_id, again.replayed, again.rows_written) == (first.run_id, True, ROWS)
    assert target.count() == ROWS
    run, attempts = _run_and_attempts(target, first.run_id)
    assert run.state is RunState.COMPLETE
    assert [(a.attempt, a.state) for a in attempts] == [(1, AttemptState.COMPLETE)]
    assert run.idempotency_key == "K"
    assert dict(run.provenance)["kind"] == "api"
    # the same key for another request is refused before anything runs
    with pytest.raises(RunKeyConflict), Runner(target.write()) as runner:
        runner.run(interval="2026-11-02/2026-11-03", idempotency_key="K")
    # the same key with another workload definition is an intent conflict
    with pytest.raises(IntentConflict):
        target.run(load={"strategy": "append", "key": [], "interval_column": "ordered_at"})
    assert target.count() == ROWS


def test_replay_of_an_unresolved_run_stops_again_and_writes_nothing(target: Target) -> None:
    """UNRESOLVED (COMMIT_UNKNOWN): every replay raises CommitUnknown; still one write."""
    # the write commits, then the attempt dies before the journal learns it; on an
    # uncertified route that policy forbids settling automatically -> COMMIT_UNKNOWN
    with pytest.raises(InjectedFault):
        target.run(failpoints="after:fence.mutate=raise", require_certified=True)
    assert target.count() == ROWS
    with pytest.raises(CommitUnknown):
        target.run(require_certified=True)  # FAILED transient -> a new attempt, which stops
    run_id = _run_id(target)
    run, attempts = _run_and_attempts(target, run_id)
    assert run.state is RunState.UNRESOLVED
    assert run.error.code == "DPONE_TARGET_COMMIT_UNKNOWN"
    for _ in range(2):
        with pytest.raises(CommitUnknown):
            target.run(require_certified=True)
        assert target.count() == ROWS
    assert _run_and_attempts(target, run_id)[1] == attempts  # no new attempt either
    assert [a.state for a in attempts] == [AttemptState.FAILED, AttemptState.UNRESOLVED]


def test_replay_of_a_terminal_failure_is_a_new_attempt_once_the_cause_is_fixed(
    target: Target,
) -> None:
    """FAILED terminal: nothing was written; a replay after the fix writes once, same run."""
    target.reject_all_rows()
    with pytest.raises(TargetWriteFailed):
        target.run()
    assert target.count() == 0
    run_id = _run_id(target)
    run, attempts = _run_and_attempts(target, run_id)
    assert (run.state, run.error.retryability) == (RunState.FAILED, "terminal")
    with pytest.raises(TargetWriteFailed):  # the cause is still there: fails again, no write
        target.run()
    assert target.count() == 0
    target.accept_rows_again()  # the operator fixed the cause; the same key runs again
    done = target.run()
    assert (done.rows_written, done.run_id) == (ROWS, run_id)
    assert target.count() == ROWS
    run, later = _run_and_attempts(target, run_id)
    assert run.state is RunState.COMPLETE
    assert len(later) == len(attempts) + 2
    assert target.run().replayed  # and from now on a replay returns the recorded result
    assert target.count() == ROWS


def test_replay_of_a_transient_failure_is_a_new_attempt_of_the_same_run(target: Target) -> None:
    """FAILED transient: in flight elsewhere -> LeaseHeld; later a new attempt writes once."""
    with pytest.raises(InjectedFault):
        target.run(failpoints="fence.mutate.before_commit=raise")  # rolled back
    assert target.count() == 0
    run_id = _run_id(target)
    run, _ = _run_and_attempts(target, run_id)
    assert (run.state, run.error.retryability) == (RunState.FAILED, "transient")
    # another executor holds the operation's lease: the replay returns at once
    journal = target.ledger()
    try:
        held = journal.acquire_lease(operation_id=run.operation_id, owner="other:1", ttl_seconds=60)
        with pytest.raises(LeaseHeld):
            target.run()
        assert _run_and_attempts(target, run_id)[0].state is RunState.FAILED  # untouched
        journal.release_lease(
            operation_id=run.operation_id, owner="other:1", lease_epoch=held.lease_epoch
        )
    finally:
        journal.close()
    done = target.run()
    # attempt numbers are lease epochs: the other executor's epoch is skipped
    assert (done.run_id, done.rows_written, done.attempt) == (run_id, ROWS, held.lease_epoch + 1)
    assert target.count() == ROWS
    run, attempts = _run_and_attempts(target, run_id)
    assert run.state is RunState.COMPLETE
    assert [(a.attempt, a.state) for a in attempts] == [
        (1, AttemptState.FAILED),
        (held.lease_epoch + 1, AttemptState.COMPLETE),
    ]


def _run_id(target: Target) -> str:
    ledger = target.ledger()
    try:
        [run] = ledger.list_runs()
        return str(run.run_id)
    finally:
        ledger.close()


def test_cli_runs_list_and_show_warn_about_an_unresolved_run(tmp_path: Path) -> None:
    """`dpone runs list/show` print the run, its attempts and an explicit warning line."""
    write_orders_csv(tmp_path / "orders.csv", ROWS)
    workload = {
        **_base(
            "sqlite:///journal.db",
            {"kind": "sqlite", "url": "sqlite:///warehouse.db", "table": "orders"},
        ),
        "require_certified": True,
    }
    (tmp_path / "w.yaml").write_text(json.dumps(workload), encoding="utf-8")
    run = ("run", "w.yaml", "--interval", INTERVAL, "--no-progress", "--idempotency-key", "nightly")
    proc = run_dpone(run, cwd=tmp_path, failpoints="fence.mutate.before_commit=raise")
    assert proc.returncode == 3, proc.stderr  # COMMIT_UNKNOWN: uncertified, not settled
    again = run_dpone(run, cwd=tmp_path)
    assert again.returncode == 3, again.stderr
    listed = run_dpone(("runs", "list", "-w", "w.yaml"), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "UNRESOLVED" in listed.stdout
    assert "warning: run run-" in listed.stderr
    assert "an operator must decide" in listed.stderr
    [entry] = json.loads(
        run_dpone(
            ("runs", "list", "-w", "w.yaml", "--json", "--state", "unresolved"), cwd=tmp_path
        ).stdout
    )
    assert (entry["idempotency_key"], entry["unresolved"]) == ("nightly", True)
    assert entry["provenance"]["kind"] == "cli"
    assert entry["provenance"]["user"] == getpass.getuser()  # the CLI user who ran it
    assert entry["provenance"]["command"].startswith("dpone run w.yaml")
    assert entry["access"]["connections"].startswith("journal=sqlite:")
    shown = run_dpone(("runs", "show", entry["run_id"], "-w", "w.yaml", "--json"), cwd=tmp_path)
    detail = json.loads(shown.stdout)
    assert [a["state"] for a in detail["attempts"]] == ["UNRESOLVED"]
    assert detail["operation"]["state"] == "COMMIT_UNKNOWN"
    text = run_dpone(("runs", "show", entry["run_id"], "-w", "w.yaml"), cwd=tmp_path)
    assert "warning: run" in text.stderr
    assert "DPONE_TARGET_COMMIT_UNKNOWN" in text.stdout
    bad = run_dpone(("runs", "list", "-w", "w.yaml", "--state", "nope"), cwd=tmp_path)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr


def test_each_airflow_try_is_an_attempt_of_one_run_with_its_provenance(target: Target) -> None:
    """Airflow tries 1 (transient failure) and 2: one run, two attempts, each try recorded.

    Drives :class:`dpone.api.Runner` exactly as ``DponeRunOperator`` does (the task's run
    context and its ledger provenance), without an Airflow installation; the real-Airflow
    scenarios are in ``tests/airflow``.
    """
    from dpone.airflow.identity import TaskIdentity

    task = TaskIdentity(dag_id="orders_daily", run_id="scheduled__2026-11-01", task_id="load")
    env = {k: v for k, v in os.environ.items() if k != "DPONE_FAILPOINTS"}

    def airflow_try(number: int, failpoints: str | None = None) -> Any:
        environ = {**env, "DPONE_FAILPOINTS": failpoints} if failpoints else env
        with Runner(target.write(), environ=environ) as runner:
            return runner.run(
                interval=INTERVAL,
                context=task.run_context(),
                provenance=task.ledger_provenance(try_number=number),
            )

    with pytest.raises(InjectedFault):
        airflow_try(1, failpoints="fence.mutate.before_commit=raise")
    assert target.count() == 0
    done = airflow_try(2)
    assert done.rows_written == ROWS
    assert target.count() == ROWS
    again = airflow_try(3)  # e.g. the task cleared after success: the recorded result
    assert (again.replayed, again.run_id) == (True, done.run_id)
    assert target.count() == ROWS
    run, attempts = _run_and_attempts(target, done.run_id)
    assert run.state is RunState.COMPLETE
    assert run.idempotency_key == f"op:{done.operation_id}"  # derived from the operation id
    assert (run.provenance["kind"], run.provenance["dag_id"], run.provenance["task_id"]) == (
        "airflow",
        "orders_daily",
        "load",
    )
    assert run.access_digest.startswith("sha256:")
    # attempt numbers are lease epochs (the one that settled try 1's write is skipped)
    assert [(a.state, a.provenance["try_number"], a.provenance["run_id"]) for a in attempts] == [
        (AttemptState.FAILED, 1, "scheduled__2026-11-01"),
        (AttemptState.COMPLETE, 2, "scheduled__2026-11-01"),
    ]
    assert (attempts[0].attempt, attempts[-1].attempt) == (1, done.attempt)
