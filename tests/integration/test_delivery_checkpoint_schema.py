"""The delivery checkpoint bindings are journal schema version 4, created by migration.

The table used to be created on first use (``CREATE TABLE IF NOT EXISTS`` inside the
first bind), which on PostgreSQL fails when two processes do it at once (a unique
violation in ``pg_type``). Now the versioned migrations create it: serialized by an
advisory lock on PostgreSQL and ``BEGIN IMMEDIATE`` on SQLite, applied by ``dpone
journal migrate`` or a writer's first use, never by a read-only open.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.adapters.journal import postgres as pg_journal
from dpone.adapters.journal import sqlite as sqlite_journal
from dpone.contracts.checkpoint import CheckpointAdvance, stream_id
from dpone.contracts.identity import Interval
from dpone.testing.crash import dpone_cmd

PROCESSES = 2
ROUNDS = 3  # fresh schemas per run: the old first-use race failed in every round
BINDINGS_VERSION = 4


def _advance(day: int) -> CheckpointAdvance:
    return CheckpointAdvance.of(
        stream=stream_id(
            workload_id="orders", deployment_id="d", partition="-", target_identity="rest:x"
        ),
        workload_id="orders",
        partition="-",
        target_identity="rest:x",
        origin=datetime(2026, 11, 1, tzinfo=UTC),
        interval=Interval(
            start=datetime(2026, 11, day, tzinfo=UTC), end=datetime(2026, 11, day + 1, tzinfo=UTC)
        ),
    )


@pytest.fixture
def unborn_schemas(pg_available: str) -> Iterator[list[str]]:
    """Schema names nobody created yet (the journal creates them); dropped after."""
    names = [f"t_{uuid.uuid4().hex[:12]}" for _ in range(ROUNDS)]
    yield names
    with psycopg.connect(pg_available, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _first_use_worker(
    dsn: str, schemas: list[str], index: int, kind: str, barrier: Any, out: Any
) -> None:
    """Child process: per schema, first use of a fresh journal at once with the others.

    ``kind`` "journal": open the journal and bind; "workload": as a REST workload
    opens it, the delivery control plane first (its own migration, its own advisory
    lock, the same schema), then the journal, and bind.
    """
    from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore
    from dpone.adapters.journal.postgres import PostgresCommitJournal

    try:
        for schema in schemas:
            barrier.wait(timeout=60)
            store = PostgresDeliveryStore(dsn, schema=schema) if kind == "workload" else None
            with PostgresCommitJournal(dsn, schema=schema) as journal:
                # the first call on a fresh schema: migrate, then bind (the old code
                # created the table here, in every process at once)
                bound = journal.bind_delivery_checkpoint(
                    operation_id=f"op-{index}", checkpoint=_advance(1 + index)
                )
                barrier.wait(timeout=60)
                others = [journal.delivery_checkpoint(f"op-{i}") for i in range(PROCESSES)]
            if store is not None:
                store.close()
            out.put(
                (
                    schema,
                    index,
                    bound == _advance(1 + index),
                    others == [_advance(1 + i) for i in range(PROCESSES)],
                )
            )
    except BaseException as exc:  # reported to the parent, which fails the test
        barrier.abort()  # the other process stops waiting for this one
        out.put(f"error in process {index}: {exc!r}")


@pytest.mark.parametrize("kinds", [("journal", "journal"), ("journal", "workload")])
def test_two_processes_first_use_a_fresh_postgres_journal_at_once(
    pg_available: str, unborn_schemas: list[str], kinds: tuple[str, str]
) -> None:
    """Two processes open and bind on a fresh schema at the same moment: both succeed
    (two journals; a journal and a REST workload's control plane + journal)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_first_use_worker,
            args=(pg_available, unborn_schemas, i, kinds[i], barrier, out),
        )
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    results: list[Any] = []
    try:
        while len(results) < PROCESSES * ROUNDS:
            results.append(out.get(timeout=120))
            if isinstance(results[-1], str):  # an error ends that process's rounds
                results.append(out.get(timeout=120))
                break
    finally:
        for proc in procs:
            proc.join(timeout=60)
            proc.close()
        out.close()
        out.join_thread()
    errors = [r for r in results if isinstance(r, str)]
    assert errors == [], errors
    assert sorted(results) == sorted(
        (schema, i, True, True) for schema in unborn_schemas for i in range(PROCESSES)
    )
    with psycopg.connect(pg_available, autocommit=True) as admin:
        for schema in unborn_schemas:
            versions = admin.execute(
                f'SELECT version FROM "{schema}".dpone_schema_version ORDER BY version'
            ).fetchall()
            assert [v[0] for v in versions] == list(range(1, pg_journal.SCHEMA_VERSION + 1))


def _pg_versions(admin: psycopg.Connection[Any], schema: str) -> list[int]:
    rows = admin.execute(f'SELECT version FROM "{schema}".dpone_schema_version ORDER BY 1')
    return [r[0] for r in rows.fetchall()]


def _pg_has_bindings(admin: psycopg.Connection[Any], schema: str) -> bool:
    row = admin.execute("SELECT to_regclass(%s)", (f'"{schema}".dpone_checkpoint_bindings',))
    return row.fetchone() != (None,)


def test_postgres_version_3_journal_read_only_then_migrated(
    pg_available: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only open of a version-3 schema reads it and migrates nothing; a writer's
    migrate applies version 4 once, keeping bindings the first-use code had created."""
    assert pg_journal.SCHEMA_VERSION >= BINDINGS_VERSION
    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", BINDINGS_VERSION - 1)
    with pg_journal.PostgresCommitJournal(pg_available, schema=pg_schema) as old:
        assert old.migrate() == [1, 2, 3]
        assert old.promote_delivered(operation_id="op-1", checkpoint=_advance(1))
    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", BINDINGS_VERSION)
    with psycopg.connect(pg_available, autocommit=True) as admin:
        with pg_journal.PostgresCommitJournal(
            pg_available, schema=pg_schema, read_only=True
        ) as look:
            assert look.delivery_checkpoint("op-1") is None  # no table: binds nothing
            [checkpoint] = look.list_checkpoints()
            assert checkpoint.watermark == _advance(1).end
            assert look.migrate() == []
        assert _pg_versions(admin, pg_schema) == [1, 2, 3]
        assert not _pg_has_bindings(admin, pg_schema)
        # the table as the first delivery code created it on first use, with a binding
        admin.execute(
            f'CREATE TABLE "{pg_schema}".dpone_checkpoint_bindings (operation_id TEXT PRIMARY '
            "KEY, stream_id TEXT NOT NULL, workload_id TEXT NOT NULL, partition TEXT NOT NULL, "
            "target_identity TEXT NOT NULL, origin_us BIGINT NOT NULL, start_us BIGINT NOT "
            "NULL, end_us BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL)"
        )
        a = _advance(2)
        admin.execute(
            f'INSERT INTO "{pg_schema}".dpone_checkpoint_bindings VALUES '
            "('op-2', %s, %s, %s, %s, %s, %s, %s, 0)",
            (a.stream_id, a.workload_id, a.partition, a.target_identity, a.origin, a.start, a.end),
        )
        with pg_journal.PostgresCommitJournal(pg_available, schema=pg_schema) as writer:
            assert writer.migrate() == [BINDINGS_VERSION]
            assert writer.delivery_checkpoint("op-2") == a
            assert writer.bind_delivery_checkpoint(operation_id="op-3", checkpoint=_advance(3))
        assert _pg_versions(admin, pg_schema) == [1, 2, 3, 4]


def test_postgres_read_only_refuses_an_unborn_or_too_old_schema(
    pg_available: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-only never creates: no journal, or one before the run ledger, is refused;
    only "what does this delivery promote" answers "nothing" where no journal exists."""
    from dpone.errors import ConfigInvalid

    with pg_journal.PostgresCommitJournal(pg_available, schema=pg_schema, read_only=True) as look:
        assert look.delivery_checkpoint("op-1") is None
        with pytest.raises(ConfigInvalid, match="schema version 0"):
            look.list_entries()
    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", 2)
    with pg_journal.PostgresCommitJournal(pg_available, schema=pg_schema) as old:
        old.migrate()
    monkeypatch.setattr(pg_journal, "SCHEMA_VERSION", BINDINGS_VERSION)
    with (
        pg_journal.PostgresCommitJournal(pg_available, schema=pg_schema, read_only=True) as look,
        pytest.raises(ConfigInvalid, match="schema version 2"),
    ):
        look.delivery_checkpoint("op-1")


def test_delivery_status_where_only_the_control_plane_exists(
    pg_available: str, pg_schema: str, tmp_path: Path
) -> None:
    """`dpone delivery send` creates only the control plane; `dpone delivery status`
    then shows the delivery (it promotes nothing) instead of failing on the journal
    nobody created, and creates no journal tables."""
    from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore
    from dpone.runtime.delivery import stage_payload

    (tmp_path / "p.jsonl").write_text('{"id": 1}\n', encoding="utf-8")
    op = "sha256:" + "c" * 64
    store = PostgresDeliveryStore(pg_available, schema=pg_schema)
    try:
        store.register(
            operation_id=op,
            intent_digest="sha256:" + "d" * 64,
            receiver="rest:http://127.0.0.1:9/api",
            receiver_url="http://127.0.0.1:9/api",
            credential_ref=None,
            payload=stage_payload(tmp_path / "p.jsonl"),
            capacity_limit=1,
            actor="test",
        )
    finally:
        store.close()
    (tmp_path / "w.yaml").write_text(
        f"workload: w\nrelease: r\ndeployment: d\njournal: {pg_available}\n"
        f"journal_schema: {pg_schema}\nsource: {{kind: csv, path: a.csv}}\n"
        "target: {kind: rest, url: 'http://127.0.0.1:9/api'}\n",
        encoding="utf-8",
    )
    body = _dpone_json(
        tmp_path, "delivery", "status", "-w", str(tmp_path / "w.yaml"), "--operation-id", op
    )
    assert (body["state"], body["checkpoint"]) == ("STAGED", None)
    with psycopg.connect(pg_available, autocommit=True) as admin:
        row = admin.execute("SELECT to_regclass(%s)", (f'"{pg_schema}".dpone_schema_version',))
        assert row.fetchone() == (None,)  # the look created no journal


def _sqlite_versions(path: Path) -> list[int]:
    with closing(sqlite3.connect(path)) as db:
        return [r[0] for r in db.execute("SELECT version FROM dpone_schema_version ORDER BY 1")]


def _dpone_json(cwd: Path, *args: str) -> Any:
    done = subprocess.run(
        dpone_cmd(*args, "--json"), cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    return json.loads(done.stdout)


def test_sqlite_version_3_journal_read_only_then_dpone_journal_migrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only look at a version-3 file changes nothing; `dpone journal migrate`
    applies version 4 once; binding then works."""
    path = tmp_path / "journal.db"
    monkeypatch.setattr(sqlite_journal, "SCHEMA_VERSION", BINDINGS_VERSION - 1)
    sqlite_journal.SqliteCommitJournal(path).close()
    monkeypatch.setattr(sqlite_journal, "SCHEMA_VERSION", BINDINGS_VERSION)
    url = f"sqlite:///{path}"
    look = sqlite_journal.SqliteCommitJournal(path, read_only=True)
    try:
        assert look.delivery_checkpoint("op-1") is None
    finally:
        look.close()
    assert _dpone_json(tmp_path, "journal", "list", "--journal", url) == []
    assert _sqlite_versions(path) == [1, 2, 3]
    assert _dpone_json(tmp_path, "journal", "migrate", "--journal", url) == {
        "applied": [BINDINGS_VERSION]
    }
    assert _dpone_json(tmp_path, "journal", "migrate", "--journal", url) == {"applied": []}
    assert _sqlite_versions(path) == [1, 2, 3, 4]
    with sqlite_journal.SqliteCommitJournal(path) as journal:
        assert journal.bind_delivery_checkpoint(operation_id="op-1", checkpoint=_advance(1))
        assert journal.delivery_checkpoint("op-1") == _advance(1)
