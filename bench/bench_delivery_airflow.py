"""Worker time of a deferred REST delivery in a real Airflow 3.3.2 (scheduler + triggerer).

The issue-8 criterion (scaled from the seed's 30 minutes): for a receiver job of 3
minutes, the worker spends at most 5 s of CPU and of wall time after the initial
submission. ``bench/bench_delivery.py`` measures it with the trigger's part emulated;
this benchmark runs the real thing: api-server, scheduler, dag-processor and triggerer
of Airflow 3.3.2 (LocalExecutor, SQLite metadata, the environment tests/airflow builds)
run one DAG with two ``DponeDeliveryOperator`` tasks side by side against the reference
receiver, each with its own job of ``--job-seconds``:

- ``deferred``: the production shape (``poll_budget_s=0``): submit, defer to
  ``DponeReceiptTrigger`` (``poll_interval_s=10``), ``execute_complete`` when woken;
- ``blocking``: the same operator with ``poll_budget_s`` longer than the job: the
  worker polls the receiver itself every 5 s (the workload's poll interval).

The journal is PostgreSQL (the shared server, a fresh schema per task) reached through
``journal_conn_id``: the Airflow connection carries a password, so the trigger gets the
``conn_id`` locator and the triggerer resolves the connection itself.

How the worker side is measured (all times are ``time.time()`` on this machine):

- The submission instant is the receiver's own ``created_at`` of the job (it is set
  while the submit request is answered), read from the receiver's database.
- Each task process writes marks (pid, parent pid, ``RUSAGE_SELF`` CPU, wall clock) at
  the start and end of ``execute`` / ``execute_complete`` (a subclass in the DAG file).
- A sampler thread reads ``/proc/PID/stat`` of every task process it learns of from the
  marks, every 50 ms: CPU = utime + stime, start = the kernel's start time; a process is
  over when it turns zombie or disappears (end = that sample, at most 50 ms late). The
  CPU at the submission instant is the last sample (or mark) at or before it, so CPU
  after submission is counted from the earliest point known, never too little.
- Worker after submission = the submitting process from the submission instant to its
  exit (it raises TaskDeferred and exits) + every later process of the task (each
  ``execute_complete``) for its whole life, fork to exit (DAG parse and imports
  included). Their parent, the LocalExecutor worker that supervises the task process,
  is reported apart (its CPU while its task process lived), and so is the executor slot
  as Airflow accounts for it: the ``Workload finished ... duration=`` the supervisor
  logs for each task run (fork to exit and clean-up), counted from the submission.
- The triggerer's CPU (every process of its session: the triggerer and its trigger
  runner) is sampled every 0.5 s; reported over the deferral and, for comparison, over
  ``--idle-seconds`` after the run when no trigger is left.

Usage: python bench/bench_delivery_airflow.py [--job-seconds 180]
(run with main's venv and ``PYTHONPATH=$PWD/src``; takes the job's length plus ~1-2 min).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the Airflow test machinery lives in tests/airflow

from tests.airflow.conftest import Airflow, _ensure_venv  # noqa: E402
from tests.airflow.scenarios import metadata  # noqa: E402
from tests.airflow.test_delivery_airflow import _start, _stop  # noqa: E402
from tests.airflow.test_delivery_trigger import INTERVAL, rest_workload  # noqa: E402
from tests.airflow.test_scheduler import _free_port, _wait_for_api  # noqa: E402
from tests.integration.test_delivery import TOKEN_ENV  # noqa: E402

from dpone.testing.rest_receiver import ReceiverProcess  # noqa: E402

VERSION = "3.3.2"
DAG_ID = "dpone_delivery_bench"
TOKEN = "bench-receiver-token"
JOURNAL_PASSWORD = "bench-journal-password-5c1d"
CLK = os.sysconf("SC_CLK_TCK")

DAG_FILE = """
import json, os, resource, time
from datetime import datetime, timezone
from pathlib import Path

from dpone.airflow.compat import DAG
from dpone.airflow.delivery import DponeDeliveryOperator

MARKS = Path({marks!r})


def _mark(task, event):
    ru = resource.getrusage(resource.RUSAGE_SELF)
    record = {{"task": task, "event": event, "pid": os.getpid(), "ppid": os.getppid(),
              "wall": time.time(), "cpu": ru.ru_utime + ru.ru_stime}}
    with (MARKS / f"{{os.getpid()}}.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\\n")


class Measured(DponeDeliveryOperator):
    def execute(self, context):
        _mark(self.task_id, "execute_start")
        try:
            return super().execute(context)
        finally:
            _mark(self.task_id, "execute_end")

    def execute_complete(self, context, event=None, operation_id=None):
        _mark(self.task_id, "complete_start")
        try:
            return super().execute_complete(context, event, operation_id)
        finally:
            _mark(self.task_id, "complete_end")


with DAG("{dag_id}", schedule="@once", catchup=False,
         start_date=datetime(2026, 11, 1, tzinfo=timezone.utc)):
    Measured(task_id="deferred", workload={deferred!r}, interval={interval!r},
             journal_conn_id="dpone_journal", poll_budget_s=0.0, poll_interval_s=10.0,
             lease_s=60.0)
    Measured(task_id="blocking", workload={blocking!r}, interval={interval!r},
             journal_conn_id="dpone_journal", poll_budget_s={budget})
"""


# ------------------------------------------------------------------ /proc sampling
def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


BOOT = _boot_time()


def _stat(pid: int) -> tuple[str, int, int, float, float] | None:
    """(state, ppid, session id, CPU seconds, start time) of ``pid``, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    cpu = (int(rest[11]) + int(rest[12])) / CLK
    return rest[0], int(rest[1]), int(rest[3]), cpu, BOOT + int(rest[19]) / CLK


@dataclass
class Tracked:
    """One process's CPU over time, as far as the sampler (and the marks) saw it."""

    pid: int
    start: float = 0.0
    end: float | None = None
    points: list[tuple[float, float]] = field(default_factory=list)  # (wall, cpu)

    def cpu_at(self, when: float) -> float:
        """The CPU used by ``when``, as the latest point at or before it (0 before any)."""
        known = [cpu for t, cpu in self.points if t <= when]
        return max(known) if known else 0.0

    @property
    def cpu_final(self) -> float:
        return max(cpu for _, cpu in self.points) if self.points else 0.0


class Sampler(threading.Thread):
    """Samples task processes (found through the marks) and the triggerer's session."""

    def __init__(self, marks: Path) -> None:
        super().__init__(daemon=True)
        self.marks_dir = marks
        self.procs: dict[int, Tracked] = {}
        self.marks: list[dict[str, Any]] = []
        self.triggerer_sid: int | None = None
        self.scheduler_sid: int | None = None
        self.triggerer: list[tuple[float, float]] = []
        self._seen_lines: dict[Path, int] = {}
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def _read_marks(self) -> None:
        for path in self.marks_dir.glob("*.jsonl"):
            lines = path.read_text().splitlines()
            done = self._seen_lines.get(path, 0)
            for line in lines[done:]:
                if not line.endswith("}"):
                    break
                mark = json.loads(line)
                self.marks.append(mark)
                done += 1
                for pid in (mark["pid"], mark["ppid"]):
                    self.procs.setdefault(pid, Tracked(pid))
                self.procs[mark["pid"]].points.append((mark["wall"], mark["cpu"]))
            self._seen_lines[path] = done

    def _sample_procs(self) -> None:
        now = time.time()
        for proc in self.procs.values():
            if proc.end is not None:
                continue
            stat = _stat(proc.pid)
            if stat is None:
                proc.end = now
                continue
            state, _ppid, _sid, cpu, start = stat
            proc.start = start
            proc.points.append((now, cpu))
            if state in ("Z", "X"):
                proc.end = now

    def _scan_sessions(self) -> None:
        """Sum the triggerer session's CPU; track every new process of the scheduler's.

        The scheduler's session holds its LocalExecutor workers (each supervises one task
        process at a time) and their task processes: tracking them from birth gives the
        supervisors' CPU before their task process started.
        """
        total = 0.0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _stat(pid)
            if stat is None:
                continue
            if stat[2] == self.triggerer_sid:
                total += stat[3]
            elif stat[2] == self.scheduler_sid and pid not in self.procs:
                self.procs[pid] = Tracked(pid)
        if self.triggerer_sid is not None:
            self.triggerer.append((time.time(), total))

    def run(self) -> None:
        tick = 0
        while not self._stop_event.is_set():
            self._read_marks()
            self._sample_procs()
            if tick % 10 == 0:
                self._scan_sessions()
            tick += 1
            time.sleep(0.05)

    def triggerer_cpu(self, start: float, end: float) -> tuple[float, float]:
        """(CPU seconds, seconds sampled) of the triggerer between ``start`` and ``end``."""
        inside = [(t, cpu) for t, cpu in self.triggerer if start <= t <= end]
        if len(inside) < 2:
            return float("nan"), 0.0
        return inside[-1][1] - inside[0][1], inside[-1][0] - inside[0][0]


# ------------------------------------------------------------------ the run
def _pg_dsn() -> str:
    return os.environ.get("DPONE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def _with_password(dsn: str, password: str) -> str:
    parts = urlsplit(dsn)
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{parts.username}:{password}@{parts.hostname}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _workload(folder: Path, receiver_url: str, name: str, schema: str) -> Path:
    """A REST workload (10,000 rows) whose journal comes from ``journal_conn_id``."""
    path = rest_workload(folder, receiver_url, rows=10_000, name=name)
    text = path.read_text().replace(f"journal: sqlite:///{folder / 'journal.db'}\n", "")
    text = text.replace("poll_interval_seconds: 1.0", "poll_interval_seconds: 5.0")
    path.write_text(text + f"journal_schema: {schema}\n")
    return path


def _states(home: Path) -> dict[str, str | None] | None:
    try:
        with metadata(home) as db:
            tis = db.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ?", (DAG_ID,)
            ).fetchall()
            runs = db.execute("SELECT state FROM dag_run WHERE dag_id = ?", (DAG_ID,)).fetchall()
            errors = db.execute("SELECT COUNT(*) FROM import_error").fetchone()[0]
    except Exception:
        return None
    out: dict[str, str | None] = dict(tis)
    out["dag_run"] = runs[0][0] if runs else None
    if errors:
        out["import_error"] = "import_error"
    return out


def _receiver_jobs(db: Path) -> dict[str, tuple[float, float]]:
    """Idempotency key -> (created_at, the job's scheduled end) from the receiver's store."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, created_at, created_at + accept_phase_s + duration_s FROM jobs"
        ).fetchall()
    return {str(key): (float(created), float(end)) for key, created, end in rows}


def _xcoms(home: Path) -> dict[str, dict[str, Any]]:
    with metadata(home) as db:
        rows = db.execute(
            "SELECT task_id, value FROM xcom WHERE dag_id = ? AND key = 'return_value'", (DAG_ID,)
        ).fetchall()
    out = {}
    for task_id, value in rows:
        text = value.decode() if isinstance(value, bytes) else value
        loaded = json.loads(text)
        out[str(task_id)] = json.loads(loaded) if isinstance(loaded, str) else loaded
    return out


def _prepare_airflow(work: Path) -> tuple[Airflow, Path]:
    venv = _ensure_venv(VERSION)
    home = work / "airflow-home"
    home.mkdir()
    airflow = Airflow(label="3.3", version=VERSION, venv=venv, template_home=home)
    done = airflow.run(["airflow", "db", "migrate"], airflow.env(home, work / "no-dags"))
    if done.returncode != 0:
        raise SystemExit(f"airflow db migrate failed:\n{done.stdout[-2000:]}")
    return airflow, home


def run(
    job_seconds: float, work: Path, idle_seconds: float, extra_env: dict[str, str]
) -> dict[str, Any]:
    import psycopg

    # one journal schema per task: two first uses of one fresh schema at the same moment
    # race in creating the checkpoint tables (see docs/benchmarks.md)
    base = f"bench_af_{uuid.uuid4().hex[:10]}"
    schemas = {"deferred": base + "_d", "blocking": base + "_b"}
    dsn = _pg_dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f'CREATE SCHEMA "{schema}"')
    marks = work / "marks"
    marks.mkdir()
    airflow, home = _prepare_airflow(work)
    sampler = Sampler(marks)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with ReceiverProcess(work / "rx", token=TOKEN) as rx:
            rx.set_faults(job_duration_s=job_seconds)
            deferred = _workload(work / "deferred", rx.url, "orders_deferred", schemas["deferred"])
            blocking = _workload(work / "blocking", rx.url, "orders_blocking", schemas["blocking"])
            dags = work / "dags"
            dags.mkdir()
            (dags / "bench.py").write_text(
                DAG_FILE.format(
                    marks=str(marks),
                    dag_id=DAG_ID,
                    deferred=str(deferred),
                    blocking=str(blocking),
                    interval=INTERVAL,
                    budget=job_seconds + 120,
                )
            )
            port = _free_port()
            env = airflow.env(
                home,
                dags,
                **{TOKEN_ENV: TOKEN},
                AIRFLOW_CONN_DPONE_JOURNAL=_with_password(dsn, JOURNAL_PASSWORD),
                AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
                AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
                AIRFLOW__CORE__PARALLELISM="2",
                AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(_free_port()),
                AIRFLOW__CORE__EXECUTOR="LocalExecutor",
                AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
                AIRFLOW__API__PORT=str(port),
                AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="60",
                AIRFLOW__WORKERS__EXECUTION_API_RETRIES="10",
            )
            env.update(extra_env)
            procs.append(
                _start(
                    airflow, ["airflow", "api-server", "--port", str(port)], env, work / "api.log"
                )
            )
            procs.append(_start(airflow, ["airflow", "dag-processor"], env, work / "dagproc.log"))
            _wait_for_api(port)
            scheduler = _start(airflow, ["airflow", "scheduler"], env, work / "scheduler.log")
            procs.append(scheduler)
            sampler.scheduler_sid = scheduler.pid
            triggerer = _start(airflow, ["airflow", "triggerer"], env, work / "triggerer.log")
            procs.append(triggerer)
            sampler.triggerer_sid = triggerer.pid  # start_new_session: sid == pid
            sampler.start()
            timeline: list[tuple[float, dict[str, str | None]]] = []
            started = time.monotonic()
            states: dict[str, str | None] | None = None
            while time.monotonic() - started < job_seconds + 600:
                states = _states(home)
                if states:
                    if not timeline or timeline[-1][1] != states:
                        timeline.append((time.time(), states))
                    if "import_error" in states or states.get("dag_run") in ("success", "failed"):
                        break
                time.sleep(0.5)
            # the last task process exits after its state is written; then the triggerer
            # runs no trigger: its idle rate, for comparison with the deferral
            time.sleep(1.0)
            idle_from = time.time()
            time.sleep(idle_seconds)
            sampler.stop()
            idle_to = time.time()
            jobs = _receiver_jobs(rx.db_path)
    finally:
        for proc in procs:
            _stop(proc)
        if sampler.is_alive():
            sampler.stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for schema in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if not states or states.get("dag_run") != "success":
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in work.glob("*.log")
        )
        raise SystemExit(f"the DAG run did not succeed: {states}\n{logs}")
    figures = _figures(job_seconds, home, work, sampler, timeline, jobs)
    idle, span = sampler.triggerer_cpu(idle_from, idle_to)
    figures.setdefault("triggerer", {})["idle_cpu_per_minute_after_s"] = round(
        idle / max(span, 1e-9) * 60, 2
    )
    return figures


def _figures(
    job_seconds: float,
    home: Path,
    work: Path,
    sampler: Sampler,
    timeline: list[tuple[float, dict[str, str | None]]],
    jobs: dict[str, tuple[float, float]],
) -> dict[str, Any]:
    xcoms = _xcoms(home)
    with metadata(home) as db:
        ti_ids = dict(
            db.execute("SELECT task_id, id FROM task_instance WHERE dag_id = ?", (DAG_ID,))
        )
    workloads = _supervised(work / "scheduler.log")
    leaks = [
        str(p)
        for p in [*home.glob("logs/**/*.log"), *work.glob("*.log")]
        if JOURNAL_PASSWORD in p.read_text(errors="replace")
    ]
    out: dict[str, Any] = {"job_seconds": job_seconds, "password_in_logs": leaks}
    for task in ("deferred", "blocking"):
        summary = xcoms[task]
        assert summary["state"] == "COMPLETE", summary
        op = str(summary["operation_id"])
        submitted, job_end = jobs[op]
        pids = []
        for mark in sampler.marks:
            if mark["task"] == task and mark["pid"] not in pids:
                pids.append(mark["pid"])
        rows = []
        wall = cpu = supervisor_cpu = 0.0
        for pid in pids:
            proc = sampler.procs[pid]
            events = [m["event"] for m in sampler.marks if m["pid"] == pid]
            end = proc.end if proc.end is not None else float("nan")
            since = max(submitted, proc.start)  # the whole process if it started later
            # a process started after the submission counts whole; the submitting one from
            # the last point known at or before the submission (0 if none: all of it)
            used = proc.cpu_final - (proc.cpu_at(submitted) if proc.start <= submitted else 0.0)
            parent_pid = next(m["ppid"] for m in sampler.marks if m["pid"] == pid)
            parent = sampler.procs[parent_pid]
            base = parent.cpu_at(proc.start) or (parent.points[0][1] if parent.points else 0.0)
            parent_used = parent.cpu_at(end) - base
            rows.append(
                {
                    "pid": pid,
                    "events": events,
                    "started_after_submit_s": round(proc.start - submitted, 2),
                    "wall_after_submit_s": round(end - since, 3),
                    "cpu_after_submit_s": round(used, 3),
                    "whole_process_cpu_s": round(proc.cpu_final, 3),
                    "supervisor_cpu_s": round(parent_used, 3),
                }
            )
            wall += end - since
            cpu += used
            supervisor_cpu += parent_used
        states = [(t - submitted, s.get(task)) for t, s in timeline]
        slots = [w for w in workloads if w["ti_id"] == str(ti_ids[task]).replace("-", "")]
        slot_after = sum(w["end"] - max(submitted, w["end"] - w["duration"]) for w in slots)
        out[task] = {
            "executor_slot_after_submit_s": round(slot_after, 3),
            "supervised_workloads": [
                {
                    "final_state": w["final_state"],
                    "duration_s": round(w["duration"], 3),
                    "ended_after_submit_s": round(w["end"] - submitted, 2),
                }
                for w in slots
            ],
            "operation_id": op,
            "processes": rows,
            "worker_wall_after_submit_s": round(wall, 3),
            "worker_cpu_after_submit_s": round(cpu, 3),
            "supervisor_cpu_s": round(supervisor_cpu, 3),
            "job_end_after_submit_s": round(job_end - submitted, 1),
            "success_after_job_end_s": round(
                next(t for t, s in states if s == "success") + submitted - job_end, 1
            ),
            "states_after_submit": _transitions(states),
        }
        if task == "deferred":
            deferred_at = next((t for t, s in states if s == "deferred"), None)
            resumed = [m["wall"] for m in sampler.marks if m["event"] == "complete_start"]
            if deferred_at is not None and resumed:
                start, stop = submitted + deferred_at, min(resumed)
                trig, span = sampler.triggerer_cpu(start, stop)
                out["triggerer"] = {
                    "deferral_s": round(stop - start, 1),
                    "cpu_during_deferral_s": round(trig, 2),
                    "cpu_per_minute_during_deferral_s": round(trig / max(span, 1e-9) * 60, 2),
                }
    return out


_FINISHED = re.compile(
    r"^(\S+Z) .*Workload finished.*?duration=([0-9.]+).*?final_state=(\w+).*?workload_id=(\S+)"
)


def _supervised(log: Path) -> list[dict[str, Any]]:
    """Airflow's own account of each supervised task run: its duration and end.

    The LocalExecutor worker logs ``Workload finished`` with the wall time it spent
    supervising one task run (fork to exit and clean-up): the time its slot was taken.
    """
    out = []
    for line in log.read_text(errors="replace").splitlines():
        found = _FINISHED.search(line)
        if found:
            stamp, duration, state, ti_id = found.groups()
            end = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            out.append(
                {
                    "end": end,
                    "duration": float(duration),
                    "final_state": state,
                    "ti_id": ti_id.replace("-", ""),  # SQLite keeps UUIDs without dashes
                }
            )
    return out


def _transitions(states: list[tuple[float, str | None]]) -> list[str]:
    out: list[str] = []
    last = None
    for t, state in states:
        if state != last:
            out.append(f"{t:+.1f}s {state}")
            last = state
    return out


def _print_table(figures: dict[str, Any]) -> None:
    d, b = figures["deferred"], figures["blocking"]
    print(f"\njob: {figures['job_seconds']:.0f} s at the receiver, Airflow {VERSION}")
    print(f"{'after the submission':<44}{'deferred':>12}{'blocking':>12}")
    for key, label in (
        ("worker_wall_after_submit_s", "task process wall (s)"),
        ("worker_cpu_after_submit_s", "task process CPU (s)"),
        ("supervisor_cpu_s", "supervising executor worker CPU (s)"),
        ("executor_slot_after_submit_s", "executor slot taken, Airflow's account (s)"),
        ("success_after_job_end_s", "task success after the job ended (s)"),
    ):
        print(f"{label:<44}{d[key]:>12}{b[key]:>12}")
    if "triggerer" in figures:
        t = figures["triggerer"]
        print(
            f"triggerer: {t['cpu_during_deferral_s']} s CPU over a {t['deferral_s']} s deferral "
            f"({t['cpu_per_minute_during_deferral_s']} s/min; with no trigger afterwards: "
            f"{t['idle_cpu_per_minute_after_s']} s/min)"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-seconds", type=float, default=180.0)
    parser.add_argument(
        "--idle-seconds", type=float, default=30.0, help="triggerer idle sampling afterwards"
    )
    parser.add_argument(
        "--airflow-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Airflow setting, e.g. AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=1",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-delivery-airflow-"))
    try:
        extra = dict(item.split("=", 1) for item in args.airflow_env)
        figures = run(args.job_seconds, work, args.idle_seconds, extra)
        figures["airflow_env"] = extra
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    figures["load_average_at_end"] = os.getloadavg()
    print(json.dumps(figures, indent=2))
    _print_table(figures)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
