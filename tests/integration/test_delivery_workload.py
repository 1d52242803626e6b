"""Workloads with ``target.kind: rest``: the reference receiver, real SQLite and PostgreSQL.

The source is materialized into the staged payload, the delivery runs through the
control plane, and the workload's checkpoint is promoted once, only after the
control plane holds verified remote success.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path

import pytest

from dpone.api import Runner
from dpone.config.workload import load_workload
from dpone.contracts.delivery import (
    DeliveryBlocked,
    DeliveryCompleted,
    DeliveryPending,
    DeliveryState,
)
from dpone.contracts.identity import derive_operation_id, parse_interval
from dpone.contracts.run import AirflowProvenance
from dpone.errors import ConfigInvalid, IntentConflict, ReceiverUnavailable, RecoveryRefused
from dpone.testing.crash import run_dpone
from tests.fixtures.receiver import RECEIVER_TOKEN

DAY1 = "2026-11-01T00:00:00Z/2026-11-02T00:00:00Z"
DAY2 = "2026-11-02T00:00:00Z/2026-11-03T00:00:00Z"
DAY3_START_US = 1_793_664_000_000_000  # 2026-11-03T00:00:00Z
DAY2_START_US = 1_793_577_600_000_000  # 2026-11-02T00:00:00Z


@pytest.fixture(autouse=True)
def _token(monkeypatch):
    monkeypatch.setenv("DPONE_TEST_RECEIVER_TOKEN", RECEIVER_TOKEN)


def _workload(root: Path, url: str, *, extra: str = "", journal: str = "sqlite:///journal.db"):
    (root / "orders.csv").write_text(
        "id,name\n" + "".join(f"{i},name-{i}\n" for i in range(25)), encoding="utf-8"
    )
    path = root / "w.yaml"  # the release differs per test: the receiver is shared
    path.write_text(
        f"""\
workload: orders
release: "r-{root.name}"
deployment: test
journal: "{journal}"
source: {{kind: csv, path: orders.csv}}
target:
  kind: rest
  url: "{url}"
  credential: env:DPONE_TEST_RECEIVER_TOKEN
  capacity: 2
  poll_interval_seconds: 0.1
  request_timeout_seconds: 5
  submit_lease_seconds: 10
{extra}incremental: {{start: "2026-11-01T00:00:00Z", max_interval_seconds: 86400}}
""",
        encoding="utf-8",
    )
    return path


def _checkpoint(journal: Path) -> tuple[int, int, list[tuple]]:
    with closing(sqlite3.connect(journal)) as conn:
        (watermark,) = conn.execute("SELECT watermark_us FROM dpone_checkpoints").fetchone()
        pending = conn.execute(
            "SELECT count(*) FROM dpone_checkpoint_intervals i JOIN dpone_checkpoints c "
            "USING (stream_id) WHERE i.start_us > c.watermark_us"
        ).fetchone()[0]
        rows = conn.execute(
            "SELECT operation_id, start_us, end_us, completed_at FROM dpone_checkpoint_intervals "
            "ORDER BY start_us"
        ).fetchall()
    return watermark, pending, rows


def _dpone(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dpone ARGS`` in a real process, with the receiver's token in its environment."""
    return run_dpone(args, cwd=cwd, env={"DPONE_TEST_RECEIVER_TOKEN": RECEIVER_TOKEN}, timeout=60)


def test_deliver_pending_then_resume_promotes_the_checkpoint_once(receiver, tmp_path):
    """Pending -> resume -> Completed; checkpoint at the interval end, one interval row;
    replays return Completed again, no second job, no second promotion; run ledger."""
    receiver.set_faults(job_duration_s=0.3)
    with Runner(_workload(tmp_path, receiver.url)) as runner:
        first = runner.deliver(interval=DAY1)
        assert isinstance(first, DeliveryPending)
        op = first.operation_id
        # the same identity builder as relational runs; the receiver URL is the target
        assert op == derive_operation_id(
            release_id=f"r-{tmp_path.name}",
            deployment_id="test",
            dag_id="-",
            dag_run_logical_identity="-",
            workload_id="orders",
            mapped_partition_identity="-",
            canonical_interval=parse_interval(DAY1),
            canonical_target_identity=f"rest:{receiver.url}",
        )
        # not promoted while the job is pending
        with closing(sqlite3.connect(tmp_path / "journal.db")) as conn:
            assert conn.execute("SELECT count(*) FROM dpone_checkpoint_intervals").fetchone() == (
                0,
            )
        done = runner.resume_delivery(op, poll_budget_s=10)
        assert isinstance(done, DeliveryCompleted)
        assert (done.rows, done.replayed) == (25, False)
        watermark, pending, rows = _checkpoint(tmp_path / "journal.db")
        assert (watermark, pending) == (DAY2_START_US, 0)
        assert [r[:3] for r in rows] == [(op, DAY2_START_US - 86_400_000_000, DAY2_START_US)]
        again = runner.resume_delivery(op)
        replay = runner.deliver(interval=DAY1)
        assert isinstance(again, DeliveryCompleted)
        assert again.replayed
        assert isinstance(replay, DeliveryCompleted)
        assert (replay.operation_id, replay.replayed) == (op, True)
        assert _checkpoint(tmp_path / "journal.db")[2] == rows  # same row, same time
        ledger = runner._rest.journal  # the journal keeps the run ledger
        [run] = ledger.list_runs()
        assert (run.operation_id, run.state.value) == (op, "COMPLETE")
        attempts = ledger.attempts(run.run_id)
        assert [a.state.value for a in attempts] == ["SUPERSEDED", "COMPLETE"]
        # no provenance given: deliver and resume_delivery record an API caller
        assert [a.provenance["kind"] for a in attempts] == ["api", "api"]
        record = runner._rest.service.store.get(op)
        assert record.state is DeliveryState.COMPLETE
        assert [h["to_state"] for h in runner._rest.service.store.history(op)].count(
            "COMPLETE"
        ) == 1
    assert receiver.jobs_created(op) == 1


def test_resume_delivery_records_the_airflow_try_of_each_attempt(receiver, tmp_path):
    """deliver (try 1) -> pending; resume_delivery(provenance=try 2) -> pending; try 3
    -> completed: the run ledger's attempts carry tries 1, 2, 3, not an API caller."""
    receiver.set_faults(job_duration_s=0.8)

    def try_(number: int) -> AirflowProvenance:
        return AirflowProvenance(
            dag_id="orders_dag", run_id="scheduled__1", task_id="deliver", try_number=number
        )

    with Runner(_workload(tmp_path, receiver.url)) as runner:
        first = runner.deliver(interval=DAY1, provenance=try_(1))
        assert isinstance(first, DeliveryPending)
        op = first.operation_id
        second = runner.resume_delivery(op, poll_budget_s=0.0, provenance=try_(2))
        assert isinstance(second, DeliveryPending)
        third = runner.resume_delivery(op, poll_budget_s=10, provenance=try_(3))
        assert isinstance(third, DeliveryCompleted)
        ledger = runner._rest.journal
        [run] = ledger.list_runs()
        attempts = ledger.attempts(run.run_id)
        assert [a.state.value for a in attempts] == ["SUPERSEDED", "SUPERSEDED", "COMPLETE"]
        assert [(a.provenance["kind"], a.provenance["try_number"]) for a in attempts] == [
            ("airflow", 1),
            ("airflow", 2),
            ("airflow", 3),
        ]
        assert {a.provenance["task_id"] for a in attempts} == {"deliver"}
        # a replay does no work: no attempt, whoever asks
        assert runner.resume_delivery(op, provenance=try_(4)).replayed
        assert len(ledger.attempts(run.run_id)) == 3
    assert receiver.jobs_created(op) == 1


def test_a_concurrent_callers_attempt_does_not_leave_a_completed_run_running(receiver, tmp_path):
    """Another call records attempt 2 while this one delivers (it then finds this call
    submitting: LEASE_HELD, its attempt left RUNNING). This call completes the delivery:
    the run is COMPLETE, not RUNNING until some later call."""
    from dpone.config.bootstrap import api_provenance
    from dpone.config.delivery import payload_materializer, plan_delivery

    receiver.set_faults(job_duration_s=0.05)
    with Runner(_workload(tmp_path, receiver.url)) as runner:
        route, window = runner._rest, parse_interval(DAY1)
        spec = plan_delivery(
            route, window=window, partition=None, context=None, provenance=api_provenance()
        )
        materialize = payload_materializer(runner.workload, window=window, partition=None)
        ledger = route.journal

        def payload():
            # the interleaving of the race: the other call's attempt lands mid-delivery
            ledger.begin_attempt(run_id=spec.run.run_id, attempt=2, owner="other-process")
            return materialize()

        result = route.service.deliver(spec, payload=payload, poll_budget_s=10)
        assert isinstance(result, DeliveryCompleted)
        [run] = ledger.list_runs()
        assert run.state.value == "COMPLETE"
        attempts = ledger.attempts(run.run_id)
        assert [a.state.value for a in attempts] == ["SUPERSEDED", "COMPLETE"]
    assert receiver.jobs_created(result.operation_id) == 1


def test_a_503_before_acceptance_waits_durably_then_is_sent_once(receiver, tmp_path):
    """The receiver refuses before accepting (503, Retry-After 1) and the call has no wait
    budget: RETRY_WAIT with the receiver's due time is durable, the call fails retryable
    (the run FAILED, transient); a call after the due time submits again and completes:
    one job, the checkpoint once."""
    receiver.set_faults(job_duration_s=0.05, unavailable_before_accept=1)
    path = _workload(tmp_path, receiver.url, extra="  wait_budget_seconds: 0\n")
    with Runner(path) as runner:
        with pytest.raises(ReceiverUnavailable) as first:
            runner.deliver(interval=DAY1)
        assert first.value.retryable
        [record] = _records(runner)
        assert record.state is DeliveryState.RETRY_WAIT
        assert record.due_at is not None
        assert record.due_at - record.updated_at == pytest.approx(1.0, abs=0.05)  # Retry-After
        op = record.operation_id
        store = runner._rest.service.store
        assert [a["outcome"] for a in store.attempts(op)] == ["refused_before_accept"]
        [run] = runner._rest.journal.list_runs()
        assert (run.state.value, run.error.retryability) == ("FAILED", "transient")
        time.sleep(max(record.due_at - store.now(), 0) + 0.05)
        done = runner.deliver(interval=DAY1, poll_budget_s=10)
        assert isinstance(done, DeliveryCompleted)
        assert [a["outcome"] for a in store.attempts(op)] == ["refused_before_accept", "accepted"]
        [run] = runner._rest.journal.list_runs()
        assert run.state.value == "COMPLETE"
    assert receiver.jobs_created(op) == 1
    assert _checkpoint(tmp_path / "journal.db")[2][0][:1] == (op,)


def _records(runner: Runner) -> list:
    """Every delivery record of the runner's control plane (one per test here)."""
    with closing(sqlite3.connect(runner.workload.base_dir / "journal.db")) as conn:
        ops = [r[0] for r in conn.execute("SELECT operation_id FROM dpone_delivery")]
    return [runner._rest.service.store.get(op) for op in ops]


def test_payload_is_materialized_deterministically(receiver, tmp_path):
    """The same source and interval give the same staged payload digest (the authority)."""
    from dpone.config.delivery import payload_materializer

    workload = load_workload(_workload(tmp_path, receiver.url))
    make = payload_materializer(workload, window=parse_interval(DAY1), partition=None)
    one, two = make(), make()
    assert (one.digest, one.path, one.rows) == (two.digest, two.path, 25)
    first = Path(one.path).read_text(encoding="utf-8").splitlines()[0]
    assert json.loads(first) == {"id": "0", "name": "name-0"}
    assert len(list(Path(one.path).parent.glob(".materialize-*"))) == 0


def test_split_delivery_next_intervals_and_contiguity(receiver, tmp_path):
    """Incremental SQLite-table source: children of 10 rows, the checkpoint promoted once
    per parent; a later day completed first waits (pending) until the gap completes."""
    receiver.set_faults(job_duration_s=0.05)
    with closing(sqlite3.connect(tmp_path / "src.db")) as conn, conn:
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, updated_at TEXT)")
        conn.executemany(
            "INSERT INTO events VALUES (?, ?)",
            [(i, f"2026-11-0{1 + i % 3} {i % 24:02d}:00:00") for i in range(60)],
        )
    path = _workload(tmp_path, receiver.url, extra="  rows_per_child: 10\n")
    text = path.read_text().replace(
        "source: {kind: csv, path: orders.csv}",
        'source: {kind: sqlite_table, url: "sqlite:///src.db", table: events}',
    )
    path.write_text(text)
    with Runner(path) as runner:
        later = runner.deliver(interval=DAY2, poll_budget_s=20)
        assert isinstance(later, DeliveryCompleted)
        assert later.rows == 20
        watermark, pending, _ = _checkpoint(tmp_path / "journal.db")
        assert (watermark, pending) == (1_793_491_200_000_000, 1)  # the gap: day 1
        first = runner.deliver(poll_budget_s=20)  # the next interval: day 1
        assert isinstance(first, DeliveryCompleted)
        assert first.rows == 20
        watermark, pending, rows = _checkpoint(tmp_path / "journal.db")
        assert (watermark, pending) == (DAY3_START_US, 0)
        assert [r[0] for r in rows] == [first.operation_id, later.operation_id]
        children = runner._rest.service.store.children(first.operation_id)
        assert [c.payload.rows for c in children] == [10, 10]
        for child in children:
            assert receiver.jobs_created(child.operation_id) == 1
        assert receiver.stats()["counters"]["max_active"] <= 1
        # rows_per_child changed under the same operation: refused, nothing sent
        path.write_text(text.replace("rows_per_child: 10", "rows_per_child: 7"))
    with Runner(path) as runner, pytest.raises(IntentConflict):
        runner.deliver(interval=DAY1)


def test_a_failed_remote_job_blocks_and_promotes_nothing(receiver, tmp_path):
    """A remote failure: Blocked, no checkpoint, the run UNRESOLVED; the evidence check
    refuses a promotion without a succeeded observation."""
    receiver.set_faults(job_duration_s=0.05, fail_next_jobs=1)
    with Runner(_workload(tmp_path, receiver.url)) as runner:
        result = runner.deliver(interval=DAY1, poll_budget_s=10)
        assert isinstance(result, DeliveryBlocked)
        assert result.reason.value == "remote_failed"
        with pytest.raises(RecoveryRefused):
            runner._rest.service.verify_success(result.operation_id)
        [run] = runner._rest.journal.list_runs()
        assert run.state.value == "UNRESOLVED"
        assert run.error.code == "DPONE_DELIVERY_BLOCKED"
    with closing(sqlite3.connect(tmp_path / "journal.db")) as conn:
        assert conn.execute("SELECT count(*) FROM dpone_checkpoint_intervals").fetchone() == (0,)


def test_a_lost_202_is_reconciled_by_key_or_blocks_without_lookup(receiver, tmp_path):
    """The receiver creates the job and the answer is lost: a workload delivery adopts it
    by key lookup (one job, promoted once); without key lookup `dpone run` blocks (exit
    3) with an operator message, keeps the slot and promotes nothing."""
    receiver.set_faults(job_duration_s=0.05, drop_response_after_accept=1)
    (tmp_path / "a").mkdir()
    with Runner(_workload(tmp_path / "a", receiver.url)) as runner:
        result = runner.deliver(interval=DAY1, poll_budget_s=10)
        assert isinstance(result, DeliveryCompleted)
        store = runner._rest.service.store
        # one submit, unanswered; the receipt came from the key lookup, nothing resent
        assert [a["outcome"] for a in store.attempts(result.operation_id)] == ["inconclusive"]
        details = [h["detail"] for h in store.history(result.operation_id)]
        assert "receipt from lookup" in details
    assert receiver.jobs_created(result.operation_id) == 1
    assert _checkpoint(tmp_path / "a" / "journal.db")[0] == DAY2_START_US

    receiver.set_faults(job_duration_s=0.05, drop_response_after_accept=1, key_lookup=False)
    (tmp_path / "b").mkdir()
    workload = _workload(tmp_path / "b", receiver.url)
    done = _dpone(tmp_path / "b", "run", str(workload), "--interval", DAY1, "--json")
    assert done.returncode == 3, (done.stdout, done.stderr[-2000:])
    body = json.loads(done.stdout)
    assert (body["outcome"], body["reason"]) == ("blocked", "key_lookup_unsupported")
    assert "check at the receiver" in body["message"]
    assert "Idempotency-Key" in body["message"]
    assert body["recovery_ref"].startswith("dpone delivery status --operation-id ")
    op = body["operation_id"]
    assert receiver.jobs_created(op) == 1
    with Runner(workload) as runner:
        store = runner._rest.service.store
        record = store.get(op)
        assert record.state is DeliveryState.BLOCKED
        assert store.active_reservations(record.receiver) == 1  # a job may exist: held
        [run] = runner._rest.journal.list_runs()
        assert (run.state.value, run.error.code) == ("UNRESOLVED", "DPONE_DELIVERY_BLOCKED")
        again = runner.deliver(interval=DAY1)  # nothing is resent blindly
        assert isinstance(again, DeliveryBlocked)
    assert receiver.jobs_created(op) == 1
    with closing(sqlite3.connect(tmp_path / "b" / "journal.db")) as conn:
        assert conn.execute("SELECT count(*) FROM dpone_checkpoint_intervals").fetchone() == (0,)


@pytest.mark.parametrize(
    ("target", "field", "words"),
    [
        ("{kind: rest}", "target", "exactly one of url or url_env"),
        ("{kind: rest, url: 'https://u:p@bulk.example.com'}", "target.url", "user info"),
        ("{kind: rest, url: 'ftp://bulk.example.com'}", "target.url", "http(s)"),
        (
            "{kind: rest, url: 'https://bulk.example.com', credential: 'abc123token'}",
            "target.credential",
            "env:NAME or file:PATH",
        ),
        (
            "{kind: rest, url: 'https://b.example.com', capacity: 0}",
            "target.capacity",
            "greater than or equal to 1",
        ),
        (
            "{kind: rest, url: 'https://b.example.com', rows_per_child: 0}",
            "target.rows_per_child",
            "greater than or equal to 1",
        ),
        ("{kind: rest, url: 'https://b.example.com', tokn: x}", "target.tokn", "remove it"),
        (
            "{kind: rest, url: 'https://b.example.com', request_timeout_seconds: 30, "
            "submit_lease_seconds: 20}",
            "target",
            "submit_lease_seconds must exceed",
        ),
    ],
)
def test_config_errors_name_the_field(tmp_path, target, field, words):
    """Every mistake in a rest target is DPONE_CONFIG_INVALID naming the field."""
    (tmp_path / "w.yaml").write_text(
        f"workload: w\nrelease: r\ndeployment: d\nsource: {{kind: csv, path: a.csv}}\n"
        f"target: {target}\n"
    )
    with pytest.raises(ConfigInvalid) as caught:
        load_workload(tmp_path / "w.yaml")
    assert caught.value.field == field, caught.value.message
    assert words in caught.value.message


def test_config_errors_at_run_time(tmp_path, monkeypatch):
    """load.strategy other than append; url_env unset or not a URL; audits; run()."""
    base = "workload: w\nrelease: r\ndeployment: d\nsource: {kind: csv, path: a.csv}\n"
    (tmp_path / "a.yaml").write_text(
        base + "target: {kind: rest, url: 'https://b.example.com'}\n"
        "load: {strategy: merge, key: [id]}\n"
    )
    with pytest.raises(ConfigInvalid, match=r"load\.strategy append"):
        load_workload(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text(
        base + "target: {kind: rest, url: 'https://b.example.com'}\naudits: {min_rows: 1}\n"
    )
    with pytest.raises(ConfigInvalid, match="audits run inside"):
        load_workload(tmp_path / "b.yaml")
    (tmp_path / "c.yaml").write_text(
        base + "journal: sqlite:///j.db\ntarget: {kind: rest, url_env: DPONE_TEST_RECV}\n"
    )
    monkeypatch.delenv("DPONE_TEST_RECV", raising=False)
    with pytest.raises(ConfigInvalid) as caught:
        Runner(tmp_path / "c.yaml")
    assert caught.value.field == "target.url_env"
    monkeypatch.setenv("DPONE_TEST_RECV", "https://user:secret-pw@b.example.com")
    with pytest.raises(ConfigInvalid) as caught:
        Runner(tmp_path / "c.yaml")
    assert caught.value.field == "target.url_env"
    assert "secret-pw" not in str(caught.value.attrs())
    monkeypatch.setenv("DPONE_TEST_RECV", "https://b.example.com/api/")
    with Runner(tmp_path / "c.yaml") as runner:
        assert runner._rest.receiver_identity == "rest:https://b.example.com/api"
        with pytest.raises(ConfigInvalid, match=r"Runner\.deliver"):
            runner.run(interval=DAY1)


def test_cli_run_pending_then_delivery_resume_completes(receiver, tmp_path):
    """`dpone run --json` -> pending (exit 0); status; `dpone delivery resume -w` ->
    completed and the checkpoint promoted; `dpone run` again -> completed, replayed."""
    receiver.set_faults(job_duration_s=0.3)
    workload = _workload(tmp_path, receiver.url)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _dpone(tmp_path, *args)

    first = cli("run", str(workload), "--interval", DAY1, "--json")
    assert first.returncode == 0, first.stderr
    body = json.loads(first.stdout)
    assert body["outcome"] == "pending"
    op = body["operation_id"]
    status = cli("delivery", "status", "-w", str(workload), "--operation-id", op, "--json")
    assert status.returncode == 0, status.stderr
    seen = json.loads(status.stdout)
    assert seen["state"] == "ACCEPTED"
    assert seen["checkpoint"]["promotes_interval"] == DAY1
    assert seen["checkpoint"]["watermark_covers_interval"] is False
    time.sleep(0.35)
    resumed = cli("delivery", "resume", "-w", str(workload), "--operation-id", op, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["outcome"] == "completed"
    assert _checkpoint(tmp_path / "journal.db")[0] == DAY2_START_US
    status = cli("delivery", "status", "-w", str(workload), "--operation-id", op, "--json")
    seen = json.loads(status.stdout)
    assert (seen["state"], seen["checkpoint"]["watermark_covers_interval"]) == ("COMPLETE", True)
    again = cli("run", str(workload), "--interval", DAY1)
    assert again.returncode == 0, again.stderr
    assert "outcome: completed" in again.stdout
    assert "replayed: True" in again.stdout
    assert receiver.jobs_created(op) == 1
    outputs = first.stdout + first.stderr + resumed.stdout + again.stdout + status.stdout
    assert RECEIVER_TOKEN not in outputs
    with open(tmp_path / "journal.db", "rb") as fh:
        assert RECEIVER_TOKEN.encode() not in fh.read()


def test_postgres_control_plane_and_journal(receiver, tmp_path, pg_available, pg_schema):
    """The same delivery with the journal and control plane in PostgreSQL."""
    from dpone.adapters.journal.postgres import PostgresCommitJournal

    receiver.set_faults(job_duration_s=0.1)
    path = _workload(tmp_path, receiver.url, journal=pg_available)
    path.write_text(path.read_text() + f"journal_schema: {pg_schema}\n")
    with Runner(path) as runner:
        result = runner.deliver(interval=DAY1, poll_budget_s=10)
        assert isinstance(result, DeliveryCompleted)
        replay = runner.resume_delivery(result.operation_id)
        assert isinstance(replay, DeliveryCompleted)
        assert replay.replayed
    journal = PostgresCommitJournal(pg_available, schema=pg_schema)
    try:
        [checkpoint] = journal.list_checkpoints()
        assert (checkpoint.watermark, checkpoint.operation_id) == (
            DAY2_START_US,
            result.operation_id,
        )
        [run] = journal.list_runs()
        assert run.state.value == "COMPLETE"
    finally:
        journal.close()
    assert receiver.jobs_created(result.operation_id) == 1


def test_operator_commands_use_the_workloads_journal_schema_on_postgres(
    receiver, tmp_path, pg_available, pg_schema
):
    """status / reconcile / release-capacity find a non-default journal_schema by -w, and
    by --journal with --schema; without the schema they find no control plane."""
    receiver.set_faults(job_duration_s=0.05, drop_response_after_accept=1, key_lookup=False)
    path = _workload(tmp_path, receiver.url, journal=pg_available)
    path.write_text(path.read_text() + f"journal_schema: {pg_schema}\n")
    with Runner(path) as runner:
        blocked = runner.deliver(interval=DAY1)
    assert isinstance(blocked, DeliveryBlocked)
    op = blocked.operation_id
    env = {
        "DPONE_TEST_RECEIVER_TOKEN": RECEIVER_TOKEN,
        "DPONE_PRINCIPAL": "ops",
        "DPONE_DELIVERY_OPERATORS": "ops",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_dpone(
            ["delivery", *args, "--operation-id", op, "--json"], cwd=tmp_path, env=env, timeout=60
        )

    by_workload = cli("status", "-w", str(path))
    assert by_workload.returncode == 0, by_workload.stdout + by_workload.stderr
    seen = json.loads(by_workload.stdout)
    assert (seen["state"], seen["capacity_held_at_receiver"]) == ("BLOCKED", 1)
    by_url = cli("status", "--journal", pg_available, "--schema", pg_schema)
    assert by_url.returncode == 0, by_url.stdout + by_url.stderr
    assert json.loads(by_url.stdout)["version"] == seen["version"]
    default = cli("status", "--journal", pg_available)  # schema "dpone": not this one
    assert json.loads(default.stdout)["error"]["code"] in (
        "DPONE_CONFIG_INVALID",  # no control plane in "dpone"
        "DPONE_OPERATION_NOT_FOUND",  # another test's control plane in "dpone"
    )
    refused = cli("reconcile", "-w", str(path))
    assert json.loads(refused.stdout)["error"]["code"] == "DPONE_RECOVERY_REFUSED"
    released = cli(
        "release-capacity",
        "-w",
        str(path),
        "--expected-version",
        str(seen["version"]),
        "--reason",
        "checked at the receiver",
    )
    assert released.returncode == 0, released.stdout + released.stderr
    body = json.loads(released.stdout)
    assert body["capacity_held_at_receiver"] == 0
    assert body["audit"][0]["principal"] == "ops"


def test_an_empty_interval_of_a_split_workload_is_one_empty_job(receiver, tmp_path):
    """No rows in the interval: one empty job (nothing to split), checkpoint promoted."""
    receiver.set_faults(job_duration_s=0.05)
    path = _workload(tmp_path, receiver.url, extra="  rows_per_child: 10\n")
    (tmp_path / "orders.csv").write_text("id,name\n", encoding="utf-8")
    with Runner(path) as runner:
        result = runner.deliver(interval=DAY1, poll_budget_s=10)
        assert isinstance(result, DeliveryCompleted)
        assert result.rows == 0
        replay = runner.deliver(interval=DAY1)
        assert replay.replayed
    assert receiver.jobs_created(result.operation_id) == 1
    assert _checkpoint(tmp_path / "journal.db")[0] == DAY2_START_US
