"""PostgresConnector against a real server: identifiers, locks, COPY values, strategies, errors."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql

from dpone.adapters.connectors.postgres import PostgresConnector
from dpone.contracts.fence import FenceCapability, FenceStatus, SealOutcome
from dpone.contracts.identity import Interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy, MutationReport
from dpone.errors import (
    ConfigInvalid,
    DponeError,
    FencedOut,
    FenceUnavailable,
    TargetSchemaMismatch,
    TargetWriteFailed,
)
from dpone.ports.connector import TargetConnectorPort

HOSTILE = 'x"; DROP TABLE y; --'
CANARY = "canary-pw-7f3e9"
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
        "sha256:" + hashlib.sha256(f"pg-op{n}".encode()).hexdigest(),
        "sha256:" + hashlib.sha256(f"pg-intent{n}".encode()).hexdigest(),
    )


class Target:
    """One test schema: connectors built on it and raw SQL for the assertions."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.table = f"{schema}.items"
        self._opened: list[PostgresConnector] = []

    def connector(self, table: str | None = None, **kw: Any) -> PostgresConnector:
        connector = PostgresConnector(
            self.dsn, table=table or self.table, fence_schema=self.schema, **kw
        )
        self._opened.append(connector)
        return connector

    def plan(
        self, strategy: LoadStrategy = LoadStrategy.APPEND, *, table: str | None = None, **kw: Any
    ) -> LoadPlan:
        return LoadPlan(
            table=self.table if table is None else table,
            strategy=strategy,
            columns=kw.pop("columns", COLUMNS),
            **kw,
        )

    def query(self, statement: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
            conn.execute("SET TIME ZONE 'UTC'")
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def execute(self, *statements: str) -> None:
        for statement in statements:
            self.query(statement)

    def close(self) -> None:
        for connector in self._opened:
            connector.close()


@pytest.fixture
def target(pg_available: str, pg_schema: str) -> Iterator[Target]:
    target = Target(pg_available, pg_schema)
    yield target
    target.close()


@pytest.fixture
def connector(target: Target) -> PostgresConnector:
    return target.connector()


def _load(
    connector: TargetConnectorPort,
    batches: Sequence[Sequence[tuple[object, ...]]],
    plan: LoadPlan,
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
        plan=plan,
        batches=[list(b) for b in batches],
        content_digest="sha256:" + "c" * 64,
        **kw,
    )
    return op, report


def _assert_safe(error: DponeError, *secrets: str) -> None:
    text = str(error) + repr(error.attrs())
    for word in ("INSERT", "SELECT", "DELETE", "COPY ", "VALUES", "postgresql://", *secrets):
        assert word not in text, word


# ----------------------------------------------------------------- identity and identifiers


def test_identity_and_locator_carry_no_credentials() -> None:
    """Identity is postgresql://host:port/db#schema.table, folded, without user or password."""
    dsn = f"postgres://dpone:{CANARY}@DB.Example.COM/app?sslmode=require"
    connector = PostgresConnector(dsn, table="Sales.Orders")
    assert connector.kind == "postgres"
    assert connector.capability is FenceCapability.TRANSACTIONAL_MARKER
    assert connector.database_locator() == "postgresql://db.example.com:5432/app"
    assert connector.target_identity() == "postgresql://db.example.com:5432/app#sales.orders"
    default = PostgresConnector("postgresql://u@db.example.com:5432/app", table="orders")
    assert default.target_identity() == "postgresql://db.example.com:5432/app#public.orders"
    assert PostgresConnector(dsn, table="public.ORDERS").target_identity() == (
        default.target_identity()
    )
    assert CANARY not in connector.target_identity() + repr(vars(connector).get("_locator"))
    connector.close()
    default.close()


@pytest.mark.parametrize(
    "table",
    [
        HOSTILE,
        "items\n",
        "a.b.c",
        "",
        "1abc",
        "public.",
        "x" * 64,
        "pg_catalog.items",
        "information_schema.items",
        "dpone.dpone_fence",
    ],
)
def test_bad_table_names_are_refused_and_never_executed(target: Target, table: str) -> None:
    """Hostile, overlong, system or reserved names are ConfigInvalid; no SQL runs."""
    target.execute("CREATE TABLE y (a int)")
    with pytest.raises(ConfigInvalid) as caught:
        PostgresConnector(target.dsn, table=table)
    assert HOSTILE not in str(caught.value)
    connector = target.connector()
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(ConfigInvalid):
        connector.check_plan(target.plan(table=table))
    with pytest.raises(ConfigInvalid):
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=target.plan(table=table),
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        )
    assert target.query("SELECT to_regclass('y') IS NOT NULL") == [(True,)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED


def test_hostile_column_and_fence_schema_are_refused(target: Target) -> None:
    """A column or fence schema that is not an identifier is ConfigInvalid, not echoed."""
    plan = target.plan(columns=(Column(name=HOSTILE, type=ColumnType.TEXT),))
    with pytest.raises(ConfigInvalid) as caught:
        target.connector().check_plan(plan)
    assert HOSTILE not in str(caught.value)
    with pytest.raises(ConfigInvalid):
        PostgresConnector(target.dsn, table="items", fence_schema=HOSTILE)
    with pytest.raises(ConfigInvalid):
        PostgresConnector(target.dsn, table="items", fence_schema="pg_catalog")


@pytest.mark.parametrize(
    "kw",
    [
        {"lock_timeout_s": 0},
        {"lock_timeout_s": float("inf")},
        {"lock_timeout_s": float("nan")},
        {"connect_timeout_s": -1},
    ],
)
def test_bounds_must_be_positive_and_finite(kw: dict[str, float]) -> None:
    """A lock or connect bound that is not a positive finite number is ConfigInvalid."""
    with pytest.raises(ConfigInvalid):
        PostgresConnector("postgresql://u@h/db", table="items", **kw)


def test_plan_table_must_match_the_configured_table(target: Target) -> None:
    """Case and the schema spelling fold; another table is refused (the identity would lie)."""
    connector = target.connector()
    connector.check_plan(target.plan(table=target.table.upper()))
    with pytest.raises(ConfigInvalid):
        connector.check_plan(target.plan(table="items"))  # public.items: another table


def test_schema_qualified_table_with_mixed_case(target: Target) -> None:
    """Schema.Table loads into the folded schema.table; unqualified names mean public."""
    table = f"{target.schema.upper()}.Items"
    connector = target.connector(table=table)
    _load(connector, [[(1, "a", 1.0)]], target.plan(table=table))
    assert target.query("SELECT id, name, amount FROM items") == [(1, "a", 1.0)]
    fence = target.query("SELECT state, row_count FROM dpone_fence")
    assert fence == [("committed", 1)]


def test_missing_target_schema_is_config_invalid(target: Target) -> None:
    """A table in a schema that does not exist: ConfigInvalid from check_plan and mutate."""
    table = f"{target.schema}_nope.items"
    connector = target.connector(table=table)
    with pytest.raises(ConfigInvalid, match="does not exist"):
        connector.check_plan(target.plan(table=table))
    with pytest.raises(ConfigInvalid):
        _load(connector, [[(1, "a", 1.0)]], target.plan(table=table))


# ----------------------------------------------------------------- schema


def test_check_plan_is_read_only(target: Target) -> None:
    """check_plan and observe create nothing: no fence table, no target table."""
    schema = f"{target.schema}_fence"
    connector = PostgresConnector(target.dsn, table=target.table, fence_schema=schema)
    try:
        connector.check_plan(target.plan())
        assert connector.observe(operation_id=_op()[0]).status is FenceStatus.ABSENT
    finally:
        connector.close()
    assert target.query("SELECT to_regnamespace(%s) IS NULL", (schema,)) == [(True,)]
    assert target.query("SELECT to_regclass('items') IS NULL") == [(True,)]


def test_plan_checked_says_only_what_check_plan_would_pass_without_a_read(
    target: Target,
) -> None:
    """Not before check_plan has verified the table; then True for that plan, and False
    for a plan check_plan refuses even though its table and columns were verified."""
    target.execute("CREATE TABLE items (id bigint, at timestamptz)")
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="at", type=ColumnType.TIMESTAMP),
    )
    connector = target.connector()
    plan = target.plan(
        LoadStrategy.REPLACE_INTERVAL, columns=columns, interval_column="at", interval=DAY1
    )
    assert not connector.plan_checked(plan)
    connector.check_plan(plan)
    assert connector.plan_checked(plan)
    # the same table, strategy and columns, but no interval to replace: refused
    refused = msgspec.structs.replace(plan, interval=None)
    with pytest.raises(ConfigInvalid):
        connector.check_plan(refused)
    assert not connector.plan_checked(refused)


def test_schema_mismatch_is_found_before_any_write(target: Target) -> None:
    """An existing table without planned columns fails check_plan, naming table and columns."""
    target.execute("CREATE TABLE items (id bigint, other text)")
    with pytest.raises(TargetSchemaMismatch) as caught:
        target.connector().check_plan(target.plan())
    message = str(caught.value)
    assert "'name'" in message
    assert "'amount'" in message
    assert "'id'" not in message


def test_mutate_rechecks_the_schema_and_writes_nothing(target: Target) -> None:
    """A table changed after check_plan is caught inside the transaction: 0 rows, fence kept."""
    connector = target.connector()
    connector.check_plan(target.plan())
    target.execute("CREATE TABLE items (id bigint)")
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetSchemaMismatch):
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=target.plan(),
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        )
    assert target.query("SELECT count(*) FROM items") == [(0,)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED


def test_a_view_is_not_a_target(target: Target) -> None:
    """A relation that is not a table (a view) is TargetSchemaMismatch, not a COPY error."""
    target.execute("CREATE VIEW items AS SELECT 1::bigint AS id, 'a'::text AS name, 1.0 AS amount")
    with pytest.raises(TargetSchemaMismatch, match="not a table"):
        target.connector().check_plan(target.plan())


def test_created_table_uses_the_mapped_types(target: Target) -> None:
    """A missing table is created with PostgreSQL types; a merge key is NOT NULL UNIQUE."""
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="r", type=ColumnType.REAL),
        Column(name="t", type=ColumnType.TEXT),
        Column(name="b", type=ColumnType.BOOLEAN),
        Column(name="ts", type=ColumnType.TIMESTAMP),
    )
    plan = target.plan(LoadStrategy.MERGE, columns=columns, key=("id",))
    _load(target.connector(), [], plan)
    info = target.query(
        "SELECT attname::text, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
        "WHERE attrelid = 'items'::regclass AND attnum > 0 ORDER BY attnum"
    )
    assert info == [
        ("id", "bigint", True),
        ("r", "double precision", False),
        ("t", "text", False),
        ("b", "boolean", False),
        ("ts", "timestamp with time zone", False),
    ]
    unique = target.query(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'items'::regclass"
    )
    assert [u[0].split(" USING ")[1] for u in unique] == ["btree (id)"]


def test_concurrent_first_loads_create_fence_and_table_once(target: Target) -> None:
    """Four connectors racing on a fresh schema: fence and table are created once, no error."""
    schema = f"{target.schema}_race"
    table = f"{target.schema}.items"
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run(n: int) -> None:
        connector = PostgresConnector(target.dsn, table=table, fence_schema=schema)
        try:
            start.wait(10)
            _load(connector, [[(n, f"r{n}", float(n))]], target.plan())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connector.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert target.query("SELECT id FROM items ORDER BY id") == [(0,), (1,), (2,), (3,)]
        counted = target.query(f'SELECT count(*) FROM "{schema}".dpone_fence')
        assert counted == [(4,)]
    finally:
        target.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_creation_racing_an_outside_session_recovers(target: Target) -> None:
    """Fence, then target table, created by another session meanwhile: dpone uses theirs."""
    schema = f"{target.schema}_ext"
    outside = psycopg.connect(target.dsn)
    connector = PostgresConnector(target.dsn, table=target.table, fence_schema=schema)
    try:
        # 1. the fence schema and table, committed while dpone waits on the catalog
        outside.execute(f'CREATE SCHEMA "{schema}"')
        outside.execute(
            f'CREATE TABLE "{schema}".dpone_fence (operation_id text PRIMARY KEY, '
            "intent_digest text, epoch bigint NOT NULL, state text NOT NULL, row_count bigint, "
            "content_digest text, committed_at timestamptz)"
        )
        op, intent = _op()
        timer = threading.Timer(0.3, outside.commit)
        timer.start()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        timer.join()
        # 2. the target table, the same way, during mutate
        outside.execute(
            f'CREATE TABLE "{target.schema}".items (id bigint, name text, amount float8, x int)'
        )
        timer = threading.Timer(0.3, outside.commit)
        timer.start()
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=target.plan(),
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        )
        timer.join()
        assert target.query("SELECT id, x FROM items") == [(1, None)]
        fence = target.query(f'SELECT state FROM "{schema}".dpone_fence')
        assert fence == [("committed",)]
    finally:
        connector.close()
        outside.close()
        target.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# ----------------------------------------------------------------- locks


def _hold_fence_row(target: Target, op: str) -> psycopg.Connection[Any]:
    """Open a transaction that holds the fence row's lock, as a zombie writer would."""
    holder = psycopg.connect(target.dsn)
    holder.execute(
        sql.SQL("SELECT 1 FROM {} WHERE operation_id = %s FOR UPDATE").format(
            sql.Identifier(target.schema, "dpone_fence")
        ),
        (op,),
    )
    return holder


def test_lock_timeout_is_fence_unavailable_then_the_fence_decides(target: Target) -> None:
    """While another session holds the fence row, seal/prepare/mutate give FenceUnavailable
    within the bound; after that session commits the data, seal reports COMMITTED."""
    connector = target.connector()
    fast = target.connector(lock_timeout_s=0.3)
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    holder = _hold_fence_row(target, op)
    try:
        calls = {
            "seal": lambda: fast.seal(operation_id=op, epoch=2),
            "prepare": lambda: fast.prepare(operation_id=op, intent_digest=intent, epoch=2),
            "mutate": lambda: fast.mutate(
                operation_id=op,
                intent_digest=intent,
                epoch=1,
                plan=target.plan(),
                batches=[[(9, "zombie-b", 9.0)]],
                content_digest="d",
            ),
        }
        for name, call in calls.items():
            started = time.monotonic()
            with pytest.raises(FenceUnavailable) as caught:
                call()
            elapsed = time.monotonic() - started
            assert 0.25 <= elapsed < 2.0, (name, elapsed)
            assert caught.value.retryable
            assert "lock" in str(caught.value)
            _assert_safe(caught.value)
        # reads do not wait for the row lock
        assert fast.observe(operation_id=op).status is FenceStatus.PREPARED
        # the holder now commits the write the zombie was making
        holder.execute(
            sql.SQL(
                "UPDATE {} SET state = 'committed', row_count = 0 WHERE operation_id = %s"
            ).format(sql.Identifier(target.schema, "dpone_fence")),
            (op,),
        )
        holder.commit()
    finally:
        holder.close()
    sealed = fast.seal(operation_id=op, epoch=2)
    assert sealed.outcome is SealOutcome.COMMITTED
    assert sealed.observation.epoch == 1
    assert target.query("SELECT to_regclass('items') IS NULL") == [(True,)]  # nothing written


def test_seal_after_a_rolled_back_holder_proves_not_committed(target: Target) -> None:
    """If the holder rolls back instead, the waiting seal raises the epoch: NOT_COMMITTED."""
    connector = target.connector()
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    holder = _hold_fence_row(target, op)
    timer = threading.Timer(0.3, holder.rollback)
    try:
        timer.start()
        sealed = target.connector(lock_timeout_s=10).seal(operation_id=op, epoch=2)
    finally:
        timer.join()
        holder.close()
    assert sealed.outcome is SealOutcome.NOT_COMMITTED
    with pytest.raises(FencedOut):
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=target.plan(),
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        )


# ----------------------------------------------------------------- values


TRICKY = [
    "plain",
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "\\.",
    "double \"quotes\" and 'single'",
    "trailing backslash\\",
    "ünïcødé ✓ 🎉",
    " ",
    "NULL",
    "a,b;c|d",
]


def test_copy_round_trips_special_text_values(target: Target) -> None:
    """Tabs, newlines, CR, backslashes, \\N, quotes and Unicode arrive exactly; '' is NULL."""
    columns = (Column(name="id", type=ColumnType.INTEGER), Column(name="v", type=ColumnType.TEXT))
    rows: list[tuple[str, str | None]] = [(str(i), v) for i, v in enumerate(TRICKY)]
    rows += [(str(len(TRICKY)), ""), (str(len(TRICKY) + 1), None)]
    # One value per batch: each special character must be caught on its own (an all-string
    # batch takes the joined fast path), and once more all together.
    _load(target.connector(), [[row] for row in rows], target.plan(columns=columns))
    _load(target.connector(), [rows], target.plan(columns=columns))
    got = target.query("SELECT id, v FROM items ORDER BY id")
    expected = [(i, v) for i, v in enumerate(TRICKY)] + [
        (len(TRICKY), None),
        (len(TRICKY) + 1, None),
    ]
    assert got == sorted(expected * 2, key=lambda r: r[0])


def test_copy_round_trips_typed_values(target: Target) -> None:
    """Python values (a JSONL source) keep their meaning; None and '' are NULL."""
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="r", type=ColumnType.REAL),
        Column(name="t", type=ColumnType.TEXT),
        Column(name="b", type=ColumnType.BOOLEAN),
        Column(name="ts", type=ColumnType.TIMESTAMP),
    )
    plus2 = timezone(timedelta(hours=2))
    rows: list[tuple[object, ...]] = [
        (1, 0.1, "x\ty", True, datetime(2026, 11, 1, 12, 0, tzinfo=plus2)),
        (2, Decimal("2.5"), None, False, datetime(2026, 11, 1, 12, 0)),  # naive means UTC
        (2**62, float("inf"), "", None, "2026-11-01T10:00:00Z"),
        (None, -1e300, "z", "yes", None),
    ]
    _load(target.connector(), [rows], target.plan(columns=columns))
    got = target.query("SELECT id, r, t, b, ts FROM items ORDER BY r")
    assert got == [
        (None, -1e300, "z", True, None),
        (1, 0.1, "x\ty", True, datetime(2026, 11, 1, 10, 0, tzinfo=UTC)),
        (2, 2.5, None, False, datetime(2026, 11, 1, 12, 0, tzinfo=UTC)),
        (2**62, float("inf"), None, None, datetime(2026, 11, 1, 10, 0, tzinfo=UTC)),
    ]


def test_row_count_spans_many_batches(target: Target) -> None:
    """Batches of odd sizes, empty ones included, all arrive in one COPY, in order."""
    sizes = [1, 0, 999, 1000, 1, 0, 2500]
    start, batches = 0, []
    for size in sizes:
        batches.append([(str(i), f"n{i}", str(i / 2)) for i in range(start, start + size)])
        start += size
    op, report = _load(target.connector(), batches, target.plan())
    assert report.row_count == sum(sizes)
    rows = target.query("SELECT id, name, amount FROM items ORDER BY id")
    assert rows == [(i, f"n{i}", i / 2) for i in range(sum(sizes))]
    assert target.connector().observe(operation_id=op).row_count == sum(sizes)


def test_empty_load_commits_a_zero_row_fence(target: Target) -> None:
    """No rows still commits: the table exists and the fence says 0 rows."""
    connector = target.connector()
    op, report = _load(connector, [], target.plan())
    assert report.row_count == 0
    assert target.query("SELECT count(*) FROM items") == [(0,)]
    seen = connector.observe(operation_id=op)
    assert (seen.status, seen.row_count) == (FenceStatus.COMMITTED, 0)


# ----------------------------------------------------------------- strategies


def test_merge_through_the_staging_table(target: Target) -> None:
    """Merge inserts new keys, updates old ones, and the last duplicate of a load wins."""
    connector = target.connector()
    plan = target.plan(LoadStrategy.MERGE, key=("id",))
    _load(connector, [[(1, "a", 1.0), (2, "b", 2.0)]], plan)
    _load(connector, [[(2, "B", 20.0), (3, "c", 3.0)], [(3, "C", 30.0), (2, "B2", 21.0)]], plan)
    assert target.query("SELECT id, name, amount FROM items ORDER BY id") == [
        (1, "a", 1.0),
        (2, "B2", 21.0),
        (3, "C", 30.0),
    ]
    # the staging table was dropped at commit: nothing left in any temp schema
    assert target.query("SELECT count(*) FROM pg_class WHERE relname = 'dpone_merge_stage'") == [
        (0,)
    ]


def test_merge_into_an_existing_table_with_a_composite_key(target: Target) -> None:
    """A unique index on (b, a) serves merge key (a, b); other target columns are kept."""
    columns = (
        Column(name="a", type=ColumnType.INTEGER),
        Column(name="b", type=ColumnType.TEXT),
        Column(name="v", type=ColumnType.REAL),
    )
    target.execute(
        "CREATE TABLE items (a bigint, b text, v numeric(10, 2), note text DEFAULT 'kept')",
        "CREATE UNIQUE INDEX u ON items (b, a)",
        "INSERT INTO items (a, b, v, note) VALUES (1, 'x', 1, 'old')",
    )
    plan = target.plan(LoadStrategy.MERGE, columns=columns, key=("a", "b"))
    connector = target.connector()
    connector.check_plan(plan)
    _load(connector, [[(1, "x", 5.0), (1, "y", 2.0)]], plan)
    assert target.query("SELECT a, b, v, note FROM items ORDER BY a, b") == [
        (1, "x", Decimal("5.00"), "old"),
        (1, "y", Decimal("2.00"), "kept"),
    ]


def test_merge_needs_a_unique_key_on_an_existing_table(target: Target) -> None:
    """Without a unique index on exactly the key: TargetSchemaMismatch, nothing written."""
    target.execute(
        "CREATE TABLE items (id bigint, name text, amount double precision)",
        "CREATE UNIQUE INDEX partial_u ON items (id) WHERE id > 0",
        "CREATE UNIQUE INDEX wider_u ON items (id, name)",
    )
    plan = target.plan(LoadStrategy.MERGE, key=("id",))
    connector = target.connector()
    with pytest.raises(TargetSchemaMismatch, match="unique") as caught:
        connector.check_plan(plan)
    assert caught.value.hint is not None
    assert "CREATE UNIQUE INDEX" in caught.value.hint
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetSchemaMismatch):
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=plan,
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        )
    assert target.query("SELECT count(*) FROM items") == [(0,)]


def test_merge_null_key_is_rejected(target: Target) -> None:
    """An empty merge key value is NULL, refused by the created NOT NULL key."""
    plan = target.plan(LoadStrategy.MERGE, key=("id",))
    with pytest.raises(TargetWriteFailed, match="NotNullViolation"):
        _load(target.connector(), [[("", "a", "1")]], plan)


def test_replace_keeps_old_rows_visible_until_commit(target: Target) -> None:
    """Replace deletes (not truncates): a reader sees the old rows, unblocked, until commit."""
    connector = target.connector()
    _load(connector, [[(1, "a", 1.0), (2, "b", 2.0)]], target.plan())
    seen: list[object] = []

    def read_meanwhile(_txn: object) -> None:
        with psycopg.connect(target.dsn, autocommit=True) as reader:
            reader.execute("SET lock_timeout = '2s'")
            query = sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(target.schema, "items")
            )
            seen.append(reader.execute(query).fetchone())

    _load(connector, [[(3, "c", 3.0)]], target.plan(LoadStrategy.REPLACE), within=read_meanwhile)
    assert seen == [(2,)]
    assert target.query("SELECT id FROM items") == [(3,)]


def test_replace_interval_compares_as_timestamptz(target: Target) -> None:
    """Rows in [start, end) go whatever their zone; bounds in another zone compare in UTC."""
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="at", type=ColumnType.TIMESTAMP),
    )
    target.execute("CREATE TABLE items (id bigint, at timestamptz)")
    target.execute(
        "INSERT INTO items VALUES "
        "(1, '2026-10-31T23:59:59Z'), "  # before
        "(2, '2026-11-01T00:00:00Z'), "  # start: inside
        "(3, '2026-11-01T12:00:00+02:00'), "  # 10:00 UTC: inside
        "(4, '2026-11-02T01:00:00+02:00'), "  # 23:00 UTC on Nov 1: inside
        "(5, '2026-11-02T00:00:00Z'), "  # end: outside
        "(6, NULL)"
    )
    plus2 = timezone(timedelta(hours=2))
    day1_plus2 = Interval(
        start=datetime(2026, 11, 1, 2, tzinfo=plus2), end=datetime(2026, 11, 2, 2, tzinfo=plus2)
    )
    plan = target.plan(
        LoadStrategy.REPLACE_INTERVAL, columns=columns, interval_column="at", interval=day1_plus2
    )
    _load(target.connector(), [[(100, "2026-11-01 05:00:00")]], plan)
    assert [r[0] for r in target.query("SELECT id FROM items ORDER BY id")] == [1, 5, 6, 100]


def test_replace_interval_on_a_timestamp_column_reads_it_as_utc(target: Target) -> None:
    """A timestamp-without-zone column is compared as UTC, like the rows dpone writes."""
    columns = (
        Column(name="id", type=ColumnType.INTEGER),
        Column(name="at", type=ColumnType.TIMESTAMP),
    )
    target.execute(
        "CREATE TABLE items (id bigint, at timestamp)",
        "INSERT INTO items VALUES (1, '2026-11-01 00:00:00'), (2, '2026-11-02 00:00:00')",
    )
    plan = target.plan(
        LoadStrategy.REPLACE_INTERVAL, columns=columns, interval_column="at", interval=DAY1
    )
    _load(target.connector(), [[(3, "2026-11-01 08:00:00")]], plan)
    assert [r[0] for r in target.query("SELECT id FROM items ORDER BY id")] == [2, 3]


# ----------------------------------------------------------------- atomic mode


def test_within_gets_the_open_connection_and_commits_with_the_data(target: Target) -> None:
    """within() gets the psycopg connection in the transaction; its writes commit together."""
    target.execute("CREATE TABLE journal_side (n int)")

    def journal_write(txn: object) -> None:
        assert isinstance(txn, psycopg.Connection)
        assert txn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        txn.execute(
            sql.SQL("INSERT INTO {} VALUES (1)").format(
                sql.Identifier(target.schema, "journal_side")
            )
        )

    _load(target.connector(), [[(1, "a", 1.0)]], target.plan(), within=journal_write)
    assert target.query("SELECT n FROM journal_side") == [(1,)]


def test_within_raising_rolls_back_its_own_writes_too(target: Target) -> None:
    """A failing within() takes the rows, the fence and its own writes back, and re-raises."""
    target.execute("CREATE TABLE journal_side (n int)")
    connector = target.connector()

    def journal_write(txn: object) -> None:
        assert isinstance(txn, psycopg.Connection)
        txn.execute(
            sql.SQL("INSERT INTO {} VALUES (1)").format(
                sql.Identifier(target.schema, "journal_side")
            )
        )
        raise DponeError("journal conflict")

    with pytest.raises(DponeError, match="journal conflict"):
        _load(connector, [[(1, "a", 1.0)]], target.plan(), within=journal_write)
    assert target.query("SELECT count(*) FROM journal_side") == [(0,)]
    assert target.query("SELECT to_regclass('items') IS NULL") == [(True,)]
    # the connection is clean afterwards
    _load(connector, [[(2, "b", 2.0)]], target.plan())
    assert target.query("SELECT id FROM items") == [(2,)]


def test_within_swallowing_a_failed_statement_commits_nothing(target: Target) -> None:
    """within() hiding a failed statement leaves an aborted transaction: refused, 0 rows."""
    connector = target.connector()

    def journal_write(txn: object) -> None:
        assert isinstance(txn, psycopg.Connection)
        try:
            txn.execute("SELECT 1/0")
        except psycopg.Error:
            pass  # a buggy caller hides the error; COMMIT would silently roll back

    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetWriteFailed, match="aborted"):
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=target.plan(),
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
            within=journal_write,
        )
    assert target.query("SELECT to_regclass('items') IS NULL") == [(True,)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED


# ----------------------------------------------------------------- error translation


def test_type_mismatch_is_target_write_failed_and_writes_nothing(target: Target) -> None:
    """Text into a bigint column: TargetWriteFailed naming column and row, never the value."""
    connector = target.connector()
    _load(connector, [[(1, "a", 1.0)]], target.plan())
    op, intent = _op()
    connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
    with pytest.raises(TargetWriteFailed) as caught:
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=target.plan(),
            batches=[[("2", "b", "2.0")], [("secret-not-a-number", "c", "3.0")]],
            content_digest="d",
        )
    message = str(caught.value)
    assert "column id" in message
    assert "row 2" in message
    _assert_safe(caught.value, "secret-not-a-number")
    assert target.query("SELECT id FROM items") == [(1,)]
    assert connector.observe(operation_id=op).status is FenceStatus.PREPARED


def test_unique_violation_names_the_constraint_not_the_value(target: Target) -> None:
    """A unique violation is TargetWriteFailed with the constraint name, not the key."""
    target.execute(
        "CREATE TABLE items (id bigint CONSTRAINT items_id_key UNIQUE, name text, amount float8)"
    )
    with pytest.raises(TargetWriteFailed, match="items_id_key") as caught:
        _load(target.connector(), [[(424242, "a", 1.0), (424242, "b", 2.0)]], target.plan())
    _assert_safe(caught.value, "424242")


@pytest.mark.parametrize(
    "row",
    [
        (1, {"nested": "secret-v"}, 1.0),
        (1, "a"),
        (1, "a", 1.0, "extra"),
        (1, "lone \udcff surrogate", 1.0),
        (1, "nul \x00 char", 1.0),
        (2**70, "a", 1.0),
    ],
    ids=["unsupported-type", "too-few", "too-many", "surrogate", "nul", "int-overflow"],
)
def test_unstorable_rows_are_target_write_failed(target: Target, row: tuple[object, ...]) -> None:
    """Values PostgreSQL cannot take and rows of the wrong width never escape as raw errors."""
    connector = target.connector()
    with pytest.raises(TargetWriteFailed) as caught:
        _load(connector, [[(0, "fine", 0.0)], [row]], target.plan())
    _assert_safe(caught.value, "secret-v", str(2**70))
    assert target.query("SELECT count(*) FROM dpone_fence WHERE state = 'committed'") == [(0,)]
    _load(connector, [[(0, "fine", 0.0)]], target.plan())  # the connection is reusable


def test_unreachable_server_is_fence_unavailable_quickly() -> None:
    """Nothing listening: every call is FenceUnavailable in well under the bound, no secrets."""
    dsn = f"postgresql://dpone:{CANARY}@127.0.0.1:1/test"
    connector = PostgresConnector(dsn, table="items", connect_timeout_s=2)
    op, intent = _op()
    plan = LoadPlan(table="items", strategy=LoadStrategy.APPEND, columns=COLUMNS)
    calls = [
        lambda: connector.observe(operation_id=op),
        lambda: connector.prepare(operation_id=op, intent_digest=intent, epoch=1),
        lambda: connector.seal(operation_id=op, epoch=1),
        lambda: connector.check_plan(plan),
        lambda: connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=plan,
            batches=[[(1, "a", 1.0)]],
            content_digest="d",
        ),
    ]
    try:
        for call in calls:
            started = time.monotonic()
            with pytest.raises(FenceUnavailable) as caught:
                call()
            assert time.monotonic() - started < 2.0
            assert caught.value.retryable
            _assert_safe(caught.value, CANARY, "dpone:", "127.0.0.1")
    finally:
        connector.close()
        connector.close()  # idempotent


def test_a_lost_connection_is_unavailable_once_then_reconnects(target: Target) -> None:
    """A backend killed between calls: FenceUnavailable (retryable), then a fresh connection."""
    name = f"dpone-test-{target.schema}"
    connector = PostgresConnector(
        f"{target.dsn}?application_name={name}", table=target.table, fence_schema=target.schema
    )
    try:
        op, intent = _op()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        killed = target.query(
            # the timeout makes the call wait until the backend has ended (PostgreSQL 14+)
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (name,),
        )
        assert killed == [(True,)]
        with pytest.raises(FenceUnavailable) as caught:
            connector.observe(operation_id=op)
        assert caught.value.retryable
        assert connector.observe(operation_id=op).status is FenceStatus.PREPARED
    finally:
        connector.close()


def test_a_table_in_a_missing_schema_is_refused_and_a_new_one_created(target: Target) -> None:
    """check_plan and mutate read the table and its schema in one statement: both answers."""
    missing = target.connector(table="no_such_schema_x.items")
    plan = target.plan(table="no_such_schema_x.items")
    with pytest.raises(ConfigInvalid, match="schema of table"):
        missing.check_plan(plan)
    with pytest.raises(ConfigInvalid, match="schema of table"):
        _load(missing, [[(1, "a", 1.0)]], plan)
    fresh = target.connector(table=f"{target.schema}.fresh")
    new_plan = target.plan(table=f"{target.schema}.fresh")
    fresh.check_plan(new_plan)  # absent from an existing schema: fine, mutate creates it
    _, report = _load(fresh, [[(1, "a", 1.0)]], new_plan)
    assert report.row_count == 1
    assert target.query("SELECT count(*) FROM fresh") == [(1,)]
