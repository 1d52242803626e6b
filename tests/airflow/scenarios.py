"""Files the Airflow tests share: workloads, source data, DAG files, metadata queries."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dpone.cli.main import app

ROWS = 100
REGIONS = ("eu", "us", "apac")
REGION_ROWS = 20
#: planted as a connection password; must never show up in logs, XCom or the journal
CANARY = "canary-Pa55w0rd-9f3e1c"


def write_orders(data: Path, rows: int = ROWS) -> Path:
    data.mkdir(parents=True, exist_ok=True)
    path = data / "orders.csv"
    lines = ["id,name,amount", *(f"{i},n{i},{i * 1.5}" for i in range(1, rows + 1))]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_regions(data: Path) -> None:
    data.mkdir(parents=True, exist_ok=True)
    for region in REGIONS:
        lines = ["id,region", *(f"{i},{region}" for i in range(1, REGION_ROWS + 1))]
        (data / f"region_{region}.csv").write_text("\n".join(lines) + "\n")


def workload(
    folder: Path,
    name: str,
    *,
    source: str,
    target: str,
    journal: Path,
    strategy: str = "append",
) -> Path:
    """Write a workload file; ``target`` is the YAML mapping of the target."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(
        f"workload: {name}\n"
        'release: "r1"\n'
        "deployment: airflow-test\n"
        f"journal: sqlite:///{journal}\n"
        f"source: {{kind: csv, path: '{source}'}}\n"
        f"target: {target}\n"
        f"load: {{strategy: {strategy}}}\n"
    )
    return path


def metadata(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True)


def task_states(home: Path, dag_id: str) -> dict[tuple[str, int], tuple[str, int]]:
    """``(task_id, map_index) -> (state, try_number)`` of the DAG's task instances."""
    with metadata(home) as db:
        rows = db.execute(
            "SELECT task_id, map_index, state, try_number FROM task_instance WHERE dag_id = ?",
            (dag_id,),
        ).fetchall()
    return {(t, m): (s, n) for t, m, s, n in rows}


def xcoms(home: Path, dag_id: str) -> dict[tuple[str, int], Any]:
    """``(task_id, map_index) -> return_value`` (JSON in both Airflow versions)."""
    with metadata(home) as db:
        rows = db.execute(
            "SELECT task_id, map_index, value FROM xcom WHERE dag_id = ? AND key = 'return_value'",
            (dag_id,),
        ).fetchall()
    out = {}
    for task, index, value in rows:
        raw = value.decode() if isinstance(value, bytes) else value
        decoded = json.loads(raw)
        out[(task, index)] = json.loads(decoded) if isinstance(decoded, str) else decoded
    return out


def journal_entries(path: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT operation_id, state, lease_owner, metadata, result FROM dpone_journal"
        ).fetchall()
    return [
        {
            "operation_id": op,
            "state": state,
            "lease_owner": owner,
            "metadata": json.loads(meta),
            "result": json.loads(result) if result else None,
        }
        for op, state, owner, meta, result in rows
    ]


def journal_text(path: Path) -> str:
    """Every journal, transition, audit and run-ledger row as text (for secret scans)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        parts = []
        tables = ("dpone_journal", "dpone_transitions", "dpone_audit", "dpone_runs")
        for table in (*tables, "dpone_run_attempts"):
            parts += [repr(row) for row in db.execute(f"SELECT * FROM {table}")]
    return "\n".join(parts)


def table_rows(db_path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


def ledger_runs(journal: Path) -> dict[str, Any]:
    """``operation_id -> dpone runs show --json`` for every run of the journal.

    The CLI runs in this process (the same dpone as the Airflow environments, editable):
    a process per command would cost seconds on a loaded machine.
    """
    cli, where = CliRunner(), ["--journal", f"sqlite:///{journal}", "--json"]
    listed = cli.invoke(app, ["runs", "list", *where])
    assert listed.exit_code == 0, listed.output
    shown = {}
    for run in json.loads(listed.stdout):
        one = cli.invoke(app, ["runs", "show", run["run_id"], *where])
        assert one.exit_code == 0, one.output
        shown[run["operation_id"]] = json.loads(one.stdout)
    return shown
