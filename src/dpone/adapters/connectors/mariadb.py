"""MariaDB / MySQL (InnoDB) target connector: rows and a fence row committed in one transaction."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime
from decimal import Decimal
from itertools import islice
from operator import itemgetter
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec
import pymysql  # type: ignore[import-untyped]
from pymysql.constants import SERVER_STATUS  # type: ignore[import-untyped]
from pymysql.converters import escape_string  # type: ignore[import-untyped]

from dpone.adapters.connectors._audit import audit_staged
from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
    committed_fence,
    require_prepared,
)
from dpone.contracts.load import ColumnType, LoadPlan, LoadStrategy, MutationReport, is_identifier
from dpone.errors import (
    ConfigInvalid,
    DponeError,
    FencedOut,
    FenceUnavailable,
    TargetSchemaMismatch,
    TargetWriteFailed,
)
from dpone.ports.connector import Rows, WithinTransaction

__all__ = ["FENCE_TABLE", "MariaDbConnector"]

FENCE_TABLE = "dpone_fence"
_SCHEMES = frozenset({"mysql", "mariadb"})
_DEFAULT_PORT = 3306
_MAX_IDENTIFIER = 64  # MySQL refuses longer names
_SYSTEM_DATABASES = frozenset({"mysql", "information_schema", "performance_schema", "sys"})

_SQL_TYPES: dict[ColumnType, str] = {
    ColumnType.INTEGER: "BIGINT",
    ColumnType.REAL: "DOUBLE",
    ColumnType.TEXT: "LONGTEXT",
    ColumnType.BOOLEAN: "BOOLEAN",
    ColumnType.TIMESTAMP: "DATETIME(6)",
}
# A unique key cannot cover a LONGTEXT column (no prefix-free index on BLOB/TEXT), so a
# text merge key is created as VARCHAR(255): 1020 bytes in utf8mb4, under InnoDB's 3072.
_TEXT_KEY_TYPE = "VARCHAR(255)"
# Binary collation: 'a' and 'A' are different merge keys, as on the other targets.
_TABLE_OPTIONS = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

# Strict: a bad value is an error, never a silent truncation or a zero date. No
# NO_BACKSLASH_ESCAPES and no ANSI_QUOTES: the literal encoder below relies on both.
# NO_ENGINE_SUBSTITUTION: ENGINE=InnoDB fails instead of quietly becoming MyISAM.
_SQL_MODE = (
    "STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_ENGINE_SUBSTITUTION"
)

_BATCH_ROWS = 1000  # rows per multi-row INSERT
_BATCH_CHARS = 4 << 20  # and at most this many characters (x4 bytes stays under the packet)

# MySQL error numbers.
_LOCK_WAIT_TIMEOUT = 1205
_DEADLOCK = 1213
_UNAVAILABLE = frozenset(
    {
        _LOCK_WAIT_TIMEOUT,
        _DEADLOCK,
        1040,  # too many connections
        1053,  # server shutdown in progress
        1317,  # query interrupted
        2002,  # cannot connect (socket)
        2003,  # cannot connect (TCP)
        2006,  # server has gone away
        2013,  # lost connection during query
        2055,  # lost connection (system error)
    }
)
_REJECTED_DATA = frozenset(
    {
        1048,  # column cannot be null
        1062,  # duplicate entry
        1264,  # out of range
        1265,  # data truncated
        1292,  # incorrect datetime value
        1366,  # incorrect value for column
        1406,  # data too long
        1416,  # cannot get geometry (bad value)
        4025,  # CHECK constraint failed
    }
)
_SCHEMA_ERRORS = frozenset({1054, 1146, 1170, 1071})  # unknown column/table, key too long
_NO_DATABASE = 1049
_ACCESS_DENIED = frozenset({1044, 1045, 1142, 1143, 1227})

# The column a data error names sits at the end of the server's message, after the value
# (which is never echoed): "... for column `db`.`t`.`c` at row 3" or "... column 'c' at row 3".
_COLUMN_AT_ROW_RE = re.compile(
    r"column (?:`[^`]*`\.)*[`']([A-Za-z_][A-Za-z0-9_]*)[`'] at row (\d+)\Z"
)
_NULL_COLUMN_RE = re.compile(r"\AColumn '([A-Za-z_][A-Za-z0-9_]*)' cannot be null\Z")
_DUP_KEY_RE = re.compile(r"for key '(?:[A-Za-z0-9_]+\.)?([A-Za-z_][A-Za-z0-9_]*)'\Z")

# Characters MySQL string literals must escape (backslash escapes, sql_mode set above).
_NEEDS_ESCAPE_RE = re.compile(r"[\\'\"\x00\n\r\x1a]")
# A timestamp text with a 'T', a zone or an offset: converted to UTC on the client.
_ZONED_CHARS = ("T", "t", "Z", "z", "+")
_TRUE = frozenset({"1", "t", "true", "y", "yes", "on"})
_FALSE = frozenset({"0", "f", "false", "n", "no", "off"})


# ----------------------------------------------------------------- configuration


def _check_identifier(name: object, *, field: str, what: str) -> str:
    if not isinstance(name, str) or not is_identifier(name):
        raise ConfigInvalid(
            f"{what} is not a plain identifier", field=field, hint="use [A-Za-z_][A-Za-z0-9_]*"
        )
    if len(name) > _MAX_IDENTIFIER:
        raise ConfigInvalid(
            f"{what} is longer than MySQL's {_MAX_IDENTIFIER} characters", field=field
        )
    return name


def _q(name: str) -> str:
    # Only validated identifiers ([A-Za-z0-9_]) reach here; backticks need no escaping.
    return f"`{name}`"


class _Dsn(msgspec.Struct, frozen=True):
    host: str
    port: int
    user: str
    password: str
    database: str

    @property
    def locator(self) -> str:
        return f"mariadb://{self.host}:{self.port}/{self.database}"


def _parse_dsn(dsn: object) -> _Dsn:
    """Parse ``mysql://user:password@host:port/database``; errors never echo the URL."""
    invalid = ConfigInvalid(
        "the MariaDB URL cannot be parsed",
        field="dsn",
        hint="use mysql://user:password@host:3306/database (or mariadb://...)",
    )
    if not isinstance(dsn, str) or not dsn:
        raise invalid
    try:
        parts = urlsplit(dsn)
        port = parts.port or _DEFAULT_PORT
    except ValueError:
        raise invalid from None
    if parts.scheme.lower() not in _SCHEMES or parts.query or parts.fragment:
        raise invalid
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigInvalid(
            "the MariaDB URL names no database", field="dsn", hint="end it with /database"
        )
    _check_identifier(database, field="dsn", what="the URL's database")
    return _Dsn(
        host=(parts.hostname or "localhost").lower(),
        port=port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=database,
    )


class _Table(msgspec.Struct, frozen=True):
    database: str
    name: str

    @property
    def sql(self) -> str:
        return f"{_q(self.database)}.{_q(self.name)}"

    @property
    def normalized(self) -> str:
        return f"{self.database}.{self.name}"


def _parse_table(table: object, *, default_database: str, fence_database: str) -> _Table:
    parts = table.split(".") if isinstance(table, str) else []
    if not parts or len(parts) > 2:
        raise ConfigInvalid(
            "the target table name is not a plain identifier",
            field="table",
            hint="use [A-Za-z_][A-Za-z0-9_]* or database.table, e.g. analytics.orders",
        )
    names = [_check_identifier(p, field="table", what="the target table name") for p in parts]
    database, name = (default_database, names[0]) if len(names) == 1 else (names[0], names[1])
    if database.lower() in _SYSTEM_DATABASES:
        raise ConfigInvalid("the target table cannot live in a system database", field="table")
    if database == fence_database and name.lower() == FENCE_TABLE:
        raise ConfigInvalid("the target table is dpone's fence table", field="table")
    return _Table(database=database, name=name)


class _Plan(msgspec.Struct, frozen=True):
    table: _Table
    columns: tuple[str, ...]
    types: tuple[ColumnType, ...]
    key: tuple[str, ...]
    interval_column: str | None


def _audit(cur: Any, plan: LoadPlan, table: _Table, rows: int, operation_id: str) -> None:
    """Write-audit-publish: the plan's audits on this transaction, before the commit."""

    def count(query: str) -> int:
        cur.execute(query)
        row = cur.fetchone()
        return int(row[0]) if row is not None else 0

    audit_staged(
        plan, rows=rows, count=count, table_sql=table.sql, quote=_q, operation_id=operation_id
    )


def _validate_plan(plan: LoadPlan, *, default_database: str, fence_database: str) -> _Plan:
    table = _parse_table(
        plan.table, default_database=default_database, fence_database=fence_database
    )
    if not plan.columns:
        raise ConfigInvalid("the load plan has no columns", field="columns")
    names: list[str] = []
    for index, column in enumerate(plan.columns, start=1):
        name = _check_identifier(column.name, field="columns", what=f"column #{index}'s name")
        if name.lower() in (n.lower() for n in names):  # MySQL column names ignore case
            raise ConfigInvalid(f"column {name!r} appears twice", field="columns")
        names.append(name)
    by_lower = {n.lower(): n for n in names}
    key: tuple[str, ...] = ()
    if plan.strategy is LoadStrategy.MERGE:
        if not plan.key:
            raise ConfigInvalid("merge needs a key", field="key", hint="set key: [id]")
        missing = [k for k in plan.key if not isinstance(k, str) or k.lower() not in by_lower]
        if missing:
            raise ConfigInvalid(
                f"merge key column(s) {', '.join(map(repr, missing))} are not among the columns",
                field="key",
            )
        key = tuple(by_lower[k.lower()] for k in plan.key)
        if len(set(key)) != len(key):
            raise ConfigInvalid("the merge key names a column twice", field="key")
    interval_column: str | None = None
    if plan.strategy is LoadStrategy.REPLACE_INTERVAL:
        if plan.interval is None:
            raise ConfigInvalid("replace_interval needs an interval", field="interval")
        raw = plan.interval_column
        if not isinstance(raw, str) or raw.lower() not in by_lower:
            raise ConfigInvalid(
                "replace_interval needs an interval_column that is one of the columns",
                field="interval_column",
            )
        interval_column = by_lower[raw.lower()]
    return _Plan(
        table=table,
        columns=tuple(names),
        types=tuple(c.type for c in plan.columns),
        key=key,
        interval_column=interval_column,
    )


def _verified_key(plan: LoadPlan) -> tuple[object, ...]:
    return (plan.table, plan.strategy, plan.key, tuple((c.name, c.type) for c in plan.columns))


# ----------------------------------------------------------------- literal encoding


class _UnsupportedValue(TypeError):
    """A value that has no MySQL literal; ``kind`` is its type name (never the value)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _utc_text(moment: datetime) -> str:
    """A DATETIME(6) literal body: aware values in UTC, naive ones taken as UTC."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.isoformat(sep=" ")


def _moment_text(text: str) -> str:
    """Normalize ISO text ('2026-11-01T10:00:00Z', '+02:00') to UTC 'YYYY-MM-DD HH:MM:SS[.f]'.

    Text Python cannot parse is passed on unchanged: the server rejects it (error 1292,
    naming the column) rather than the client guessing.
    """
    try:
        return _utc_text(datetime.fromisoformat(text))
    except ValueError:
        return text


def _quoted(values: Sequence[str]) -> list[str]:
    if _NEEDS_ESCAPE_RE.search("\x01".join(values)):
        return ["'" + escape_string(v) + "'" for v in values]
    return ["'" + v + "'" for v in values]


def _literal(value: object, ctype: ColumnType) -> str:
    """One value as a MySQL literal (the slow path for mixed or unusual columns)."""
    if value is None or value == "":
        return "NULL"
    if isinstance(value, str):
        if ctype is ColumnType.TIMESTAMP:
            value = _moment_text(value)
        elif ctype is ColumnType.BOOLEAN:
            lowered = value.strip().lower()
            if lowered in _TRUE:
                return "1"
            if lowered in _FALSE:
                return "0"
        return "'" + str(escape_string(value)) + "'"
    if isinstance(value, bool):  # before int: bool is an int
        return "1" if value else "0"
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _UnsupportedValue("non-finite float")
        return repr(value)
    if isinstance(value, datetime):
        return "'" + _utc_text(value) + "'"
    if isinstance(value, date):
        return "'" + value.isoformat() + "'"
    raise _UnsupportedValue(type(value).__name__)


_NONE_TYPE = type(None)


def _column_literals(values: list[Any], ctype: ColumnType) -> Sequence[str]:
    """Encode one column; C-level conversions when its values share a type."""
    kinds = set(map(type, values))
    if kinds == {str} and ctype is not ColumnType.BOOLEAN:
        # Text (a CSV source): quoted as is; the server converts numbers and parses
        # plain timestamps. '' is NULL.
        blanks = "" in values
        present = [v for v in values if v] if blanks else values
        if ctype is ColumnType.TIMESTAMP:
            joined = "\x01".join(present)
            # Plain 'YYYY-MM-DD HH:MM:SS[.f]' (two '-' each, no T/Z/+) goes as is;
            # anything zoned is converted to UTC here.
            if joined.count("-") != 2 * len(present) or any(c in joined for c in _ZONED_CHARS):
                present = [_moment_text(v) for v in present]
        quoted = iter(_quoted(present))
        return [next(quoted) if v else "NULL" for v in values] if blanks else list(quoted)
    if kinds in ({int}, {Decimal}):
        return list(map(str, values))
    if kinds == {_NONE_TYPE}:
        return ["NULL"] * len(values)
    return [_literal(v, ctype) for v in values]


def _row_literals(batch: Sequence[Sequence[object]], types: Sequence[ColumnType]) -> list[str]:
    """Return one ``(v1,v2,...)`` text per row."""
    columns = [
        _column_literals(list(map(itemgetter(i), batch)), ctype) for i, ctype in enumerate(types)
    ]
    return ["(" + row + ")" for row in map(",".join, zip(*columns, strict=True))]


def _chunks(rows: list[str]) -> Iterator[list[str]]:
    """Split rows into statements of at most _BATCH_ROWS rows and ~_BATCH_CHARS characters."""
    it = iter(rows)
    while chunk := list(islice(it, _BATCH_ROWS)):
        if sum(map(len, chunk)) <= _BATCH_CHARS:
            yield chunk
            continue
        part: list[str] = []
        size = 0
        for row in chunk:
            if part and size + len(row) > _BATCH_CHARS:
                yield part
                part, size = [], 0
            part.append(row)
            size += len(row)
        if part:
            yield part


# ----------------------------------------------------------------- fence rows

_FenceRow = tuple[str, int, str | None, int | None, str | None]


def _observation(row: Sequence[Any] | None) -> FenceObservation:
    if row is None:
        return FenceObservation(status=FenceStatus.ABSENT)
    state, epoch, intent, row_count, content_digest = row
    return FenceObservation(
        status=FenceStatus.COMMITTED if state == "committed" else FenceStatus.PREPARED,
        epoch=int(epoch),
        intent_digest=intent,
        row_count=None if row_count is None else int(row_count),
        content_digest=content_digest,
    )


class _Statements(msgspec.Struct, frozen=True):
    """The fence statements of one connector, with its quoted fence table."""

    create_fence: str
    select: str
    lock: str
    insert: str
    raise_epoch: str
    commit: str

    @classmethod
    def build(cls, database: str) -> _Statements:
        fence = f"{_q(database)}.{_q(FENCE_TABLE)}"
        columns = "state, epoch, intent_digest, row_count, content_digest"
        return cls(
            create_fence=(
                f"CREATE TABLE IF NOT EXISTS {fence} ("
                "operation_id VARCHAR(255) NOT NULL PRIMARY KEY, "
                "intent_digest VARCHAR(255) NULL, "
                "epoch BIGINT NOT NULL, "
                "state VARCHAR(16) NOT NULL CHECK (state IN ('prepared', 'committed')), "
                "row_count BIGINT NULL, "
                "content_digest VARCHAR(255) NULL, "
                f"committed_at DATETIME(6) NULL) {_TABLE_OPTIONS}"
            ),
            select=f"SELECT {columns} FROM {fence} WHERE operation_id = %s",
            lock=f"SELECT {columns} FROM {fence} WHERE operation_id = %s FOR UPDATE",
            # An absent row: insert it; a concurrent insert of the same row makes this wait
            # for it (duplicate-key lock) and then change nothing: the caller locks and reads.
            insert=(
                f"INSERT INTO {fence} (operation_id, intent_digest, epoch, state) "
                "VALUES (%s, %s, %s, 'prepared') ON DUPLICATE KEY UPDATE epoch = epoch"
            ),
            raise_epoch=(
                f"UPDATE {fence} SET epoch = %s, intent_digest = %s WHERE operation_id = %s"
            ),
            commit=(
                f"UPDATE {fence} SET state = 'committed', row_count = %s, content_digest = %s, "
                "committed_at = UTC_TIMESTAMP(6) "
                "WHERE operation_id = %s AND epoch = %s AND state = 'prepared'"
            ),
        )


# ----------------------------------------------------------------- target table

_TABLE_INFO = (
    "SELECT TABLE_TYPE, ENGINE FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)
_COLUMNS = (
    "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)
_UNIQUE_KEYS = (
    "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0"
)
_DATABASE_EXISTS = "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s"


def _table_info(cur: Any, table: _Table) -> tuple[str, str | None] | None:
    cur.execute(_TABLE_INFO, (table.database, table.name))
    row = cur.fetchone()
    return None if row is None else (str(row[0]), row[1])


def _check_table(cur: Any, info: tuple[str, str | None], plan: _Plan, raw: str) -> None:
    """Refuse a table that cannot take the plan's rows: a view, not InnoDB, missing columns/key."""
    kind, engine = info
    if kind != "BASE TABLE":
        raise TargetSchemaMismatch(
            f"{raw!r} exists but is not a table (a view or system table)",
            hint="point the workload at an InnoDB table",
        )
    if (engine or "").lower() != "innodb":
        # Only InnoDB commits rows and fence together; converting a table is the owner's call.
        raise TargetSchemaMismatch(
            f"table {raw!r} uses the {engine or 'unknown'} engine, not InnoDB: its rows cannot "
            "commit atomically with the fence",
            hint=f"ALTER TABLE {plan.table.normalized} ENGINE=InnoDB",
        )
    cur.execute(_COLUMNS, (plan.table.database, plan.table.name))
    present = {str(r[0]).lower() for r in cur.fetchall()}
    missing = [c for c in plan.columns if c.lower() not in present]
    if missing:
        raise TargetSchemaMismatch(
            f"table {raw!r} has no column(s) {', '.join(map(repr, missing))} that the load writes",
            hint=f"add the column(s) to {plan.table.normalized} or drop them from the "
            "workload's columns",
        )
    if plan.key:
        cur.execute(_UNIQUE_KEYS, (plan.table.database, plan.table.name))
        keys: dict[str, set[str]] = {}
        for index, column in cur.fetchall():
            keys.setdefault(str(index), set()).add(str(column).lower())
        if {k.lower() for k in plan.key} not in keys.values():
            raise TargetSchemaMismatch(
                f"table {raw!r} has no unique key on exactly the merge key "
                f"({', '.join(plan.key)}), which INSERT ... ON DUPLICATE KEY UPDATE needs",
                hint=f"ALTER TABLE {plan.table.normalized} ADD UNIQUE ({', '.join(plan.key)})",
            )


def _create_table(plan: _Plan) -> str:
    key = set(plan.key)
    parts = []
    for name, kind in zip(plan.columns, plan.types, strict=True):
        sql_type = _TEXT_KEY_TYPE if name in key and kind is ColumnType.TEXT else _SQL_TYPES[kind]
        parts.append(f"{_q(name)} {sql_type}{' NOT NULL' if name in key else ''}")
    if plan.key:
        parts.append(f"UNIQUE KEY `dpone_merge_key` ({', '.join(map(_q, plan.key))})")
    return f"CREATE TABLE IF NOT EXISTS {plan.table.sql} ({', '.join(parts)}) {_TABLE_OPTIONS}"


def _insert_prefix(plan: _Plan) -> str:
    return f"INSERT INTO {plan.table.sql} ({', '.join(map(_q, plan.columns))}) VALUES "


def _merge_suffix(plan: _Plan) -> str:
    # Rows are applied in order, so a key repeated inside one load: the last row wins.
    updates = [f"{_q(c)} = VALUES({_q(c)})" for c in plan.columns if c not in plan.key]
    if not updates:
        updates = [f"{_q(plan.key[0])} = {_q(plan.key[0])}"]
    return " ON DUPLICATE KEY UPDATE " + ", ".join(updates)


# ----------------------------------------------------------------- error translation


def _error_code(exc: BaseException) -> int:
    args: tuple[object, ...] = exc.args
    return args[0] if args and isinstance(args[0], int) else 0


def _error_text(exc: BaseException) -> str:
    args: tuple[object, ...] = exc.args
    return args[1] if len(args) > 1 and isinstance(args[1], str) else ""


def _where(exc: BaseException, *, columns: Sequence[str], row_base: int | None) -> str:
    """Column (and row of the load) a data error names; only names the plan declares."""
    text = _error_text(exc)
    known = {c.lower(): c for c in columns}
    match = _COLUMN_AT_ROW_RE.search(text)
    if match and match.group(1).lower() in known:
        where = f", column {known[match.group(1).lower()]}"
        if row_base is not None:
            where += f", row {row_base + int(match.group(2))} of the load"
        return where
    match = _NULL_COLUMN_RE.search(text)
    if match and match.group(1).lower() in known:
        return f", column {known[match.group(1).lower()]}"
    match = _DUP_KEY_RE.search(text)
    if match:
        return f", key {match.group(1)}"
    return ""


def _translate(
    exc: BaseException,
    *,
    action: str,
    lock_timeout_s: float,
    operation_id: str | None,
    columns: Sequence[str] = (),
    row_base: int | None = None,
) -> DponeError:
    """Map a PyMySQL error to the DponeError the port promises (the one place that does it).

    Messages carry the action, the MySQL error number and declared names only: never the
    server's text (it quotes values), the SQL or the URL.
    """
    code = _error_code(exc)
    label = f"MySQL error {code}" if code else type(exc).__name__
    if code in (_LOCK_WAIT_TIMEOUT, _DEADLOCK):
        reason = "a deadlock" if code == _DEADLOCK else f"a lock wait past {lock_timeout_s:g}s"
        return FenceUnavailable(
            f"{action}: the MariaDB target gave up on {reason} ({label}); nothing was decided",
            operation_id=operation_id,
            hint="retry later; a transaction still holding the lock will finish or be fenced out",
        )
    if code in _UNAVAILABLE or isinstance(exc, pymysql.err.InterfaceError | OSError):
        return FenceUnavailable(
            f"{action}: the MariaDB target was unreachable or interrupted the statement ({label})",
            operation_id=operation_id,
            hint="check that the server is up and reachable, then retry",
        )
    if code == _NO_DATABASE:
        return ConfigInvalid(
            f"{action}: a database the target needs does not exist ({label})",
            field="table",
            hint="create the database or name a table in an existing one",
        )
    if code in _ACCESS_DENIED:
        return TargetWriteFailed(
            f"{action}: the MariaDB target denied access ({label})",
            operation_id=operation_id,
            hint="check the user's password and its grants (SELECT, INSERT, UPDATE, DELETE, "
            "CREATE on the target and fence tables)",
        )
    if code in _SCHEMA_ERRORS:
        return TargetSchemaMismatch(
            f"{action}: the target table does not match what the load writes ({label})",
            operation_id=operation_id,
            hint="align the workload's columns, types and merge key with the target table",
        )
    if code in _REJECTED_DATA:
        where = _where(exc, columns=columns, row_base=row_base)
        return TargetWriteFailed(
            f"{action}: the MariaDB target rejected a row ({label}{where}); "
            "the transaction was rolled back",
            operation_id=operation_id,
            hint="fix the source rows or the target table's types and constraints, then run again",
        )
    return TargetWriteFailed(
        f"{action}: the MariaDB target refused the statement ({label})", operation_id=operation_id
    )


# ----------------------------------------------------------------- connector


class MariaDbConnector:
    """Target connector for one MariaDB/MySQL InnoDB table with a ``transactional_marker`` fence.

    The fence lives in ``<fence_schema>.dpone_fence`` (an InnoDB table). ``prepare`` and
    ``seal`` lock the fence row (``SELECT ... FOR UPDATE``) and write it in one short
    transaction; ``mutate`` holds that lock for its whole transaction. A seal therefore
    waits for a writer still in flight, up to ``innodb_lock_wait_timeout`` (the bound,
    rounded up to whole seconds), and then raises ``FenceUnavailable`` rather than guess.

    One connection is kept per connector (autocommit between calls, an explicit
    transaction for every write) and calls from several threads take turns on it. The
    session runs READ COMMITTED, strict sql_mode and UTC. Timestamps are stored as UTC
    ``DATETIME(6)``: ISO text with a ``T``, ``Z`` or an offset is converted to UTC on the
    client (a column of plain ``YYYY-MM-DD HH:MM:SS`` text is sent as is).

    Args:
        dsn: ``mysql://user:password@host:port/database`` (or ``mariadb://``); it never
            appears in messages or identities.
        table: ``name`` or ``database.name`` (the URL's database by default).
        fence_schema: the database holding the fence table (the URL's database by default).
        lock_timeout_s: the longest wait for a row or metadata lock.
        connect_timeout_s: the longest wait to connect.
    """

    def __init__(
        self,
        dsn: str,
        *,
        table: str,
        fence_schema: str | None = None,
        lock_timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        for field, value in (
            ("lock_timeout_s", lock_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigInvalid(f"{field} must be a positive number of seconds", field=field)
        self._dsn = _parse_dsn(dsn)
        fence = self._dsn.database if fence_schema is None else fence_schema
        self._fence_schema = _check_identifier(
            fence, field="fence_schema", what="the fence database"
        )
        if self._fence_schema.lower() in _SYSTEM_DATABASES:
            raise ConfigInvalid(
                "the fence database cannot be a system database", field="fence_schema"
            )
        self._table = _parse_table(
            table, default_database=self._dsn.database, fence_database=self._fence_schema
        )
        self._lock_timeout_s = float(lock_timeout_s)
        self._connect_timeout_s = float(connect_timeout_s)
        self._sql = _Statements.build(self._fence_schema)
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._fence_ready = False
        # Tables already found able to take a plan's rows (checked once per connector);
        # a table changed since makes the write fail safely (rolled back) and is re-checked.
        self._verified: set[tuple[object, ...]] = set()
        self._row_base: int | None = None  # rows loaded before the statement running now
        self._lock = threading.RLock()  # re-entrant: within() may call back into observe

    @property
    def kind(self) -> str:
        """Connector name."""
        return "mariadb"

    @property
    def capability(self) -> FenceCapability:
        """A fence row in the same transaction as the data."""
        return FenceCapability.TRANSACTIONAL_MARKER

    @property
    def table(self) -> str:
        """The target table as ``database.name``."""
        return self._table.normalized

    @property
    def fence_schema(self) -> str:
        """The database holding ``dpone_fence``."""
        return self._fence_schema

    def target_identity(self) -> str:
        """Return ``mariadb://<host>:<port>/<database>#<db>.<table>``: no credentials."""
        return f"{self._dsn.locator}#{self._table.normalized}"

    def database_locator(self) -> str:
        """Return ``mariadb://<host>:<port>/<database>``, the key atomic mode matches."""
        return self._dsn.locator

    # ----------------------------------------------------------------- connection

    def _connect(self) -> pymysql.connections.Connection[Any]:
        bound = max(1, math.ceil(self._lock_timeout_s))
        conn = pymysql.connect(
            host=self._dsn.host,
            port=self._dsn.port,
            user=self._dsn.user,
            password=self._dsn.password,
            database=self._dsn.database,
            charset="utf8mb4",
            autocommit=True,  # between calls; every write opens an explicit transaction
            connect_timeout=self._connect_timeout_s,
            program_name="dpone",  # lets an operator find a stuck writer
        )
        try:
            with conn.cursor() as cur:
                # The row-lock bound (InnoDB) and the metadata-lock bound (DDL, table
                # locks): without the second, a DDL behind a zombie waits a year.
                cur.execute(
                    "SET SESSION innodb_lock_wait_timeout = %s, SESSION lock_wait_timeout = %s, "
                    "SESSION time_zone = '+00:00', SESSION sql_mode = %s",
                    (bound, bound, _SQL_MODE),
                )
                # READ COMMITTED: no gap locks, and plain reads see the latest commit.
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _session(
        self, *, action: str, operation_id: str | None, plan: _Plan | None = None
    ) -> Iterator[pymysql.connections.Connection[Any]]:
        """Yield the connection under the connector's lock; translate driver errors."""
        with self._lock:
            self._row_base = None
            try:
                conn = self._conn
                if conn is None or not conn.open:
                    conn = self._conn = self._connect()
                yield conn
            except (pymysql.MySQLError, OSError) as exc:
                self._discard_if_unusable()
                error = _translate(
                    exc,
                    action=action,
                    lock_timeout_s=self._lock_timeout_s,
                    operation_id=operation_id,
                    columns=plan.columns if plan else (),
                    row_base=self._row_base,
                )
                if isinstance(error, TargetSchemaMismatch):
                    self._verified.clear()  # the table changed under us: check it again
                raise error from None
            except BaseException:
                self._discard_if_unusable()
                raise

    def _discard_if_unusable(self) -> None:
        """Roll back a transaction left open; drop the connection if that fails."""
        conn = self._conn
        if conn is None:
            return
        try:
            if conn.open and conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
                conn.rollback()
            if conn.open:
                return
        except (pymysql.MySQLError, OSError):
            pass
        self._conn = None
        try:
            conn.close()
        except (pymysql.MySQLError, OSError):
            pass

    def _ensure_fence(self, conn: pymysql.connections.Connection[Any]) -> None:
        if self._fence_ready:
            return
        with conn.cursor() as cur:
            cur.execute(_TABLE_INFO, (self._fence_schema, FENCE_TABLE))
            row = cur.fetchone()
            if row is None:
                cur.execute(_DATABASE_EXISTS, (self._fence_schema,))
                found = cur.fetchone()
                if not (found and found[0]):
                    cur.execute(
                        f"CREATE DATABASE IF NOT EXISTS {_q(self._fence_schema)} "
                        "DEFAULT CHARSET=utf8mb4"
                    )
                # DDL commits implicitly: it runs alone, outside any transaction.
                cur.execute(self._sql.create_fence)
                cur.execute(_TABLE_INFO, (self._fence_schema, FENCE_TABLE))
                row = cur.fetchone()
            if row is None or str(row[1] or "").lower() != "innodb":
                raise TargetSchemaMismatch(
                    f"the fence table {self._fence_schema}.{FENCE_TABLE} is not an InnoDB table: "
                    "it cannot commit atomically with the data",
                    hint=f"ALTER TABLE {self._fence_schema}.{FENCE_TABLE} ENGINE=InnoDB",
                )
        self._fence_ready = True

    def _lock_fence(
        self, cur: Any, operation_id: str, *, intent_digest: str | None, epoch: int, insert: bool
    ) -> tuple[FenceObservation, bool]:
        """Lock the fence row in the open transaction; insert it first when absent and asked.

        Returns the locked row and whether this call inserted it.
        """
        cur.execute(self._sql.lock, (operation_id,))
        row = cur.fetchone()
        inserted = False
        if row is None and insert:
            # Affected rows: 1 inserted here, 0 when a concurrent insert won (we waited
            # for it, then changed nothing).
            inserted = cur.execute(self._sql.insert, (operation_id, intent_digest, epoch)) == 1
            cur.execute(self._sql.lock, (operation_id,))
            row = cur.fetchone()
        return _observation(row), inserted

    def _raise_to(
        self, cur: Any, operation_id: str, *, intent_digest: str, epoch: int
    ) -> FenceObservation:
        """prepare's rule, under the row lock: install or raise to ``epoch``, never lower."""
        current, _ = self._lock_fence(
            cur, operation_id, intent_digest=intent_digest, epoch=epoch, insert=True
        )
        if current.status is FenceStatus.COMMITTED:
            return current
        if current.epoch is not None and current.epoch > epoch:
            raise FencedOut(
                f"the fence is prepared at epoch {current.epoch}, above this executor's epoch "
                f"{epoch}: its lease is stale",
                operation_id=operation_id,
            )
        if current.epoch != epoch or current.intent_digest != intent_digest:
            cur.execute(self._sql.raise_epoch, (epoch, intent_digest, operation_id))
        return FenceObservation(
            status=FenceStatus.PREPARED, epoch=epoch, intent_digest=intent_digest
        )

    # ----------------------------------------------------------------- port

    def _plan(self, plan: LoadPlan) -> _Plan:
        checked = _validate_plan(
            plan, default_database=self._dsn.database, fence_database=self._fence_schema
        )
        if checked.table != self._table:
            raise ConfigInvalid(
                "the plan's table is not the table this connector was configured for",
                field="table",
            )
        return checked

    def check_plan(self, plan: LoadPlan) -> None:
        """Check, read-only, that the table (if it exists) is InnoDB with every column and key."""
        checked = self._plan(plan)
        if _verified_key(plan) in self._verified:
            return
        with self._session(action="check_plan", operation_id=None) as conn, conn.cursor() as cur:
            info = _table_info(cur, checked.table)
            if info is None:
                cur.execute(_DATABASE_EXISTS, (checked.table.database,))
                found = cur.fetchone()
                if not (found and found[0]):
                    raise ConfigInvalid(
                        f"the database of table {plan.table!r} does not exist",
                        field="table",
                        hint="create the database or name a table in an existing one",
                    )
                return
            _check_table(cur, info, checked, plan.table)
            self._verified.add(_verified_key(plan))

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        """Install the fence or raise its epoch; never lower it, never touch a committed row."""
        with self._session(action="prepare", operation_id=operation_id) as conn:
            self._ensure_fence(conn)
            conn.begin()
            with conn.cursor() as cur:
                seen = self._raise_to(cur, operation_id, intent_digest=intent_digest, epoch=epoch)
            conn.commit()
            return seen

    def observe(self, *, operation_id: str) -> FenceObservation:
        """Read the fence without writing (a missing fence table reads as ABSENT)."""
        with (
            self._session(action="observe", operation_id=operation_id) as conn,
            conn.cursor() as cur,
        ):
            if not self._fence_ready:
                cur.execute(_TABLE_INFO, (self._fence_schema, FENCE_TABLE))
                if cur.fetchone() is None:
                    return FenceObservation(status=FenceStatus.ABSENT)
            cur.execute(self._sql.select, (operation_id,))
            return _observation(cur.fetchone())

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        """Raise the fence to ``epoch`` under its row lock, proving a non-commit, or say why not."""
        with self._session(action="seal", operation_id=operation_id) as conn:
            self._ensure_fence(conn)
            conn.begin()
            with conn.cursor() as cur:
                # FOR UPDATE waits for a zombie writer holding the row, within the bound.
                current, inserted = self._lock_fence(
                    cur, operation_id, intent_digest=None, epoch=epoch, insert=True
                )
                if current.status is FenceStatus.COMMITTED:
                    result = SealResult(outcome=SealOutcome.COMMITTED, observation=current)
                elif current.epoch is not None and current.epoch < epoch:
                    cur.execute(self._sql.raise_epoch, (epoch, current.intent_digest, operation_id))
                    result = SealResult(
                        outcome=SealOutcome.NOT_COMMITTED,
                        observation=FenceObservation(
                            status=FenceStatus.PREPARED,
                            epoch=epoch,
                            intent_digest=current.intent_digest,
                        ),
                    )
                elif inserted:
                    # Absent until this seal inserted it at ``epoch``: the proof holds.
                    result = SealResult(outcome=SealOutcome.NOT_COMMITTED, observation=current)
                else:
                    result = SealResult(outcome=SealOutcome.FENCED, observation=current)
            conn.commit()
            return result

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
    ) -> MutationReport:
        """Write the rows and mark the fence committed in one transaction, or nothing.

        The target table is created (or checked) first, outside the transaction: MySQL
        DDL commits implicitly, so a CREATE TABLE inside would commit the fence lock and
        any rows with it. ``CREATE TABLE IF NOT EXISTS`` keeps that step idempotent. Then
        one transaction locks the fence row (raising it first with ``prepare``), applies
        the strategy, loads multi-row INSERTs, marks the fence committed, runs ``within``
        and commits. ``within`` must not run DDL (it would commit implicitly).
        """
        checked = self._plan(plan)
        with self._session(action="mutate", operation_id=operation_id, plan=checked) as conn:
            self._ensure_fence(conn)
            key = _verified_key(plan)
            if key not in self._verified:
                self._prepare_table(conn, checked, plan.table)
                self._verified.add(key)
            conn.begin()
            with conn.cursor() as cur:
                if prepare:
                    current = self._raise_to(
                        cur, operation_id, intent_digest=intent_digest, epoch=epoch
                    )
                else:
                    current, _ = self._lock_fence(
                        cur, operation_id, intent_digest=None, epoch=epoch, insert=False
                    )
                require_prepared(
                    current, operation_id=operation_id, intent_digest=intent_digest, epoch=epoch
                )
                count = self._load(cur, checked, plan, batches, operation_id=operation_id)
                _audit(cur, plan, checked.table, count, operation_id)
                cur.execute(self._sql.commit, (count, content_digest, operation_id, epoch))
                if cur.rowcount != 1:  # impossible under the row lock; refuse, never guess
                    raise FencedOut(
                        "the fence moved during the write; nothing was written",
                        operation_id=operation_id,
                    )
                if within is not None:
                    within(conn)
            conn.commit()
        # the commit is acknowledged: the row locked FOR UPDATE is committed as written
        committed = committed_fence(current, row_count=count, content_digest=content_digest)
        return MutationReport(row_count=count, content_digest=content_digest, committed=committed)

    def _prepare_table(
        self, conn: pymysql.connections.Connection[Any], plan: _Plan, raw: str
    ) -> None:
        """Create the table if absent (own statement, autocommit) and check it."""
        with conn.cursor() as cur:
            info = _table_info(cur, plan.table)
            if info is None:
                cur.execute(_create_table(plan))  # implicit commit: nothing else is open
                info = _table_info(cur, plan.table)
                if info is None:
                    raise TargetSchemaMismatch(
                        f"table {raw!r} could not be created", hint="check the user's grants"
                    )
            _check_table(cur, info, plan, raw)

    def _load(
        self, cur: Any, plan: _Plan, raw_plan: LoadPlan, batches: Rows, *, operation_id: str
    ) -> int:
        strategy = raw_plan.strategy
        if strategy is LoadStrategy.REPLACE:
            # DELETE, not TRUNCATE: TRUNCATE is DDL, commits implicitly and cannot roll back.
            cur.execute(f"DELETE FROM {plan.table.sql}")
        elif strategy is LoadStrategy.REPLACE_INTERVAL:
            interval = raw_plan.interval
            if interval is None or plan.interval_column is None:  # _validate_plan refused
                raise ConfigInvalid("replace_interval needs an interval", field="interval")
            column = _q(plan.interval_column)
            cur.execute(
                f"DELETE FROM {plan.table.sql} WHERE {column} >= %s AND {column} < %s",
                (_utc_text(interval.start), _utc_text(interval.end)),
            )
        prefix = _insert_prefix(plan)
        suffix = _merge_suffix(plan) if strategy is LoadStrategy.MERGE else ""
        width = len(plan.columns)
        count = 0
        for batch in batches:
            if not batch:
                continue
            if set(map(len, batch)) != {width}:
                # A short row would shift values across columns: refuse before writing it.
                raise TargetWriteFailed(
                    f"a row does not have the plan's {width} values; nothing was written",
                    operation_id=operation_id,
                )
            try:
                rows = _row_literals(batch, plan.types)
            except _UnsupportedValue as exc:
                raise TargetWriteFailed(
                    f"a value of type {exc.kind} cannot be written to MariaDB; nothing was written",
                    operation_id=operation_id,
                    hint="give the column a string, number, boolean or timestamp",
                ) from None
            for chunk in _chunks(rows):
                self._row_base = count  # the server's "at row N" is per statement
                cur.execute(prefix + ",".join(chunk) + suffix)
                count += len(chunk)
            self._row_base = None
        return count

    # ----------------------------------------------------------------- certification probe

    def server_version(self) -> str:
        """The server's product and version, e.g. ``MariaDB 10.11.19-MariaDB-0+deb12u1``."""
        with self._session(action="server_version", operation_id=None) as conn:
            # MariaDB reports "5.5.5-<real version>" for old clients' sake
            version = str(conn.get_server_info()).removeprefix("5.5.5-")
        product = "MariaDB" if "mariadb" in version.lower() else "MySQL"
        return f"{product} {version}"

    def count_rows(self, table: str, *, distinct: str) -> tuple[int, int]:
        """Rows and distinct values of one column; ``(0, 0)`` when the table is absent."""
        target = self._probe_table(table)
        column = _check_identifier(distinct, field="distinct", what="the counted column")
        with (
            self._session(action="count", operation_id=None) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(_TABLE_INFO, (target.database, target.name))
            if cur.fetchone() is None:
                return (0, 0)
            cur.execute(f"SELECT count(*), count(DISTINCT {_q(column)}) FROM {target.sql}")
            row = cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def _probe_table(self, table: str) -> _Table:
        return _parse_table(
            table, default_database=self._dsn.database, fence_database=self._fence_schema
        )

    def drop_table(self, table: str) -> None:
        """Drop a certification scratch table."""
        target = self._probe_table(table)
        with (
            self._session(action="drop", operation_id=None) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(f"DROP TABLE IF EXISTS {target.sql}")
        self._verified.clear()

    def close(self) -> None:
        """Close the connection. Idempotent."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except (pymysql.MySQLError, OSError):
                pass
