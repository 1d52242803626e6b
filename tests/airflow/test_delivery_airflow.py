"""The deferrable delivery operator and its trigger in real Airflow 3.3.2 and 2.11.2.

The receiver and the control plane are real (the reference receiver process, SQLite);
the trigger and the operator run inside each Airflow environment in their own processes.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpone.airflow.delivery_runtime import open_delivery_runtime, trigger_locator
from dpone.config.bootstrap import RunContext
from dpone.contracts.delivery import DeliveryPending
from tests.airflow.conftest import Airflow, both
from tests.airflow.scenarios import metadata, task_states, xcoms
from tests.airflow.test_delivery_trigger import (
    CANARY,
    INTERVAL,
    _children,
    _pg_delivery,
    _schema_text,
    _with_password,
    pg_connection,
    promotions,
    rest_workload,
    run_attempts,
)
from tests.airflow.test_scheduler import (
    SCHEDULER,
    TRIGGERER,
    _free_port,
    _scheduler_env,
    _stop_all,
    _wait_for_api,
)
from tests.fixtures.receiver import RECEIVER_TOKEN
from tests.integration.test_delivery import TOKEN_ENV

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

PROBE = Path(__file__).with_name("delivery_probe.py")
FORBIDDEN = ("dpone.runtime", "dpone.adapters", "dpone.config", "dpone.api")


def _probe(af: Airflow, home: Path, *args: str, **extra_env: str) -> dict[str, Any]:
    env = af.env(home, home / "no-dags", **{TOKEN_ENV: RECEIVER_TOKEN}, **extra_env)
    done = subprocess.run(
        [af.bin("python"), str(PROBE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=home,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    why = f"{af.label}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, why
    assert lines, why
    assert RECEIVER_TOKEN not in done.stdout + done.stderr
    assert CANARY not in done.stdout + done.stderr
    result: dict[str, Any] = json.loads(lines[-1][len("PROBE ") :])
    return result


def _pending(folder: Path, receiver_url: str, partition: str) -> tuple[str, dict[str, str]]:
    runtime = open_delivery_runtime(str(rest_workload(folder, receiver_url)), {})
    try:
        result = runtime.deliver(
            interval=INTERVAL, partition=partition, context=RunContext(), provenance=None
        )
        assert isinstance(result, DeliveryPending)
        return result.operation_id, trigger_locator(runtime, {})
    finally:
        runtime.close()


def test_the_trigger_round_trips_runs_and_imports_no_runtime(
    airflows: dict[str, Airflow], receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's own trigger row rebuilds it from plain values; one run imports no runtime."""
    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)
    receiver.set_faults(job_duration_s=1.0)
    ops = {
        label: _pending(tmp_path / label, receiver.url, f"trigger-{label}") for label in airflows
    }

    def run(af: Airflow) -> dict[str, Any]:
        op, locator = ops[af.label]
        return _probe(af, af.home(tmp_path / af.label), "trigger", op, json.dumps(locator))

    for label, result in both(airflows, run).items():
        op, locator = ops[label]
        assert result["same"], result
        assert result["stored"] == result["kwargs"], result  # plain values survive Airflow
        assert result["kwargs"]["journal"] == locator
        assert result["event"] == {
            "operation_id": op,
            "status": "succeeded",
            "polls": result["event"]["polls"],
        }
        assert result["airflow_loaded"]
        leaked = [m for m in result["dpone_modules"] if m.startswith(FORBIDDEN)]
        assert leaked == [], leaked
        assert RECEIVER_TOKEN not in json.dumps(result)
        assert receiver.jobs_created(op) == 1


def test_duplicate_events_replay_and_a_running_job_defers_again(
    airflows: dict[str, Airflow], receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """execute_complete asks the control plane, never the event.

    While the job runs, every wake-up (a real hint or a forged one) defers again with the
    same operation id; once it succeeded, the first wake-up verifies and promotes, the
    duplicate replays; the stand-in checkpoint is promoted once.
    """
    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)
    receiver.set_faults(job_duration_s=300.0)  # still running whatever the machine's load
    running = {
        label: _pending(tmp_path / label / "long", receiver.url, f"long-{label}")
        for label in airflows
    }
    receiver.set_faults(job_duration_s=0.2)
    done = {
        label: _pending(tmp_path / label / "short", receiver.url, f"short-{label}")
        for label in airflows
    }
    time.sleep(0.5)  # the short jobs have succeeded at the receiver (not yet recorded)

    def probe(af: Airflow) -> dict[str, Any]:
        args = []
        for kind, ops in (("long", running), ("short", done)):
            args += [str(tmp_path / af.label / kind / "orders_rest.yaml"), ops[af.label][0]]
        return _probe(af, af.home(tmp_path / af.label), "operator", *args)

    for label, result in both(airflows, probe).items():
        early, late = result["ops"]
        op, locator = running[label]
        # the triggerer could not resolve the locator, or found no such delivery in the
        # journal it opened, and the job still runs: no deferral into the same instant
        # wake-up (a busy loop), the task fails for an operator
        unresolved = early["calls"].pop()["failed"]
        assert unresolved.startswith("DPONE_CONFIG_INVALID: the triggerer cannot open"), result
        assert "clear the task" in unresolved
        missing = early["calls"].pop()["failed"]
        assert missing.startswith("DPONE_CONFIG_INVALID: the triggerer found no delivery"), result
        assert "clear the task" in missing
        for call in early["calls"]:
            assert call.get("deferred") == "dpone.airflow.triggers.DponeReceiptTrigger", result
            assert call["method"] == "execute_complete"
            assert call["next_kwargs"] == {"operation_id": op}
            assert call["kwargs"]["journal"] == locator
            assert set(call["kwargs"]) == {
                "operation_id", "journal", "poll_interval_s", "max_polls", "deadline",
                "lease_s", "request_timeout_s", "not_before",
            }  # fmt: skip
        op, _ = done[label]
        first, second, third, fourth = (call["returned"] for call in late["calls"])
        assert (first["state"], first["replayed"]) == ("COMPLETE", False), result
        assert (second["state"], second["replayed"]) == ("COMPLETE", True), result
        assert (third["state"], third["replayed"]) == ("COMPLETE", True), result  # hint ignored
        assert (fourth["state"], fourth["replayed"]) == ("COMPLETE", True), result
        assert first["operation_id"] == second["operation_id"] == op
        assert promotions(tmp_path / label / "short", op) == 1
        assert promotions(tmp_path / label / "long", running[label][0]) == 0
        for ops in (running, done):
            assert receiver.jobs_created(ops[label][0]) == 1


# ---------------------------------------------------------------- a real scheduler + triggerer
DAG_ID = "dpone_delivery"
#: each child's remote job: the scenario's delivery is split into CHILDREN jobs; once
#: every version's triggerer was killed (on the first child) later jobs run LATER_JOB_S,
#: so the split costs the test one shorter job, not a second long one. Not shorter: a
#: trigger that fires within ~5 s of its deferral meets Airflow 3.3's race between the
#: deferral's own executor event and the re-queued task (apache/airflow#67287,
#: #72716): the scheduler fails the task (seen here with 3 s jobs)
JOB_S, LATER_JOB_S = 20.0, 10.0
ROWS, ROWS_PER_CHILD, CHILDREN = 5, 3, 2
DAG_FILE = """
from datetime import datetime, timezone

from airflow.providers.common.compat.sdk import task

from dpone.airflow.compat import DAG
from dpone.airflow.delivery import DponeDeliveryOperator

with DAG(
    "{dag_id}",
    schedule="@once",
    start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
    catchup=False,
):
    DponeDeliveryOperator(
        task_id="deliver",
        workload="{workload}",
        interval="{interval}",
        poll_interval_s=1.0,
        lease_s=3.0,
        priority_weight=10,
    )

    @task(priority_weight=1)
    def independent():
        return {{"ran": "while the delivery was deferred"}}

    independent()
"""


def _attempt_provenance(journal: Path, operation_id: str) -> list[tuple[str, int]]:
    """(provenance kind, try number) of each ledger attempt of the operation's run."""
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute(
            "SELECT a.provenance FROM dpone_run_attempts a JOIN dpone_runs r USING (run_id) "
            "WHERE r.operation_id = ? ORDER BY a.attempt",
            (operation_id,),
        ).fetchall()
    finally:
        db.close()
    return [(p["kind"], p["try_number"]) for p in (json.loads(row[0]) for row in rows)]


def _lease_row(journal: Path) -> tuple[str, int, int] | None:
    """The observation lease of the first child (the one the triggerer is killed on)."""
    try:
        with sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=1) as db:
            row = db.execute(
                "SELECT l.holder, l.epoch, l.polls FROM dpone_delivery_observer_leases l "
                "JOIN dpone_delivery d ON d.operation_id = l.operation_id "
                "ORDER BY d.child_index LIMIT 1"
            ).fetchone()
    except sqlite3.Error:
        return None
    return (str(row[0]), int(row[1]), int(row[2])) if row else None


def _states(home: Path) -> dict[str, str | None] | None:
    try:
        with metadata(home) as db:
            if db.execute("SELECT COUNT(*) FROM import_error").fetchone()[0]:
                return {"import_error": "import_error"}
            tis = db.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ?", (DAG_ID,)
            ).fetchall()
            runs = db.execute("SELECT state FROM dag_run WHERE dag_id = ?", (DAG_ID,)).fetchall()
    except Exception:  # the database is busy: look again
        return None
    out: dict[str, str | None] = dict(tis)
    out["dag_run"] = runs[0][0] if runs else None
    return out


def _start(af: Airflow, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [af.bin(argv[0]), *argv[1:]],
            env=env,
            cwd=env["AIRFLOW_HOME"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _name(label: str) -> str:
    return "orders_" + label.replace(".", "_")


def _deferral_scenario(
    af: Airflow, tmp: Path, receiver_url: str, on_killed: Callable[[], None]
) -> dict[str, Any]:
    work = tmp / af.label
    # one workload name per version: the shared receiver dedupes by operation id
    workload = rest_workload(
        work, receiver_url, name=_name(af.label), rows=ROWS, rows_per_child=ROWS_PER_CHILD
    )
    journal = work / "journal.db"
    dags = work / "dags"
    dags.mkdir()
    (dags / "delivery.py").write_text(
        DAG_FILE.format(dag_id=DAG_ID, workload=workload, interval=INTERVAL)
    )
    home = af.home(work)
    port = _free_port()
    env = _scheduler_env(
        af,
        home,
        dags,
        port=port,
        **{TOKEN_ENV: RECEIVER_TOKEN},
        # one task slot: the independent task can only run if the deferral frees it
        AIRFLOW__CORE__PARALLELISM="1",
        AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="5",
        AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1",
    )
    if af.major >= 3:
        services = [["airflow", "api-server", "--port", str(port)], ["airflow", "dag-processor"]]
    else:
        services = []
    procs = [_start(af, argv, env, work / f"{argv[1]}.log") for argv in services]
    # the triggerer needs no api-server (3.x gives it an in-process execution API): it
    # starts up while the api-server does
    triggerer = _start(af, TRIGGERER, env, work / "triggerer.log")
    if af.major >= 3:
        _wait_for_api(port)
    procs.append(_start(af, SCHEDULER, env, work / "scheduler.log"))
    seen: dict[str, Any] = {"deferred_s": 0.0, "running_s": 0.0, "killed": None}
    started = time.monotonic()
    last = started
    states: dict[str, str | None] | None = None
    try:
        while time.monotonic() - started < 300:
            states = _states(home)
            now = time.monotonic()
            if states:
                if "import_error" in states or states.get("dag_run") in ("success", "failed"):
                    break
                deliver = states.get("deliver")
                if deliver == "deferred":
                    seen["deferred_s"] += now - last
                    seen.setdefault("first_deferred", now - started)
                elif deliver == "running":
                    seen["running_s"] += now - last
                if states.get("independent") == "success" and "independent_done" not in seen:
                    seen["independent_done"] = deliver
                lease = _lease_row(journal)
                if seen["killed"] is None and deliver == "deferred" and lease and lease[2] >= 1:
                    _stop(triggerer, signal.SIGKILL)  # the triggerer dies mid-deferral
                    seen["killed"] = {"lease": lease, "at": now - started}
                    on_killed()
                    triggerer = _start(af, TRIGGERER, env, work / "triggerer.log")
            last = now
            time.sleep(0.3)
    finally:
        _stop_all([*procs, triggerer])
    seen.update(
        states=states,
        seconds=time.monotonic() - started,
        home=home,
        journal=journal,
        work=work,
        logs="\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in work.glob("*.log")
        ),
    )
    return seen


def test_deferral_frees_the_worker_and_survives_a_killed_triggerer(
    airflows: dict[str, Airflow], receiver, tmp_path: Path
) -> None:
    """A real scheduler and triggerer: the delivery defers while each remote job runs.

    The delivery is split into two child jobs (``rows_per_child``): the trigger watches
    the parent's in-flight child, so the task defers once per child and the run ledger
    has one attempt per deferral plus the first (no busy loop of wake-ups). With one
    task slot, the independent task runs while the delivery is deferred (the worker was
    released). The triggerer is SIGKILLed while its trigger holds the first child's
    observation lease; a new triggerer takes the trigger (and the expired lease) over,
    and the task finishes on try 1 with one remote job per child and one checkpoint
    promotion. Once both triggerers were killed the receiver's later jobs are short, so
    the second child adds a few seconds to the test, not a second long job.
    """
    receiver.set_faults(job_duration_s=JOB_S)
    before = receiver.stats()["jobs_total"]
    killed: list[None] = []
    lock = threading.Lock()

    def on_killed() -> None:
        with lock:
            killed.append(None)
            if len(killed) == len(airflows):
                receiver.set_faults(job_duration_s=LATER_JOB_S)

    results = both(airflows, lambda af: _deferral_scenario(af, tmp_path, receiver.url, on_killed))
    for label, run in results.items():
        where = f"Airflow {label} ({run['seconds']:.0f}s): {run}\n{run['logs']}"
        states = run["states"] or {}
        assert states.get("dag_run") == "success", where
        home = Path(run["home"])
        tis = task_states(home, DAG_ID)
        assert tis == {("deliver", -1): ("success", 1), ("independent", -1): ("success", 1)}, where
        assert run["independent_done"] == "deferred", where  # ran in the freed slot
        assert run["killed"] is not None, where
        lease = _lease_row(Path(run["journal"]))
        assert lease is not None, where
        assert lease[1] >= 2, (lease, where)  # a new holder took over
        assert lease[0] != run["killed"]["lease"][0]
        summary = xcoms(home, DAG_ID)[("deliver", -1)]
        assert (summary["state"], summary["replayed"]) == ("COMPLETE", False), summary
        op = summary["operation_id"]
        assert summary["rows"] == ROWS, summary
        journal = Path(run["journal"])
        children = _children(journal, op)
        assert [state for _, state in children] == ["COMPLETE"] * CHILDREN, children
        assert [receiver.jobs_created(child) for child, _ in children] == [1] * CHILDREN
        # execute, then one resume per child's wake-up: each deferral waited for its job
        assert run_attempts(journal) == 1 + CHILDREN, where
        assert promotions(Path(run["work"]), op, _name(label)) == 1
        # the submit and each resume after a wake-up are attempts of one run, all try 1
        attempts = _attempt_provenance(Path(run["journal"]), op)
        assert len(attempts) >= 2, (attempts, where)
        assert set(attempts) == {("airflow", 1)}, (attempts, where)
        logs = "\n".join(p.read_text(errors="replace") for p in home.glob("logs/**/*.log"))
        assert RECEIVER_TOKEN not in logs + run["logs"]
        print(
            f"\n[delivery {label}] {run['seconds']:.0f}s end to end; deferred "
            f"{run['deferred_s']:.1f}s, running {run['running_s']:.1f}s (0.3 s sampling); "
            f"first deferred at {run['first_deferred']:.1f}s; triggerer killed at "
            f"{run['killed']['at']:.1f}s"
        )
    # one remote job per child, none for the parent
    assert receiver.stats()["jobs_total"] - before == CHILDREN * len(airflows)


PARSE_DAG = """
from datetime import datetime, timezone

from dpone.airflow import DponeDeliveryOperator
from dpone.airflow.compat import DAG

dag = DAG("parse_only", schedule=None, start_date=datetime(2026, 11, 1, tzinfo=timezone.utc))
with dag:
    DponeDeliveryOperator(task_id="deliver", workload="/nonexistent/orders_rest.yaml")
"""


def test_parsing_a_delivery_dag_does_no_io_and_airflow_lists_the_trigger(
    airflows: dict[str, Airflow], tmp_path: Path
) -> None:
    """The operator's DAG parses with the network shut; ``providers triggers`` shows ours."""
    from tests.airflow.test_parse_and_provider import PROBE as PARSE_PROBE

    def run(af: Airflow) -> tuple[dict[str, Any], str]:
        work = tmp_path / af.label
        work.mkdir()
        dag_file = work / "delivery_dag.py"
        dag_file.write_text(PARSE_DAG)
        home = af.home(work)
        env = af.env(home, work)
        parsed = af.run(["python", str(PARSE_PROBE), str(dag_file)], env)
        assert parsed.returncode == 0, parsed.stderr[-3000:]
        listed = af.run(["airflow", "providers", "triggers", "--output", "json"], env)
        assert listed.returncode == 0, listed.stderr[-3000:]
        return json.loads(parsed.stdout.strip().splitlines()[-1]), listed.stdout

    for label, (report, triggers) in both(airflows, run).items():
        assert (report["dags"], report["tasks"]) == (1, 1), (label, report)
        assert report["connection_attempts"] == [], (label, report)
        assert report["forbidden_new"] == [], (label, report)
        assert "dpone.airflow.triggers" in triggers, (label, triggers[-2000:])


def test_a_failed_remote_job_fails_the_task_for_an_operator(
    airflows: dict[str, Airflow], receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A "succeeded" hint does not count: the job failed, so the task fails, nothing promoted."""
    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)
    receiver.set_faults(job_duration_s=0.5, fail_next_jobs=len(airflows))
    ops = {label: _pending(tmp_path / label, receiver.url, f"fails-{label}") for label in airflows}
    time.sleep(1.0)  # both jobs are terminal (failed) now

    def run(af: Airflow) -> dict[str, Any]:
        workload = str(tmp_path / af.label / "orders_rest.yaml")
        return _probe(af, af.home(tmp_path / af.label), "blocked", workload, ops[af.label][0])

    for label, result in both(airflows, run).items():
        op, _ = ops[label]
        message = result.get("failed", "")
        assert message.startswith("DELIVERY_BLOCKED (remote_failed)"), result
        assert f"dpone delivery status --operation-id {op}" in message
        assert "remaining retries are not used" in message
        assert promotions(tmp_path / label, op) == 0


def test_a_password_carrying_journal_in_real_airflow(
    airflows: dict[str, Airflow],
    receiver,
    pg_available: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The conn_id locator through Airflow's own connection lookup; the fail-fast refusal.

    A PostgreSQL journal whose Airflow connection (``AIRFLOW_CONN_DPONE_JOURNAL``) carries
    a canary password: the trigger gets only the connection id, rebuilt from its stored
    row it looks the connection up through Airflow (``BaseHook.get_connection``) and wakes
    on the finished job; the canary is nowhere in its kwargs, event or output. A workload
    file with the password written in its ``journal:`` fails ``execute`` with
    DPONE_CONFIG_INVALID before anything reaches the receiver.
    """

    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)
    receiver.set_faults(job_duration_s=1.0)
    conn = pg_connection(pg_available)
    ops = {
        label: _pg_delivery(
            tmp_path / label,
            receiver.url,
            pg_schema,
            {},
            journal_conn_id=conn.conn_id,
            lookup=lambda conn_id: conn if conn_id == conn.conn_id else None,
        )
        for label in airflows
    }
    refused = tmp_path / "refused"
    workload = rest_workload(refused, receiver.url, name="orders_refused")
    workload.write_text(
        workload.read_text().replace(
            f"journal: sqlite:///{refused / 'journal.db'}",
            f"journal: {_with_password(pg_available, CANARY)}",
        )
    )
    jobs_before = receiver.stats()["jobs_total"]

    def run(af: Airflow) -> tuple[dict[str, Any], dict[str, Any]]:
        op, locator = ops[af.label]
        home = af.home(tmp_path / af.label)
        uri = _with_password(pg_available, CANARY)
        woken = _probe(af, home, "trigger", op, json.dumps(locator), AIRFLOW_CONN_DPONE_JOURNAL=uri)
        return woken, _probe(af, home, "execute", str(workload))

    for label, (woken, stopped) in both(airflows, run).items():
        op, locator = ops[label]
        assert locator == {"kind": "postgresql", "conn_id": "dpone_journal", "schema": pg_schema}
        assert woken["kwargs"]["journal"] == locator
        assert woken["event"] == {
            "operation_id": op,
            "status": "succeeded",
            "polls": woken["event"]["polls"],
        }, (label, woken)
        assert stopped.get("failed", "").startswith("DPONE_CONFIG_INVALID"), (label, stopped)
        assert "journal_conn_id" in stopped["failed"]
        assert CANARY not in json.dumps([woken, stopped])
    assert receiver.stats()["jobs_total"] == jobs_before  # the refused task submitted nothing
    assert CANARY not in _schema_text(pg_available, pg_schema)
