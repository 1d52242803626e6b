"""SqliteConnector against real SQLite files: schema checks, identifiers, strategies, errors."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from dpone.adapters.connectors.sqlite import SqliteConnector
from dpone.contracts.fence import FenceCapability, FenceStatus
from dpone.contracts.identity import Interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy, MutationReport
from dpone.errors import (
    ConfigInvalid,
    DponeError,
    FenceUnavailable,
    TargetSchemaMismatch,
    TargetWriteFailed,
)

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


def _plan(
    table: str = "items", strategy: LoadStrategy = LoadStrategy.APPEND, **kw: Any
) -> LoadPlan:
    return LoadPlan(table=table, strategy=strategy, columns=kw.pop("columns", COLUMNS), **kw)


def _load(
    connector: SqliteConnector,
    batches: Sequence[Sequence[tuple[object, ...]]],
    plan: LoadPlan | None = None,
    *,
    epoch: int = 1,
    **kw: Any,
) -> tuple[str, MutationReport]:
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=epoch)
    report = connector.mutate(
        operation_id=op,
        intent_digest=intent,
        epoch=epoch,
        plan=plan or _plan(),
        batches=[list(b) for b in batches],
        content_digest="sha256:" + "c" * 64,
        **kw,
    )
    return op, report


def _query(path: Path, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute(sql, params).fetchall()


def _exec(path: Path, *statements: str) -> None:
    with closing(sqlite3.connect(path)) as db:
        for statement in statements:
            db.execute(statement)
        db.commit()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "target.db"


@pytest.fixture
def connector(db: Path) -> Iterator[SqliteConnector]:
    connector = SqliteConnector(db)
    yield connector
    connector.close()


# ----------------------------------------------------------------- identity and identifiers


def test_identity_and_locator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """target_identity is sqlite:<abs path>#<table>; the locator is the journal's format."""
    monkeypatch.chdir(tmp_path)
    connector = SqliteConnector("sub/../t.db", table="main.Orders")
    absolute = str((tmp_path / "t.db").resolve())
    assert connector.kind == "sqlite"
    assert connector.capability is FenceCapability.TRANSACTIONAL_MARKER
    assert connector.database_locator() == f"sqlite:{absolute}"
    assert connector.target_identity() == f"sqlite:{absolute}#orders"
    assert SqliteConnector(absolute, table="orders").target_identity() == (
        connector.target_identity()
    )


def test_locator_is_recognised_by_the_sqlite_journal(tmp_path: Path) -> None:
    """The SQLite journal on the same file recognises the locator: atomic mode is detected."""
    from dpone.adapters.journal.sqlite import SqliteCommitJournal

    journal = SqliteCommitJournal(tmp_path / "both.db")
    try:
        assert journal.shares_database_with(
            SqliteConnector(tmp_path / "both.db").database_locator()
        )
        assert not journal.shares_database_with(
            SqliteConnector(tmp_path / "other.db").database_locator()
        )
    finally:
        journal.close()


@pytest.mark.parametrize(
    "table", [HOSTILE, "a.b.c", "", "1abc", "temp.items", "other.items", "dpone_fence", "sqlite_x"]
)
def test_bad_table_names_are_refused_without_echo(db: Path, table: str) -> None:
    """Hostile, qualified-elsewhere or reserved table names are ConfigInvalid; no SQL runs."""
    _exec(db, "CREATE TABLE y (a)")
    with pytest.raises(ConfigInvalid) as caught:
        SqliteConnector(db, table=table)
    if table == HOSTILE:
        assert table not in str(caught.value)
    connector = SqliteConnector(db)
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(ConfigInvalid):
        connector.check_plan(_plan(table))
    with pytest.raises(ConfigInvalid):
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=_plan(table),
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        )
    assert _query(db, "SELECT name FROM sqlite_master WHERE name = 'y'") == [("y",)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED


def test_hostile_column_name_is_refused(connector: SqliteConnector) -> None:
    """A column name that is not an identifier is ConfigInvalid and is not echoed."""
    plan = _plan(columns=(Column(name=HOSTILE, type=ColumnType.TEXT),))
    with pytest.raises(ConfigInvalid) as caught:
        connector.check_plan(plan)
    assert HOSTILE not in str(caught.value)


def test_plan_table_must_match_the_configured_table(db: Path) -> None:
    """A connector built for one table refuses a plan for another (its identity would lie)."""
    connector = SqliteConnector(db, table="orders")
    connector.check_plan(_plan("main.ORDERS"))
    with pytest.raises(ConfigInvalid):
        connector.check_plan(_plan("items"))


def test_memory_database_is_refused() -> None:
    """:memory: cannot hold a fence across connections."""
    with pytest.raises(ConfigInvalid):
        SqliteConnector(":memory:")


# ----------------------------------------------------------------- schema


def test_check_plan_on_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    """check_plan and observe are read-only: a missing file and directory stay missing."""
    path = tmp_path / "dir" / "t.db"
    connector = SqliteConnector(path)
    connector.check_plan(_plan())
    assert connector.observe(operation_id=_op()[0]).status is FenceStatus.ABSENT
    assert not path.parent.exists()


def test_schema_mismatch_is_found_before_any_write(db: Path, connector: SqliteConnector) -> None:
    """An existing table without a planned column fails check_plan, naming table and columns."""
    _exec(db, "CREATE TABLE items (id INTEGER, other TEXT)")
    with pytest.raises(TargetSchemaMismatch) as caught:
        connector.check_plan(_plan())
    message = str(caught.value)
    assert "'items'" in message
    assert "'name'" in message
    assert "'amount'" in message
    assert "'id'" not in message
    assert _query(db, "SELECT name FROM sqlite_master WHERE name = 'dpone_fence'") == []


def test_mutate_rechecks_the_schema_and_writes_nothing(
    db: Path, connector: SqliteConnector
) -> None:
    """A table changed after check_plan is caught inside the transaction: 0 rows, fence kept."""
    _exec(db, "CREATE TABLE items (id INTEGER)")
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetSchemaMismatch):
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=_plan(),
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        )
    assert _query(db, "SELECT count(*) FROM items") == [(0,)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED


def test_column_names_match_case_insensitively(db: Path, connector: SqliteConnector) -> None:
    """SQLite names are case-insensitive, so ID matches id."""
    _exec(db, "CREATE TABLE items (ID INTEGER, Name TEXT, AMOUNT REAL)")
    connector.check_plan(_plan())
    _load(connector, [[(1, "a", 2.0)]])
    assert _query(db, "SELECT * FROM items") == [(1, "a", 2.0)]


def test_created_table_uses_the_plan_types(db: Path, connector: SqliteConnector) -> None:
    """A missing table is created with the mapped types; a merge key becomes NOT NULL UNIQUE."""
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="r", type=ColumnType.REAL),
        Column(name="t", type=ColumnType.TEXT),
        Column(name="b", type=ColumnType.BOOLEAN),
        Column(name="ts", type=ColumnType.TIMESTAMP),
    )
    _load(connector, [], _plan(strategy=LoadStrategy.MERGE, columns=columns, key=("id",)))
    info = _query(db, "SELECT name, type, \"notnull\", pk FROM pragma_table_info('items')")
    assert info == [
        ("id", "INTEGER", 1, 0),
        ("r", "REAL", 0, 0),
        ("t", "TEXT", 0, 0),
        ("b", "INTEGER", 0, 0),
        ("ts", "TEXT", 0, 0),
    ]
    unique = _query(
        db, "SELECT name FROM pragma_index_info((SELECT name FROM pragma_index_list('items')))"
    )
    assert unique == [("id",)]


def test_missing_directory_is_created_on_first_write(tmp_path: Path) -> None:
    """The file's directory is created by the first write."""
    connector = SqliteConnector(tmp_path / "a" / "b" / "t.db")
    _load(connector, [[(1, "a", 1.0)]])
    assert _query(tmp_path / "a" / "b" / "t.db", "SELECT count(*) FROM items") == [(1,)]
    assert _query(tmp_path / "a" / "b" / "t.db", "PRAGMA journal_mode") == [("wal",)]


# ----------------------------------------------------------------- values and strategies


def test_empty_strings_become_null(db: Path, connector: SqliteConnector) -> None:
    """'' is stored as NULL in every column type; '0', ' ' and 0 are kept."""
    _load(connector, [[("1", "", ""), ("", " ", "0"), ("0", "x", 0)]])
    assert _query(db, "SELECT id, name, amount FROM items ORDER BY rowid") == [
        (1, None, None),
        (None, " ", 0.0),
        (0, "x", 0.0),
    ]


def test_row_count_spans_statement_groups(db: Path, connector: SqliteConnector) -> None:
    """Batches of odd sizes (grouped statements plus remainders) insert every row in order."""
    sizes = [199, 200, 201, 499, 500, 501, 1, 0, 1200]  # around the 500-row statements
    start, batches = 0, []
    for size in sizes:
        batches.append([(i, f"n{i}", i / 2) for i in range(start, start + size)])
        start += size
    op, report = _load(connector, batches)
    assert report.row_count == sum(sizes)
    rows = _query(db, "SELECT id, name, amount FROM items ORDER BY rowid")
    assert rows == [(i, f"n{i}", i / 2) for i in range(sum(sizes))]
    assert connector.observe(operation_id=op).row_count == sum(sizes)


def test_empty_load_commits_a_zero_row_fence(db: Path, connector: SqliteConnector) -> None:
    """No rows still commits: the table exists and the fence says 0 rows."""
    op, report = _load(connector, [])
    assert report.row_count == 0
    assert _query(db, "SELECT count(*) FROM items") == [(0,)]
    seen = connector.observe(operation_id=op)
    assert (seen.status, seen.row_count) == (FenceStatus.COMMITTED, 0)


def test_merge_upserts_into_a_created_table(db: Path, connector: SqliteConnector) -> None:
    """Merge inserts new keys, updates existing ones; the last duplicate in a load wins."""
    plan = _plan(strategy=LoadStrategy.MERGE, key=("id",))
    _load(connector, [[(1, "a", 1.0), (2, "b", 2.0)]], plan)
    _load(connector, [[(2, "B", 20.0), (3, "c", 3.0), (3, "C", 30.0)]], plan)
    assert _query(db, "SELECT * FROM items ORDER BY id") == [
        (1, "a", 1.0),
        (2, "B", 20.0),
        (3, "C", 30.0),
    ]


def test_merge_adds_a_unique_index_to_an_existing_table(
    db: Path, connector: SqliteConnector
) -> None:
    """An existing table without a unique key on the merge key gets one, then upserts."""
    _exec(
        db,
        "CREATE TABLE items (id INTEGER, name TEXT, amount REAL)",
        "INSERT INTO items VALUES (1, 'a', 1)",
    )
    plan = _plan(strategy=LoadStrategy.MERGE, key=("id",))
    connector.check_plan(plan)
    _load(connector, [[(1, "A", 10.0), (2, "b", 2.0)]], plan)
    assert _query(db, "SELECT * FROM items ORDER BY id") == [(1, "A", 10.0), (2, "b", 2.0)]
    unique = _query(db, "SELECT count(*) FROM pragma_index_list('items') WHERE \"unique\" = 1")
    assert unique == [(1,)]


def test_merge_uses_an_integer_primary_key(db: Path, connector: SqliteConnector) -> None:
    """A rowid-alias INTEGER PRIMARY KEY already makes the key unique: no index is added."""
    _exec(db, "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, amount REAL)")
    plan = _plan(strategy=LoadStrategy.MERGE, key=("id",))
    _load(connector, [[(1, "a", 1.0)]], plan)
    _load(connector, [[(1, "b", 2.0)]], plan)
    assert _query(db, "SELECT * FROM items") == [(1, "b", 2.0)]
    assert _query(db, "SELECT count(*) FROM pragma_index_list('items')") == [(0,)]


def test_merge_on_a_composite_key_in_another_order(db: Path, connector: SqliteConnector) -> None:
    """A unique index on (b, a) serves a merge keyed on (a, b)."""
    columns = (
        Column(name="a", type=ColumnType.INTEGER),
        Column(name="b", type=ColumnType.TEXT),
        Column(name="v", type=ColumnType.REAL),
    )
    _exec(
        db,
        "CREATE TABLE items (a INTEGER, b TEXT, v REAL)",
        "CREATE UNIQUE INDEX u ON items (b, a)",
    )
    plan = _plan(strategy=LoadStrategy.MERGE, columns=columns, key=("a", "b"))
    _load(connector, [[(1, "x", 1.0), (1, "y", 2.0)]], plan)
    _load(connector, [[(1, "x", 5.0)]], plan)
    assert _query(db, "SELECT * FROM items ORDER BY a, b") == [(1, "x", 5.0), (1, "y", 2.0)]
    assert _query(db, "SELECT count(*) FROM pragma_index_list('items')") == [(1,)]


def test_merge_with_existing_duplicate_keys_fails_clearly(
    db: Path, connector: SqliteConnector
) -> None:
    """Duplicates already in the table make the key un-uniqueable: TargetWriteFailed, 0 rows."""
    _exec(
        db,
        "CREATE TABLE items (id INTEGER, name TEXT, amount REAL)",
        "INSERT INTO items VALUES (1, 'secret-value', 1), (1, 'b', 2)",
    )
    plan = _plan(strategy=LoadStrategy.MERGE, key=("id",))
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetWriteFailed, match=r"same merge key") as caught:
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=plan,
            batches=[[(2, "c", 3.0)]],
            content_digest="d",
        )
    assert "secret-value" not in str(caught.value)
    assert caught.value.hint
    assert _query(db, "SELECT count(*) FROM items") == [(2,)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED


def test_merge_null_key_is_rejected(connector: SqliteConnector) -> None:
    """An empty merge key value (NULL) is refused by the created table: TargetWriteFailed."""
    plan = _plan(strategy=LoadStrategy.MERGE, key=("id",))
    with pytest.raises(TargetWriteFailed, match="NOTNULL"):
        _load(connector, [[("", "a", 1.0)]], plan)


def test_replace_empties_the_table_first(db: Path, connector: SqliteConnector) -> None:
    """Replace deletes every row, including ones another writer put there, then inserts."""
    _load(connector, [[(1, "a", 1.0), (2, "b", 2.0)]])
    _exec(db, "INSERT INTO items VALUES (9, 'z', 9)")
    _load(connector, [[(3, "c", 3.0)]], _plan(strategy=LoadStrategy.REPLACE))
    assert _query(db, "SELECT id FROM items") == [(3,)]


def test_replace_interval_handles_mixed_timestamp_formats(
    db: Path, connector: SqliteConnector
) -> None:
    """Rows in [start, end) are replaced whatever their ISO spelling; the rest stay."""
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="at", type=ColumnType.TIMESTAMP),
    )
    _exec(db, "CREATE TABLE items (id INTEGER, at TEXT)")
    existing = [
        (1, "2026-10-31T23:59:59Z"),  # before
        (2, "2026-11-01 00:00:00"),  # start: inside
        (3, "2026-11-01T10:00:00Z"),
        (4, "2026-11-01T12:00:00+02:00"),  # 10:00 UTC
        (5, "2026-11-01 23:59:59.999"),
        (6, "2026-11-02T00:00:00Z"),  # end: outside
        (7, "2026-11-02T01:00:00+02:00"),  # 23:00 UTC on Nov 1: inside
        (8, "2026-11-01"),  # a date: midnight, inside
        (9, None),
        (10, "not a time"),
    ]
    with closing(sqlite3.connect(db)) as raw:
        raw.executemany("INSERT INTO items VALUES (?, ?)", existing)
        raw.commit()
    plan = _plan(
        strategy=LoadStrategy.REPLACE_INTERVAL, columns=columns, interval_column="at", interval=DAY1
    )
    _load(connector, [[(100, "2026-11-01T05:00:00Z")]], plan)
    assert [r[0] for r in _query(db, "SELECT id FROM items ORDER BY id")] == [1, 6, 9, 10, 100]


def test_replace_interval_with_offset_bounds(db: Path, connector: SqliteConnector) -> None:
    """Interval bounds given in another zone are compared in UTC."""
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="at", type=ColumnType.TIMESTAMP),
    )
    plus2 = timezone(timedelta(hours=2))
    interval = Interval(
        start=datetime(2026, 11, 1, 2, tzinfo=plus2), end=datetime(2026, 11, 1, 3, tzinfo=plus2)
    )  # [00:00, 01:00) UTC
    plan = _plan(
        strategy=LoadStrategy.REPLACE_INTERVAL,
        columns=columns,
        interval_column="at",
        interval=interval,
    )
    _load(connector, [[(1, "2026-11-01T00:30:00Z"), (2, "2026-11-01 01:00:00")]], plan)
    _load(connector, [[(3, "2026-11-01T00:45:00Z")]], plan)
    assert [r[0] for r in _query(db, "SELECT id FROM items ORDER BY id")] == [2, 3]


def test_strategy_requirements_are_config_errors(connector: SqliteConnector) -> None:
    """merge without a key, replace_interval without interval or column: ConfigInvalid."""
    for plan in (
        _plan(strategy=LoadStrategy.MERGE),
        _plan(strategy=LoadStrategy.MERGE, key=("nope",)),
        _plan(strategy=LoadStrategy.REPLACE_INTERVAL, interval_column="id"),
        _plan(strategy=LoadStrategy.REPLACE_INTERVAL, interval=DAY1),
        _plan(columns=()),
        _plan(columns=(COLUMNS[0], COLUMNS[0])),
    ):
        with pytest.raises(ConfigInvalid):
            connector.check_plan(plan)


# ----------------------------------------------------------------- atomic mode


def test_within_gets_the_open_connection_on_the_same_file(
    db: Path, connector: SqliteConnector
) -> None:
    """within() writes on the target's transaction: its rows commit with the data."""

    def journal_write(txn: object) -> None:
        assert isinstance(txn, sqlite3.Connection)
        assert txn.in_transaction
        path = txn.execute("SELECT file FROM pragma_database_list WHERE name = 'main'").fetchone()
        assert Path(path[0]) == db.resolve()
        txn.execute("CREATE TABLE IF NOT EXISTS journal_side (n INTEGER)")
        txn.execute("INSERT INTO journal_side VALUES (1)")

    _load(connector, [[(1, "a", 1.0)]], within=journal_write)
    assert _query(db, "SELECT n FROM journal_side") == [(1,)]


def test_within_raising_rolls_back_its_own_writes_too(db: Path, connector: SqliteConnector) -> None:
    """A failing within() takes the rows, the fence and its own writes back."""

    def journal_write(txn: object) -> None:
        assert isinstance(txn, sqlite3.Connection)
        txn.execute("CREATE TABLE journal_side (n INTEGER)")
        raise DponeError("journal conflict")

    with pytest.raises(DponeError, match="journal conflict"):
        _load(connector, [[(1, "a", 1.0)]], within=journal_write)
    names = {r[0] for r in _query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert names == {"dpone_fence"}


# ----------------------------------------------------------------- error translation


def _assert_safe(error: DponeError, *secrets: str) -> None:
    text = str(error) + repr(error.attrs())
    for word in ("INSERT", "SELECT", "DELETE", "VALUES", *secrets):
        assert word not in text


def test_constraint_violation_is_target_write_failed(db: Path, connector: SqliteConnector) -> None:
    """A CHECK constraint rejecting a row is TargetWriteFailed without SQL or the value."""
    _exec(
        db,
        "CREATE TABLE items (id INTEGER, name TEXT CHECK (name <> 'forbidden-1234'), amount REAL)",
    )
    with pytest.raises(TargetWriteFailed, match="CONSTRAINT_CHECK") as caught:
        _load(connector, [[(1, "ok", 1.0), (2, "forbidden-1234", 2.0)]])
    _assert_safe(caught.value, "forbidden-1234", "CHECK (")
    assert _query(db, "SELECT count(*) FROM items") == [(0,)]


def test_unique_violation_names_only_the_column(db: Path, connector: SqliteConnector) -> None:
    """A UNIQUE violation names table.column, never the duplicated value."""
    _exec(db, "CREATE TABLE items (id INTEGER UNIQUE, name TEXT, amount REAL)")
    with pytest.raises(TargetWriteFailed, match=r"items\.id") as caught:
        _load(connector, [[(424242, "a", 1.0), (424242, "b", 2.0)]])
    _assert_safe(caught.value, "424242")


@pytest.mark.parametrize(
    "row",
    [(2**70, "a", 1.0), (1, {"nested": "secret-v"}, 1.0), (1, "a"), (1, "a", 1.0, "extra")],
    ids=["int-overflow", "unsupported-type", "too-few", "too-many"],
)
def test_unstorable_rows_are_target_write_failed(
    db: Path, connector: SqliteConnector, row: tuple[object, ...]
) -> None:
    """Values SQLite cannot bind and rows of the wrong width never escape as raw errors."""
    with pytest.raises(TargetWriteFailed) as caught:
        _load(connector, [[(0, "fine", 0.0)], [row]])
    _assert_safe(caught.value, "secret-v", str(2**70))
    assert _query(db, "SELECT count(*) FROM dpone_fence WHERE state = 'committed'") == [(0,)]


def test_a_locked_database_is_fence_unavailable(db: Path) -> None:
    """Another writer holding the lock past the bound gives FenceUnavailable (retryable)."""
    fast = SqliteConnector(db, lock_timeout_s=0.1)
    fast.observe(operation_id=_op()[0])
    _load(SqliteConnector(db), [[(1, "a", 1.0)]])  # creates the file in WAL mode
    with closing(sqlite3.connect(db, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        op, intent = _op()
        for call in (
            lambda: fast.prepare(operation_id=op, intent_digest=intent, epoch=1),
            lambda: fast.seal(operation_id=op, epoch=1),
        ):
            with pytest.raises(FenceUnavailable) as caught:
                call()
            assert caught.value.retryable
        # reads are not blocked by a writer in WAL mode
        assert fast.observe(operation_id=op).status is FenceStatus.ABSENT
        holder.execute("ROLLBACK")
    assert fast.prepare(operation_id=op, intent_digest=intent, epoch=1).epoch == 1


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    """A non-SQLite file is TargetWriteFailed on every call, never sqlite3.DatabaseError."""
    path = tmp_path / "t.db"
    path.write_bytes(b"this is not a database" * 100)
    connector = SqliteConnector(path)
    op, intent = _op()
    with pytest.raises(TargetWriteFailed, match="not a usable SQLite database"):
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetWriteFailed, match="not a usable SQLite database"):
        connector.observe(operation_id=op)
    with pytest.raises(TargetWriteFailed, match="not a usable SQLite database"):
        connector.check_plan(_plan())


def test_close_is_idempotent(connector: SqliteConnector) -> None:
    """close() may be called any number of times."""
    connector.close()
    connector.close()
