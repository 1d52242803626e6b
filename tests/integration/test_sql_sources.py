"""PostgreSQL and MariaDB source tables and Parquet files, read by real drivers.

The requirement shown here: rows that arrive in the source after the cut do not change
what a retry of the same operation loads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.adapters.sources.sql import SqlTableSource
from dpone.api import Runner
from dpone.config.workload import Workload, parse_workload
from dpone.contracts.identity import parse_interval
from dpone.contracts.states import CommitState
from dpone.errors import InjectedFault, IntentConflict, SourceInvalid, SourceUnavailable
from dpone.runtime import failpoints

DAY1 = "2026-11-01/2026-11-02"
CRASH = {"DPONE_FAILPOINTS": "fence.mutate.before_commit=raise"}
BEFORE_CUT = [
    (1, "a", datetime(2026, 11, 1, 0, 0, tzinfo=UTC)),
    (2, "b", datetime(2026, 11, 1, 9, 30, 0, 123456, tzinfo=UTC)),
    (3, None, datetime(2026, 11, 1, 23, 59, 59, tzinfo=UTC)),
]
AFTER_CUT = [
    (100, "late", datetime(2026, 11, 2, 0, 0, tzinfo=UTC)),  # exactly at the cut: excluded
    (101, "later", datetime(2026, 11, 3, 12, 0, tzinfo=UTC)),
]


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    failpoints.configure(None)


def _workload(root: Path, source: dict[str, Any]) -> Workload:
    return parse_workload(
        {
            "workload": "events",
            "release": "r1",
            "deployment": "test",
            "journal": "sqlite:///journal.db",
            "source": source,
            "target": {"kind": "sqlite", "url": "sqlite:///wh.db", "table": "events"},
            "load": {"strategy": "append", "batch_size": 2},  # several batches
        },
        base_dir=root,
    )


def _target(root: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(root / "wh.db") as conn:
        return sorted(conn.execute("SELECT id, body, updated_at FROM events").fetchall())


def _retry_after_source_moved_on(
    root: Path, source: dict[str, Any], insert_late: Callable[[], None]
) -> None:
    """Crash the first attempt, insert rows after the cut, retry: the same rows load."""
    w = _workload(root, source)
    with Runner(w, environ=CRASH) as runner, pytest.raises(InjectedFault):
        runner.run(interval=DAY1)
    insert_late()
    with Runner(w) as runner:
        result = runner.run(interval=DAY1)
    assert result.state is CommitState.COMPLETE
    assert result.rows_written == 3
    rows = _target(root)
    assert [r[0] for r in rows] == [1, 2, 3]
    assert rows[1][1] == "b"
    assert rows[2][1] is None
    # timestamps arrive as UTC text, microseconds kept
    assert str(rows[1][2]).startswith("2026-11-01 09:30:00.123456")
    journal = SqliteCommitJournal(root / "journal.db")
    try:
        [entry] = journal.list_entries()  # the crash and the retry were one operation
        states = [t.to_state for t in journal.history(entry.operation_id)]
    finally:
        journal.close()
    assert CommitState.FAILED_PRE_COMMIT in states
    assert entry.state is CommitState.COMPLETE


def test_postgres_source_retry_ignores_rows_after_the_cut(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """PostgreSQL table (timestamptz cursor): a retry reads exactly the first cut."""
    import psycopg

    with psycopg.connect(pg_available, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{pg_schema}".events (id int PRIMARY KEY, body text, '
            "updated_at timestamptz NOT NULL)"
        )
        with conn.cursor() as cur:
            cur.executemany(f'INSERT INTO "{pg_schema}".events VALUES (%s, %s, %s)', BEFORE_CUT)

    def insert_late() -> None:
        with psycopg.connect(pg_available, autocommit=True) as conn, conn.cursor() as cur:
            cur.executemany(f'INSERT INTO "{pg_schema}".events VALUES (%s, %s, %s)', AFTER_CUT)

    source = {"kind": "postgres_table", "url": pg_available, "table": f"{pg_schema}.events"}
    _retry_after_source_moved_on(tmp_path, source, insert_late)


def _mariadb(dsn: str) -> Any:
    import pymysql

    parts = urlsplit(dsn)
    return pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.path.lstrip("/"),
        autocommit=True,
    )


def _naive(rows: list[tuple[int, str | None, datetime]]) -> list[tuple[Any, ...]]:
    return [(i, b, t.replace(tzinfo=None)) for i, b, t in rows]


def test_mariadb_source_retry_ignores_rows_after_the_cut(
    tmp_path: Path, mariadb_database: str
) -> None:
    """MariaDB table (DATETIME(6) cursor, UTC): a retry reads exactly the first cut."""
    conn = _mariadb(mariadb_database)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE events (id INT PRIMARY KEY, body TEXT, "
                "updated_at DATETIME(6) NOT NULL)"
            )
            cur.executemany("INSERT INTO events VALUES (%s, %s, %s)", _naive(BEFORE_CUT))
    finally:
        conn.close()

    def insert_late() -> None:
        late = _mariadb(mariadb_database)
        try:
            with late.cursor() as cur:
                cur.executemany("INSERT INTO events VALUES (%s, %s, %s)", _naive(AFTER_CUT))
        finally:
            late.close()

    source = {"kind": "mariadb_table", "url": mariadb_database, "table": "events"}
    _retry_after_source_moved_on(tmp_path, source, insert_late)


def test_a_missing_source_table_is_a_clear_error(tmp_path: Path, pg_available: str) -> None:
    """A table that does not exist fails with DPONE_SOURCE_INVALID, before any write."""
    source = {"kind": "postgres_table", "url": pg_available, "table": "no_such_schema.nothing"}
    with Runner(_workload(tmp_path, source)) as runner, pytest.raises(SourceInvalid):
        runner.run(interval=DAY1)


# ---------------------------------------------------------------------- Parquet
def _parquet(path: Path, ids: list[int]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "body": pa.array([f"row {i}" if i % 2 else None for i in ids], pa.string()),
            "updated_at": pa.array(
                [datetime(2026, 11, 1, i % 24, tzinfo=UTC) for i in ids], pa.timestamp("us", "UTC")
            ),
            "amount": pa.array([i * 1.5 for i in ids], pa.float64()),
        }
    )
    pq.write_table(table, path, row_group_size=3)


def test_parquet_streams_record_batches_and_is_content_hashed(tmp_path: Path) -> None:
    """Rows arrive batch by batch; new content under the same operation is a conflict."""
    _parquet(tmp_path / "events.parquet", list(range(1, 8)))
    w = _workload(tmp_path, {"kind": "parquet", "path": "events.parquet"})
    seen: list[int] = []
    with Runner(w) as runner:
        result = runner.run(interval=DAY1, on_rows=seen.append)
    assert result.rows_written == 7
    assert seen == [2, 2, 2, 1]  # batch_size 2: streamed, never the whole file at once
    with sqlite3.connect(tmp_path / "wh.db") as conn:
        rows = conn.execute(
            "SELECT id, body, updated_at, amount FROM events ORDER BY id"
        ).fetchall()
    assert rows[0] == (1, "row 1", "2026-11-01 01:00:00+00:00", 1.5)
    assert rows[1][1] is None
    _parquet(tmp_path / "events.parquet", list(range(1, 9)))
    with Runner(w) as runner, pytest.raises(IntentConflict):
        runner.run(interval=DAY1)


def test_source_credentials_never_reach_the_journal_or_errors(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """A password in the source URL is in no journal byte and no error message."""
    import psycopg

    with psycopg.connect(pg_available, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg_schema}".events (id int, updated_at timestamptz)')
        conn.execute(f"INSERT INTO \"{pg_schema}\".events VALUES (1, '2026-11-01 01:00+00')")
    parts = urlsplit(pg_available)
    canary = "CanaryPassw0rd"
    user = parts.username or "postgres"
    url = f"postgresql://{user}:{canary}@{parts.hostname}:{parts.port}{parts.path}"
    source = {"kind": "postgres_table", "url": url, "table": f"{pg_schema}.events"}
    with Runner(_workload(tmp_path, source)) as runner:
        assert runner.run(interval=DAY1).rows_written == 1
    journal_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("journal.db*"))
    assert canary.encode() not in journal_bytes
    unreachable = {**source, "url": f"postgresql://u:{canary}@127.0.0.1:1/nope"}
    with (
        Runner(_workload(tmp_path, unreachable)) as runner,
        pytest.raises(SourceUnavailable) as caught,
    ):
        runner.run(interval=DAY1)
    assert canary not in str(caught.value)
    assert canary not in repr(caught.value.attrs())


# ------------------------------------------------- unreachable vs invalid sources
def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _read(kind: str, url: str) -> None:
    source = SqlTableSource(
        kind, url=url, table="events", cursor_column="updated_at", interval=parse_interval(DAY1)
    )
    list(source.batches(batch_size=10, expected_identity=source.snapshot_identity()))


def test_an_unreachable_source_server_is_transient_a_wrong_database_is_not(
    pg_available: str, mariadb_available: str
) -> None:
    """Refused connection: DPONE_SOURCE_UNAVAILABLE (retried); unknown database: INVALID."""
    port = _closed_port()
    pg = urlsplit(pg_available)
    maria = urlsplit(mariadb_available)
    with pytest.raises(SourceUnavailable) as down:
        _read("postgres_table", f"postgresql://postgres@127.0.0.1:{port}/test")
    assert down.value.retryable
    with pytest.raises(SourceUnavailable):
        _read("mariadb_table", f"mysql://root@127.0.0.1:{port}/test")
    with pytest.raises(SourceInvalid) as wrong:
        _read("postgres_table", pg._replace(path="/dpone_no_such_db").geturl())
    assert not wrong.value.retryable
    with pytest.raises(SourceInvalid):
        _read("mariadb_table", maria._replace(path="/dpone_no_such_db").geturl())


def test_a_locked_sqlite_source_is_transient_a_missing_table_is_not(tmp_path: Path) -> None:
    """Real SQLite errors: SQLITE_BUSY is DPONE_SOURCE_UNAVAILABLE, no such table is INVALID."""
    from dpone.adapters.sources.sql import _failed, _sqlite_transient

    db = tmp_path / "src.db"
    with closing(sqlite3.connect(db, isolation_level=None)) as holder:
        holder.execute("CREATE TABLE other (id int)")
        holder.execute("BEGIN EXCLUSIVE")  # rollback-journal mode: readers are locked out
        with closing(sqlite3.connect(db, timeout=0)) as reader:
            with pytest.raises(sqlite3.OperationalError) as busy:
                reader.execute("SELECT * FROM other").fetchall()
            with pytest.raises(sqlite3.OperationalError) as missing:
                sqlite3.connect(":memory:").execute("SELECT * FROM events")
        holder.execute("ROLLBACK")
    assert isinstance(
        _failed("sqlite_table", "sqlite:x", busy.value, _sqlite_transient(busy.value)),
        SourceUnavailable,
    )
    assert not _sqlite_transient(missing.value)
    with pytest.raises(SourceInvalid):
        _read("sqlite_table", str(db))  # the table does not exist
