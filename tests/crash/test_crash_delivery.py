"""SIGKILL of delivery workers at every delivery failpoint; 8 processes against a limit of 3."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore
from dpone.contracts.delivery import DeliveryState
from dpone.runtime.failpoints import DELIVERY_FAILPOINT_NAMES
from dpone.testing.crash import dpone_cmd
from dpone.testing.rest_receiver import ReceiverProcess
from tests.fixtures.receiver import RECEIVER_TOKEN

pytestmark = pytest.mark.crash

WORKER = Path(__file__).with_name("_delivery_worker.py")


def _env(failpoints: str | None = None, schema: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_FAILPOINTS"}
    env["DPONE_TEST_DELIVERY_TOKEN"] = RECEIVER_TOKEN
    if schema:
        env["DPONE_TEST_DELIVERY_SCHEMA"] = schema
    if failpoints:
        env["DPONE_FAILPOINTS"] = failpoints
    return env


def _op() -> str:
    return "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def _argv(
    tmp: Path, url: str, op: str, *, limit=3, poll=5.0, wait=5.0, journal: str | None = None
) -> list[str]:
    payload = tmp / "payload.jsonl"
    if not payload.exists():
        payload.write_text("".join(f'{{"id": {i}}}\n' for i in range(50)))
    return [
        sys.executable,
        str(WORKER),
        journal or str(tmp / "journal.sqlite"),
        url,
        str(payload),
        op,
        str(limit),
        str(poll),
        str(wait),
        str(tmp / f"checkpoint-{op[7:15]}"),
    ]


def _run(
    argv: list[str], failpoints: str | None = None, schema: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=_env(failpoints, schema), capture_output=True, text=True, timeout=60, check=False
    )


def _run_until_done(argv: list[str], schema: str | None = None) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 30
    while True:
        done = _run(argv, schema=schema)
        if done.returncode not in (5, 10, 75) or time.monotonic() > deadline:
            return done
        time.sleep(0.2)  # a dead worker's submit lease (0.3 s) must expire first


@pytest.mark.parametrize("point", DELIVERY_FAILPOINT_NAMES)
def test_sigkill_at_every_delivery_point_then_rerun(receiver, tmp_path, point):
    """Killed at POINT, rerun: exactly one remote job, COMPLETE once, checkpoint written."""
    receiver.set_faults(job_duration_s=0.3)
    op = _op()
    argv = _argv(tmp_path, receiver.url, op)
    killed = _run(argv, failpoints=f"{point}=kill")
    assert killed.returncode == -9, killed.stderr[-2000:]
    done = _run_until_done(argv)
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    assert receiver.jobs_created(op) == 1
    store = SqliteDeliveryStore(tmp_path / "journal.sqlite")
    try:
        record = store.get(op)
        assert record.state is DeliveryState.COMPLETE
        states = [h["to_state"] for h in store.history(op)]
        assert states.count("COMPLETE") == 1
        assert store.active_reservations(record.receiver) == 0
    finally:
        store.close()
    checkpoint = tmp_path / f"checkpoint-{op[7:15]}"
    assert checkpoint.read_text().strip() == record.payload.digest


# On PostgreSQL: the riskiest point (202 answered, receipt not durable) and the two
# points the workload matrix (test_crash_delivery_workload.py, which runs on PostgreSQL
# too) does not reach; together every delivery failpoint runs on PostgreSQL.
@pytest.mark.parametrize(
    "point", ["after:delivery.SUBMITTING", "after:delivery.submit", "after:delivery.ACCEPTED"]
)
def test_sigkill_on_the_postgres_control_plane_then_rerun(
    receiver, tmp_path, point, pg_available, pg_schema
):
    """Killed at POINT on the PostgreSQL control plane, rerun: one job, COMPLETE once,
    the slot released, the checkpoint written."""
    from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

    receiver.set_faults(job_duration_s=0.2)
    op = _op()
    argv = _argv(tmp_path, receiver.url, op, journal=pg_available)
    killed = _run(argv, failpoints=f"{point}=kill", schema=pg_schema)
    assert killed.returncode == -9, killed.stderr[-2000:]
    done = _run_until_done(argv, schema=pg_schema)
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    assert receiver.jobs_created(op) == 1
    store = PostgresDeliveryStore(pg_available, schema=pg_schema)
    try:
        record = store.get(op)
        assert record.state is DeliveryState.COMPLETE
        assert [h["to_state"] for h in store.history(op)].count("COMPLETE") == 1
        assert store.active_reservations(record.receiver) == 0
    finally:
        store.close()
    checkpoint = tmp_path / f"checkpoint-{op[7:15]}"
    assert checkpoint.read_text().strip() == record.payload.digest


def test_receiver_sigkill_while_a_worker_polls(receiver, tmp_path):
    """The receiver dies and restarts mid-job: the polling worker completes, one job."""
    receiver.set_faults(job_duration_s=1.0)
    op = _op()
    worker = subprocess.Popen(
        _argv(tmp_path, receiver.url, op, poll=30.0),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while receiver.jobs_created(op) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    receiver.kill()
    time.sleep(0.3)
    receiver.start()
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, (out, err[-2000:])
    assert receiver.jobs_created(op) == 1


# one point per parent (the single-delivery matrix covers the others; test budget)
@pytest.mark.parametrize("point", ["after:delivery.submit@2"])
def test_sigkill_inside_a_split_delivery_then_rerun(receiver, tmp_path, point):
    """Killed around child 1 of 3, rerun: one remote job per child, all COMPLETE once."""
    receiver.set_faults(job_duration_s=0.1)
    parent = _op()
    argv = [*_argv(tmp_path, receiver.url, parent), "20"]  # 50 rows -> children of 20, 20, 10
    killed = _run(argv, failpoints=point.replace("@", "=kill@"))
    assert killed.returncode == -9, (killed.stdout, killed.stderr[-2000:])
    done = _run_until_done(argv)
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    store = SqliteDeliveryStore(tmp_path / "journal.sqlite")
    try:
        children = store.children(parent)
        assert [c.payload.rows for c in children] == [20, 20, 10]
        for child in children:
            assert child.state is DeliveryState.COMPLETE
            assert receiver.jobs_created(child.operation_id) == 1
            assert [h["to_state"] for h in store.history(child.operation_id)].count("COMPLETE") == 1
    finally:
        store.close()


def test_cli_status_reconcile_resume_after_a_kill_before_the_receipt(receiver, tmp_path):
    """After a kill between the 202 and the durable receipt the CLI reconciles by key."""
    op = _op()
    argv = _argv(tmp_path, receiver.url, op)
    assert _run(argv, failpoints="after:delivery.submit=kill").returncode == -9
    journal = f"sqlite:///{tmp_path / 'journal.sqlite'}"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            dpone_cmd("delivery", *args, "--operation-id", op, "--journal", journal, "--json"),
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )

    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "SUBMITTING"
    time.sleep(0.35)  # the dead worker's submit lease expires
    reconciled = cli("reconcile")
    assert reconciled.returncode == 0, reconciled.stderr
    body = json.loads(reconciled.stdout)
    assert body["receipt"] is not None
    assert body["state"] in ("ACCEPTED", "REMOTE_SUCCEEDED")
    resumed = cli("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["outcome"] == "completed"
    assert receiver.jobs_created(op) == 1
    assert RECEIVER_TOKEN not in status.stdout + reconciled.stdout + resumed.stdout


def test_cli_reconcile_without_key_lookup_blocks(receiver, tmp_path):
    """No key lookup: blocked (exit 3), slot held; an authorized operator releases it."""
    receiver.set_faults(drop_response_after_accept=1, key_lookup=False)
    op = _op()
    done = _run(_argv(tmp_path, receiver.url, op))
    assert done.returncode == 3, done.stdout + done.stderr
    status = subprocess.run(
        dpone_cmd(
            "delivery",
            "status",
            "--operation-id",
            op,
            "--json",
            "--journal",
            f"sqlite:///{tmp_path / 'journal.sqlite'}",
        ),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    body = json.loads(status.stdout)
    assert body["state"] == "BLOCKED"
    assert body["block_reason"] == "key_lookup_unsupported"
    assert body["capacity_held_at_receiver"] == 1
    assert receiver.jobs_created(op) == 1
    release = [
        *dpone_cmd("delivery", "release-capacity", "--operation-id", op, "--json"),
        *("--journal", f"sqlite:///{tmp_path / 'journal.sqlite'}"),
        *("--expected-version", str(body["version"]), "--reason", "checked at the receiver"),
    ]
    env = {**_env(), "DPONE_PRINCIPAL": "ops-anna"}
    refused = subprocess.run(release, env=env, capture_output=True, text=True, check=False)
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["error"]["code"] == "DPONE_RECOVERY_UNAUTHORIZED"
    env["DPONE_DELIVERY_OPERATORS"] = "ops-anna"
    applied = subprocess.run(release, env=env, capture_output=True, text=True, check=False)
    assert applied.returncode == 0, applied.stderr
    after = json.loads(applied.stdout)
    assert after["capacity_held_at_receiver"] == 0
    assert after["audit"][0]["principal"] == "ops-anna"


def _max_overlap(rows: list[tuple[float, float | None]]) -> int:
    """The most reservations ever held at once, from (reserved_at, released_at) rows."""
    events = sorted([(r, 1) for r, _ in rows] + [(e, -1) for _, e in rows if e is not None])
    level = peak = 0
    for _, delta in events:  # a release at the same instant sorts before a reservation
        level += delta
        peak = max(peak, level)
    return peak


_RESERVATIONS = "SELECT reserved_at, released_at FROM {p}dpone_delivery_reservations"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_eight_processes_never_exceed_a_capacity_of_three(tmp_path, request, backend):
    """8 worker processes, limit 3: at most 3 jobs active at the receiver and in the store
    (the SQLite file, and the PostgreSQL control plane)."""
    schema = journal = None
    if backend == "postgres":
        journal = request.getfixturevalue("pg_available")
        schema = request.getfixturevalue("pg_schema")
    with ReceiverProcess(tmp_path / "rx", token=RECEIVER_TOKEN) as rx:
        rx.set_faults(job_duration_s=1.0)
        ops = [_op() for _ in range(8)]
        procs = [
            subprocess.Popen(
                _argv(tmp_path, rx.url, op, limit=3, poll=40.0, wait=40.0, journal=journal),
                env=_env(schema=schema),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for op in ops
        ]
        outputs = [p.communicate(timeout=90) for p in procs]
        codes = [p.returncode for p in procs]
        assert codes == [0] * 8, outputs
        stats = rx.stats()
        assert all(stats["jobs_by_key"][op] == 1 for op in ops)
        assert stats["counters"]["max_active"] <= 3
    if journal is None:
        with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
            rows = conn.execute(_RESERVATIONS.replace("{p}", "")).fetchall()
    else:
        import psycopg

        with psycopg.connect(journal) as conn:
            rows = conn.execute(_RESERVATIONS.replace("{p}", f'"{schema}".')).fetchall()
    assert len(rows) >= 8
    assert _max_overlap(rows) == 3  # the limit was reached, and never exceeded
