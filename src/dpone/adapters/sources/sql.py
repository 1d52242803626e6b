"""Incremental SQL table sources (PostgreSQL, MariaDB, SQLite): rows of a fixed cut.

One operation reads the rows with ``lower <= cursor_column < cut``, where ``[lower,
cut)`` is the operation's interval. Both bounds are part of the operation id (through
the canonical interval) and of ``source_snapshot_identity``, so a retry of the same
operation reads the same range whatever was inserted after the cut. The rows stream
from a server-side cursor (PostgreSQL), an unbuffered cursor (MariaDB) or ``fetchmany``
(SQLite) inside one read-only snapshot transaction: memory does not grow with the table.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from dpone.adapters.sources._common import declared_columns
from dpone.contracts.identity import Interval, digest_of
from dpone.contracts.load import Column, ColumnType, is_identifier
from dpone.errors import ConfigInvalid, SourceInvalid, SourceUnavailable

__all__ = ["SQL_SOURCE_KINDS", "SqlTableSource", "portable", "portable_batch", "portable_columns"]

#: Source kinds this module reads, by workload ``source.kind``.
SQL_SOURCE_KINDS = ("postgres_table", "mariadb_table", "sqlite_table")

Batch = list[tuple[object, ...]]


def _utc_text(moment: datetime) -> str:
    # naive values come from UTC sessions (or are UTC by the documented convention)
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(sep=" ")


def portable(value: object) -> object:
    """Return ``value`` as a type every connector takes: scalars as is, the rest as text.

    Timestamps become ISO-8601 UTC text with an explicit ``+00:00``; decimals keep their
    exact digits as text; bytes become hex.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return _utc_text(value)
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


_PLAIN = frozenset({int, float, str, bool, type(None)})
_NONE = type(None)


def _moment_or_none(value: object) -> object:
    return None if value is None else _utc_text(value)  # type: ignore[arg-type]


def portable_columns(columns: list[Sequence[object]]) -> list[Sequence[object]]:
    """Convert columns in place where needed; columns of plain scalars are not touched.

    One C-level type scan per column decides; only timestamp, decimal or other columns
    pay a Python call per value. Returns the same list.
    """
    for index, column in enumerate(columns):
        kinds = set(map(type, column))
        if kinds <= _PLAIN:
            continue
        convert = _moment_or_none if kinds <= {datetime, _NONE} else portable
        columns[index] = tuple(map(convert, column))
    return columns


def portable_batch(rows: Sequence[Sequence[object]]) -> Batch:
    """Convert a fetched batch of rows (see :func:`portable_columns`)."""
    columns: list[Sequence[object]] = list(zip(*rows, strict=True))
    before = list(columns)
    portable_columns(columns)
    if all(a is b for a, b in zip(before, columns, strict=True)):
        return [tuple(row) for row in rows]
    return list(zip(*columns, strict=True))


def _qualified(table: str) -> list[str]:
    parts = table.split(".") if isinstance(table, str) else []
    if not parts or len(parts) > 2 or not all(is_identifier(p) for p in parts):
        raise ConfigInvalid(
            "the source table is not a plain identifier [schema.]name",
            field="source.table",
            hint="use letters, digits and _, not starting with a digit",
        )
    return parts


class _Dialect(Protocol):
    kind: str

    def locator(self) -> str: ...
    def quote(self, name: str) -> str: ...
    def bounds(self, interval: Interval) -> tuple[object, object]: ...
    def predicate(self, column: str) -> str: ...
    def discover(self, table_sql: str, parts: list[str]) -> list[Column]: ...
    @contextmanager
    def stream(self, sql: str, params: tuple[object, ...], size: int) -> Iterator[Any]: ...


# ---------------------------------------------------------------------- PostgreSQL
_PG_TYPES = {
    16: ColumnType.BOOLEAN,
    20: ColumnType.INTEGER,
    21: ColumnType.INTEGER,
    23: ColumnType.INTEGER,
    700: ColumnType.REAL,
    701: ColumnType.REAL,
    1700: ColumnType.REAL,
    1114: ColumnType.TIMESTAMP,
    1184: ColumnType.TIMESTAMP,
}


class _Postgres:
    kind = "postgres_table"

    def __init__(self, url: str) -> None:
        from dpone.adapters import _pg

        self._url = url
        self._locator = _pg.pg_locator(url)

    def locator(self) -> str:
        return self._locator

    def quote(self, name: str) -> str:
        return f'"{name}"'

    def bounds(self, interval: Interval) -> tuple[object, object]:
        return (interval.start, interval.end)

    def predicate(self, column: str) -> str:
        return f"{self.quote(column)} >= %s AND {self.quote(column)} < %s"

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        import psycopg
        from psycopg import IsolationLevel

        try:
            conn = psycopg.connect(self._url, autocommit=False, connect_timeout=10)
        except psycopg.Error as exc:
            raise _unreachable(self.kind, self._locator, _pg_transient(exc)) from exc
        try:
            # one snapshot for the whole read; UTC so `timestamp` columns compare as UTC
            conn.isolation_level = IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            conn.execute("SELECT set_config('TimeZone', 'UTC', true)")
            yield conn
        except psycopg.Error as exc:
            raise _failed(self.kind, self._locator, exc, _pg_transient(exc)) from exc
        finally:
            conn.close()

    def discover(self, table_sql: str, parts: list[str]) -> list[Column]:
        with self._connection() as conn:
            cur = conn.execute(f"SELECT * FROM {table_sql} WHERE false")
            return [
                Column(name=d.name, type=_PG_TYPES.get(d.type_code, ColumnType.TEXT))
                for d in cur.description or ()
            ]

    @contextmanager
    def stream(self, sql: str, params: tuple[object, ...], size: int) -> Iterator[Any]:
        with self._connection() as conn, conn.cursor(name="dpone_source") as cur:
            cur.itersize = size  # a server-side cursor: the server holds the rows
            cur.execute(sql, params)
            yield cur


# ---------------------------------------------------------------------- MariaDB
class _MariaDb:
    kind = "mariadb_table"

    def __init__(self, url: str) -> None:
        from dpone.adapters.connectors.mariadb import _parse_dsn

        self._dsn = _parse_dsn(url)

    def locator(self) -> str:
        return self._dsn.locator

    def quote(self, name: str) -> str:
        return f"`{name}`"

    def bounds(self, interval: Interval) -> tuple[object, object]:
        # the session runs in UTC: naive UTC values compare with DATETIME and TIMESTAMP
        return (
            interval.start.astimezone(UTC).replace(tzinfo=None),
            interval.end.astimezone(UTC).replace(tzinfo=None),
        )

    def predicate(self, column: str) -> str:
        return f"{self.quote(column)} >= %s AND {self.quote(column)} < %s"

    @contextmanager
    def _connection(self, *, unbuffered: bool) -> Iterator[Any]:
        import pymysql  # type: ignore[import-untyped]
        import pymysql.cursors  # type: ignore[import-untyped]

        try:
            conn = pymysql.connect(
                host=self._dsn.host,
                port=self._dsn.port,
                user=self._dsn.user,
                password=self._dsn.password,
                database=self._dsn.database,
                charset="utf8mb4",
                connect_timeout=10,
                cursorclass=pymysql.cursors.SSCursor if unbuffered else pymysql.cursors.Cursor,
                program_name="dpone-source",
            )
        except pymysql.Error as exc:
            raise _unreachable(self.kind, self.locator(), _mariadb_transient(exc)) from exc
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION time_zone = '+00:00'")
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            yield conn
        except pymysql.Error as exc:
            raise _failed(self.kind, self.locator(), exc, _mariadb_transient(exc)) from exc
        finally:
            conn.close()

    def discover(self, table_sql: str, parts: list[str]) -> list[Column]:
        from pymysql.constants import FIELD_TYPE as F  # type: ignore[import-untyped]

        types = {
            F.TINY: ColumnType.INTEGER,
            F.SHORT: ColumnType.INTEGER,
            F.LONG: ColumnType.INTEGER,
            F.LONGLONG: ColumnType.INTEGER,
            F.INT24: ColumnType.INTEGER,
            F.FLOAT: ColumnType.REAL,
            F.DOUBLE: ColumnType.REAL,
            F.DECIMAL: ColumnType.REAL,
            F.NEWDECIMAL: ColumnType.REAL,
            F.DATETIME: ColumnType.TIMESTAMP,
            F.TIMESTAMP: ColumnType.TIMESTAMP,
        }
        with self._connection(unbuffered=False) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table_sql} WHERE 1 = 0")
            described = cur.description or ()
            return [Column(name=d[0], type=types.get(d[1], ColumnType.TEXT)) for d in described]

    @contextmanager
    def stream(self, sql: str, params: tuple[object, ...], size: int) -> Iterator[Any]:
        with self._connection(unbuffered=True) as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            yield cur


# ---------------------------------------------------------------------- SQLite
class _Sqlite:
    kind = "sqlite_table"

    def __init__(self, path: Path) -> None:
        self._path = Path(path)

    def locator(self) -> str:
        return f"sqlite:{self._path}"

    def quote(self, name: str) -> str:
        return f'"{name}"'

    def bounds(self, interval: Interval) -> tuple[object, object]:
        return (_utc_text(interval.start), _utc_text(interval.end))

    def predicate(self, column: str) -> str:
        # julianday() reads '2026-11-01 10:00:00', '...T10:00:00Z' and '+00:00' alike
        q = self.quote(column)
        return f"julianday({q}) >= julianday(?) AND julianday({q}) < julianday(?)"

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if not self._path.is_file():
            raise SourceInvalid(
                f"the SQLite source database {str(self._path)!r} does not exist",
                hint="check the source URL (sqlite:///relative.db or sqlite:////abs.db)",
            )
        try:
            conn = sqlite3.connect(
                f"{self._path.as_uri()}?mode=ro", uri=True, timeout=10, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise _unreachable(self.kind, self.locator(), _sqlite_transient(exc)) from exc
        try:
            conn.execute("BEGIN")  # one read snapshot for the whole extraction
            yield conn
        except sqlite3.Error as exc:
            raise _failed(self.kind, self.locator(), exc, _sqlite_transient(exc)) from exc
        finally:
            conn.close()

    def discover(self, table_sql: str, parts: list[str]) -> list[Column]:
        schema, name = ("main", parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT name, type FROM pragma_table_info(?, ?) ORDER BY cid", (name, schema)
            ).fetchall()
        return [Column(name=str(n), type=_sqlite_type(str(t))) for n, t in rows]

    @contextmanager
    def stream(self, sql: str, params: tuple[object, ...], size: int) -> Iterator[Any]:
        with self._connection() as conn:
            cur = conn.execute(sql, params)
            cur.arraysize = size
            yield cur


def _sqlite_type(declared: str) -> ColumnType:
    """SQLite's affinity rules, plus TIMESTAMP/DATETIME and BOOL by their declared names."""
    upper = declared.upper()
    if "INT" in upper:
        return ColumnType.INTEGER
    if any(k in upper for k in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
        return ColumnType.REAL
    if "BOOL" in upper:
        return ColumnType.BOOLEAN
    if "TIME" in upper or "DATE" in upper:
        return ColumnType.TIMESTAMP
    return ColumnType.TEXT


#: PostgreSQL SQLSTATE classes that say "try again": connection exception, transaction
#: rollback (serialization, deadlock), insufficient resources, object not in
#: prerequisite state (lock not available), operator intervention (shutdown, cancel),
#: system error. A missing password or database (28, 3D) is not among them.
_PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "55", "57", "58"})

#: MariaDB / MySQL error numbers that say "try again": too many connections, server
#: shutdown, lock wait timeout, deadlock, connection killed, cannot connect, server gone
#: away, connection lost, idle disconnect. Access denied (1044/1045) and an unknown
#: database (1049) are not among them.
_MARIADB_TRANSIENT_ERRNOS = frozenset(
    {1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055, 4031}
)

#: SQLite primary result codes that say "try again": SQLITE_BUSY and SQLITE_LOCKED.
_SQLITE_TRANSIENT_CODES = frozenset({5, 6})


#: libpq reports a refused connection without a SQLSTATE; these phrases of its message
#: mean the server answered and said no for good (unknown database or role, failed
#: authentication, no pg_hba entry). Any other connection failure (refused, timed out,
#: starting up, shutting down, too many clients) is transient.
_PG_REFUSALS = (
    "does not exist",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "not permitted to log in",
)


def _pg_transient(exc: BaseException) -> bool:
    """True for a dropped or refused connection and the SQLSTATE classes above."""
    import psycopg

    if not isinstance(exc, psycopg.OperationalError):
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is None:  # no server result: a connection failure (libpq's message only)
        text = str(exc)
        return not any(refusal in text for refusal in _PG_REFUSALS)
    return sqlstate[:2] in _PG_TRANSIENT_CLASSES


def _mariadb_transient(exc: BaseException) -> bool:
    """True for the connection and lock error numbers above, and a closed connection."""
    import pymysql

    if isinstance(exc, pymysql.err.InterfaceError):
        return True  # the connection was already closed under the read
    if not isinstance(exc, pymysql.err.OperationalError):
        return False
    errno = exc.args[0] if exc.args else None
    return errno in _MARIADB_TRANSIENT_ERRNOS


def _sqlite_transient(exc: BaseException) -> bool:
    """True when another connection holds the database (SQLITE_BUSY / SQLITE_LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and (code & 0xFF) in _SQLITE_TRANSIENT_CODES


def _unreachable(kind: str, locator: str, transient: bool) -> SourceInvalid | SourceUnavailable:
    if transient:
        return SourceUnavailable(
            f"the {kind} source {locator} could not be reached; nothing was loaded",
            hint="retryable: the workload's retry policy or the scheduler runs it again; "
            "check that the server runs and accepts connections",
        )
    return SourceInvalid(
        f"the {kind} source {locator} could not be opened",
        hint="check the source URL, that the server runs, and the user's permissions",
    )


def _failed(
    kind: str, locator: str, exc: BaseException, transient: bool
) -> SourceInvalid | SourceUnavailable:
    # driver messages may quote values; only the exception class is echoed
    if transient:
        return SourceUnavailable(
            f"reading the {kind} source {locator} was interrupted ({type(exc).__name__}); "
            "nothing was loaded",
            hint="retryable: a new attempt reads the same fixed cut again",
        )
    return SourceInvalid(
        f"reading the {kind} source {locator} failed ({type(exc).__name__}); nothing was loaded",
        hint="check that the table and the cursor column exist and are readable",
    )


@dataclass(frozen=True, slots=True)
class _Shape:
    table_sql: str
    parts: list[str]


class SqlTableSource:
    """Rows of one table with ``interval.start <= cursor_column < interval.end``.

    Args:
        dialect: ``postgres_table``, ``mariadb_table`` or ``sqlite_table``.
        url: the database URL (PostgreSQL / MariaDB) or SQLite file path.
        table: ``name`` or ``schema.name`` (plain identifiers, quoted in SQL).
        cursor_column: the column that orders changes (e.g. ``updated_at``).
        interval: the operation's interval; its end is the fixed cut.
        columns: declared ``name -> type`` (which columns, in which order); without it
            every column of the table, typed from the catalog.
    """

    def __init__(
        self,
        dialect: str,
        *,
        url: str | Path,
        table: str,
        cursor_column: str,
        interval: Interval,
        columns: Mapping[str, ColumnType | str] | None = None,
    ) -> None:
        if not is_identifier(cursor_column):
            raise ConfigInvalid(
                "the cursor column is not a plain identifier", field="source.cursor_column"
            )
        self._dialect: _Dialect
        if dialect == "postgres_table":
            self._dialect = _Postgres(str(url))
        elif dialect == "mariadb_table":
            self._dialect = _MariaDb(str(url))
        elif dialect == "sqlite_table":
            self._dialect = _Sqlite(Path(url))
        else:
            raise ConfigInvalid(f"unknown SQL source kind {dialect!r}", field="source.kind")
        parts = _qualified(table)
        self._shape = _Shape(table_sql=".".join(self._dialect.quote(p) for p in parts), parts=parts)
        self._table = table
        self._cursor = cursor_column
        self._interval = interval
        self._declared = declared_columns(columns) if columns is not None else None
        self._columns: tuple[Column, ...] | None = None

    @property
    def kind(self) -> str:
        """Source kind."""
        return self._dialect.kind

    @property
    def cut(self) -> datetime:
        """The fixed upper bound (exclusive) of the rows this operation reads."""
        return self._interval.end

    def snapshot_identity(self) -> str:
        """Return the digest of what is read: database, table, columns, column and cut.

        No credentials enter it (the database is named by host, port and name only).
        """
        return digest_of(
            {
                "source": self.kind,
                "database": self._dialect.locator(),
                "table": self._table,
                "columns": [[c.name, c.type.value] for c in self.columns()],
                "cursor_column": self._cursor,
                "from": self._interval.canonical().split("/")[0],
                "cut": self._interval.canonical().split("/")[1],
            }
        )

    def columns(self) -> tuple[Column, ...]:
        """Return the declared columns, or the table's columns from its catalog."""
        if self._columns is None:
            if self._declared is not None:
                self._columns = tuple(Column(name=n, type=t) for n, t in self._declared.items())
            else:
                found = self._dialect.discover(self._shape.table_sql, self._shape.parts)
                if not found:
                    raise SourceInvalid(
                        f"the {self.kind} source table {self._table!r} does not exist or "
                        "has no columns",
                        hint="check source.table (and the schema / database of the URL)",
                    )
                self._columns = tuple(found)
            names = {c.name.lower() for c in self._columns}
            if self._cursor.lower() not in names and self._declared is None:
                raise SourceInvalid(
                    f"the source table {self._table!r} has no column {self._cursor!r}",
                    hint="set source.cursor_column to the column that records changes",
                )
        return self._columns

    def _select(self) -> str:
        q = self._dialect.quote
        names = ", ".join(q(c.name) for c in self.columns())
        return (
            f"SELECT {names} FROM {self._shape.table_sql} "
            f"WHERE {self._dialect.predicate(self._cursor)} ORDER BY {q(self._cursor)}"
        )

    def batches(self, *, batch_size: int, expected_identity: str) -> Iterator[Batch]:
        """Yield the rows of the fixed cut in batches of ``batch_size``.

        Raises:
            SourceInvalid: the definition no longer matches ``expected_identity``, or
                the database cannot be read as declared.
            SourceUnavailable: the database could not be reached or dropped the read
                (transient: the retry policy tries again).
        """
        if batch_size < 1:
            raise ConfigInvalid("batch_size must be at least 1", field="load.batch_size")
        if self.snapshot_identity() != expected_identity:
            raise SourceInvalid(
                "the source definition (table, columns or cut) is not the one this "
                "operation recorded; nothing was loaded"
            )
        params = self._dialect.bounds(self._interval)
        with self._dialect.stream(self._select(), params, batch_size) as cur:
            while True:
                rows: Sequence[Sequence[object]] = cur.fetchmany(batch_size)
                if not rows:
                    break
                yield portable_batch(rows)
