"""MariaDbConnector on the local MariaDB: names, lock bounds, strategies, values, errors."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

import pymysql
import pytest

from dpone.adapters.connectors.mariadb import MariaDbConnector
from dpone.contracts.fence import FenceStatus, SealOutcome
from dpone.contracts.identity import Interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy
from dpone.errors import (
    ConfigInvalid,
    FenceUnavailable,
    TargetSchemaMismatch,
    TargetWriteFailed,
)
from tests.conformance.test_fence_mariadb import query

ITEMS = (
    Column(name="id", type=ColumnType.INTEGER),
    Column(name="v", type=ColumnType.TEXT),
    Column(name="at", type=ColumnType.TIMESTAMP),
)


def plan(strategy: LoadStrategy = LoadStrategy.APPEND, **extra: Any) -> LoadPlan:
    return LoadPlan(table="items", strategy=strategy, columns=ITEMS, **extra)


def load(
    connector: MariaDbConnector,
    rows: Sequence[tuple[object, ...]],
    *,
    load_plan: LoadPlan | None = None,
    batch_size: int = 1000,
) -> str:
    op = "op-" + secrets.token_hex(8)
    connector.prepare(operation_id=op, intent_digest="intent", epoch=1)
    connector.mutate(
        operation_id=op,
        intent_digest="intent",
        epoch=1,
        plan=load_plan or plan(),
        batches=[list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)],
        content_digest="digest",
    )
    return op


@pytest.fixture
def dsn(mariadb_database: str) -> str:
    return mariadb_database


@pytest.fixture
def connector(dsn: str) -> Iterator[MariaDbConnector]:
    connector = MariaDbConnector(dsn, table="items", lock_timeout_s=1.0)
    yield connector
    connector.close()


def rows_of(dsn: str, columns: str = "id, v, at") -> list[tuple[Any, ...]]:
    return query(dsn, f"SELECT {columns} FROM items ORDER BY id")


# ----------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "table",
    [
        "items; DROP TABLE x",
        "`items`",
        "a.b.c",
        "items ",
        "items\n",
        "1items",
        "x" * 65,
        "mysql.user",
        "information_schema.tables",
        "dpone_fence",
        "",
    ],
)
def test_hostile_table_names_are_refused(dsn: str, table: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        MariaDbConnector(dsn, table=table)
    assert caught.value.field == "table"


def test_hostile_column_names_are_refused_before_any_sql(connector: MariaDbConnector) -> None:
    bad = LoadPlan(
        table="items",
        strategy=LoadStrategy.APPEND,
        columns=(Column(name="id`; DROP TABLE items; --", type=ColumnType.INTEGER),),
    )
    with pytest.raises(ConfigInvalid):
        connector.check_plan(bad)


def test_identity_has_no_credentials(mariadb_database: str) -> None:
    parts = urlsplit(mariadb_database)
    with_secret = f"mariadb://root:canary-pw-7f3a@{parts.hostname}:{parts.port}{parts.path}"
    connector = MariaDbConnector(with_secret, table="items")
    database = parts.path.lstrip("/")
    assert connector.database_locator() == f"mariadb://{parts.hostname}:{parts.port}/{database}"
    assert connector.target_identity() == f"{connector.database_locator()}#{database}.items"
    assert "canary" not in connector.target_identity()
    connector.close()
    connector.close()  # idempotent


def test_bad_dsn_is_refused_without_echo() -> None:
    for dsn in ("postgresql://u:canary-pw@h/db", "mysql://u:canary-pw@h:notaport/db", "mysql://h/"):
        with pytest.raises(ConfigInvalid) as caught:
            MariaDbConnector(dsn, table="items")
        assert "canary" not in str(caught.value)


# ----------------------------------------------------------------- lock bound


def test_lock_wait_bound_is_unavailable_then_the_fence_decides(
    connector: MariaDbConnector, dsn: str
) -> None:
    """A seal behind another transaction's row lock gives up after the bound; never guesses."""
    op = "op-held"
    connector.prepare(operation_id=op, intent_digest="intent", epoch=1)
    parts = urlsplit(dsn)
    holder = pymysql.connect(
        host=parts.hostname, port=parts.port, user="root", database=parts.path.lstrip("/")
    )
    try:
        with holder.cursor() as cur:
            holder.begin()
            cur.execute("SELECT epoch FROM dpone_fence WHERE operation_id = %s FOR UPDATE", (op,))
            started = time.monotonic()
            with pytest.raises(FenceUnavailable) as caught:
                connector.seal(operation_id=op, epoch=2)
            assert caught.value.retryable
            assert 0.5 < time.monotonic() - started < 5
            with pytest.raises(FenceUnavailable):
                connector.prepare(operation_id=op, intent_digest="intent", epoch=2)
            # The holder was a writer: it commits the operation.
            cur.execute(
                "UPDATE dpone_fence SET state = 'committed', row_count = 0 WHERE operation_id = %s",
                (op,),
            )
            holder.commit()
    finally:
        holder.close()
    sealed = connector.seal(operation_id=op, epoch=2)
    assert sealed.outcome is SealOutcome.COMMITTED
    assert sealed.observation.epoch == 1


def test_seal_released_before_the_bound_proves_not_committed(
    connector: MariaDbConnector, dsn: str
) -> None:
    op = "op-released"
    connector.prepare(operation_id=op, intent_digest="intent", epoch=1)
    parts = urlsplit(dsn)
    holder = pymysql.connect(
        host=parts.hostname, port=parts.port, user="root", database=parts.path.lstrip("/")
    )
    try:
        holder.begin()
        holder.cursor().execute(
            "SELECT epoch FROM dpone_fence WHERE operation_id = %s FOR UPDATE", (op,)
        )
        timer = threading.Timer(0.3, holder.rollback)
        timer.start()
        sealed = connector.seal(operation_id=op, epoch=2)
        timer.join()
    finally:
        holder.close()
    assert sealed.outcome is SealOutcome.NOT_COMMITTED
    assert connector.observe(operation_id=op).epoch == 2


# ----------------------------------------------------------------- strategies


def test_merge_upserts_and_the_last_row_of_a_key_wins(
    connector: MariaDbConnector, dsn: str
) -> None:
    merge = plan(LoadStrategy.MERGE, key=("id",))
    load(connector, [(1, "a", None), (2, "b", None)], load_plan=merge)
    load(connector, [(2, "B", None), (3, "c", None), (3, "C", None)], load_plan=merge)
    assert rows_of(dsn, "id, v") == [(1, "a"), (2, "B"), (3, "C")]


def test_merge_on_a_text_key_distinguishes_case(connector: MariaDbConnector, dsn: str) -> None:
    merge = LoadPlan(
        table="items",
        strategy=LoadStrategy.MERGE,
        columns=(
            Column(name="v", type=ColumnType.TEXT),
            Column(name="id", type=ColumnType.INTEGER),
        ),
        key=("v",),
    )
    load(connector, [("a", 1), ("A", 2)], load_plan=merge)
    load(connector, [("a", 3)], load_plan=merge)
    assert query(dsn, "SELECT v, id FROM items ORDER BY id") == [("A", 2), ("a", 3)]


def test_merge_needs_a_unique_key_on_an_existing_table(
    connector: MariaDbConnector, dsn: str
) -> None:
    query(dsn, "CREATE TABLE items (id BIGINT, v TEXT, at DATETIME(6)) ENGINE=InnoDB")
    with pytest.raises(TargetSchemaMismatch):
        connector.check_plan(plan(LoadStrategy.MERGE, key=("id",)))


def test_replace_swaps_the_whole_table(connector: MariaDbConnector, dsn: str) -> None:
    load(connector, [(1, "a", None), (2, "b", None)])
    load(connector, [(3, "c", None)], load_plan=plan(LoadStrategy.REPLACE))
    assert rows_of(dsn, "id, v") == [(3, "c")]


def test_replace_interval_with_iso_zulu_and_offset_times(
    connector: MariaDbConnector, dsn: str
) -> None:
    day1 = Interval(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 2, tzinfo=UTC))
    load(
        connector,
        [
            (1, "a", "2026-10-31T23:30:00Z"),
            (2, "b", "2026-11-01T10:00:00.123456Z"),
            (3, "c", "2026-11-02T01:00:00+02:00"),  # 23:00 UTC on day 1
            (4, "d", datetime(2026, 11, 2, 0, 0, tzinfo=timezone(timedelta(hours=-1)))),
        ],
    )
    assert [r[2] for r in rows_of(dsn)] == [
        datetime(2026, 10, 31, 23, 30),
        datetime(2026, 11, 1, 10, 0, 0, 123456),
        datetime(2026, 11, 1, 23, 0),
        datetime(2026, 11, 2, 1, 0),
    ]
    load(
        connector,
        [(5, "e", "2026-11-01T12:00:00Z")],
        load_plan=plan(LoadStrategy.REPLACE_INTERVAL, interval_column="at", interval=day1),
    )
    assert rows_of(dsn, "id, v") == [(1, "a"), (4, "d"), (5, "e")]


# ----------------------------------------------------------------- values


def test_text_values_round_trip_and_empty_strings_are_null(
    connector: MariaDbConnector, dsn: str
) -> None:
    texts = [
        None,
        "",
        "it's",
        'say "hi"',
        "back\\slash\\",
        "new\nline\r\ttab",
        "nul\x00byte",
        "ctrl-z\x1a",
        "naïve café 日本語 😀",
        "'); DROP TABLE items; --",
    ]
    load(connector, [(i, t, None) for i, t in enumerate(texts)], batch_size=3)
    stored = [r[1] for r in rows_of(dsn, "id, v")]
    assert stored == [None, None, *texts[2:]]


def test_booleans_and_reals(connector: MariaDbConnector, dsn: str) -> None:
    typed = LoadPlan(
        table="items",
        strategy=LoadStrategy.APPEND,
        columns=(
            Column(name="id", type=ColumnType.INTEGER),
            Column(name="ok", type=ColumnType.BOOLEAN),
            Column(name="x", type=ColumnType.REAL),
        ),
    )
    load(
        connector,
        [(1, True, 1.5), (2, "false", "2.25"), (3, "yes", ""), (4, None, None)],
        load_plan=typed,
    )
    assert rows_of(dsn, "id, ok, x") == [(1, 1, 1.5), (2, 0, 2.25), (3, 1, None), (4, None, None)]


def test_a_bad_value_is_target_write_failed_naming_the_column(
    connector: MariaDbConnector, dsn: str
) -> None:
    op = "op-bad"
    connector.prepare(operation_id=op, intent_digest="intent", epoch=1)
    good = [(i, "ok", None) for i in range(1500)]
    with pytest.raises(TargetWriteFailed) as caught:
        connector.mutate(
            operation_id=op,
            intent_digest="intent",
            epoch=1,
            plan=plan(),
            batches=[good, [(1500, "ok", None), ("secret-abc", "ok", None)]],
            content_digest="digest",
        )
    message = str(caught.value)
    assert "column id" in message
    assert "row 1502 of the load" in message
    assert "secret-abc" not in message
    assert "INSERT" not in message
    assert query(dsn, "SELECT COUNT(*) FROM items") == [(0,)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED
    load(connector, [(1, "after", None)])  # the connection is still usable
    assert rows_of(dsn, "id, v") == [(1, "after")]


def test_a_value_of_no_sql_type_is_refused(connector: MariaDbConnector, dsn: str) -> None:
    with pytest.raises(TargetWriteFailed, match="type object"):
        load(connector, [(1, object(), None)])
    assert query(dsn, "SELECT COUNT(*) FROM items") == [(0,)]


# ----------------------------------------------------------------- tables


def test_a_table_that_is_not_innodb_is_refused(connector: MariaDbConnector, dsn: str) -> None:
    query(dsn, "CREATE TABLE items (id BIGINT, v TEXT, at DATETIME(6)) ENGINE=MyISAM")
    with pytest.raises(TargetSchemaMismatch, match="InnoDB"):
        connector.check_plan(plan())
    with pytest.raises(TargetSchemaMismatch):
        load(connector, [(1, "a", None)])
    assert query(dsn, "SELECT COUNT(*) FROM items") == [(0,)]


def test_missing_columns_are_a_schema_mismatch(connector: MariaDbConnector, dsn: str) -> None:
    query(dsn, "CREATE TABLE items (id BIGINT) ENGINE=InnoDB")
    with pytest.raises(TargetSchemaMismatch, match="'v', 'at'"):
        connector.check_plan(plan())


def test_created_tables_are_innodb_with_the_mapped_types(
    connector: MariaDbConnector, dsn: str
) -> None:
    load(connector, [(1, "a", "2026-11-01 10:00:00")])
    database = urlsplit(dsn).path.lstrip("/")
    engines = query(
        dsn,
        "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
        "ORDER BY TABLE_NAME",
        (database,),
    )
    assert engines == [("dpone_fence", "InnoDB"), ("items", "InnoDB")]
    types = query(
        dsn,
        "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'items' ORDER BY ORDINAL_POSITION",
        (database,),
    )
    assert types == [("id", "bigint(20)"), ("v", "longtext"), ("at", "datetime(6)")]


# ----------------------------------------------------------------- unreachable


def test_an_unreachable_server_is_unavailable_quickly_without_the_password() -> None:
    connector = MariaDbConnector(
        "mysql://root:canary-pw-91c2@127.0.0.1:1/test", table="items", connect_timeout_s=2
    )
    started = time.monotonic()
    try:
        with pytest.raises(FenceUnavailable) as caught:
            connector.prepare(operation_id="op", intent_digest="intent", epoch=1)
        with pytest.raises(FenceUnavailable):
            connector.observe(operation_id="op")
    finally:
        connector.close()
    assert time.monotonic() - started < 5
    error = caught.value
    assert error.retryable
    for text in (str(error), repr(error), repr(error.attrs())):
        assert "canary" not in text
        assert "127.0.0.1:1" not in text
    assert error.__cause__ is None  # the driver's message (with the host) is not chained


def test_csv_text_rows_load_with_blanks_as_null(connector: MariaDbConnector, dsn: str) -> None:
    """All-string rows (a CSV source): numbers and times parsed, '' is NULL in every column."""
    load(
        connector,
        [
            ("1", "a", "2026-11-01T10:00:00Z"),
            ("2", "", ""),
            ("3", "c", "2026-11-01 11:00:00"),
            ("", "d", "2026-11-01T12:00:00+01:00"),
        ],
    )
    assert query(dsn, "SELECT id, v, at FROM items ORDER BY v") == [
        (2, None, None),
        (1, "a", datetime(2026, 11, 1, 10, 0)),
        (3, "c", datetime(2026, 11, 1, 11, 0)),
        (None, "d", datetime(2026, 11, 1, 11, 0)),
    ]
