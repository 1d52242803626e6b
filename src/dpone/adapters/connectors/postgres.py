"""PostgreSQL target connector: rows (by COPY) and a fence row committed in one transaction."""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import date, datetime, time
from decimal import Decimal
from itertools import chain, count
from operator import itemgetter
from typing import Any

import msgspec
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.types.numeric import Int8

from dpone.adapters._pg import (
    describe,
    is_unavailable,
    pg_locator,
    pipeline_quietly,
    translate,
)
from dpone.adapters.connectors._audit import audit_staged
from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
    require_prepared,
)
from dpone.contracts.load import (
    IDENTIFIER_RE,
    ColumnType,
    LoadPlan,
    LoadStrategy,
    MutationReport,
)
from dpone.errors import (
    ConfigInvalid,
    DponeError,
    FencedOut,
    FenceUnavailable,
    TargetSchemaMismatch,
    TargetWriteFailed,
)
from dpone.ports.connector import (
    CannotQueueAhead,
    Collector,
    Fused,
    Gate,
    QueuedWithin,
    Rows,
    WithinTransaction,
)
from dpone.ports.source import RawCsv, RawCsvRefused, raw_csv_of, raw_csv_size_of

__all__ = ["FENCE_TABLE", "PostgresConnector"]

FENCE_TABLE = "dpone_fence"
_DEFAULT_SCHEMA = "public"
_MAX_IDENTIFIER = 63  # NAMEDATALEN - 1: longer names are silently truncated by the server

_SQL_TYPES: dict[ColumnType, str] = {
    ColumnType.INTEGER: "bigint",
    ColumnType.REAL: "double precision",
    ColumnType.TEXT: "text",
    ColumnType.BOOLEAN: "boolean",
    ColumnType.TIMESTAMP: "timestamptz",
}

# The merge staging table's arrival order column. "$" cannot appear in a plan column
# (is_identifier), so it never collides with one.
_SEQ = "dpone$seq"
_STAGE = "dpone_merge_stage"

# COPY text format: these four characters are the only ones that need a backslash escape.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_SPECIAL_RE = re.compile(r"[\\\t\n\r]")

# Constant advisory-lock keys (64-bit, signed) serialize the creation of the fence table
# and of a target table: CREATE ... IF NOT EXISTS alone races into a unique violation on
# the catalog when two sessions run it at once.
_LOCK_NAMESPACE = "dpone.connector.postgres"


def _advisory_key(*parts: str) -> int:
    digest = hashlib.sha256("\x1f".join((_LOCK_NAMESPACE, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _fold(name: str) -> str:
    # PostgreSQL folds unquoted names to lower case; dpone always quotes, so it folds
    # first: "Orders" in a workload names the table psql users know as orders.
    return name.lower()


def _check_identifier(name: str, *, field: str, what: str) -> str:
    # fullmatch: the shared pattern ends in "$", which also accepts a trailing newline.
    if not isinstance(name, str) or not IDENTIFIER_RE.fullmatch(name):
        raise ConfigInvalid(
            f"{what} is not a plain identifier",
            field=field,
            hint="use [A-Za-z_][A-Za-z0-9_]*",
        )
    if len(name) > _MAX_IDENTIFIER:
        raise ConfigInvalid(
            f"{what} is longer than PostgreSQL's {_MAX_IDENTIFIER} characters",
            field=field,
            hint="shorten the name: the server would truncate it and could name another object",
        )
    return _fold(name)


def _reserved_schema(schema: str) -> bool:
    return schema == "information_schema" or schema.startswith("pg_")


class _Table(msgspec.Struct, frozen=True):
    schema: str
    name: str

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    @property
    def normalized(self) -> str:
        return f"{self.schema}.{self.name}"


def _parse_table(table: str, *, fence_schema: str) -> _Table:
    parts = table.split(".") if isinstance(table, str) else []
    if not parts or len(parts) > 2:
        raise ConfigInvalid(
            "the target table name is not a plain identifier",
            field="table",
            hint="use [A-Za-z_][A-Za-z0-9_]* or schema.table, e.g. analytics.orders",
        )
    names = [_check_identifier(p, field="table", what="the target table name") for p in parts]
    schema, name = (_DEFAULT_SCHEMA, names[0]) if len(names) == 1 else (names[0], names[1])
    if _reserved_schema(schema):
        raise ConfigInvalid(
            "the target table cannot live in a system schema (pg_* or information_schema)",
            field="table",
        )
    if schema == fence_schema and name == FENCE_TABLE:
        raise ConfigInvalid("the target table is dpone's fence table", field="table")
    return _Table(schema=schema, name=name)


class _Plan(msgspec.Struct, frozen=True):
    """A validated plan with every identifier folded."""

    table: _Table
    columns: tuple[str, ...]
    types: tuple[ColumnType, ...]
    key: tuple[str, ...]
    interval_column: str | None


def _audit(
    cur: psycopg.Cursor[Any], plan: LoadPlan, table: _Table, rows: int, operation_id: str
) -> None:
    """Write-audit-publish: the plan's audits on this transaction, before the commit."""

    def count(query: str) -> int:
        row = cur.execute(query.encode()).fetchone()
        return int(row[0]) if row is not None else 0

    audit_staged(
        plan,
        rows=rows,
        count=count,
        table_sql=f'"{table.schema}"."{table.name}"',
        quote=lambda name: f'"{_fold(name)}"',
        operation_id=operation_id,
    )


def _validate_plan(plan: LoadPlan, *, fence_schema: str) -> _Plan:
    table = _parse_table(plan.table, fence_schema=fence_schema)
    if not plan.columns:
        raise ConfigInvalid("the load plan has no columns", field="columns")
    names: list[str] = []
    for index, column in enumerate(plan.columns, start=1):
        name = _check_identifier(column.name, field="columns", what=f"column #{index}'s name")
        if name in names:
            raise ConfigInvalid(f"column {column.name!r} appears twice", field="columns")
        names.append(name)
    key: tuple[str, ...] = ()
    if plan.strategy is LoadStrategy.MERGE:
        if not plan.key:
            raise ConfigInvalid("merge needs a key", field="key", hint="set key: [id]")
        key = tuple(_fold(k) if isinstance(k, str) else "" for k in plan.key)
        missing = [k for k, folded in zip(plan.key, key, strict=True) if folded not in names]
        if missing:
            raise ConfigInvalid(
                f"merge key column(s) {', '.join(map(repr, missing))} are not among the columns",
                field="key",
            )
        if len(set(key)) != len(key):
            raise ConfigInvalid("the merge key names a column twice", field="key")
    interval_column: str | None = None
    if plan.strategy is LoadStrategy.REPLACE_INTERVAL:
        if plan.interval is None:
            raise ConfigInvalid("replace_interval needs an interval", field="interval")
        folded = _fold(plan.interval_column) if isinstance(plan.interval_column, str) else None
        if folded is None or folded not in names:
            raise ConfigInvalid(
                "replace_interval needs an interval_column that is one of the columns",
                field="interval_column",
            )
        interval_column = folded
    return _Plan(
        table=table,
        columns=tuple(names),
        types=tuple(c.type for c in plan.columns),
        key=key,
        interval_column=interval_column,
    )


# ----------------------------------------------------------------- COPY text encoding


class _UnsupportedValue(TypeError):
    """A value of a type COPY text cannot carry; ``kind`` is its type name (never the value)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _field(value: object) -> str:
    """One value in COPY text format; '' is NULL (the COPY runs with NULL '')."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.translate(_ESCAPES) if _SPECIAL_RE.search(value) else value
    if isinstance(value, bool):  # before int: bool is an int
        return "t" if value else "f"
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # shortest exact form; 'inf' and 'nan' parse as float8
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    raise _UnsupportedValue(type(value).__name__)


_NONE_TYPE = type(None)
_NUMBER_TYPES = frozenset({int, float, Decimal})  # str() is their COPY text (bool excluded)
_MOMENT_TYPES = frozenset({datetime, date, time})


def _column_text(values: Sequence[Any]) -> Sequence[str]:
    """Encode one column: a single C-level conversion when its values share one type."""
    kinds = set(map(type, values))
    nulls = _NONE_TYPE in kinds
    kinds.discard(_NONE_TYPE)
    if not kinds:
        return [""] * len(values)
    if kinds == {str}:
        strings: Sequence[str] = ["" if v is None else v for v in values] if nulls else values
        if _SPECIAL_RE.search("".join(strings)):
            return [v.translate(_ESCAPES) for v in strings]
        return strings
    if kinds <= _NUMBER_TYPES:
        return ["" if v is None else str(v) for v in values] if nulls else list(map(str, values))
    if kinds == {bool}:
        return ["" if v is None else ("t" if v else "f") for v in values]
    if kinds <= _MOMENT_TYPES:
        return ["" if v is None else v.isoformat() for v in values]
    return list(map(_field, values))  # mixed or subclassed values: one by one


def _encode_columns(batch: Sequence[Sequence[object]]) -> str:
    # itemgetter per column, not zip(*batch): a zip over thousands of row iterators
    # allocates one tracked object per row and wakes the garbage collector.
    columns = [_column_text(list(map(itemgetter(i), batch))) for i in range(len(batch[0]))]
    return "\n".join(chain(map("\t".join, zip(*columns, strict=True)), ("",)))


def _encode_batch(batch: Sequence[Sequence[object]], width: int, *, operation_id: str) -> bytes:
    """Encode one batch as COPY text lines; no Python work per value when it can be avoided.

    Rows of strings (a CSV source) are joined in C. The join cannot tell a tab or newline
    inside a value from a separator, so the separators are counted: when the counts are
    exact and no backslash or CR appears, no value needed escaping. Otherwise (other
    types, special characters) the batch is encoded column by column.
    """
    size = len(batch)
    if set(map(len, batch)) != {width}:
        # A short row would shift values across columns: refuse before writing anything.
        raise TargetWriteFailed(
            f"a row does not have the plan's {width} values; nothing was written",
            operation_id=operation_id,
        )
    try:
        text = "\n".join(chain(map("\t".join, batch), ("",)))  # type: ignore[arg-type]
        if (
            text.count("\t") != size * (width - 1)
            or text.count("\n") != size
            or "\\" in text
            or "\r" in text
        ):
            text = _encode_columns(batch)
    except TypeError:
        try:
            text = _encode_columns(batch)
        except (TypeError, ValueError) as exc:
            kind = f" of type {exc.kind}" if isinstance(exc, _UnsupportedValue) else ""
            raise TargetWriteFailed(
                f"a value{kind} cannot be written to PostgreSQL; nothing was written",
                operation_id=operation_id,
                hint="give the column a string, number, boolean or timestamp",
            ) from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise TargetWriteFailed(
            "a text value is not valid Unicode (a lone surrogate); nothing was written",
            operation_id=operation_id,
        ) from None


# ----------------------------------------------------------------- small operations

#: A load of at most this many rows is written by one multi-row INSERT, pipelined with
#: the fence statements, instead of a COPY: COPY cannot join a pipeline, and for a few
#: rows its extra round trips cost more than the rows themselves.
SMALL_ROWS = 1000
#: A source file above this size is never read ahead for the small path (see above).
SMALL_FILE_BYTES = 256 * 1024
_MAX_PARAMS = 32_767  # well below the protocol's 65,535 bind parameters
_SMALL_STRATEGIES = frozenset(
    {LoadStrategy.APPEND, LoadStrategy.REPLACE, LoadStrategy.REPLACE_INTERVAL}
)
_STR = frozenset({str})


def _offers_large_file(batches: Rows) -> bool:
    """True when the stream offers its source file raw and the file is no small load.

    Reading ahead for the small path takes rows from the stream, and a stream whose rows
    were taken no longer offers its file (``Counted.raw_csv``): a large file would then
    be parsed in Python instead of passing through COPY unparsed (ADR 0004). A file
    over ``SMALL_FILE_BYTES`` goes straight to the COPY path; its size is known to a
    source that read it whole, else one ``stat``.
    """
    size = raw_csv_size_of(batches)
    return size is not None and size > SMALL_FILE_BYTES


def _small_fields(
    plan: _Plan,
    raw: LoadPlan,
    rows: list[Sequence[object]],
    *,
    operation_id: str,
    intent_digest: str,
    epoch: int,
    content_digest: str,
    prepare: bool,
) -> tuple[tuple[sql.Composed, tuple[object, ...]] | None, list[object]]:
    """The small path's clearing statement (``replace_interval``) and all its parameters."""
    count = len(rows)
    clear = _clear_statement(plan, raw)
    params: list[object] = (
        [operation_id, intent_digest, epoch, count, content_digest]
        if prepare
        else [count, content_digest, operation_id, epoch, intent_digest]
    )
    if clear is not None:
        params.extend(clear[1])
    params.extend(_insert_params(rows, len(plan.columns), operation_id=operation_id))
    return clear, params


def _take_small(batches: Rows, limit: int) -> tuple[list[Sequence[object]] | None, Rows]:
    """Read ahead up to ``limit`` rows: (all the rows, -) if that is the whole load.

    Otherwise (None, batches) where the returned batches start with those read ahead:
    also for a load without rows, which the general path writes (an empty COPY; the
    one statement of the small path needs a row). Reading ahead is read-only (the
    source's own end-of-file checks run here when the load is small), so it happens
    before any lock is taken.
    """
    taken: list[Sequence[Sequence[object]]] = []
    total = 0
    it = iter(batches)
    for batch in it:
        taken.append(batch)
        total += len(batch)
        if total > limit:
            return None, chain(taken, it)
    if total == 0:
        return None, taken
    return [row for batch in taken for row in batch], ()


def _insert_params(
    rows: Sequence[Sequence[object]], width: int, *, operation_id: str
) -> list[str | None]:
    """The rows' values as the text a COPY would carry, unescaped; ``''`` and None are NULL.

    The parameters go out untyped (text), so the server parses each with the column's
    input function exactly as COPY does.
    """
    if set(map(len, rows)) != {width}:
        raise TargetWriteFailed(
            f"a row does not have the plan's {width} values; nothing was written",
            operation_id=operation_id,
        )
    values = [value for row in rows for value in row]
    if set(map(type, values)) <= _STR:
        return [value or None for value in values]  # type: ignore[misc]
    try:
        return [
            None
            if value is None or value == ""
            else (value if isinstance(value, str) else _field(value))
            for value in values
        ]
    except _UnsupportedValue as exc:
        raise TargetWriteFailed(
            f"a value of type {exc.kind} cannot be written to PostgreSQL; nothing was written",
            operation_id=operation_id,
            hint="give the column a string, number, boolean or timestamp",
        ) from None


def _fused_write(plan: _Plan, rows: int, *, fence: sql.Composable, part: Fused) -> bytes:
    """ONE autocommit statement: the operation's lock, ``part``'s CTEs, the fence, the rows.

    ``gate`` takes the operation's advisory lock (``_OPERATION_LOCK``) before the
    fence's INSERT and every write of ``part`` (they read it), so writers of one
    operation queue on it as on every other path (ADR 0022). The closing SELECT joins
    ``part``'s row with the fence's RETURNING; the rows' CTE is read by nobody, and runs
    to completion after them, in the same statement and snapshot.
    """
    own = _small_write(plan, rows, fence=fence, clear=None, head=False).as_bytes(None)
    return _numbered(
        b"".join(
            (
                b"WITH gate AS MATERIALIZED (SELECT pg_advisory_xact_lock(%s)), ",
                part.ctes,
                b", ",
                own,
                b" SELECT ",
                part.select,
                b", fence.state, fence.epoch, fence.intent_digest, fence.row_count, "
                b"fence.content_digest FROM ",
                part.source,
                b" CROSS JOIN fence",
            )
        )
    )


_PLACEHOLDER = re.compile(rb"%(.)", re.DOTALL)


def _numbered(statement: bytes) -> bytes:
    """``statement``'s ``%s`` placeholders as PostgreSQL's own ``$1``, ``$2``... in order.

    For a ``psycopg.RawCursor``, which sends the statement as it is: psycopg parses a
    ``%s`` statement again on every execute once it has more than 50 parameters (it
    caches only shorter ones), which costs a fused statement more than its round trip.
    ``%%`` is a percent sign, as psycopg reads it; any other ``%`` is refused.
    """
    numbers = count(1)

    def number(match: re.Match[bytes]) -> bytes:
        kind = match.group(1)
        if kind == b"%":
            return b"%"
        if kind != b"s":
            raise ValueError(f"a statement may hold only %s and %% placeholders, not %{kind!r}")
        return b"$%d" % next(numbers)

    return _PLACEHOLDER.sub(number, statement)


def _small_write(
    plan: _Plan,
    rows: int,
    *,
    fence: sql.Composable,
    clear: sql.Composable | None,
    head: bool = True,
) -> sql.Composed:
    """ONE statement: the fence statement (RETURNING its row), the replace DELETE, the rows.

    Data-modifying CTEs run to completion whatever the main query reads, all in the
    statement's snapshot: the DELETE sees only rows committed before it, never the new
    ones. The main query reads the fence's RETURNING (no row: refused): the fence row as
    this transaction wrote it, which ``mutate`` reports once the commit is acknowledged.
    """
    parts: list[sql.Composable] = [sql.SQL("fence AS ({})").format(fence)]
    if clear is not None:
        parts.append(sql.SQL("cleared AS ({})").format(clear))
    if rows:
        row = sql.SQL("({})").format(sql.SQL(", ").join([sql.Placeholder()] * len(plan.columns)))
        parts.append(
            sql.SQL("data AS (INSERT INTO {} ({}) VALUES {})").format(
                plan.table.ident, _column_list(plan.columns), sql.SQL(", ").join([row] * rows)
            )
        )
    if not head:  # the CTEs alone, for a host statement (``_fused_write``)
        return sql.SQL(", ").join(parts)
    return sql.SQL("WITH {} SELECT {} FROM fence").format(sql.SQL(", ").join(parts), _FENCE_COLUMNS)


def _clear_statement(plan: _Plan, raw: LoadPlan) -> tuple[sql.Composed, tuple[object, ...]] | None:
    """The DELETE a replace strategy runs before its rows (same statements as ``_load``)."""
    if raw.strategy is LoadStrategy.REPLACE:
        return sql.SQL("DELETE FROM {}").format(plan.table.ident), ()
    if raw.strategy is LoadStrategy.REPLACE_INTERVAL:
        if raw.interval is None or plan.interval_column is None:  # _validate_plan refused
            raise ConfigInvalid("replace_interval needs an interval", field="interval")
        column = sql.Identifier(plan.interval_column)
        statement = sql.SQL(
            "DELETE FROM {t} WHERE {c}::timestamptz >= %s AND {c}::timestamptz < %s"
        ).format(t=plan.table.ident, c=column)
        return statement, (raw.interval.start, raw.interval.end)
    return None


# ----------------------------------------------------------------- fence rows

_FenceRow = tuple[str, int, str | None, int | None, str | None]
#: The columns ``_observation`` reads, in its order (reads and RETURNING alike).
_FENCE_COLUMNS = sql.SQL("state, epoch, intent_digest, row_count, content_digest")


def _observation(row: _FenceRow | None) -> FenceObservation:
    if row is None:
        return FenceObservation(status=FenceStatus.ABSENT)
    state, epoch, intent, row_count, content_digest = row
    return FenceObservation(
        status=FenceStatus.COMMITTED if state == "committed" else FenceStatus.PREPARED,
        epoch=epoch,
        intent_digest=intent,
        row_count=row_count,
        content_digest=content_digest,
    )


class _Statements(msgspec.Struct, frozen=True):
    """The fence statements of one connector, composed once with its quoted schema."""

    connect: sql.Composed
    fence_exists: sql.Composed
    create_fence: sql.Composed
    select: sql.Composed
    lock: sql.Composed
    prepare: sql.Composed
    seal: sql.Composed
    commit: sql.Composed
    prepare_committed: sql.Composed
    insert_committed: sql.Composed
    insert_committed_gated: sql.Composed
    commit_checked: sql.Composed

    @classmethod
    def build(cls, schema: str) -> _Statements:
        fence = sql.Identifier(schema, FENCE_TABLE)
        columns = _FENCE_COLUMNS
        # the row a committing statement leaves, read back by the same statement
        returning = sql.SQL(
            "RETURNING f.state, f.epoch, f.intent_digest, f.row_count, f.content_digest"
        )
        qualified = sql.Literal(fence.as_string(None))
        return cls(
            connect=sql.SQL(
                "SELECT set_config('lock_timeout', %s, false) || "
                "set_config('TimeZone', 'UTC', false), to_regclass({qualified}) IS NOT NULL"
            ).format(qualified=qualified),
            fence_exists=sql.SQL(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = {schema}), "
                "to_regclass({qualified}) IS NOT NULL"
            ).format(schema=sql.Literal(schema), qualified=qualified),
            create_fence=sql.SQL(
                "CREATE TABLE IF NOT EXISTS {fence} ("
                "operation_id text PRIMARY KEY, "
                "intent_digest text, "
                "epoch bigint NOT NULL, "
                "state text NOT NULL CHECK (state IN ('prepared', 'committed')), "
                "row_count bigint, "
                "content_digest text, "
                "committed_at timestamptz)"
            ).format(fence=fence),
            select=sql.SQL("SELECT {columns} FROM {fence} WHERE operation_id = %s").format(
                columns=columns, fence=fence
            ),
            lock=sql.SQL("SELECT {columns} FROM {fence} WHERE operation_id = %s FOR UPDATE").format(
                columns=columns, fence=fence
            ),
            # ON CONFLICT DO UPDATE locks the existing row before it evaluates WHERE, so
            # both statements wait (up to lock_timeout) for a transaction holding the row,
            # then judge its committed version. No row returned: the WHERE refused it.
            prepare=sql.SQL(
                "INSERT INTO {fence} AS f (operation_id, intent_digest, epoch, state) "
                "VALUES (%s, %s, %s, 'prepared') "
                "ON CONFLICT (operation_id) DO UPDATE "
                "SET epoch = EXCLUDED.epoch, intent_digest = EXCLUDED.intent_digest "
                "WHERE f.state = 'prepared' AND f.epoch <= EXCLUDED.epoch "
                "RETURNING f.epoch"
            ).format(fence=fence),
            seal=sql.SQL(
                "INSERT INTO {fence} AS f (operation_id, intent_digest, epoch, state) "
                "VALUES (%s, NULL, %s, 'prepared') "
                "ON CONFLICT (operation_id) DO UPDATE SET epoch = EXCLUDED.epoch "
                "WHERE f.state = 'prepared' AND f.epoch < EXCLUDED.epoch "
                "RETURNING f.intent_digest"
            ).format(fence=fence),
            commit=sql.SQL(
                "UPDATE {fence} AS f SET state = 'committed', row_count = %s, "
                "content_digest = %s, committed_at = now() "
                "WHERE operation_id = %s AND epoch = %s AND state = 'prepared' {returning}"
            ).format(fence=fence, returning=returning),
            # The small path (row count known before the write): ``prepare`` and
            # ``commit`` as one locking statement, under the same conditions. The row is
            # locked before WHERE is judged, so a refusal can be read back under the lock.
            prepare_committed=sql.SQL(
                "INSERT INTO {fence} AS f (operation_id, intent_digest, epoch, state, "
                "row_count, content_digest, committed_at) "
                "VALUES (%s, %s, %s, 'committed', %s, %s, now()) "
                "ON CONFLICT (operation_id) DO UPDATE "
                "SET epoch = EXCLUDED.epoch, intent_digest = EXCLUDED.intent_digest, "
                "state = 'committed', row_count = EXCLUDED.row_count, "
                "content_digest = EXCLUDED.content_digest, committed_at = EXCLUDED.committed_at "
                "WHERE f.state = 'prepared' AND f.epoch <= EXCLUDED.epoch {returning}"
            ).format(fence=fence, returning=returning),
            # ... and for a first attempt, where no row is expected: any existing row is
            # a unique violation that aborts the transaction (ADR 0016)
            insert_committed=sql.SQL(
                "INSERT INTO {fence} AS f (operation_id, intent_digest, epoch, state, "
                "row_count, content_digest, committed_at) "
                "VALUES (%s, %s, %s, 'committed', %s, %s, now()) {returning}"
            ).format(fence=fence, returning=returning),
            # ... the same once the host statement's CTE ``gate`` (the operation's lock)
            # has a row: a fused statement's (ADR 0022); a SELECT list infers no types
            insert_committed_gated=sql.SQL(
                "INSERT INTO {fence} AS f (operation_id, intent_digest, epoch, state, "
                "row_count, content_digest, committed_at) "
                "SELECT %s::text, %s::text, %s::bigint, 'committed', %s::bigint, %s::text, "
                "now() FROM gate {returning}"
            ).format(fence=fence, returning=returning),
            # ... and ``commit`` alone, with the checks mutate makes under the lock.
            commit_checked=sql.SQL(
                "UPDATE {fence} AS f SET state = 'committed', row_count = %s, "
                "content_digest = %s, committed_at = now() "
                "WHERE operation_id = %s AND epoch = %s AND state = 'prepared' "
                "AND (intent_digest IS NULL OR intent_digest = %s) {returning}"
            ).format(fence=fence, returning=returning),
        )


# ----------------------------------------------------------------- target table

_TABLE_INFO = (
    "SELECT c.oid, c.relkind::text, "
    "array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid "
    "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %s AND c.relname = %s"
)
# The table's row (all NULL when there is none) and whether its schema exists: one round
# trip where a missing table used to cost a second one for its schema.
_TABLE_OR_SCHEMA = (
    "SELECT t.*, EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s) "
    f"FROM (SELECT 1) AS one LEFT JOIN LATERAL ({_TABLE_INFO}) AS t ON true"
)
# Key columns of every unique index ON CONFLICT can infer: valid, immediate, not partial,
# no expressions (INCLUDE columns are not key columns).
_UNIQUE_KEYS = (
    "SELECT array(SELECT a.attname::text FROM unnest(i.indkey[0:i.indnkeyatts - 1]) k(n) "
    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n) "
    "FROM pg_index i WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid "
    "AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL"
)
_WRITABLE_KINDS = frozenset({"r", "p"})  # ordinary and partitioned tables


class _TableInfo(msgspec.Struct, frozen=True):
    oid: int
    kind: str
    columns: frozenset[str]


def _table_info(cur: psycopg.Cursor[Any], table: _Table) -> _TableInfo | None:
    row = cur.execute(_TABLE_INFO, (table.schema, table.name)).fetchone()
    if row is None:
        return None
    return _TableInfo(oid=int(row[0]), kind=str(row[1]), columns=frozenset(row[2]))


def _verified_key(plan: LoadPlan) -> tuple[object, ...]:
    return (plan.table, plan.strategy, plan.key, tuple((c.name, c.type) for c in plan.columns))


def _check_table(cur: psycopg.Cursor[Any], info: _TableInfo, plan: _Plan, raw: str) -> None:
    """Refuse a relation that cannot take the plan's rows: not a table, missing columns/key."""
    if info.kind not in _WRITABLE_KINDS:
        raise TargetSchemaMismatch(
            f"{raw!r} exists but is not a table (a view, sequence or other relation)",
            hint="point the workload at a table",
        )
    missing = [c for c in plan.columns if c not in info.columns]
    if missing:
        raise TargetSchemaMismatch(
            f"table {raw!r} has no column(s) {', '.join(map(repr, missing))} that the load writes",
            hint=f"add the column(s) to {plan.table.normalized} or drop them from the "
            "workload's columns",
        )
    if plan.key:
        want = frozenset(plan.key)
        keys = [frozenset(r[0]) for r in cur.execute(_UNIQUE_KEYS, (info.oid,))]
        if want not in keys:
            # No index is built here: on a large table CREATE UNIQUE INDEX would block
            # writers for the whole build, inside the fenced transaction.
            raise TargetSchemaMismatch(
                f"table {raw!r} has no unique index or constraint on exactly the merge key "
                f"({', '.join(plan.key)}), which INSERT ... ON CONFLICT needs",
                hint=f"CREATE UNIQUE INDEX ON {plan.table.normalized} ({', '.join(plan.key)})",
            )


def _existing_table(cur: psycopg.Cursor[Any], plan: _Plan, raw: str) -> _TableInfo | None:
    """The table's info, or None when it is absent; refuse a schema that does not exist."""
    table = plan.table
    row = cur.execute(_TABLE_OR_SCHEMA, (table.schema, table.schema, table.name)).fetchone()
    if row is not None and row[0] is not None:
        return _TableInfo(oid=int(row[0]), kind=str(row[1]), columns=frozenset(row[2]))
    if not (row and row[3]):
        raise ConfigInvalid(
            f"the schema of table {raw!r} does not exist in the target database",
            field="table",
            hint=f"CREATE SCHEMA {plan.table.schema}, or name a table in an existing schema",
        )
    return None


def _create_table(plan: _Plan) -> sql.Composed:
    key = set(plan.key)
    parts: list[sql.Composable] = [
        sql.SQL("{} {}{}").format(
            sql.Identifier(name),
            sql.SQL(_SQL_TYPES[kind]),
            sql.SQL(" NOT NULL" if name in key else ""),
        )
        for name, kind in zip(plan.columns, plan.types, strict=True)
    ]
    if plan.key:
        parts.append(
            sql.SQL("UNIQUE ({})").format(sql.SQL(", ").join(map(sql.Identifier, plan.key)))
        )
    return sql.SQL("CREATE TABLE {} ({})").format(plan.table.ident, sql.SQL(", ").join(parts))


def _column_list(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, names))


def _copy_statement(target: sql.Composable, plan: _Plan) -> sql.Composed:
    # NULL '': an empty field is NULL, so '' from a CSV and None both load as NULL and
    # no per-value substitution is needed on the client.
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT text, NULL '')").format(
        target, _column_list(plan.columns)
    )


def _csv_copy_statement(target: sql.Composable, plan: _Plan, raw: RawCsv) -> sql.Composed:
    # CSV's NULL is the unquoted empty field; FORCE_NULL makes a quoted "" NULL too, so
    # every empty field is NULL, as in the rows path (NULL '' in text format).
    columns = _column_list(plan.columns)
    return sql.SQL(
        "COPY {} ({}) FROM STDIN (FORMAT csv, HEADER true, DELIMITER {}, ENCODING 'UTF8', "
        "FORCE_NULL ({}))"
    ).format(target, columns, sql.Literal(raw.delimiter), columns)


def _copy_file(cur: psycopg.Cursor[Any], statement: sql.Composed, raw: RawCsv) -> int:
    """COPY the file's chunks under a savepoint; refuse a count other than Python's."""
    with cur.connection.transaction():
        with cur.copy(statement) as copy:
            for chunk in raw.chunks(crlf=True):
                copy.write(chunk)
        count = cur.rowcount
        if count != raw.records():  # the server read other records than Python would
            raise RawCsvRefused("record count")
    return count


def _merge_statements(plan: _Plan) -> tuple[sql.Composed, sql.Composed]:
    """Return (create the staging table, upsert it into the target)."""
    stage = sql.Identifier(_STAGE)
    columns = _column_list(plan.columns)
    key = _column_list(plan.key)
    create = sql.SQL(
        # Only the plan's columns, with the target's own types; ON COMMIT DROP (and a
        # rollback) remove it. The identity column records arrival order.
        "CREATE TEMP TABLE {stage} ON COMMIT DROP AS SELECT {columns} FROM {target} "
        "WITH NO DATA; "
        "ALTER TABLE {stage} ADD COLUMN {seq} bigint GENERATED ALWAYS AS IDENTITY"
    ).format(stage=stage, columns=columns, target=plan.table.ident, seq=sql.Identifier(_SEQ))
    updates = [
        sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
        for c in plan.columns
        if c not in plan.key
    ]
    action = (
        sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(updates))
        if updates
        else sql.SQL("DO NOTHING")
    )
    # A key repeated inside one load: the last row wins (as in the SQLite connector),
    # decided by arrival order, because ON CONFLICT refuses to touch a row twice.
    upsert = sql.SQL(
        "INSERT INTO {target} ({columns}) "
        "SELECT DISTINCT ON ({key}) {columns} FROM {stage} ORDER BY {key}, {seq} DESC "
        "ON CONFLICT ({key}) {action}"
    ).format(
        target=plan.table.ident,
        columns=columns,
        key=key,
        stage=stage,
        seq=sql.Identifier(_SEQ),
        action=action,
    )
    return create, upsert


_BEGIN = b"BEGIN ISOLATION LEVEL READ COMMITTED"
_COMMIT = b"COMMIT"
_INSERT_CACHE = 64  # entries per connector cache: rendered small statements, validated plans


#: Every write transaction of an operation takes its advisory lock first (pipelined
#: behind BEGIN on the small path). The one-sync path writes the journal entry before
#: the fence row, the others the fence row first: two writers of one operation on
#: different paths would otherwise lock the two in opposite orders and deadlock (ADR
#: 0016). Bounded by lock_timeout like any other wait: FENCE_UNAVAILABLE past it.
_OPERATION_LOCK = b"SELECT pg_advisory_xact_lock(%s)"


def _operation_key(operation_id: str) -> Int8:
    return Int8(_advisory_key("operation", operation_id))  # always bigint: one prepared plan


class _FenceRowExists(Exception):
    """The first attempt's INSERT met an existing fence row; the transaction rolled back."""


def _unconfirmed(operation_id: str) -> FenceUnavailable:
    """A fused statement that succeeded but whose row could not be read (ADR 0022)."""
    return FenceUnavailable(
        "the target committed the write's statement but its confirming row could not be "
        "read; the next try reads the journal before writing anything",
        operation_id=operation_id,
    )


class _Unclaimed(Exception):
    """The fused statement failed with an error that names no table (ADR 0022).

    A trigger's RAISE, a privilege or a value's type, never a wait or a lost server
    (``is_unavailable``: writing again would only wait again): not the fused part's by its
    tables, nor the fence row's, nor certainly the rows'. The statement rolled back whole,
    so the pipelined path runs the same writes again, where the statement
    order attributes the error (``_small_at_once``).
    """


#: the epoch of a first attempt: no fence row exists for it yet (ADR 0016)
_FIRST_EPOCH = 1


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    """End a failed transaction; a connection that cannot is discarded by ``_session``."""
    try:
        if conn.info.transaction_status is not TransactionStatus.IDLE and not conn.broken:
            conn.execute(b"ROLLBACK")
    except psycopg.Error:
        pass


def _check_marked(rowcount: int, *, operation_id: str) -> None:
    if rowcount != 1:  # impossible under the row lock; refuse, never guess
        raise FencedOut(
            "the fence moved during the write; nothing was written", operation_id=operation_id
        )


def _check_healthy(conn: psycopg.Connection[Any], *, operation_id: str) -> None:
    if conn.info.transaction_status is not TransactionStatus.INTRANS:
        # A failed statement whose error was swallowed (in within) leaves the
        # transaction aborted: COMMIT would silently roll back. Say so.
        raise TargetWriteFailed(
            "the transaction was aborted by a failed statement before commit; nothing was written",
            operation_id=operation_id,
        )


# ----------------------------------------------------------------- error translation

# CREATE ... IF NOT EXISTS racing another session: a catalog unique violation or a
# duplicate-object error, depending on who got there first.
_DUPLICATE_OBJECT = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DuplicateSchema,
    psycopg.errors.DuplicateTable,
    psycopg.errors.DuplicateObject,
)

_SCHEMA_STATES = frozenset({"42P01", "42703", "42P10", "42804", "42846", "42883"})


def _translate(
    exc: BaseException, *, action: str, lock_timeout_s: float, operation_id: str | None
) -> DponeError:
    """Map a driver error to the DponeError the port promises (the one place that does it)."""
    state = getattr(exc, "sqlstate", None) or ""
    if state == "3F000":
        return ConfigInvalid(
            f"{action}: a schema the target table needs does not exist ({describe(exc)})",
            field="table",
            hint="create the schema or name a table in an existing schema",
        )
    if state in _SCHEMA_STATES:
        return TargetSchemaMismatch(
            f"{action}: the target table does not match what the load writes ({describe(exc)})",
            operation_id=operation_id,
            hint="align the workload's columns, types and merge key with the target table",
        )
    if state == "42501":
        return TargetWriteFailed(
            f"{action}: permission denied on the PostgreSQL target ({describe(exc)})",
            operation_id=operation_id,
            hint="grant the role USAGE/CREATE on the schemas and INSERT/UPDATE/DELETE on the "
            "tables dpone writes (including the fence table)",
        )
    error = translate(
        exc,
        action=action,
        unavailable=FenceUnavailable,
        rejected=TargetWriteFailed,
        operation_id=operation_id,
        lock_timeout_s=lock_timeout_s,
        subject="the PostgreSQL target",
    )
    if isinstance(error, TargetWriteFailed) and state[:2] in {"22", "23"}:
        return TargetWriteFailed(
            f"{action}: the PostgreSQL target rejected a row ({describe(exc)}); "
            "the transaction was rolled back",
            operation_id=operation_id,
            hint="fix the source rows or the target table's types and constraints, then run again",
        )
    return error


# ----------------------------------------------------------------- connector


class PostgresConnector:
    """Target connector for one PostgreSQL table with a ``transactional_marker`` fence.

    The fence lives in ``<fence_schema>.dpone_fence``. ``prepare`` and ``seal`` are
    locking writes on the fence row and ``mutate`` holds that row's lock (``FOR UPDATE``)
    for its whole transaction, so a seal waits for a writer still in flight, up to
    ``lock_timeout_s``, and then raises ``FenceUnavailable`` rather than guess.

    One connection is kept per connector and reused (a connection costs more than a
    small operation); calls from several threads take turns on it. Identifiers are
    folded to lower case, as PostgreSQL does for unquoted names, and always quoted.

    Args:
        dsn: libpq URL or key/value string; it never appears in messages or identities.
        table: ``name`` or ``schema.name`` (schema ``public`` by default); plans must name
            the same table.
        fence_schema: the schema holding the fence table; created if absent.
        lock_timeout_s: the longest wait for a lock (fence row, table, catalog).
        connect_timeout_s: the longest wait to connect (libpq rounds it up to whole seconds).
    """

    #: a ``QueuedWithin(ahead=True)`` is sent before the rows, or refused (ADR 0019)
    queues_ahead = True
    #: ``mutate(gate=...)`` calls the gate before its first byte to the target (ADR 0021)
    gates_writes = True

    def __init__(
        self,
        dsn: str,
        *,
        table: str,
        fence_schema: str = "dpone",
        lock_timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise ConfigInvalid("the PostgreSQL target needs a URL", field="dsn")
        for field, value in (
            ("lock_timeout_s", lock_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigInvalid(f"{field} must be a positive number of seconds", field=field)
        self._locator = pg_locator(dsn)  # ConfigInvalid, without the DSN, if it cannot parse
        self._has_application_name = "application_name" in conninfo_to_dict(dsn)
        self._dsn = dsn
        self._fence_schema = _check_identifier(
            fence_schema, field="fence_schema", what="the fence schema"
        )
        if _reserved_schema(self._fence_schema):
            raise ConfigInvalid("the fence schema cannot be a system schema", field="fence_schema")
        self._table = _parse_table(table, fence_schema=self._fence_schema)
        self._lock_timeout_s = float(lock_timeout_s)
        self._connect_timeout_s = float(connect_timeout_s)
        self._sql = _Statements.build(self._fence_schema)
        self._conn: psycopg.Connection[Any] | None = None
        self._fence_ready = False
        # Tables already found able to take a plan's rows (a committed fact, checked once
        # per connector): saves catalog round trips on every small operation. The write
        # itself still fails safely (rolled back) if the table changed since.
        self._verified: set[tuple[object, ...]] = set()
        self._inserts: dict[tuple[_Plan, int, bool, bool, bool], bytes] = {}
        self._fusions: dict[tuple[_Plan, int, bytes], bytes] = {}  # fused statements
        self._plans: dict[tuple[object, ...], _Plan] = {}
        self._lock = threading.RLock()  # re-entrant: within() may call back into observe

    @property
    def kind(self) -> str:
        """Connector name."""
        return "postgres"

    @property
    def capability(self) -> FenceCapability:
        """A fence row in the same transaction as the data."""
        return FenceCapability.TRANSACTIONAL_MARKER

    @property
    def table(self) -> str:
        """The target table as ``schema.name`` (folded)."""
        return self._table.normalized

    @property
    def fence_schema(self) -> str:
        """The schema holding ``dpone_fence``."""
        return self._fence_schema

    def target_identity(self) -> str:
        """Return ``postgresql://<host>:<port>/<db>#<schema>.<table>``: no credentials."""
        return f"{self._locator}#{self._table.normalized}"

    def database_locator(self) -> str:
        """Return ``postgresql://<host>:<port>/<db>``, the key atomic mode matches."""
        return self._locator

    # ----------------------------------------------------------------- connection

    def _connect(self) -> psycopg.Connection[Any]:
        extra: dict[str, Any] = {}
        if not self._has_application_name:
            extra["application_name"] = "dpone"  # lets an operator find a stuck writer
        conn = psycopg.connect(
            self._dsn,
            autocommit=True,
            connect_timeout=max(1, math.ceil(self._connect_timeout_s)),
            client_encoding="utf8",  # _encode_batch sends UTF-8 bytes
            **extra,
        )
        try:
            # READ COMMITTED explicitly: FOR UPDATE then sees the version a waited-for
            # writer committed (stricter levels would fail with a serialization error).
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            # UTC: a timestamp without zone in the rows means UTC, as on SQLite. The same
            # round trip asks whether the fence table exists (the next call needs to know).
            row = conn.execute(
                self._sql.connect,
                (f"{max(1, round(self._lock_timeout_s * 1000))}ms",),
            ).fetchone()
        except BaseException:
            conn.close()
            raise
        if row is not None and row[1]:
            self._fence_ready = True
        return conn

    @contextmanager
    def _session(
        self, *, action: str, operation_id: str | None
    ) -> Iterator[psycopg.Connection[Any]]:
        """Yield the connection under the connector's lock; translate driver errors."""
        with self._lock:
            conn = self._conn
            try:
                if conn is None or conn.closed:
                    conn = self._conn = self._connect()
                yield conn
            except psycopg.Error as exc:
                self._discard_if_unusable()
                raise _translate(
                    exc,
                    action=action,
                    lock_timeout_s=self._lock_timeout_s,
                    operation_id=operation_id,
                ) from exc
            except BaseException:
                self._discard_if_unusable()
                raise

    def _discard_if_unusable(self) -> None:
        conn = self._conn
        if conn is None:
            return
        status = conn.info.transaction_status
        piped = not conn.closed and conn.info.pipeline_status is not PipelineStatus.OFF
        if conn.closed or conn.broken or status is not TransactionStatus.IDLE or piped:
            self._conn = None
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _ensure_fence(self, conn: psycopg.Connection[Any]) -> None:
        if self._fence_ready:
            return
        for attempt in (1, 2):
            row = conn.execute(self._sql.fence_exists).fetchone()
            schema_exists, table_exists = bool(row and row[0]), bool(row and row[1])
            if table_exists:
                break
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_advisory_key("fence"),))
                    # CREATE SCHEMA needs the database's CREATE privilege even when the
                    # schema exists, so an existing schema is not created again.
                    if not schema_exists:
                        conn.execute(
                            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                                sql.Identifier(self._fence_schema)
                            )
                        )
                    conn.execute(self._sql.create_fence)
                break
            except _DUPLICATE_OBJECT:
                # Someone outside this lock (the journal, another tool) created the schema
                # or table at the same moment: look again once, it exists now.
                if attempt == 2:
                    raise
        self._fence_ready = True

    def _read_fence(self, conn: psycopg.Connection[Any], operation_id: str) -> _FenceRow | None:
        row: _FenceRow | None = conn.execute(self._sql.select, (operation_id,)).fetchone()
        return row

    # ----------------------------------------------------------------- port

    def _plan(self, plan: LoadPlan) -> _Plan:
        # Validated once per plan shape (everything but the interval's bounds): every
        # small operation of a Runner has the same one.
        shape = (
            plan.table,
            plan.strategy,
            plan.columns,
            plan.key,
            plan.interval_column,
            plan.interval is None,
        )
        try:
            hash(shape)
        except TypeError:  # an unhashable value: validate (and refuse), never cache
            return self._validated(plan)
        checked = self._plans.get(shape)
        if checked is None:
            checked = self._validated(plan)
            if len(self._plans) < _INSERT_CACHE:
                self._plans[shape] = checked
        return checked

    def _validated(self, plan: LoadPlan) -> _Plan:
        checked = _validate_plan(plan, fence_schema=self._fence_schema)
        if checked.table != self._table:
            raise ConfigInvalid(
                "the plan's table is not the table this connector was configured for",
                field="table",
            )
        return checked

    def check_plan(self, plan: LoadPlan) -> None:
        """Check, read-only, that the table (if it exists) has every column and the merge key."""
        checked = self._plan(plan)
        if _verified_key(plan) in self._verified:
            return
        with self._session(action="check_plan", operation_id=None) as conn, conn.cursor() as cur:
            info = _existing_table(cur, checked, plan.table)
            if info is not None:
                _check_table(cur, info, checked, plan.table)
                self._verified.add(_verified_key(plan))

    def plan_checked(self, plan: LoadPlan) -> bool:
        """True when ``check_plan`` would pass without reading the target (it did before).

        An optional ability: a caller may then write the journal without calling
        ``check_plan`` first (ADR 0018). False for a plan ``check_plan`` would refuse or
        would have to read the target for.
        """
        try:
            self._plan(plan)  # the plan's own checks (columns, key, interval)
            return _verified_key(plan) in self._verified
        except (DponeError, TypeError):  # refused, or an unhashable value (never cached)
            return False

    def _explain_refusal(self, plan: LoadPlan, refused: DponeError) -> None:
        """Raise check_plan's precise error for a table that refused a cached plan."""
        try:
            self.check_plan(plan)
        except (TargetSchemaMismatch, ConfigInvalid) as precise:
            raise precise from refused

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        """Install the fence or raise its epoch; never lower it, never touch a committed row."""
        with self._session(action="prepare", operation_id=operation_id) as conn:
            self._ensure_fence(conn)
            # One autocommit statement: a durable, locking upsert in a single round trip.
            row = conn.execute(self._sql.prepare, (operation_id, intent_digest, epoch)).fetchone()
            if row is not None:
                return FenceObservation(
                    status=FenceStatus.PREPARED, epoch=int(row[0]), intent_digest=intent_digest
                )
            current = _observation(self._read_fence(conn, operation_id))
        if current.status is FenceStatus.COMMITTED:
            return current
        raise FencedOut(
            f"the fence is prepared at epoch {current.epoch}, above this executor's epoch "
            f"{epoch}: its lease is stale",
            operation_id=operation_id,
        )

    def observe(self, *, operation_id: str) -> FenceObservation:
        """Read the fence without writing (a missing fence table reads as ABSENT)."""
        with self._session(action="observe", operation_id=operation_id) as conn:
            if not self._fence_ready:
                row = conn.execute(self._sql.fence_exists).fetchone()
                if not (row and row[1]):
                    return FenceObservation(status=FenceStatus.ABSENT)
                self._fence_ready = True
            return _observation(self._read_fence(conn, operation_id))

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        """Raise the fence to ``epoch`` with a row lock, proving a non-commit, or report why not."""
        with self._session(action="seal", operation_id=operation_id) as conn:
            self._ensure_fence(conn)
            row = conn.execute(self._sql.seal, (operation_id, epoch)).fetchone()
            if row is not None:
                return SealResult(
                    outcome=SealOutcome.NOT_COMMITTED,
                    observation=FenceObservation(
                        status=FenceStatus.PREPARED, epoch=epoch, intent_digest=row[0]
                    ),
                )
            # The upsert waited for any holder of the row, then refused to change it:
            # committed is terminal and epochs only rise, so this read is the answer.
            current = _observation(self._read_fence(conn, operation_id))
        if current.status is FenceStatus.COMMITTED:
            return SealResult(outcome=SealOutcome.COMMITTED, observation=current)
        return SealResult(outcome=SealOutcome.FENCED, observation=current)

    def mutate(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        plan: LoadPlan,
        batches: Rows,
        content_digest: str,
        within: WithinTransaction | None = None,
        prepare: bool = False,
        gate: Gate | None = None,
    ) -> MutationReport:
        """Write the rows and mark the fence committed in one transaction, or nothing.

        With ``prepare`` the fence is first installed or raised to ``epoch`` by the same
        locking upsert as ``prepare``, inside this transaction: the row lock it takes is
        held to the commit, exactly like ``FOR UPDATE``. ``gate`` is called after the
        plan is checked and a few rows are read, before the first byte to the target.
        """
        checked = self._plan(plan)
        key = _verified_key(plan)
        small: list[Sequence[object]] | None = None
        # audits need the staged rows in the table before commit: the general path runs them
        if (
            plan.strategy in _SMALL_STRATEGIES
            and key in self._verified
            and plan.audits is None
            and not _offers_large_file(batches)
        ):
            limit = min(SMALL_ROWS, _MAX_PARAMS // len(checked.columns))
            small, batches = _take_small(batches, limit)
        if small is None and isinstance(within, QueuedWithin) and within.ahead:
            raise CannotQueueAhead  # the rows would go first (COPY): nothing written
        fields, count = None, 0
        if small is not None:
            count = len(small)
            fields = _small_fields(
                checked,
                plan,
                small,
                operation_id=operation_id,
                intent_digest=intent_digest,
                epoch=epoch,
                content_digest=content_digest,
                prepare=prepare,
            )
        if gate is not None:
            gate()  # raises to stop here: nothing was sent to the target
        try:
            with self._session(action="mutate", operation_id=operation_id) as conn:
                self._ensure_fence(conn)
                if fields is not None:
                    return self._mutate_small(
                        conn,
                        checked,
                        fields,
                        count=count,
                        operation_id=operation_id,
                        intent_digest=intent_digest,
                        epoch=epoch,
                        content_digest=content_digest,
                        within=within,
                        prepare=prepare,
                    )
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(_OPERATION_LOCK, (_operation_key(operation_id),))
                    current = self._lock_fence(
                        cur,
                        operation_id=operation_id,
                        intent_digest=intent_digest,
                        epoch=epoch,
                        prepare=prepare,
                    )
                    require_prepared(
                        current, operation_id=operation_id, intent_digest=intent_digest, epoch=epoch
                    )
                    if key not in self._verified and self._prepare_table(cur, checked, plan.table):
                        self._verified.add(key)
                    count = self._load(cur, checked, plan, batches, operation_id=operation_id)
                    _audit(cur, plan, checked.table, count, operation_id)
                    cur.execute(self._sql.commit, (count, content_digest, operation_id, epoch))
                    _check_marked(cur.rowcount, operation_id=operation_id)
                    marked: _FenceRow | None = cur.fetchone()
                    if within is not None:
                        within(conn)
                    _check_healthy(conn, operation_id=operation_id)
        except (TargetSchemaMismatch, ConfigInvalid) as exc:
            # The table changed since it was checked (a column or the table dropped): the
            # write was refused and rolled back. Check it again now, to say exactly what
            # no longer fits, and on the next operation.
            cached = key in self._verified
            self._verified.discard(key)
            if cached:
                self._explain_refusal(plan, exc)
            raise
        # the transaction that marked the row committed is acknowledged: the row it
        # RETURNED is the committed fence, terminal from here on (no observe needed)
        return MutationReport(
            row_count=count, content_digest=content_digest, committed=_observation(marked)
        )

    def _lock_fence(
        self,
        cur: psycopg.Cursor[Any],
        *,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        prepare: bool,
    ) -> FenceObservation:
        """Lock the fence row for this transaction (raising it first with ``prepare``)."""
        if prepare:
            raised = cur.execute(self._sql.prepare, (operation_id, intent_digest, epoch)).fetchone()
            if raised is not None:
                return FenceObservation(
                    status=FenceStatus.PREPARED, epoch=epoch, intent_digest=intent_digest
                )
            # Refused (committed, or a higher epoch): the upsert still holds the row
            # lock, so this read is current.
        return _observation(cur.execute(self._sql.lock, (operation_id,)).fetchone())

    def _mutate_small(
        self,
        conn: psycopg.Connection[Any],
        plan: _Plan,
        fields: tuple[tuple[sql.Composed, tuple[object, ...]] | None, list[object]],
        *,
        count: int,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        content_digest: str,
        within: WithinTransaction | None,
        prepare: bool,
    ) -> MutationReport:
        """``mutate`` for a few rows: one statement instead of a COPY, pipelined.

        The row count is known before the write, so the fence is installed (or raised)
        and marked committed by one locking statement under the conditions ``mutate``
        checks (prepared, not above ``epoch``; with ``prepare`` False: prepared at
        ``epoch`` for this intent), in the same statement as the rows. BEGIN and that
        statement are judged at one sync; ``within`` runs in the open transaction; then
        COMMIT. A refusal or any error rolls the whole transaction back. The fence row
        the statement RETURNED is reported as committed only once COMMIT is acknowledged.
        """
        clear, params = fields
        ahead = isinstance(within, QueuedWithin) and within.ahead
        if (
            prepare
            and epoch == _FIRST_EPOCH
            and (within is None or isinstance(within, QueuedWithin))
        ):
            try:
                if isinstance(within, QueuedWithin) and within.fuse is not None and clear is None:
                    try:
                        return self._small_fused(
                            conn,
                            plan,
                            params,
                            within.fuse(conn),
                            operation_id=operation_id,
                            content_digest=content_digest,
                            count=count,
                        )
                    except _Unclaimed:
                        pass  # rolled back whole: written again below, told by statement order
                return self._small_at_once(
                    conn,
                    self._small_statement(plan, count, prepare=prepare, clear=clear, fresh=True),
                    params,
                    operation_id=operation_id,
                    content_digest=content_digest,
                    count=count,
                    within=within,
                )
            except _FenceRowExists:
                # rolled back, nothing written: judge that row as below, where within's
                # statements follow the rows (so not for one that must go ahead)
                if ahead:
                    raise CannotQueueAhead from None
        elif ahead:
            raise CannotQueueAhead
        statement = self._small_statement(plan, count, prepare=prepare, clear=clear)
        try:
            with pipeline_quietly(conn) as pipeline, conn.cursor() as cur:
                cur.execute(_BEGIN)
                cur.execute(_OPERATION_LOCK, (_operation_key(operation_id),))
                try:
                    cur.execute(statement, params)
                except UnicodeEncodeError:
                    raise TargetWriteFailed(
                        "a text value is not valid Unicode (a lone surrogate); nothing was written",
                        operation_id=operation_id,
                    ) from None
                pipeline.sync()
                marked: _FenceRow | None = cur.fetchone()
                if marked is None:
                    # Refused: the statement holds the row lock, so this read is current.
                    current = _observation(cur.execute(self._sql.lock, (operation_id,)).fetchone())
                    require_prepared(
                        current, operation_id=operation_id, intent_digest=intent_digest, epoch=epoch
                    )
                    _check_marked(0, operation_id=operation_id)  # never reached: refused
                if isinstance(within, QueuedWithin):
                    collect = within.queue(conn)
                    try:
                        pipeline.sync()  # the statement was judged: an error here is within's
                    except psycopg.Error as exc:
                        collect(exc)
                        raise
                    collect(None)
                elif within is not None:
                    within(conn)
                _check_healthy(conn, operation_id=operation_id)
                cur.execute(_COMMIT)  # sent and confirmed by the pipeline's closing sync
        except BaseException:
            _rollback_quietly(conn)
            raise
        return MutationReport(
            row_count=count, content_digest=content_digest, committed=_observation(marked)
        )

    def _small_at_once(
        self,
        conn: psycopg.Connection[Any],
        statement: bytes,
        params: list[object],
        *,
        operation_id: str,
        content_digest: str,
        count: int,
        within: QueuedWithin | None,
    ) -> MutationReport:
        """A first attempt's small write: BEGIN, ``within``, rows and fence, COMMIT, one sync.

        At epoch 1 no fence row is expected, so the statement INSERTs the row committed
        with no ON CONFLICT (ADR 0016): any existing row (another executor's, or one
        left by a prepare) is a unique violation that aborts the transaction, so the
        COMMIT queued behind it can never commit a write the fence did not admit. That
        case raises ``_FenceRowExists`` after the rollback, and ``_mutate_small`` judges
        the row with the locking upsert as it always did. ``within`` only queues its
        statements, first; any error is offered to its collector first (its statements
        come first), then is this statement's when it has no result, else COMMIT's.
        """
        cur = conn.cursor()
        ctl = conn.cursor()
        collect: Collector | None = None
        try:
            try:
                with pipeline_quietly(conn):
                    ctl.execute(_BEGIN)
                    ctl.execute(_OPERATION_LOCK, (_operation_key(operation_id),))
                    # within's statements first: an error its own executes read can then
                    # only be its own (a pipelined execute reads results that arrived)
                    if within is not None:
                        collect = within.queue(conn)
                    try:
                        cur.execute(statement, params)
                    except UnicodeEncodeError:
                        raise TargetWriteFailed(
                            "a text value is not valid Unicode (a lone surrogate); "
                            "nothing was written",
                            operation_id=operation_id,
                        ) from None
                    ctl.execute(_COMMIT)
                # the pipeline's closing sync sent all of it and read every result
                marked: _FenceRow | None = cur.fetchone()
                confirmed = marked is not None and ctl.statusmessage == "COMMIT"
            except psycopg.Error as exc:
                # In pipeline mode any execute may raise an earlier statement's error:
                # attribute it by the first statement without a result, in their order.
                _rollback_quietly(conn)
                if conn.broken:
                    raise  # the connection itself: no statement's error (commit unread)
                if collect is not None:
                    collect(exc)  # raises its own error when one of its statements failed
                if cur.pgresult is None and self._is_fence_row(exc):
                    raise _FenceRowExists from exc
                raise  # the rows-and-fence statement's, else COMMIT's: the connector's
            except BaseException:
                _rollback_quietly(conn)
                raise
        finally:
            cur.close()
            ctl.close()
        if not confirmed:  # never after a clean sync: refuse, never guess
            _rollback_quietly(conn)
            raise TargetWriteFailed(
                "the target did not confirm the commit", operation_id=operation_id
            )
        if collect is not None:
            collect(None)  # committed: hands over what its statements returned
        return MutationReport(
            row_count=count, content_digest=content_digest, committed=_observation(marked)
        )

    def _small_fused(
        self,
        conn: psycopg.Connection[Any],
        plan: _Plan,
        params: list[object],
        part: Fused,
        *,
        operation_id: str,
        content_digest: str,
        count: int,
    ) -> MutationReport:
        """``_small_at_once`` as ONE autocommit statement, ``part`` fused in (ADR 0022).

        The lock, ``part``'s writes (the journal's entry born COMPLETE), the fence row
        and the rows commit together or not at all: one statement needs no BEGIN or
        COMMIT, and a client that stops at any point before its one message is sent has
        sent nothing. A successful execute is the acknowledged commit. Any error is
        offered to ``part`` first (one of its tables: its own), then judged as
        ``_small_at_once`` judges its statement's; one that names no table is
        ``_Unclaimed`` (the caller writes again, pipelined, to tell whose it is).
        """
        if not conn.autocommit or conn.info.transaction_status is not TransactionStatus.IDLE:
            # a statement in an open transaction would not commit by itself succeeding
            raise RuntimeError("the fused write needs an idle autocommit connection")
        key = (plan, count, part.ctes)
        statement = self._fusions.get(key)
        if statement is None:
            if len(self._fusions) >= _INSERT_CACHE:
                self._fusions.clear()
            statement = _fused_write(plan, count, fence=self._sql.insert_committed_gated, part=part)
            self._fusions[key] = statement
        values = [_operation_key(operation_id), *part.params, *params]
        with psycopg.RawCursor(conn) as cur:  # $n placeholders (``_numbered``)
            try:
                try:
                    cur.execute(statement, values)
                except UnicodeEncodeError:
                    raise TargetWriteFailed(
                        "a text value is not valid Unicode (a lone surrogate); nothing was written",
                        operation_id=operation_id,
                    ) from None
            except psycopg.Error as exc:
                _rollback_quietly(conn)
                if conn.broken:
                    raise  # the connection itself: the commit is unknown (the caller's)
                part.collect(None, exc)  # raises its own error when one of its tables failed
                if self._is_fence_row(exc):
                    raise _FenceRowExists from exc
                if exc.diag.table_name is None and not is_unavailable(exc):
                    raise _Unclaimed from exc
                raise  # the rows', or a wait's (a lock or statement timeout: never twice)
            # The statement succeeded: it committed what it wrote. Its row (two one-row
            # RETURNINGs joined) is never missing; if it were, never guess: the next try
            # reads the journal first, as after a lost connection, and nothing of this
            # one is recorded as failed.
            try:
                row = cur.fetchone()
            except psycopg.Error as exc:
                raise _unconfirmed(operation_id) from exc
        if row is None:
            raise _unconfirmed(operation_id)
        width = part.width
        part.collect(row[:width], None)
        marked: _FenceRow = row[width:]
        return MutationReport(
            row_count=count, content_digest=content_digest, committed=_observation(marked)
        )

    def _is_fence_row(self, exc: psycopg.Error) -> bool:
        """True for the unique violation of an existing row of this connector's fence."""
        diag = exc.diag
        return (
            isinstance(exc, psycopg.errors.UniqueViolation)
            and diag.table_name == FENCE_TABLE
            and diag.schema_name == self._fence_schema
        )

    def _small_statement(
        self,
        plan: _Plan,
        rows: int,
        *,
        prepare: bool,
        clear: tuple[sql.Composed, tuple[object, ...]] | None,
        fresh: bool = False,
    ) -> bytes:
        """The small path's statement, rendered once per connector and shape."""
        key = (plan, rows, prepare, clear is not None, fresh)
        statement = self._inserts.get(key)
        if statement is None:
            if len(self._inserts) >= _INSERT_CACHE:
                self._inserts.clear()
            if fresh:
                fence = self._sql.insert_committed
            else:
                fence = self._sql.prepare_committed if prepare else self._sql.commit_checked
            statement = _small_write(
                plan, rows, fence=fence, clear=None if clear is None else clear[0]
            ).as_bytes(None)
            self._inserts[key] = statement
        return statement

    def _prepare_table(self, cur: psycopg.Cursor[Any], plan: _Plan, raw: str) -> bool:
        """Create the table or check it; True when it existed before this transaction."""
        info = _existing_table(cur, plan, raw)
        if info is None:
            # Serialize first loads of one table; the loser then sees the winner's table.
            cur.execute(
                "SELECT pg_advisory_xact_lock(%s)", (_advisory_key("table", plan.table.normalized),)
            )
            info = _table_info(cur, plan.table)
            if info is None:
                try:
                    # A savepoint: a creator outside dpone's lock racing us must not abort
                    # the whole transaction.
                    with cur.connection.transaction():
                        cur.execute(_create_table(plan))
                    return False  # created here: rolled back with us if we fail
                except _DUPLICATE_OBJECT:
                    info = _table_info(cur, plan.table)
                    if info is None:
                        raise
        _check_table(cur, info, plan, raw)
        return True

    def _load(
        self,
        cur: psycopg.Cursor[Any],
        plan: _Plan,
        raw_plan: LoadPlan,
        batches: Rows,
        *,
        operation_id: str,
    ) -> int:
        target: sql.Composable = plan.table.ident
        upsert: sql.Composed | None = None
        strategy = raw_plan.strategy
        if strategy is LoadStrategy.REPLACE:
            # DELETE, not TRUNCATE: TRUNCATE takes an ACCESS EXCLUSIVE lock (readers block
            # for the whole load) and is not MVCC-safe (a concurrent snapshot would see the
            # table empty). DELETE lets readers see the old rows until this commit.
            cur.execute(sql.SQL("DELETE FROM {}").format(target))
        elif strategy is LoadStrategy.REPLACE_INTERVAL:
            interval = raw_plan.interval
            if interval is None or plan.interval_column is None:  # _validate_plan refused
                raise ConfigInvalid("replace_interval needs an interval", field="interval")
            column = sql.Identifier(plan.interval_column)
            # Compared as timestamptz: a no-op (index usable) on timestamptz columns; a
            # timestamp or text column is read in the session's UTC.
            cur.execute(
                sql.SQL(
                    "DELETE FROM {t} WHERE {c}::timestamptz >= %s AND {c}::timestamptz < %s"
                ).format(t=target, c=column),
                (interval.start, interval.end),
            )
        elif strategy is LoadStrategy.MERGE:
            create, upsert = _merge_statements(plan)
            cur.execute(create)
            target = sql.Identifier(_STAGE)
        count = self._copy_raw(cur, target, plan, raw_plan, batches)
        if count is None:
            count = self._copy(cur, _copy_statement(target, plan), plan, batches, operation_id)
        if upsert is not None:
            cur.execute(upsert)
        return count

    def _copy_raw(
        self,
        cur: psycopg.Cursor[Any],
        target: sql.Composable,
        plan: _Plan,
        raw_plan: LoadPlan,
        batches: Rows,
    ) -> int | None:
        """Stream the source file's own bytes into ``COPY (FORMAT csv)``; None: use the rows.

        Only when the stream offers the file (no row needs Python) and its header is the
        plan's columns. The chunks are hashed and checked on the way (``RawCsv``): a
        refused chunk, a record the server's parser rejects, or a row count other than
        the records Python would read rolls back to the savepoint and the rows path
        loads the file instead, with its own messages. A
        file that is no longer the snapshot raises "source changed" and the whole
        transaction rolls back.
        """
        raw = raw_csv_of(batches)
        if raw is None or raw.columns != tuple(c.name for c in raw_plan.columns):
            return None
        try:
            count = _copy_file(cur, _csv_copy_statement(target, plan, raw), raw)
        except (RawCsvRefused, psycopg.errors.DataError):
            return None
        raw.loaded(count)
        return count

    def _copy(
        self,
        cur: psycopg.Cursor[Any],
        statement: sql.Composed,
        plan: _Plan,
        batches: Rows,
        operation_id: str,
    ) -> int:
        """Stream every batch through one COPY, opened at the first row; return the row count."""
        width = len(plan.columns)
        count = 0
        with ExitStack() as stack:
            write: Callable[[bytes], None] | None = None
            for batch in batches:
                if not batch:
                    continue
                data = _encode_batch(batch, width, operation_id=operation_id)
                if write is None:
                    write = stack.enter_context(cur.copy(statement)).write
                write(data)
                count += len(batch)
        return count

    # ----------------------------------------------------------------- certification probe

    def server_version(self) -> str:
        """``PostgreSQL <version>`` of the server this connector talks to."""
        with self._session(action="server_version", operation_id=None) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return f"PostgreSQL {row[0] if row else '?'}"

    def count_rows(self, table: str, *, distinct: str) -> tuple[int, int]:
        """Rows and distinct values of one column; ``(0, 0)`` when the table is absent."""
        target = _parse_table(table, fence_schema=self._fence_schema)
        column = _check_identifier(distinct, field="distinct", what="the counted column")
        with self._session(action="count", operation_id=None) as conn, conn.cursor() as cur:
            if _table_info(cur, target) is None:
                conn.rollback()
                return (0, 0)
            row = cur.execute(
                sql.SQL("SELECT count(*), count(DISTINCT {c}) FROM {t}").format(
                    c=sql.Identifier(column), t=target.ident
                )
            ).fetchone()
            conn.rollback()  # a read: end the implicit transaction
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def drop_table(self, table: str) -> None:
        """Drop a certification scratch table."""
        target = _parse_table(table, fence_schema=self._fence_schema)
        with self._session(action="drop", operation_id=None) as conn:
            with conn.transaction():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target.ident))
            self._verified = {k for k in self._verified if k[0] != table}

    def close(self) -> None:
        """Close the connection. Idempotent."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
