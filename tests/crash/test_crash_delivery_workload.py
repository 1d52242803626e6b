"""SIGKILL of `dpone run` on a REST workload, and of the receiver; reruns finish it once.

Real processes (`python -m dpone run|delivery resume`), the reference receiver in its
own process; every point runs twice: journal, control plane and checkpoint in one SQLite
file (the embedded default), and in one PostgreSQL schema (production). After the
reruns: exactly one remote job per delivery (the receiver's own count), COMPLETE
once, the workload's checkpoint promoted once (one recorded interval, the watermark
at the interval's end), the run ledger COMPLETE with the killed attempts superseded.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore
from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.contracts.delivery import DeliveryState
from dpone.testing.crash import dpone_cmd, run_dpone
from tests.fixtures.receiver import RECEIVER_TOKEN

pytestmark = pytest.mark.crash

KILLED = -9
DAY1 = "2026-11-01T00:00:00Z/2026-11-02T00:00:00Z"
DAY1_US = (1_793_491_200_000_000, 1_793_577_600_000_000)
WORKLOAD = """\
workload: orders
release: "r-{release}"
deployment: crash
journal: "{journal}"
journal_schema: {schema}
source: {{kind: csv, path: orders.csv}}
target:
  kind: rest
  url: "{url}"
  credential: env:DPONE_TEST_RECEIVER_TOKEN
  capacity: 3
  poll_interval_seconds: 0.1
  wait_budget_seconds: 5
  request_timeout_seconds: 0.5
  submit_lease_seconds: 0.8
{extra}incremental: {{start: "2026-11-01T00:00:00Z", max_interval_seconds: 86400}}
"""


def _setup(
    root: Path,
    url: str,
    *,
    extra: str = "",
    journal: str = "sqlite:///journal.db",
    schema: str = "dpone",
) -> Path:
    (root / "orders.csv").write_text(
        "id,amount\n" + "".join(f"{i},{i * 3}.5\n" for i in range(25)), encoding="utf-8"
    )
    path = root / "w.yaml"
    path.write_text(
        WORKLOAD.format(release=root.name, journal=journal, schema=schema, url=url, extra=extra),
        encoding="utf-8",
    )
    return path


def _dpone(root: Path, *args: str, failpoints: str | None = None) -> subprocess.CompletedProcess:
    return run_dpone(
        args,
        cwd=root,
        failpoints=failpoints,
        env={"DPONE_TEST_RECEIVER_TOKEN": RECEIVER_TOKEN},
        timeout=90,
    )


def _run_args(root: Path) -> list[str]:
    return ["run", str(root / "w.yaml"), "--interval", DAY1, "--poll-budget", "15", "--json"]


def _until_completed(root: Path, args: list[str]) -> dict:
    """Rerun without failpoints until the delivery is completed (lease held: wait, again)."""
    for _ in range(12):
        done = _dpone(root, *args)
        if done.returncode == 0:
            body = json.loads(done.stdout)
            if body["outcome"] == "completed":
                assert RECEIVER_TOKEN not in done.stdout + done.stderr
                return body
        else:
            # 5: a dead worker's submit lease has not expired yet; 75: retry later
            assert done.returncode in (5, 75), (done.returncode, done.stdout, done.stderr[-2000:])
        time.sleep(0.3)
    raise AssertionError("the delivery did not complete after 12 reruns")


class _Backend:
    """Where the journal, control plane and checkpoint live: a SQLite file or a PG schema."""

    def __init__(self, root: Path, dsn: str | None = None, schema: str = "dpone") -> None:
        self.root = root
        self.dsn = dsn
        self.schema = schema

    @property
    def journal_url(self) -> str:
        return self.dsn or "sqlite:///journal.db"

    def query(self, sql: str) -> list[tuple]:
        """Rows of ``sql`` (``{p}`` is the table prefix); [] while the tables are absent."""
        if self.dsn is None:
            try:
                with closing(sqlite3.connect(self.root / "journal.db")) as conn:
                    return conn.execute(sql.replace("{p}", "")).fetchall()
            except sqlite3.OperationalError:
                return []  # not created yet
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            try:
                return conn.execute(sql.replace("{p}", f'"{self.schema}".')).fetchall()
            except psycopg.errors.UndefinedTable:
                return []

    def stores(self) -> tuple[Any, Any]:
        """The control plane and the journal, opened on this backend."""
        if self.dsn is None:
            return (
                SqliteDeliveryStore(self.root / "journal.db"),
                SqliteCommitJournal(self.root / "journal.db"),
            )
        from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore
        from dpone.adapters.journal.postgres import PostgresCommitJournal

        return (
            PostgresDeliveryStore(self.dsn, schema=self.schema),
            PostgresCommitJournal(self.dsn, schema=self.schema),
        )


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path) -> _Backend:
    """The SQLite file (embedded default) or a fresh PostgreSQL schema (production)."""
    if request.param == "sqlite":
        return _Backend(tmp_path)
    return _Backend(
        tmp_path,
        request.getfixturevalue("pg_available"),
        request.getfixturevalue("pg_schema"),
    )


def _operation(backend: _Backend) -> str:
    rows = backend.query("SELECT coalesce(parent_id, operation_id) FROM {p}dpone_delivery LIMIT 1")
    assert rows, "nothing was recorded before the kill"
    return str(rows[0][0])


def _intervals(backend: _Backend) -> list[tuple]:
    return backend.query(
        "SELECT operation_id, start_us, end_us, completed_at FROM {p}dpone_checkpoint_intervals"
    )


def _check(backend: _Backend, receiver, op: str, *, killed: bool = True) -> None:
    """One job per delivery, COMPLETE once, capacity free, checkpoint once, ledger COMPLETE."""
    store, journal = backend.stores()
    try:
        record = store.get(op)
        records = [record] if record is not None else store.children(op)
        assert records
        for one in records:
            assert one.state is DeliveryState.COMPLETE
            assert receiver.jobs_created(one.operation_id) == 1
            moves = [h["to_state"] for h in store.history(one.operation_id)]
            assert moves.count("COMPLETE") == 1
            assert store.active_reservations(one.receiver) == 0
        [(promoted_by, start, end, _)] = _intervals(backend)
        assert (promoted_by, start, end) == (op, *DAY1_US)
        [checkpoint] = journal.list_checkpoints()
        assert (checkpoint.watermark, checkpoint.operation_id, checkpoint.pending) == (
            DAY1_US[1],
            op,
            0,
        )
        [run] = journal.list_runs()
        assert (run.operation_id, run.state.value) == (op, "COMPLETE")
        attempts = journal.attempts(run.run_id)
        assert [a.attempt for a in attempts] == list(range(1, len(attempts) + 1))
        assert attempts[-1].state.value == "COMPLETE"
        assert {a.state.value for a in attempts[:-1]} <= {"SUPERSEDED"}
        assert len(attempts) >= (2 if killed else 1)  # a killed attempt is superseded
    finally:
        store.close()
        journal.close()


@pytest.mark.parametrize(
    ("point", "rerun"),
    [
        ("before:delivery.submit", "run"),  # before the submit
        ("after:delivery.submit", "run"),  # 202 answered, the receipt not durable
        ("before:delivery.observe", "resume"),  # during polling
        ("before:delivery.promote", "resume"),  # terminal success durable, no checkpoint
        ("before:delivery.COMPLETE", "run"),  # checkpoint promoted, COMPLETE not written
    ],
)
def test_sigkill_dpone_run_then_rerun(receiver, tmp_path, backend, point, rerun):
    """Killed at POINT, rerun (`dpone run` or `dpone delivery resume`): one job, COMPLETE
    once, the checkpoint promoted once, the run ledger consistent; SQLite and PostgreSQL."""
    receiver.set_faults(job_duration_s=0.3)
    _setup(tmp_path, receiver.url, journal=backend.journal_url, schema=backend.schema)
    killed = _dpone(tmp_path, *_run_args(tmp_path), failpoints=f"{point}=kill")
    assert killed.returncode == KILLED, (killed.stdout, killed.stderr[-2000:])
    op = _operation(backend)
    before = _intervals(backend)
    if point == "before:delivery.COMPLETE":
        assert len(before) == 1  # promoted before the kill; the rerun must not add one
    else:
        assert before == []  # never promoted before verified success
    if rerun == "run":
        body = _until_completed(tmp_path, _run_args(tmp_path))
    else:
        time.sleep(0.3)  # let the job end at the receiver
        body = _until_completed(
            tmp_path,
            [
                "delivery",
                "resume",
                "-w",
                str(tmp_path / "w.yaml"),
                "--operation-id",
                op,
                "--poll-budget",
                "15",
                "--json",
            ],
        )
    assert body["operation_id"] == op
    _check(backend, receiver, op)
    if before:
        assert _intervals(backend) == before  # the repeated absolute write changed nothing
    replay = _dpone(tmp_path, *_run_args(tmp_path))
    assert json.loads(replay.stdout)["replayed"] is True
    _check(backend, receiver, op)


def _setup_split(root: Path, receiver: Any, backend: Any) -> Path:
    """The workload split into children of 10 rows (25 rows: 3 children)."""
    return _setup(
        root,
        receiver.url,
        extra="  rows_per_child: 10\n",
        journal=backend.journal_url,
        schema=backend.schema,
    )


def test_sigkill_inside_a_split_delivery_then_rerun(receiver, tmp_path, backend):
    """Killed at child 1's submit (of 3), rerun: one job per child, one promotion."""
    receiver.set_faults(job_duration_s=0.1)
    _setup_split(tmp_path, receiver, backend)
    killed = _dpone(tmp_path, *_run_args(tmp_path), failpoints="after:delivery.submit=kill@2")
    assert killed.returncode == KILLED, (killed.stdout, killed.stderr[-2000:])
    op = _operation(backend)
    assert _intervals(backend) == []
    body = _until_completed(tmp_path, _run_args(tmp_path))
    assert (body["operation_id"], body["rows"]) == (op, 25)
    rows = backend.query(
        "SELECT payload_rows FROM {p}dpone_delivery WHERE parent_id IS NOT NULL "
        "ORDER BY child_index"
    )
    assert [r[0] for r in rows] == [10, 10, 5]
    _check(backend, receiver, op)


def test_receiver_sigkill_and_restart_while_dpone_run_polls(receiver, tmp_path, backend):
    """The receiver dies mid-job (child 0 of a split delivery) and restarts: the polling
    `dpone run` completes; one remote job per child, one promotion."""
    receiver.set_faults(job_duration_s=0.8)
    _setup_split(tmp_path, receiver, backend)
    env = {**os.environ, "DPONE_TEST_RECEIVER_TOKEN": RECEIVER_TOKEN}
    env.pop("DPONE_FAILPOINTS", None)
    worker = subprocess.Popen(
        dpone_cmd(*_run_args(tmp_path)[:-2], "40", "--json"),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    receipt = None
    while receipt is None and time.monotonic() < deadline:
        time.sleep(0.05)
        rows = backend.query("SELECT receipt FROM {p}dpone_delivery WHERE child_index = 0")
        receipt = rows[0][0] if rows else None
    assert receipt is not None
    receiver.kill()
    time.sleep(0.3)
    receiver.start()
    out, err = worker.communicate(timeout=90)
    assert worker.returncode == 0, (out, err[-2000:])
    body = json.loads(out)
    assert (body["outcome"], body["rows"]) == ("completed", 25)
    _check(backend, receiver, body["operation_id"], killed=False)
