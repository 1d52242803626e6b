"""`airflow dags test` with retries=3 on Airflow 3.3.2 and 2.11.2 (both run at once).

One DAG, three tasks, each with its own workload and fault:
- lost_after_commit: try 1 raises right after the target commit (``after:fence.mutate``),
  before the journal records it; try 2 reconciles through the fence and finishes. Its
  target is an Airflow connection id whose password is a planted canary.
- xcom_lost: try 1 completes the journal and is lost before Airflow records its XCom;
  try 2 returns the recorded result (replayed) without writing.
- commit_unknown: a capability-``none`` target (jsonl_append) loses try 1 after the write;
  try 2 finds COMMITTING, cannot prove the outcome and fails with AirflowFailException:
  tries 3 and 4 are never used and the log names the recovery command.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.conftest import Airflow, both
from tests.airflow.scenarios import (
    CANARY,
    ROWS,
    journal_entries,
    journal_text,
    ledger_runs,
    table_rows,
    task_states,
    workload,
    write_orders,
    xcoms,
)

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(480)]

DAG_ID = "dpone_retry_scenarios"
INTERVAL = "2026-11-01/2026-11-02"
SAFE_KEYS = {"operation_id", "state", "rows_written", "replayed", "resumed"}

DAG_FILE = '''
import os
from datetime import datetime, timedelta, timezone

from airflow.providers.common.compat.sdk import DAG

from dpone.airflow import DponeRunOperator


class FaultyRun(DponeRunOperator):
    """Test only: arms dpone failpoints (DPONE_FAILPOINTS) for every try of this task."""

    def __init__(self, *, failpoints, **kwargs):
        super().__init__(**kwargs)
        self.failpoints = failpoints

    def execute(self, context):
        os.environ["DPONE_FAILPOINTS"] = self.failpoints
        try:
            return super().execute(context)
        finally:
            os.environ.pop("DPONE_FAILPOINTS", None)


with DAG(
    dag_id="{dag_id}",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    default_args={{"retries": 3, "retry_delay": timedelta(seconds=1)}},
):
    FaultyRun(
        task_id="lost_after_commit",
        workload="{wl_a}",
        interval="{interval}",
        target_conn_id="dpone_warehouse",
        failpoints="after:fence.mutate=raise",
    )
    FaultyRun(
        task_id="xcom_lost",
        workload="{wl_b}",
        interval="{interval}",
        failpoints="after:COMPLETE=raise",
    )
    FaultyRun(
        task_id="commit_unknown",
        workload="{wl_c}",
        interval="{interval}",
        failpoints="after:fence.mutate=raise",
    )
    DponeRunOperator(
        task_id="missing_connection",
        workload="{wl_d}",
        interval="{interval}",
        target_conn_id="dpone_no_such_connection",
    )
'''


def _scenario(airflow: Airflow, tmp: Path) -> dict[str, object]:
    work = tmp / airflow.label
    source = write_orders(work / "data")
    out = work / "out"
    out.mkdir(parents=True)
    journal = out / "journal.db"
    warehouse = out / "warehouse.db"
    wl = work / "workloads"
    wl_a = workload(
        wl, "orders_a", source=str(source), journal=journal,
        target="{kind: sqlite, url_env: SET_BY_THE_CONNECTION, table: orders_a}",
    )  # fmt: skip
    wl_b = workload(
        wl, "orders_b", source=str(source), journal=journal,
        target=f"{{kind: sqlite, url: 'sqlite:///{warehouse}', table: orders_b}}",
    )  # fmt: skip
    wl_c = workload(
        wl, "orders_c", source=str(source), journal=journal,
        target=f"{{kind: jsonl_append, path: {out / 'orders.jsonl'}}}",
    )  # fmt: skip
    wl_d = workload(
        wl, "orders_d", source=str(source), journal=journal,
        target="{kind: sqlite, url_env: SET_BY_THE_CONNECTION, table: orders_d}",
    )  # fmt: skip
    dags = work / "dags"
    dags.mkdir()
    (dags / "scenarios.py").write_text(
        DAG_FILE.format(
            dag_id=DAG_ID, wl_a=wl_a, wl_b=wl_b, wl_c=wl_c, wl_d=wl_d, interval=INTERVAL
        )
    )
    home = airflow.home(work)
    connection = {"conn_type": "sqlite", "host": str(warehouse), "password": CANARY}
    env = airflow.env(home, dags, AIRFLOW_CONN_DPONE_WAREHOUSE=json.dumps(connection))
    done: subprocess.CompletedProcess[str] = airflow.run(
        ["airflow", "dags", "test", DAG_ID, "2026-11-01"], env
    )
    return {
        "log": done.stdout + done.stderr,
        "rc": done.returncode,
        "home": home,
        "journal": journal,
        "warehouse": warehouse,
        "jsonl": out / "orders.jsonl",
    }


def test_retries_reconcile_replay_and_stop(airflows: dict[str, Airflow], tmp_path: Path) -> None:
    results = both(airflows, lambda af: _scenario(af, tmp_path))
    for label, run in results.items():
        _check(label, run)


def _check(label: str, run: dict[str, object]) -> None:
    log = str(run["log"])
    home = Path(str(run["home"]))
    where = f"Airflow {label}:\n{log[-4000:]}"
    states = task_states(home, DAG_ID)
    # 1. lost after the target commit: try 2 reconciled, every row once
    assert states[("lost_after_commit", -1)] == ("success", 2), where
    assert table_rows(
        Path(str(run["warehouse"])), "SELECT COUNT(*), COUNT(DISTINCT id) FROM orders_a"
    ) == [(ROWS, ROWS)]
    # 2. XCom lost between tries: try 2 replayed the recorded result, nothing rewritten
    assert states[("xcom_lost", -1)] == ("success", 2), where
    assert table_rows(
        Path(str(run["warehouse"])), "SELECT COUNT(*), COUNT(DISTINCT id) FROM orders_b"
    ) == [(ROWS, ROWS)]
    values = xcoms(home, DAG_ID)
    lost, replayed = values[("lost_after_commit", -1)], values[("xcom_lost", -1)]
    assert set(lost) == SAFE_KEYS
    assert set(replayed) == SAFE_KEYS
    assert (lost["state"], lost["rows_written"], lost["resumed"]) == ("COMPLETE", ROWS, True)
    assert (replayed["replayed"], replayed["rows_written"]) == (True, ROWS)
    # 3. COMMIT_UNKNOWN: failed on try 2 of 4, no further retries, log names the command
    assert states[("commit_unknown", -1)] == ("failed", 2), where
    assert ("commit_unknown", -1) not in values
    entries = {e["metadata"]["workload_id"]: e for e in journal_entries(Path(str(run["journal"])))}
    unknown = entries["orders_c"]
    assert unknown["state"] == "COMMIT_UNKNOWN"
    command = f"dpone recovery target-commit plan --operation-id {unknown['operation_id']}"
    assert command in log, where
    assert "DPONE_TARGET_COMMIT_UNKNOWN" in log
    assert len(Path(str(run["jsonl"])).read_text().splitlines()) == ROWS  # written once
    # the operation ids are the ones in XCom; all three are distinct operations
    assert entries["orders_a"]["operation_id"] == lost["operation_id"]
    assert entries["orders_b"]["operation_id"] == replayed["operation_id"]
    assert entries["orders_a"]["state"] == entries["orders_b"]["state"] == "COMPLETE"
    # the connection's password never left the worker
    assert CANARY not in log
    assert CANARY not in json.dumps(list(values.values()))
    assert CANARY not in journal_text(Path(str(run["journal"])))
    # a connection id Airflow does not define: failed on try 1 of 4, named, nothing journaled
    assert states[("missing_connection", -1)] == ("failed", 1), where
    assert "the Airflow connection 'dpone_no_such_connection' (target_conn_id) is not" in log
    assert "AIRFLOW_CONN_DPONE_NO_SUCH_CONNECTION" in log
    assert "orders_d" not in entries
    # the run ledger records every try's Airflow provenance (try number: provenance only)
    ledger = ledger_runs(Path(str(run["journal"])))
    _check_ledger(
        ledger,
        lost=lost["operation_id"],
        replayed=replayed["operation_id"],
        unknown=unknown["operation_id"],
    )


def _tries(shown: dict[str, Any]) -> list[tuple[int, str, int]]:
    """``(attempt, state, try_number)`` of every attempt of one run, checking provenance."""
    out = []
    for attempt in shown["attempts"]:
        prov = attempt["provenance"]
        assert (prov["kind"], prov["dag_id"], prov["map_index"]) == ("airflow", DAG_ID, -1), prov
        out.append((attempt["attempt"], attempt["state"], prov["try_number"]))
    return out


def _check_ledger(ledger: dict[str, Any], *, lost: str, replayed: str, unknown: str) -> None:
    """The ledger of the three journaled tasks, given their operation ids."""
    dump = json.dumps(ledger, indent=1)[-6000:]
    runs = {op: shown["run"] for op, shown in ledger.items()}
    assert set(runs) == {lost, replayed, unknown}, dump
    for op, task in (
        (lost, "lost_after_commit"),
        (replayed, "xcom_lost"),
        (unknown, "commit_unknown"),
    ):
        prov = runs[op]["provenance"]
        assert (prov["kind"], prov["dag_id"], prov["task_id"]) == ("airflow", DAG_ID, task), dump
    # lost after the target commit: try 1 is attempt 1, try 2 (which reconciled) attempt 2
    assert runs[lost]["state"] == "COMPLETE", dump
    tries = _tries(ledger[lost])
    assert [(a, n) for a, _, n in tries] == [(1, 1), (2, 2)], dump
    assert tries[-1][1] == "COMPLETE", dump
    # XCom lost: try 1 completed the operation as attempt 1 (and then raised); try 2
    # replayed the recorded result, took no attempt, and the run reads COMPLETE
    assert runs[replayed]["state"] == "COMPLETE", dump
    assert [(a, n) for a, _, n in _tries(ledger[replayed])] == [(1, 1)], dump
    # COMMIT_UNKNOWN: try 2 is the attempt that stopped; the run waits for an operator
    assert runs[unknown]["state"] == "UNRESOLVED", dump
    assert "dpone recovery target-commit plan" in str(runs[unknown]["warning"]), dump
    tries = _tries(ledger[unknown])
    assert [(a, n) for a, _, n in tries] == [(1, 1), (2, 2)], dump
    assert tries[-1][1] == "UNRESOLVED", dump
