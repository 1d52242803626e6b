"""A real scheduler and executor run a mapped DAG; one worker process dies by SIGKILL.

Airflow 3.3.2: api-server + scheduler + dag-processor, LocalExecutor, SQLite metadata.
Airflow 2.11.2: scheduler with SequentialExecutor (2.x refuses LocalExecutor on SQLite).

The DAGs come from the DAG factory: one workload whose source path has ``{partition}``,
mapped over three regions, and one capability-``none`` workload (jsonl_append). Every
try sleeps inside the open target transaction (failpoint
``fence.mutate.before_commit=sleep``); the test reads the journal, finds the first
operation of each workload in COMMITTING, and SIGKILLs the process that holds its lease (the
lease owner names the pid): the task process, mid-load. Airflow retries that task; the
retry seals the fence, proves nothing committed, and writes. Every partition lands once.
The same kill on the jsonl_append workload ends in COMMIT_UNKNOWN on try 2 of 4.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.conftest import Airflow, both
from tests.airflow.scenarios import (
    REGION_ROWS,
    REGIONS,
    journal_entries,
    ledger_runs,
    metadata,
    table_rows,
    task_states,
    workload,
    write_regions,
)

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(480)]

DAG_ID = "dpone_regions"
#: a capability-``none`` workload killed in COMMITTING: its retry must stop, not rewrite
UNKNOWN_DAG_ID = "dpone_events"
DEADLINE_S = 200
#: the tests read task logs from files: no log server (one process less to start)
SCHEDULER = ["airflow", "scheduler", "--skip-serve-logs"]
TRIGGERER = ["airflow", "triggerer", "--skip-serve-logs"]

DAG_FILE = """
from datetime import datetime, timedelta, timezone

from dpone.airflow import dags_from_folder

globals().update(
    dags_from_folder(
        "{workloads}",
        schedule="@daily",
        start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
        partitions={{"regions": {regions}}},
        retries=3,
        retry_delay=timedelta(seconds=2),
    )
)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scheduler_env(
    airflow: Airflow, home: Path, dags: Path, *, port: int, **extra: str
) -> dict[str, str]:
    """The environment of a live scheduler run: fast heartbeats and parsing, the executor.

    Airflow 3 runs tasks with the LocalExecutor through the api-server on ``port``;
    Airflow 2 with the SequentialExecutor. ``extra`` adds variables.
    """
    env = airflow.env(
        home,
        dags,
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
        AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL="5",
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(_free_port()),
        **extra,
    )
    if airflow.major >= 3:
        env.update(
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
            AIRFLOW__API__PORT=str(port),
            # a loaded 2-core machine answers the first execution-API calls slowly
            AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="60",
            AIRFLOW__WORKERS__EXECUTION_API_RETRIES="10",
        )
    else:
        env.update(AIRFLOW__CORE__EXECUTOR="SequentialExecutor")
    return env


def _wait_for_api(port: int, timeout: float = 120) -> None:
    """Wait until the api-server answers (the port opens before the app is ready)."""
    url = f"http://127.0.0.1:{port}/api/v2/monitor/health"
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the api-server did not answer on {port} within {timeout}s")


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process group at once, then wait (SIGKILL what is left after 15 s).

    The shutdowns overlap: stopping one service after the other cost seconds per service.
    """
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _dag_run_states(home: Path) -> dict[str, str] | None:
    """DAG id -> run state; None while unreadable; ``import_error`` if a DAG file failed."""
    try:
        with metadata(home) as db:
            if db.execute("SELECT COUNT(*) FROM import_error").fetchone()[0]:
                return {"import_error": "import_error"}
            rows = db.execute("SELECT dag_id, state FROM dag_run").fetchall()
    except Exception:  # the database is busy: look again
        return None
    return dict(rows)


def _finished(states: dict[str, str] | None) -> bool:
    if states is None:
        return False
    if "import_error" in states:
        return True
    done = ("success", "failed")
    return states.get(DAG_ID) in done and states.get(UNKNOWN_DAG_ID) in done


def _appended(jsonl: Path) -> bool:
    """Whether the events load has appended its rows (it then sleeps in the failpoint)."""
    try:
        return len(jsonl.read_bytes().splitlines()) >= REGION_ROWS
    except FileNotFoundError:
        return False


def _kill_committing(journal: Path, killed: dict[str, str], jsonl: Path) -> None:
    """SIGKILL the lease holder of the first operation seen in COMMITTING, per workload.

    The events load (no fence) is killed only once its rows are in the file: COMMITTING
    is durable a moment before the append, and a kill in that moment would leave nothing
    for the retry to refuse to write again.
    """
    if not journal.exists():
        return
    try:
        entries = journal_entries(journal)
    except Exception:  # the journal is being created
        return
    for entry in entries:
        name = entry["metadata"]["workload_id"]
        if name in killed or entry["state"] != "COMMITTING" or not entry["lease_owner"]:
            continue
        if name == "events" and not _appended(jsonl):
            continue  # seen again at the next poll, asleep after the append
        try:
            os.kill(int(entry["lease_owner"].split(":")[1]), signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed[name] = str(entry["operation_id"])


def _scenario(airflow: Airflow, tmp: Path) -> dict[str, object]:
    work = tmp / airflow.label
    data = work / "data"
    write_regions(data)
    out = work / "out"
    out.mkdir(parents=True)
    journal, warehouse = out / "journal.db", out / "warehouse.db"
    folder = work / "workloads"
    workload(
        folder, "regions", source=str(data / "region_{partition}.csv"), journal=journal,
        target=f"{{kind: sqlite, url: 'sqlite:///{warehouse}', table: regions}}",
    )  # fmt: skip
    workload(
        folder, "events", source=str(data / "region_eu.csv"), journal=journal,
        target=f"{{kind: jsonl_append, path: {out / 'events.jsonl'}}}",
    )  # fmt: skip
    dags = work / "dags"
    dags.mkdir()
    (dags / "regions.py").write_text(DAG_FILE.format(workloads=folder, regions=list(REGIONS)))
    home = airflow.home(work)
    port = _free_port()
    env = _scheduler_env(
        airflow,
        home,
        dags,
        port=port,
        DPONE_FAILPOINTS="fence.mutate.before_commit=sleep(2)",
        AIRFLOW__CORE__PARALLELISM="2",
    )
    if airflow.major >= 3:
        commands = [
            ["airflow", "api-server", "--port", str(port)],
            ["airflow", "dag-processor"],
            SCHEDULER,
        ]
    else:
        commands = [SCHEDULER]
    logs = [(work / f"{c[1]}.log").open("w") for c in commands]
    procs = [
        subprocess.Popen(
            [airflow.bin(c[0]), *c[1:]],
            env=env,
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for c, log in zip(commands, logs, strict=True)
    ]
    killed: dict[str, str] = {}
    states: dict[str, str] | None = None
    started = time.monotonic()
    try:
        while time.monotonic() - started < DEADLINE_S:
            _kill_committing(journal, killed, out / "events.jsonl")
            states = _dag_run_states(home)
            if _finished(states):
                break
            time.sleep(0.3)
    finally:
        _stop_all(procs)
        for log in logs:
            log.close()
    service_logs = "\n".join(
        f"--- {c[1]}\n" + (work / f"{c[1]}.log").read_text()[-3000:] for c in commands
    )
    task_logs = "\n".join(
        p.read_text() for p in home.glob(f"logs/dag_id={UNKNOWN_DAG_ID}/**/attempt=*.log")
    )
    return {
        "states": states,
        "killed": killed,
        "events_log": task_logs,
        "jsonl": out / "events.jsonl",
        "home": home,
        "journal": journal,
        "warehouse": warehouse,
        "seconds": time.monotonic() - started,
        "logs": service_logs,
    }


def test_mapped_dag_survives_a_killed_worker(airflows: dict[str, Airflow], tmp_path: Path) -> None:
    results = both(airflows, lambda af: _scenario(af, tmp_path))
    for label, run in results.items():
        where = f"Airflow {label} ({run['seconds']:.0f}s):\n{run['logs']}"
        killed = dict(run["killed"])  # type: ignore[call-overload]
        assert set(killed) == {"regions", "events"}, "workers not killed mid-load\n" + where
        dag_runs = run["states"] or {}
        assert dag_runs.get(DAG_ID) == "success", where  # type: ignore[union-attr]
        home = Path(str(run["home"]))
        states = task_states(home, DAG_ID)
        assert sorted(states) == [("load", i) for i in range(len(REGIONS))], where
        assert all(s == "success" for s, _ in states.values()), states
        entries = journal_entries(Path(str(run["journal"])))
        partitions = {e["operation_id"]: e["metadata"]["partition"] for e in entries}
        killed_index = REGIONS.index(partitions[killed["regions"]])
        assert states[("load", killed_index)][1] >= 2, states  # the killed try was retried
        # every partition landed exactly once
        rows = table_rows(
            Path(str(run["warehouse"])),
            "SELECT region, COUNT(*), COUNT(DISTINCT id) FROM regions GROUP BY region",
        )
        assert sorted(rows) == sorted((r, REGION_ROWS, REGION_ROWS) for r in REGIONS)
        regions = [e for e in entries if e["metadata"]["workload_id"] == "regions"]
        assert len(regions) == len(REGIONS)
        assert {e["state"] for e in regions} == {"COMPLETE"}
        assert {e["metadata"]["partition"] for e in regions} == set(REGIONS)
        # capability none, killed in COMMITTING: try 2 stops with COMMIT_UNKNOWN and the
        # recovery command; tries 3 and 4 are not used; the rows were appended once
        assert dag_runs.get(UNKNOWN_DAG_ID) == "failed", where  # type: ignore[union-attr]
        assert task_states(home, UNKNOWN_DAG_ID) == {("load", -1): ("failed", 2)}
        [events] = [e for e in entries if e["metadata"]["workload_id"] == "events"]
        assert events["state"] == "COMMIT_UNKNOWN"
        assert events["operation_id"] == killed["events"]
        command = f"dpone recovery target-commit plan --operation-id {killed['events']}"
        assert command in str(run["events_log"]), str(run["events_log"])[-3000:]
        assert len(Path(str(run["jsonl"])).read_text().splitlines()) == REGION_ROWS
        _check_ledger(run, killed, dag_states=states)


def _check_ledger(
    run: dict[str, object], killed: dict[str, str], *, dag_states: dict[tuple[str, int], Any]
) -> None:
    """Every mapped try is in the run ledger with its map index and try number."""
    home = Path(str(run["home"]))
    ledger = ledger_runs(Path(str(run["journal"])))
    dump = json.dumps(ledger, indent=1)[-6000:]
    regions = {op: shown for op, shown in ledger.items() if op != killed["events"]}
    assert len(regions) == len(REGIONS), dump
    for op, shown in regions.items():
        index = REGIONS.index(shown["operation"]["metadata"]["partition"])
        provs = [shown["run"]["provenance"], *(a["provenance"] for a in shown["attempts"])]
        for prov in provs:
            assert (prov["kind"], prov["dag_id"], prov["task_id"]) == ("airflow", DAG_ID, "load")
            assert prov["map_index"] == index, dump
        tries = [a["provenance"]["try_number"] for a in shown["attempts"]]
        # one attempt per try that took the lease, in try order; a later try can only
        # replay (no attempt) if Airflow lost a finished try (an execution-API timeout)
        assert tries == sorted(set(tries)), dump
        assert 1 <= tries[-1] <= dag_states[("load", index)][1], dump
        if op == killed["regions"]:
            assert len(tries) >= 2, dump  # the killed try and the one that wrote
            assert shown["attempts"][-1]["state"] == "COMPLETE", dump
    events = ledger[killed["events"]]
    assert events["run"]["state"] == "UNRESOLVED", dump
    tries = [a["provenance"]["try_number"] for a in events["attempts"]]
    assert tries[-1] == task_states(home, UNKNOWN_DAG_ID)[("load", -1)][1] == 2, dump
