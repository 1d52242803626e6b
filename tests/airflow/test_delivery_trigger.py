"""The delivery trigger's observation loop against the real reference receiver (no Airflow).

``dpone.airflow._observe`` is what ``DponeReceiptTrigger.run`` awaits; here it runs in this
process's event loop against a real receiver process and a real SQLite or PostgreSQL
control plane. The trigger class itself, its serialization and its imports are tested in
the real Airflow environments (``test_delivery_airflow.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from dpone.airflow._conn_url import connection_url
from dpone.airflow._observe import (
    HINTS,
    ObservationBounds,
    conn_locator,
    env_locator,
    journal_locator,
    observe_once_woken,
)
from dpone.airflow.delivery_runtime import open_delivery_runtime, prepare_delivery, trigger_locator
from dpone.config.bootstrap import RunContext
from dpone.contracts.delivery import DeliveryCompleted, DeliveryPending, DeliveryState
from dpone.errors import ConfigInvalid
from tests.fixtures.receiver import RECEIVER_TOKEN
from tests.integration.test_delivery import TOKEN_ENV, _payload, _processor, _request

INTERVAL = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
#: a journal password that must appear in no trigger argument, event, log or row
CANARY = "canary-pw-7d1e0b5a"
FAST = ObservationBounds(poll_interval_s=0.1, max_polls=200, lease_s=2.0, request_timeout_s=1.0)


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, RECEIVER_TOKEN)


@pytest.fixture(autouse=True)
def _close_processors():
    from tests.integration.test_delivery import _OPEN

    yield
    while _OPEN:
        _OPEN.pop().close()


def rest_workload(
    folder: Path,
    receiver_url: str,
    *,
    rows: int = 5,
    name: str = "orders_rest",
    rows_per_child: int | None = None,
) -> Path:
    """A REST delivery workload file (incremental, so it has a checkpoint) and its source.

    ``rows_per_child`` makes it a split delivery: one child job per that many rows.
    """
    split = "" if rows_per_child is None else f"rows_per_child: {rows_per_child}, "
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "orders.csv"
    source.write_text("id,name\n" + "".join(f"{i},n{i}\n" for i in range(rows)))
    path = folder / f"{name}.yaml"
    path.write_text(
        f"workload: {name}\n"
        'release: "r1"\n'
        "deployment: test\n"
        f"journal: sqlite:///{folder / 'journal.db'}\n"
        f"source: {{kind: csv, path: '{source}'}}\n"
        f"target: {{kind: rest, url: '{receiver_url}', credential: 'env:{TOKEN_ENV}', "
        f"{split}poll_interval_seconds: 1.0}}\n"
        'incremental: {start: "2026-11-01T00:00:00Z", max_interval_seconds: 86400}\n'
    )
    return path


def promotions(folder: Path, op: str, name: str = "orders_rest") -> int:
    """How many completed checkpoint intervals ``op`` has in the workload's journal (0 or 1)."""
    del name
    with sqlite3.connect(folder / "journal.db") as conn:
        try:
            row = conn.execute(
                "SELECT COUNT(*) FROM dpone_checkpoint_intervals "
                "WHERE operation_id = ? AND completed_at IS NOT NULL",
                (op,),
            ).fetchone()
        except sqlite3.OperationalError:  # no checkpoint table yet
            return 0
    return int(row[0])


def _unique(tmp_path: Path) -> str:
    """A partition per test: the module's receiver dedupes by operation id."""
    return f"p{abs(hash(str(tmp_path))) % 10**9}"


def _delivered(tmp_path: Path, receiver_url: str) -> tuple[str, dict[str, str]]:
    """Start a delivery (no poll budget: left running) and return its id and trigger locator."""
    runtime = open_delivery_runtime(str(rest_workload(tmp_path, receiver_url)), {})
    try:
        op = runtime.deliver(
            interval=INTERVAL, partition=_unique(tmp_path), context=RunContext(), provenance=None
        ).operation_id
        return op, trigger_locator(runtime, {})
    finally:
        runtime.close()


def pg_connection(pg_url: str) -> _Conn:
    """A stand-in Airflow connection ``dpone_journal`` to ``pg_url``, with the canary password."""
    parts = urlsplit(pg_url)
    return _Conn(
        conn_id="dpone_journal",
        password=CANARY,
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        schema=parts.path.lstrip("/"),
        login=parts.username or "postgres",
    )


def _lease(db: Path, op: str) -> tuple[Any, ...]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT holder, epoch, polls, last_status FROM dpone_delivery_observer_leases "
            "WHERE operation_id = ?",
            (op,),
        ).fetchone()
    return tuple(row)


def _two(op: str, locator: dict[str, str], bounds: ObservationBounds = FAST) -> list[Any]:
    async def both() -> list[Any]:
        return list(
            await asyncio.gather(
                observe_once_woken(op, locator, bounds), observe_once_woken(op, locator, bounds)
            )
        )

    return asyncio.run(both())


def test_two_triggers_one_lease_no_mutation_and_a_promotion_once(
    receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two triggers for one operation: one polls, both wake; the receiver sees no new job.

    Then the duplicate wake-ups reach the runtime: the first verifies and promotes, the
    second replays; the stand-in checkpoint is promoted exactly once.
    """
    caplog.set_level(logging.DEBUG)
    receiver.set_faults(job_duration_s=1.5)
    runtime = open_delivery_runtime(str(rest_workload(tmp_path, receiver.url)), {})
    try:
        pending = runtime.deliver(
            interval=INTERVAL, partition=_unique(tmp_path), context=RunContext(), provenance=None
        )
        assert isinstance(pending, DeliveryPending)
        op = pending.operation_id
        locator = trigger_locator(runtime, {})
    finally:
        runtime.close()
    db = tmp_path / "journal.db"
    assert locator == {"kind": "sqlite", "path": str(db.resolve())}
    before = receiver.stats()
    version_before = _version(db, op)

    hints = _two(op, locator)

    assert [h["status"] for h in hints] == ["succeeded", "succeeded"]
    polls = sorted(int(h["polls"]) for h in hints)
    assert polls[0] == 0, hints  # only the lease holder sent GETs
    assert polls[1] >= 2, hints
    _holder, epoch, lease_polls, last = _lease(db, op)
    assert (epoch, lease_polls, last) == (1, polls[1], "succeeded")  # one holder, never handed on
    after = receiver.stats()
    assert after == before  # no job, no submit, no lookup, no upload: GETs only
    assert _version(db, op) == version_before  # the trigger never advanced the delivery
    # the same observation again is harmless and still mutates nothing
    assert _two(op, locator)[0]["status"] == "succeeded"
    assert receiver.stats() == before

    for expected_replayed in (False, True):  # duplicate events -> two resumes
        runtime = open_delivery_runtime(str(tmp_path / "orders_rest.yaml"), {})
        try:
            done = runtime.resume_delivery(op)
        finally:
            runtime.close()
        assert isinstance(done, DeliveryCompleted)
        assert done.replayed is expected_replayed
    assert promotions(tmp_path, op) == 1
    assert receiver.jobs_created(op) == 1
    # the canary token is nowhere in what the trigger returned, wrote or logged
    text = json.dumps(hints) + repr(_lease(db, op)) + caplog.text
    assert RECEIVER_TOKEN not in text


def _version(db: Path, op: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(
            conn.execute(
                "SELECT version FROM dpone_delivery WHERE operation_id = ?", (op,)
            ).fetchone()[0]
        )


def test_a_trigger_takes_over_an_expired_lease(receiver, tmp_path: Path) -> None:
    """A killed trigger's lease blocks others only until it expires; then one takes over."""
    receiver.set_faults(job_duration_s=0.5)
    op, locator = _delivered(tmp_path, receiver.url)
    db = tmp_path / "journal.db"
    with sqlite3.connect(db) as conn:  # a triggerer that died holding the lease for 1.5 s
        conn.execute(
            "INSERT INTO dpone_delivery_observer_leases (operation_id, holder, expires_at, epoch) "
            "VALUES (?, 'dead-triggerer', (julianday('now') - 2440587.5) * 86400.0 + 1.5, 1)",
            (op,),
        )
    started = time.monotonic()
    [hint] = [asyncio.run(observe_once_woken(op, locator, FAST))]
    waited = time.monotonic() - started
    assert hint["status"] == "succeeded"
    assert waited >= 1.2, waited  # it did not poll while the dead holder's lease was live
    holder, epoch, polls, _last = _lease(db, op)
    assert holder != "dead-triggerer"
    assert epoch == 2
    assert polls == hint["polls"] >= 1


def test_bounds_end_the_watch_with_a_wake_up_and_hand_the_lease_on(
    receiver, tmp_path: Path
) -> None:
    """Polling is bounded: on exhaustion the trigger wakes the task and frees the lease."""
    receiver.set_faults(job_duration_s=30)
    op, locator = _delivered(tmp_path, receiver.url)
    bounded = ObservationBounds(poll_interval_s=0.1, max_polls=3, lease_s=5.0)
    hint = asyncio.run(observe_once_woken(op, locator, bounded))
    assert hint == {"operation_id": op, "status": "exhausted", "polls": 3}
    started = time.monotonic()
    deadline = ObservationBounds(poll_interval_s=0.2, deadline=time.time() + 0.5, lease_s=5.0)
    again = asyncio.run(observe_once_woken(op, locator, deadline))
    # the next trigger did not wait out the 5 s lease: the first one released it
    assert again["status"] == "exhausted"
    assert again["polls"] >= 1
    assert time.monotonic() - started < 2.5
    assert set(HINTS) >= {hint["status"], again["status"]}


def test_the_trigger_ends_when_the_control_plane_no_longer_waits(receiver, tmp_path) -> None:
    """A COMPLETE (or unknown) delivery wakes the task at once without any GET."""
    receiver.set_faults(job_duration_s=0.0)
    runtime = open_delivery_runtime(str(rest_workload(tmp_path, receiver.url)), {})
    try:
        result = runtime.deliver(
            interval=INTERVAL,
            partition=_unique(tmp_path),
            context=RunContext(),
            provenance=None,
            poll_budget_s=5.0,
        )
        locator = trigger_locator(runtime, {})
    finally:
        runtime.close()
    assert isinstance(result, DeliveryCompleted)
    hint = asyncio.run(observe_once_woken(result.operation_id, locator, FAST))
    assert hint == {"operation_id": result.operation_id, "status": "not_pending", "polls": 0}
    missing = asyncio.run(observe_once_woken("sha256:" + "0" * 64, locator, FAST))
    assert missing["status"] == "missing"


def test_two_triggers_on_a_postgres_control_plane(receiver, pg_available, pg_schema, tmp_path):
    """The same lease on PostgreSQL (psycopg's AsyncConnection): one holder, no mutation."""
    from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

    receiver.set_faults(job_duration_s=1.0)
    store = PostgresDeliveryStore(pg_available, schema=pg_schema)
    try:
        proc = _processor(store)
        request = _request(receiver, _payload(tmp_path))
        assert isinstance(proc.deliver(request), DeliveryPending)
        before = receiver.stats()
        locator = journal_locator(pg_available, schema=pg_schema)
        hints = _two(request.operation_id, locator)
        assert [h["status"] for h in hints] == ["succeeded", "succeeded"]
        assert sorted(int(h["polls"]) for h in hints)[0] == 0
        assert receiver.stats() == before
        record = store.get(request.operation_id)
        assert record is not None
        assert record.state is DeliveryState.ACCEPTED
        done = proc.resume(request.operation_id)
        assert isinstance(done, DeliveryCompleted)
        assert not done.replayed
        assert isinstance(proc.resume(request.operation_id), DeliveryCompleted)
        assert receiver.jobs_created(request.operation_id) == 1
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://u:secret@h/db", "password"),
        ("postgresql://u@h/db?password=x", "password"),
        ("sqlite:relative.db", "absolute"),
        ("mysql://u@h/db", "sqlite:/// or postgresql://"),
    ],
)
def test_the_locator_never_carries_a_secret(url: str, why: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        journal_locator(url)
    assert why in caught.value.message
    assert "secret" not in repr(caught.value.__dict__.get("hint", ""))
    assert journal_locator("postgresql://u@h:5432/db", schema="s") == {
        "kind": "postgresql",
        "url": "postgresql://u@h:5432/db",
        "schema": "s",
    }


def test_bad_bounds_are_a_clear_error() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        asyncio.run(
            observe_once_woken(
                "op", {"kind": "sqlite", "path": "/x"}, ObservationBounds(lease_s=1.0)
            )
        )
    assert caught.value.field == "lease_s"


def test_an_unreachable_control_plane_costs_rounds_not_a_crash(tmp_path: Path) -> None:
    """A control plane that does not answer now ends the watch within its bounds."""
    bounds = ObservationBounds(poll_interval_s=0.05, max_polls=3, lease_s=1.0)
    missing = {"kind": "sqlite", "path": str(tmp_path / "not-there.db")}
    hint = asyncio.run(observe_once_woken("op", missing, bounds))
    assert hint == {"operation_id": "op", "status": "exhausted", "polls": 0}
    assert not (tmp_path / "not-there.db").exists()  # never created by the trigger
    down = {"kind": "postgresql", "url": "postgresql://nobody@127.0.0.1:1/none", "schema": "s"}
    assert asyncio.run(observe_once_woken("op", down, bounds))["status"] == "exhausted"


# ---------------------------------------------------------------- a journal with a password
def _with_password(dsn: str, password: str) -> str:
    parts = urlsplit(dsn)
    netloc = f"{parts.username}:{password}@{parts.hostname}" + (
        f":{parts.port}" if parts.port else ""
    )
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass
class _Conn:
    """The fields of an Airflow ``Connection`` (no Airflow in this environment)."""

    conn_id: str
    password: str
    conn_type: str = "postgres"
    host: str = "127.0.0.1"
    schema: str = "test"
    login: str = "postgres"
    port: int = 5432

    def get_uri(self) -> str:  # pragma: no cover - postgres connections never use it
        raise AssertionError("not used for postgres")


def _workload(folder: Path, **journal: str | None) -> Any:
    from dpone.config.workload import load_workload, replace

    loaded = load_workload(rest_workload(folder, "http://127.0.0.1:9"))
    return replace(loaded, **{"journal": None, **journal})


def test_locators_name_where_a_journal_password_is_never_its_value(tmp_path: Path) -> None:
    """A password-carrying PostgreSQL journal reaches the trigger as a name, or is refused."""
    from dpone.airflow.delivery_runtime import workload_locator
    from dpone.config.workload import replace

    secret = "postgresql://u:" + CANARY + "@db.internal:5432/prod"
    plain = "postgresql://u@db.internal:5432/prod"
    via_conn = "DPONE_AIRFLOW_JOURNAL_URL"  # where apply_connections puts the resolved URL
    cases: list[tuple[dict[str, Any], dict[str, str], str | None, dict[str, str]]] = [
        ({"journal": plain}, {}, None, {"url": plain}),
        ({"journal_env": "PROD_J"}, {"PROD_J": secret}, None, {"url_env": "PROD_J"}),
        ({}, {"DPONE_JOURNAL": secret}, None, {"url_env": "DPONE_JOURNAL"}),
        ({}, {"DPONE_JOURNAL": plain + "?sslmode=require"}, None, {"url_env": "DPONE_JOURNAL"}),
        ({"journal_env": via_conn}, {via_conn: secret}, "jrn", {"conn_id": "jrn"}),
        ({"journal_env": "X"}, {"X": plain}, "jrn", {"url": plain}),  # nothing to hide
    ]
    for journal, env, conn_id, expected in cases:
        workload = replace(_workload(tmp_path, **journal), journal_schema="ops")
        locator = workload_locator(workload, env, journal_conn_id=conn_id)
        assert locator == {"kind": "postgresql", **expected, "schema": "ops"}, journal
        assert CANARY not in json.dumps(locator)
    sqlite = workload_locator(_workload(tmp_path, journal="sqlite:///j.db"), {})
    assert sqlite == {"kind": "sqlite", "path": str(tmp_path / "j.db")}

    with pytest.raises(ConfigInvalid) as caught:
        workload_locator(_workload(tmp_path, journal=secret), {})
    error = caught.value
    assert (error.code.value, error.field) == ("DPONE_CONFIG_INVALID", "journal")
    assert "password" in error.message
    assert "journal_env" in (error.hint or "")
    assert "journal_conn_id" in (error.hint or "")
    assert CANARY not in repr(error.attrs()) + str(error)
    with pytest.raises(ConfigInvalid):
        env_locator("not a name")
    with pytest.raises(ConfigInvalid):
        conn_locator("bad id!")


def test_a_password_in_the_workload_file_fails_before_anything_is_submitted(
    receiver, tmp_path: Path
) -> None:
    """prepare_delivery (what the operator calls first) refuses before opening anything."""
    folder = tmp_path / "w"
    path = rest_workload(folder, receiver.url)
    path.write_text(
        path.read_text().replace(
            f"journal: sqlite:///{folder / 'journal.db'}",
            "journal: postgresql://postgres:" + CANARY + "@127.0.0.1:5432/test",
        )
    )
    before = receiver.stats()["jobs_total"]
    with pytest.raises(ConfigInvalid) as caught:
        prepare_delivery(str(path), {})
    assert caught.value.field == "journal"
    assert receiver.stats()["jobs_total"] == before
    assert CANARY not in str(caught.value)


def _pg_delivery(
    folder: Path, receiver_url: str, pg_schema: str, env: dict[str, str], **options: Any
) -> tuple[str, dict[str, str]]:
    """Submit a delivery whose journal is the shared PostgreSQL; (operation id, locator)."""
    path = rest_workload(folder, receiver_url)
    text = path.read_text().replace(f"journal: sqlite:///{folder / 'journal.db'}\n", "")
    path.write_text(text + f"journal_schema: {pg_schema}\n" + options.pop("extra", ""))
    prepared = prepare_delivery(str(path), env, **options)
    try:
        result = prepared.runtime.deliver(
            interval=INTERVAL, partition=_unique(folder), context=RunContext(), provenance=None
        )
    finally:
        prepared.runtime.close()
    assert isinstance(result, DeliveryPending), result
    return result.operation_id, prepared.locator


def _schema_text(dsn: str, schema: str) -> str:
    """Every row of every table in ``schema``, as text (to look for a leaked secret)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).fetchall()
        ]
        assert "dpone_delivery_observer_leases" in tables, tables
        return "\n".join(
            str(row)
            for table in tables
            for row in conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall()
        )


def test_a_url_env_locator_keeps_the_journal_password_out_of_the_trigger(
    receiver,
    pg_available: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL journal given by journal_env with a (canary) password; trust auth accepts it.

    The trigger gets the variable's name, reads its own environment, polls under the lease
    and wakes the task; the canary is in no locator, hint, log line or control-plane row.
    Without the variable the watch ends at once with ``locator_unresolved`` and a log
    line naming it.
    """
    caplog.set_level(logging.DEBUG)
    receiver.set_faults(job_duration_s=1.0)
    secret_url = _with_password(pg_available, CANARY)
    env = {"DPONE_TEST_JOURNAL": secret_url, TOKEN_ENV: RECEIVER_TOKEN}
    op, locator = _pg_delivery(
        tmp_path, receiver.url, pg_schema, env, extra="journal_env: DPONE_TEST_JOURNAL\n"
    )
    assert locator == {"kind": "postgresql", "url_env": "DPONE_TEST_JOURNAL", "schema": pg_schema}

    monkeypatch.delenv("DPONE_TEST_JOURNAL", raising=False)
    missing = asyncio.run(observe_once_woken(op, locator, FAST))
    assert missing == {"operation_id": op, "status": "locator_unresolved", "polls": 0}
    assert "DPONE_TEST_JOURNAL" in caplog.text
    assert "not set in the triggerer" in caplog.text

    monkeypatch.setenv("DPONE_TEST_JOURNAL", secret_url)
    hint = asyncio.run(observe_once_woken(op, locator, FAST))
    assert hint["status"] == "succeeded", hint
    assert int(hint["polls"]) >= 1

    prepared = prepare_delivery(str(tmp_path / "orders_rest.yaml"), env)
    try:
        done = prepared.runtime.resume_delivery(op)
    finally:
        prepared.runtime.close()
    assert isinstance(done, DeliveryCompleted)
    assert receiver.jobs_created(op) == 1
    seen = (
        json.dumps([locator, missing, hint]) + caplog.text + _schema_text(pg_available, pg_schema)
    )
    assert CANARY not in seen


def test_a_conn_id_locator_resolves_the_connection_in_the_triggerer(
    receiver, pg_available: str, pg_schema: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """journal_conn_id: the worker resolves the connection, the trigger gets only its id.

    The trigger's connection lookup (Airflow's in the triggerer; here the same
    ``connection_url`` over a stand-in connection) builds the URL with the password.
    """
    caplog.set_level(logging.DEBUG)
    receiver.set_faults(job_duration_s=1.0)
    conn = pg_connection(pg_available)
    op, locator = _pg_delivery(
        tmp_path,
        receiver.url,
        pg_schema,
        {},
        journal_conn_id=conn.conn_id,
        lookup=lambda conn_id: conn if conn_id == conn.conn_id else None,
    )
    assert locator == {"kind": "postgresql", "conn_id": "dpone_journal", "schema": pg_schema}

    async def lookup(conn_id: str) -> str | None:
        return connection_url(conn) if conn_id == conn.conn_id else None

    async def unknown(conn_id: str) -> str | None:
        del conn_id
        return None

    gone = asyncio.run(observe_once_woken(op, locator, FAST, connection_url=unknown))
    assert gone["status"] == "locator_unresolved"
    assert "'dpone_journal'" in caplog.text
    hint = asyncio.run(observe_once_woken(op, locator, FAST, connection_url=lookup))
    assert hint["status"] == "succeeded", hint
    assert CANARY not in json.dumps([locator, gone, hint]) + caplog.text
    assert CANARY not in _schema_text(pg_available, pg_schema)


def run_attempts(journal: Path) -> int:
    """How many attempts the run ledger recorded (one per deliver or resume call)."""
    with sqlite3.connect(journal) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM dpone_run_attempts").fetchone()[0])


def _children(journal: Path, parent: str) -> list[tuple[str, str]]:
    with sqlite3.connect(journal) as conn:
        rows = conn.execute(
            "SELECT operation_id, state FROM dpone_delivery WHERE parent_id = ? "
            "ORDER BY child_index",
            (parent,),
        ).fetchall()
    return [(str(op), str(state)) for op, state in rows]


def test_a_split_delivery_is_watched_child_by_child_not_in_a_busy_loop(
    receiver, tmp_path: Path
) -> None:
    """A split parent has no row of its own: the trigger watches its in-flight child.

    The loop below is the operator's: deliver, then per wake-up ``resume_delivery`` (what
    ``execute_complete`` runs) until the delivery is no longer pending. Each watch ends
    only once the child's job ended, so three children take three wake-ups however long
    the jobs run (the parent id used to give ``missing`` at once: a busy loop of resumes
    for as long as a job ran), and every child is one remote job.
    """
    job_s = 1.5
    receiver.set_faults(job_duration_s=job_s)
    workload = rest_workload(tmp_path, receiver.url, rows=6, rows_per_child=2)
    runtime = open_delivery_runtime(str(workload), {})
    hints: list[dict[str, object]] = []
    started = time.monotonic()
    try:
        result = runtime.deliver(
            interval=INTERVAL, partition=_unique(tmp_path), context=RunContext(), provenance=None
        )
        locator = trigger_locator(runtime, {})
        parent = result.operation_id
        while isinstance(result, DeliveryPending):
            assert len(hints) < 10, hints  # a busy loop: the trigger did not wait
            hints.append(asyncio.run(observe_once_woken(parent, locator, FAST)))
            result = runtime.resume_delivery(parent, poll_budget_s=0.0)
    finally:
        runtime.close()
    elapsed = time.monotonic() - started
    assert isinstance(result, DeliveryCompleted), result
    assert (result.operation_id, result.rows) == (parent, 6)
    assert [h["status"] for h in hints] == ["succeeded"] * 3, hints  # one wake-up per child
    assert all(h["operation_id"] == parent for h in hints)
    assert all(int(str(h["polls"])) >= 2 for h in hints), hints  # each one waited for its job
    assert elapsed >= 3 * job_s
    children = _children(tmp_path / "journal.db", parent)
    assert [state for _, state in children] == ["COMPLETE"] * 3
    for child, _ in children:
        assert receiver.jobs_created(child) == 1
        assert _lease(tmp_path / "journal.db", child)[3] == "succeeded"  # observed under it
    assert run_attempts(tmp_path / "journal.db") == 1 + len(hints)  # deliver + one per wake-up
    # all children COMPLETE: the parent is no longer pending, not "missing"
    done = asyncio.run(observe_once_woken(parent, locator, FAST))
    assert done == {"operation_id": parent, "status": "not_pending", "polls": 0}


def test_the_trigger_opens_a_sqlite_journal_whose_path_has_uri_characters(
    receiver, tmp_path: Path
) -> None:
    """'#', '?' and '%' are file-name characters, not URI syntax, in the trigger's locator."""
    import shutil

    receiver.set_faults(job_duration_s=0.0)
    runtime = open_delivery_runtime(str(rest_workload(tmp_path, receiver.url)), {})
    try:
        result = runtime.deliver(
            interval=INTERVAL,
            partition=_unique(tmp_path),
            context=RunContext(),
            provenance=None,
            poll_budget_s=5.0,
        )
    finally:
        runtime.close()
    assert isinstance(result, DeliveryCompleted)
    odd = tmp_path / "a#b?c%20d"
    odd.mkdir()
    shutil.copy(tmp_path / "journal.db", odd / "journal.db")
    locator = {"kind": "sqlite", "path": str(odd / "journal.db")}
    assert journal_locator(f"sqlite:///{odd / 'journal.db'}") == locator
    bounds = ObservationBounds(poll_interval_s=0.1, max_polls=3, lease_s=1.0)
    hint = asyncio.run(observe_once_woken(result.operation_id, locator, bounds))
    assert hint["status"] == "not_pending", hint  # it read the row: the file was found
    assert not (tmp_path / "a").exists()  # and nothing was created at a truncated path


@pytest.mark.parametrize(
    "url", ["sqlite:////abs/dir/j.db", "sqlite:///abs/dir/j.db", "sqlite:/abs/dir/j.db"]
)
def test_a_sqlite_locator_names_the_plain_absolute_path(url: str) -> None:
    assert journal_locator(url) == {"kind": "sqlite", "path": "/abs/dir/j.db"}


def test_the_trigger_settles_before_waking_the_task() -> None:
    """An event is never due before ``not_before``; a past or absent bound costs nothing."""
    from dpone.airflow._observe import settle

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    now = 1_000.0
    asyncio.run(settle(now + 4.5, clock=lambda: now, sleep=sleep))
    asyncio.run(settle(now - 1.0, clock=lambda: now, sleep=sleep))
    asyncio.run(settle(None, clock=lambda: now, sleep=sleep))
    assert slept == [4.5]
    started = time.monotonic()
    asyncio.run(settle(time.time() + 0.3))  # the real clock and sleep
    assert time.monotonic() - started >= 0.25
