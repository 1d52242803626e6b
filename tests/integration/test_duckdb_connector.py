"""DuckDbConnector against real DuckDB files: identifiers, strategies, values, errors, locks."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dpone.contracts.fence import FenceStatus
from dpone.contracts.identity import Interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy, MutationReport
from dpone.errors import (
    ConfigInvalid,
    FenceUnavailable,
    TargetSchemaMismatch,
    TargetWriteFailed,
)

duckdb = pytest.importorskip("duckdb")

from dpone.adapters.connectors.duckdb import DuckDbConnector  # noqa: E402

HOSTILE = 'x"; DROP TABLE y; --'
COLUMNS = (
    Column(name="id", type=ColumnType.INTEGER),
    Column(name="name", type=ColumnType.TEXT),
    Column(name="amount", type=ColumnType.REAL),
)
DAY1 = Interval(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 2, tzinfo=UTC))
_counter = iter(range(1, 1_000_000))


def _op() -> tuple[str, str]:
    n = next(_counter)
    return (
        "sha256:" + hashlib.sha256(f"op{n}".encode()).hexdigest(),
        "sha256:" + hashlib.sha256(f"intent{n}".encode()).hexdigest(),
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "target.duckdb"


@pytest.fixture
def connector(db: Path) -> Iterator[DuckDbConnector]:
    connector = DuckDbConnector(db, table="items")
    yield connector
    connector.close()


def _plan(strategy: LoadStrategy = LoadStrategy.APPEND, **kwargs: Any) -> LoadPlan:
    return LoadPlan(
        table=kwargs.pop("table", "items"),
        strategy=strategy,
        columns=kwargs.pop("columns", COLUMNS),
        **kwargs,
    )


def _load(
    connector: DuckDbConnector, rows: Sequence[Sequence[object]], plan: LoadPlan | None = None
) -> tuple[str, MutationReport]:
    op, intent = _op()
    report = connector.mutate(
        operation_id=op,
        intent_digest=intent,
        epoch=1,
        plan=plan or _plan(),
        batches=[list(rows)],
        content_digest="sha256:x",
        prepare=True,
    )
    return op, report


def _query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(db)) as conn:
        rows: list[tuple[Any, ...]] = conn.execute(sql).fetchall()
        return rows


@pytest.mark.parametrize(
    "table", [HOSTILE, "a.b.c", "other.items", "dpone_fence", "duckdb_tables", "", "1x"]
)
def test_hostile_or_reserved_table_names_are_refused(db: Path, table: str) -> None:
    with pytest.raises(ConfigInvalid):
        DuckDbConnector(db, table=table)
    assert not db.exists()


def test_hostile_column_name_is_refused_before_any_write(connector: DuckDbConnector) -> None:
    plan = _plan(columns=(Column(name=HOSTILE, type=ColumnType.TEXT),))
    with pytest.raises(ConfigInvalid):
        _load(connector, [("x",)], plan)
    assert not connector.path.exists()


def test_identities(connector: DuckDbConnector, db: Path) -> None:
    assert connector.kind == "duckdb"
    assert connector.database_locator() == f"duckdb:{db.resolve()}"
    assert DuckDbConnector(db, table="main.Items").target_identity() == (
        f"duckdb:{db.resolve()}#items"
    )


def test_observe_and_check_plan_on_a_missing_file_create_nothing(
    connector: DuckDbConnector, db: Path
) -> None:
    assert connector.observe(operation_id=_op()[0]).status is FenceStatus.ABSENT
    connector.check_plan(_plan())
    assert list(db.parent.iterdir()) == []


def test_observe_from_a_fresh_connector_reads_without_writing(
    connector: DuckDbConnector, db: Path
) -> None:
    op, _ = _load(connector, [(1, "a", 1.5)])
    connector.close()
    before = sorted(p.name for p in db.parent.iterdir())
    reader = DuckDbConnector(db, table="items")
    seen = reader.observe(operation_id=op)
    reader.close()
    assert (seen.status, seen.row_count) == (FenceStatus.COMMITTED, 1)
    assert sorted(p.name for p in db.parent.iterdir()) == before


def test_values_round_trip_nulls_quotes_unicode_and_timestamps(
    connector: DuckDbConnector, db: Path
) -> None:
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="txt", type=ColumnType.TEXT),
        Column(name="r", type=ColumnType.REAL),
        Column(name="b", type=ColumnType.BOOLEAN),
        Column(name="at", type=ColumnType.TIMESTAMP),
    )
    rows = [
        (1, 'quote " and, comma', 0.1, True, "2026-11-01T10:00:00Z"),
        (2, "line\nbreak\r\nand 'single'", -2.5e300, False, "2026-11-01 10:00:00"),
        (3, "ünïcødé 数据 🚀", None, None, None),
        (4, "", "", "", ""),
        (5, None, 3, 1, datetime(2026, 11, 1, 12, 0, tzinfo=UTC)),
    ]
    _load(connector, rows, _plan(columns=columns))
    connector.close()
    got = _query(db, 'SELECT id, txt, r, b, "at" FROM items ORDER BY id')
    ten = datetime(2026, 11, 1, 10, 0, tzinfo=UTC)
    assert [(r[0], r[1], r[2], r[3]) for r in got] == [
        (1, 'quote " and, comma', 0.1, True),
        (2, "line\nbreak\r\nand 'single'", -2.5e300, False),
        (3, "ünïcødé 数据 🚀", None, None),
        (4, None, None, None),
        (5, None, 3.0, True),
    ]
    moments = [r[4] for r in got]
    assert moments[:2] == [ten, ten]
    assert moments[2:4] == [None, None]
    assert moments[4] == datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def test_a_type_error_names_the_column_writes_nothing_and_leaks_no_value(
    connector: DuckDbConnector, db: Path
) -> None:
    private = "pr1vate-value"
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetWriteFailed) as caught:
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=_plan(),
            batches=[[(1, "a", 1.0)], [(2, "b", private)]],
            content_digest="sha256:x",
        )
    text = str(caught.value)
    assert "amount" in text
    assert private not in text
    assert "INSERT" not in text
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED
    connector.close()
    assert _query(db, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'items'") == [(0,)]


def test_a_merge_key_null_is_rejected(connector: DuckDbConnector, db: Path) -> None:
    plan = _plan(LoadStrategy.MERGE, key=("id",))
    with pytest.raises(TargetWriteFailed):
        _load(connector, [(1, "a", 1.0), (None, "b", 2.0)], plan)


def test_schema_mismatch_on_an_existing_table(connector: DuckDbConnector, db: Path) -> None:
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE items (id BIGINT, name VARCHAR, must BIGINT NOT NULL)")
    with pytest.raises(TargetSchemaMismatch):
        connector.check_plan(_plan())
    with pytest.raises(TargetSchemaMismatch):
        _load(connector, [(1, "a", 1.0)])


def test_merge_updates_by_key_and_the_last_repeat_wins(
    connector: DuckDbConnector, db: Path
) -> None:
    plan = _plan(LoadStrategy.MERGE, key=("id",))
    _load(connector, [(1, "a", 1.0), (2, "b", 2.0)], plan)
    _load(connector, [(2, "old", 0.0), (3, "c", 3.0), (2, "new", 20.0)], plan)
    connector.close()
    assert _query(db, "SELECT id, name, amount FROM items ORDER BY id") == [
        (1, "a", 1.0),
        (2, "new", 20.0),
        (3, "c", 3.0),
    ]


def test_merge_into_a_table_without_a_unique_key_replaces_by_key(
    connector: DuckDbConnector, db: Path
) -> None:
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE items (id BIGINT, name VARCHAR, amount DOUBLE)")
        conn.execute("INSERT INTO items VALUES (1, 'a', 1), (2, 'b', 2), (2, 'b2', 2)")
    _load(connector, [(2, "B", 5.0), (4, "d", 4.0)], _plan(LoadStrategy.MERGE, key=("id",)))
    connector.close()
    assert _query(db, "SELECT id, name FROM items ORDER BY id") == [
        (1, "a"),
        (2, "B"),
        (4, "d"),
    ]


def test_replace_and_replace_interval(connector: DuckDbConnector, db: Path) -> None:
    columns = (*COLUMNS, Column(name="at", type=ColumnType.TIMESTAMP))
    _load(connector, [(9, "gone", 0.0, "2026-10-01T00:00:00Z")], _plan(columns=columns))
    replace = _plan(LoadStrategy.REPLACE, columns=columns)
    _load(
        connector,
        [
            (1, "day1", 1.0, "2026-11-01T00:00:00Z"),
            (2, "day1 late", 1.0, "2026-11-01 23:59:59.999"),
            (3, "day2", 1.0, "2026-11-02T00:00:00+00:00"),
        ],
        replace,
    )
    interval = _plan(
        LoadStrategy.REPLACE_INTERVAL, columns=columns, interval_column="at", interval=DAY1
    )
    _, report = _load(connector, [(4, "new day1", 1.0, "2026-11-01T12:00:00Z")], interval)
    assert report.row_count == 1
    connector.close()
    assert _query(db, "SELECT id FROM items ORDER BY id") == [(3,), (4,)]


def test_an_empty_load_commits_the_fence(connector: DuckDbConnector) -> None:
    op, report = _load(connector, [])
    assert report.row_count == 0
    seen = connector.observe(operation_id=op)
    assert (seen.status, seen.row_count) == (FenceStatus.COMMITTED, 0)


_HOLDER = """
import sys, duckdb
conn = duckdb.connect(sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
conn.close()
"""


def test_a_file_held_by_another_process_is_unavailable_within_the_bound(db: Path) -> None:
    DuckDbConnector(db, table="items").close()  # nothing created yet: make the file
    with duckdb.connect(str(db)):
        pass
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        connector = DuckDbConnector(db, table="items", lock_timeout_s=0.5)
        op = _op()[0]
        started = time.monotonic()
        with pytest.raises(FenceUnavailable) as caught:
            connector.seal(operation_id=op, epoch=2)
        elapsed = time.monotonic() - started
        assert 0.5 <= elapsed < 3.0
        assert caught.value.retryable
        assert "another process" in str(caught.value)
        with pytest.raises(FenceUnavailable):
            connector.observe(operation_id=op)
        connector.close()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    # Once the holder is gone, the same connector class takes the file.
    connector = DuckDbConnector(db, table="items", lock_timeout_s=0.5)
    try:
        assert connector.seal(operation_id=op, epoch=2).outcome.value == "not_committed"
    finally:
        connector.close()


def test_observe_while_another_connector_of_this_process_writes(
    connector: DuckDbConnector, db: Path
) -> None:
    op, _ = _load(connector, [(1, "a", 1.0)])
    other = DuckDbConnector(db, table="items", lock_timeout_s=0.5)
    try:
        started = time.monotonic()
        seen = other.observe(operation_id=op)
        assert time.monotonic() - started < 0.5
        assert (seen.status, seen.row_count) == (FenceStatus.COMMITTED, 1)
    finally:
        other.close()
