"""SQLite target connector: rows and a fence row committed in one BEGIN IMMEDIATE transaction."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import chain, islice
from pathlib import Path
from typing import TypeVar

import msgspec

from dpone.adapters.connectors._audit import audit_staged
from dpone.adapters.connectors._plan import check_plan_shape
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

__all__ = ["FENCE_TABLE", "SqliteConnector"]

_T = TypeVar("_T")

FENCE_TABLE = "dpone_fence"

_FENCE_DDL = (
    f'CREATE TABLE IF NOT EXISTS "main"."{FENCE_TABLE}" ('
    "operation_id TEXT PRIMARY KEY, "
    "intent_digest TEXT, "
    "epoch INTEGER NOT NULL, "
    "state TEXT NOT NULL CHECK (state IN ('prepared','committed')), "
    "row_count INTEGER, "
    "content_digest TEXT, "
    "committed_at REAL)"
)
_FENCE_SELECT = (
    "SELECT state, epoch, intent_digest, row_count, content_digest "
    f'FROM "main"."{FENCE_TABLE}" WHERE operation_id = ?'
)
_FENCE_INSERT = (
    f'INSERT INTO "main"."{FENCE_TABLE}" (operation_id, intent_digest, epoch, state) '
    "VALUES (?, ?, ?, 'prepared')"
)

# Size of one multi-row INSERT: past a few thousand values the gain is nil and the
# statement (compiled once, cached) only grows.
_ROWS_PER_STATEMENT = 500
_VALUES_PER_STATEMENT = 2000

_SQL_TYPES: dict[ColumnType, str] = {
    ColumnType.INTEGER: "INTEGER",
    ColumnType.REAL: "REAL",
    ColumnType.TEXT: "TEXT",
    ColumnType.BOOLEAN: "INTEGER",
    ColumnType.TIMESTAMP: "TEXT",
}

# SQLite's own messages name tables and columns; only these shapes are echoed (never values).
_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_CONSTRAINT_TARGET_RE = re.compile(
    rf"^(?:UNIQUE|NOT NULL) constraint failed: ({_NAME}(?:, {_NAME})*)$"
)
_SCHEMA_ERROR_RE = re.compile(r"no such table|no such column|has no column named")

# Primary result codes (the low byte of an extended code).
_LOCK_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_UNAVAILABLE_CODES = frozenset(
    {
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_INTERRUPT,
        sqlite3.SQLITE_NOLFS,
    }
)
_NOT_A_DATABASE_CODES = frozenset({sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT})
_REJECTED_ROW_CODES = frozenset(
    {
        sqlite3.SQLITE_CONSTRAINT,
        sqlite3.SQLITE_MISMATCH,
        sqlite3.SQLITE_TOOBIG,
        sqlite3.SQLITE_RANGE,
    }
)


def _translate(
    exc: BaseException, *, action: str, lock_timeout_s: float, operation_id: str | None = None
) -> DponeError:
    """Map a driver error to the DponeError the port promises (the one place that does it)."""
    if isinstance(exc, OverflowError):
        return TargetWriteFailed(
            f"{action}: an integer value does not fit SQLite's 64-bit INTEGER; "
            "the transaction was rolled back",
            operation_id=operation_id,
        )
    if not isinstance(exc, sqlite3.Error):
        return TargetWriteFailed(
            f"{action}: unexpected {type(exc).__name__}; the transaction was rolled back",
            operation_id=operation_id,
        )
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    name: str = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    primary = code & 0xFF if code is not None else None
    if primary in _LOCK_CODES:
        return FenceUnavailable(
            f"{action}: the SQLite target stayed locked by another writer for more than "
            f"{lock_timeout_s:g}s; nothing was decided",
            operation_id=operation_id,
            hint="retry later; a writer still holding the lock will finish or be fenced out",
        )
    if primary in _UNAVAILABLE_CODES:
        return FenceUnavailable(
            f"{action}: the SQLite target could not be read or written ({name}); "
            "nothing was decided",
            operation_id=operation_id,
            hint="check that the database file and its directory are reachable and have space",
        )
    if primary in _REJECTED_ROW_CODES:
        match = _CONSTRAINT_TARGET_RE.match(str(exc))
        detail = f" on {match.group(1)}" if match else ""
        return TargetWriteFailed(
            f"{action}: the SQLite target rejected a row ({name}{detail}); "
            "the transaction was rolled back",
            operation_id=operation_id,
            hint="fix the source rows or the target table's constraints, then run again",
        )
    if primary == sqlite3.SQLITE_ERROR and _SCHEMA_ERROR_RE.search(str(exc)):
        return TargetSchemaMismatch(
            f"{action}: the target table does not have the columns the load writes",
            operation_id=operation_id,
            hint="align the workload's columns with the target table",
        )
    if code is None:
        # Binding errors (wrong number of values, unsupported type) carry no result code.
        return TargetWriteFailed(
            f"{action}: a row does not fit the plan's columns (wrong number of values or "
            f"a value type SQLite cannot store: {type(exc).__name__}); "
            "the transaction was rolled back",
            operation_id=operation_id,
        )
    if primary in _NOT_A_DATABASE_CODES:
        return TargetWriteFailed(
            f"{action}: the target file is not a usable SQLite database ({name})",
            operation_id=operation_id,
            hint="check that the target URL points at the right file",
        )
    return TargetWriteFailed(
        f"{action}: the SQLite target failed ({name}); nothing was written",
        operation_id=operation_id,
    )


_DRIVER_ERRORS = (sqlite3.Error, OverflowError)


def _q(name: str) -> str:
    """Quote an identifier; callers pass only names validated by ``is_identifier``."""
    return f'"{name}"'


class _Table(msgspec.Struct, frozen=True):
    schema: str
    name: str

    @property
    def sql(self) -> str:
        return f"{_q(self.schema)}.{_q(self.name)}"

    @property
    def normalized(self) -> str:
        # SQLite identifiers are case-insensitive and "main" is the only schema this
        # connector opens, so "main.Orders" and "orders" name the same table.
        return self.name.lower()


def _parse_table(table: str) -> _Table:
    parts = table.split(".") if isinstance(table, str) else []
    if not parts or len(parts) > 2 or not all(is_identifier(p) for p in parts):
        raise ConfigInvalid(
            "the target table name is not a plain identifier",
            field="table",
            hint="use [A-Za-z_][A-Za-z0-9_]* or schema.table, e.g. main.orders",
        )
    schema, name = ("main", parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    if schema.lower() != "main":
        raise ConfigInvalid(
            "a SQLite target table can only live in the schema 'main' of its file",
            field="table",
            hint="write the table as 'orders' or 'main.orders' and point the path at the file",
        )
    lowered = name.lower()
    if lowered == FENCE_TABLE or lowered.startswith("sqlite_"):
        raise ConfigInvalid(
            "the target table name is reserved (dpone_fence or sqlite_*)", field="table"
        )
    return _Table(schema="main", name=name)


def _validate_plan(plan: LoadPlan) -> _Table:
    table = _parse_table(plan.table)
    check_plan_shape(plan)
    return table


def _sql_moment(moment: datetime) -> str:
    # Naive UTC ISO text: julianday() parses it exactly, sub-second digits included.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")


_FenceRow = tuple[str, int, str | None, int | None, str | None]


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


def _read_fence(conn: sqlite3.Connection, operation_id: str) -> _FenceRow | None:
    row: _FenceRow | None = conn.execute(_FENCE_SELECT, (operation_id,)).fetchone()
    return row


class _Existing(msgspec.Struct, frozen=True):
    """An existing table's lower-cased columns, and those that must be given a value."""

    names: frozenset[str]
    required: frozenset[str]  # NOT NULL, no default (an INTEGER PRIMARY KEY fills itself)


def _table_columns(conn: sqlite3.Connection, table: _Table) -> _Existing:
    """Describe ``table``; ``names`` is empty when it does not exist."""
    rows = conn.execute(
        'SELECT name, "notnull", dflt_value, pk FROM pragma_table_info(?, ?)',
        (table.name, table.schema),
    ).fetchall()
    return _Existing(
        names=frozenset(str(r[0]).lower() for r in rows),
        required=frozenset(str(r[0]).lower() for r in rows if r[1] and r[2] is None and not r[3]),
    )


def _check_columns(existing: _Existing, plan: LoadPlan, table: _Table) -> None:
    missing = [c.name for c in plan.columns if c.name.lower() not in existing.names]
    if missing:
        raise TargetSchemaMismatch(
            f"table {plan.table!r} has no column(s) {', '.join(map(repr, missing))} "
            "that the load writes",
            hint=f"add the column(s) to {table.name} or drop them from the workload's columns",
        )
    unfilled = sorted(existing.required - {c.name.lower() for c in plan.columns})
    if unfilled:
        raise TargetSchemaMismatch(
            f"table {plan.table!r} has NOT NULL column(s) {', '.join(map(repr, unfilled))} "
            "without a default that the load does not write",
            hint="give the column(s) a default, make them nullable, or add them to the source",
        )


def _has_unique_key(conn: sqlite3.Connection, table: _Table, key: tuple[str, ...]) -> bool:
    want = {k.lower() for k in key}
    # An INTEGER PRIMARY KEY aliases the rowid and has no entry in index_list.
    primary = {
        str(r[0]).lower()
        for r in conn.execute(
            "SELECT name FROM pragma_table_info(?, ?) WHERE pk > 0", (table.name, table.schema)
        )
    }
    if primary == want:
        return True
    indexes = conn.execute(
        'SELECT name FROM pragma_index_list(?, ?) WHERE "unique" = 1 AND partial = 0',
        (table.name, table.schema),
    ).fetchall()
    for (index_name,) in indexes:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM pragma_index_info(?, ?)", (index_name, table.schema)
            )
        ]
        if None not in names and {str(n).lower() for n in names} == want:
            return True
    return False


def _create_sql(plan: LoadPlan, table: _Table) -> str:
    key = {k.lower() for k in plan.key} if plan.strategy is LoadStrategy.MERGE else set()
    parts = [
        f"{_q(c.name)} {_SQL_TYPES[c.type]}{' NOT NULL' if c.name.lower() in key else ''}"
        for c in plan.columns
    ]
    if key:
        # UNIQUE, not PRIMARY KEY: a one-column INTEGER PRIMARY KEY aliases the rowid and
        # would turn a NULL key into a fresh rowid instead of refusing it.
        parts.append(f"UNIQUE ({', '.join(_q(k) for k in plan.key)})")
    return f"CREATE TABLE IF NOT EXISTS {table.sql} ({', '.join(parts)})"


def _insert_sql(plan: LoadPlan, table: _Table, *, rows: int) -> str:
    names = ", ".join(_q(c.name) for c in plan.columns)
    # NULLIF runs in SQLite's VM: empty strings become NULL without per-row Python work.
    one = "(" + ", ".join("NULLIF(?, '')" for _ in plan.columns) + ")"
    sql = f"INSERT INTO {table.sql} ({names}) VALUES {', '.join([one] * rows)}"
    if plan.strategy is LoadStrategy.MERGE:
        key = {k.lower() for k in plan.key}
        updates = [
            f"{_q(c.name)} = excluded.{_q(c.name)}"
            for c in plan.columns
            if c.name.lower() not in key
        ]
        target = ", ".join(_q(k) for k in plan.key)
        action = f"DO UPDATE SET {', '.join(updates)}" if updates else "DO NOTHING"
        sql += f" ON CONFLICT ({target}) {action}"
    return sql


def _insert_rows(
    conn: sqlite3.Connection, plan: LoadPlan, table: _Table, batches: Rows, *, operation_id: str
) -> int:
    """Insert every batch; return the number of rows. No Python work per row or value.

    Rows go in groups through one multi-row ``VALUES`` statement with the group's values
    flattened in C (``chain.from_iterable`` + ``islice``): that saves a statement step per
    row and keeps dpone below a plain ``executemany`` of the same rows.
    """
    width = len(plan.columns)
    limit = min(_VALUES_PER_STATEMENT, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
    group = max(1, min(_ROWS_PER_STATEMENT, limit // width))
    span = group * width
    group_sql = _insert_sql(plan, table, rows=group)
    single_sql = _insert_sql(plan, table, rows=1)
    execute, executemany = conn.execute, conn.executemany
    expected = {width}
    count = 0
    for batch in batches:
        size = len(batch)
        if not size:
            continue
        # Flattened values would silently shift between rows of the wrong width: refuse.
        if set(map(len, batch)) != expected:
            raise TargetWriteFailed(
                f"a row does not have the plan's {width} values; nothing was written",
                operation_id=operation_id,
            )
        whole = size - size % group
        values = chain.from_iterable(batch)  # one C iterator over the batch's values
        for _ in range(whole // group):
            execute(group_sql, list(islice(values, span)))
        if whole < size:
            executemany(single_sql, batch[whole:])
        count += size
    return count


def _audit(
    conn: sqlite3.Connection, plan: LoadPlan, table: _Table, rows: int, operation_id: str
) -> None:
    """Write-audit-publish: the plan's audits on this transaction, before the commit."""
    audit_staged(
        plan,
        rows=rows,
        count=lambda query: int(conn.execute(query).fetchone()[0]),
        table_sql=table.sql,
        quote=_q,
        operation_id=operation_id,
    )


def _prepare_in(
    conn: sqlite3.Connection, operation_id: str, intent_digest: str, epoch: int
) -> FenceObservation:
    """Install the fence or raise it to ``epoch`` inside the caller's write transaction."""
    row = _read_fence(conn, operation_id)
    if row is None:
        conn.execute(_FENCE_INSERT, (operation_id, intent_digest, epoch))
    else:
        current = _observation(row)
        if current.status is FenceStatus.COMMITTED:
            return current
        if current.epoch is not None and current.epoch > epoch:
            raise FencedOut(
                f"the fence is prepared at epoch {current.epoch}, above this "
                f"executor's epoch {epoch}: its lease is stale",
                operation_id=operation_id,
            )
        conn.execute(
            f'UPDATE "main"."{FENCE_TABLE}" SET epoch = ?, intent_digest = ? '
            "WHERE operation_id = ? AND state = 'prepared'",
            (epoch, intent_digest, operation_id),
        )
    return FenceObservation(status=FenceStatus.PREPARED, epoch=epoch, intent_digest=intent_digest)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        # Closing the connection rolls back as well; the primary error matters more.
        pass


class SqliteConnector:
    """Target connector for one SQLite file with a ``transactional_marker`` fence.

    Every write opens its own connection and runs under ``BEGIN IMMEDIATE``, SQLite's
    database write lock: ``seal`` therefore waits for a writer still in flight, up to
    ``lock_timeout_s``, and then raises ``FenceUnavailable`` rather than guess.

    Args:
        path: the database file; its directory is created on the first write.
        table: the target table (``orders`` or ``main.orders``) this connector's identity
            names; when given, plans must name the same table.
        lock_timeout_s: how long to wait for another writer's lock.
    """

    def __init__(
        self, path: str | Path, *, table: str | None = None, lock_timeout_s: float = 10.0
    ) -> None:
        if str(path) in {"", ":memory:"} or str(path).startswith("file:"):
            raise ConfigInvalid(
                "the SQLite target must be a file path (not :memory: or a URI)", field="path"
            )
        if not lock_timeout_s > 0:
            raise ConfigInvalid("lock_timeout_s must be positive", field="lock_timeout_s")
        self._path = Path(path).expanduser().resolve()
        self._table = _parse_table(table) if table is not None else None
        self._lock_timeout_s = float(lock_timeout_s)
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()

    @property
    def kind(self) -> str:
        """Connector name."""
        return "sqlite"

    @property
    def capability(self) -> FenceCapability:
        """A fence row in the same transaction as the data."""
        return FenceCapability.TRANSACTIONAL_MARKER

    @property
    def path(self) -> Path:
        """The resolved absolute database file."""
        return self._path

    def target_identity(self) -> str:
        """Return ``sqlite:<abs path>#<table>`` (table lower-cased, without ``main.``)."""
        if self._table is None:
            raise ConfigInvalid(
                "the SQLite connector needs a table to name a target identity",
                field="table",
                hint="construct SqliteConnector(path, table='orders')",
            )
        return f"{self.database_locator()}#{self._table.normalized}"

    def database_locator(self) -> str:
        """Return ``sqlite:<abs path>``, the identity atomic mode compares with the journal's."""
        return f"sqlite:{self._path}"

    # ----------------------------------------------------------------- connections

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._lock_timeout_s,
            isolation_level=None,
            check_same_thread=False,  # only close() touches another thread's connection
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a fence reported committed must survive power loss with its data.
            conn.execute("PRAGMA synchronous=FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _connection(
        self, *, action: str, write: bool, operation_id: str | None = None
    ) -> Iterator[sqlite3.Connection]:
        # One connection per thread, kept until close(): closing the last connection of a
        # WAL database checkpoints it, which would cost a few fsyncs on every call.
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None and not write:
            # A read before any write (recovery inspect/plan): open the file read-only, so
            # looking never creates, converts (WAL) or checkpoints anything.
            try:
                wal = self._path.with_name(self._path.name + "-wal")
                # no -wal file: all pages are in the main file; immutable needs no -shm
                suffix = "" if wal.exists() else "&immutable=1"
                reader = sqlite3.connect(
                    f"{self._path.as_uri()}?mode=ro{suffix}", uri=True, timeout=self._lock_timeout_s
                )
            except sqlite3.Error as exc:
                raise self._translate(exc, action, operation_id) from exc
            try:
                yield reader
            finally:
                reader.close()
            return
        if conn is None:
            if write:
                try:
                    self._path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise FenceUnavailable(
                        f"{action}: the SQLite target's directory could not be created "
                        f"({type(exc).__name__})",
                        operation_id=operation_id,
                    ) from exc
            try:
                conn = self._connect()
            except sqlite3.Error as exc:
                raise self._translate(exc, action, operation_id) from exc
            with self._conns_lock:
                self._conns.append(conn)
            self._local.conn = conn
        yield conn

    def _translate(self, exc: BaseException, action: str, operation_id: str | None) -> DponeError:
        return _translate(
            exc, action=action, lock_timeout_s=self._lock_timeout_s, operation_id=operation_id
        )

    def _write(
        self,
        body: Callable[[sqlite3.Connection], _T],
        *,
        action: str,
        operation_id: str,
    ) -> _T:
        """Run ``body`` in one BEGIN IMMEDIATE transaction; any failure rolls it all back."""
        with self._connection(action=action, write=True, operation_id=operation_id) as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(_FENCE_DDL)
                result = body(conn)
                conn.execute("COMMIT")
                return result
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, _DRIVER_ERRORS):
                    raise self._translate(exc, action, operation_id) from exc
                raise

    # ----------------------------------------------------------------- port

    def _plan_table(self, plan: LoadPlan) -> _Table:
        table = _validate_plan(plan)
        if self._table is not None and table.normalized != self._table.normalized:
            raise ConfigInvalid(
                "the plan's table is not the table this connector was configured for",
                field="table",
            )
        return table

    def check_plan(self, plan: LoadPlan) -> None:
        """Check, read-only, that an existing table has every column the plan writes."""
        table = self._plan_table(plan)
        if not self._path.exists():
            return
        with self._connection(action="check_plan", write=False) as conn:
            try:
                existing = _table_columns(conn, table)
            except sqlite3.Error as exc:
                raise self._translate(exc, "check_plan", None) from exc
        if existing.names:
            _check_columns(existing, plan, table)

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        """Install the fence or raise its epoch; never lower it, never touch a committed row."""

        def body(conn: sqlite3.Connection) -> FenceObservation:
            return _prepare_in(conn, operation_id, intent_digest, epoch)

        return self._write(body, action="prepare", operation_id=operation_id)

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
        """Write the rows and mark the fence committed in one transaction, or nothing."""
        table = self._plan_table(plan)
        create_sql = _create_sql(plan, table)

        def body(conn: sqlite3.Connection) -> tuple[int, FenceObservation]:
            if prepare:
                # under the same write lock as the data: no window between the two
                _prepare_in(conn, operation_id, intent_digest, epoch)
            current = _observation(_read_fence(conn, operation_id))
            require_prepared(
                current, operation_id=operation_id, intent_digest=intent_digest, epoch=epoch
            )
            existing = _table_columns(conn, table)
            if existing.names:
                _check_columns(existing, plan, table)
            else:
                conn.execute(create_sql)
            self._apply_strategy(conn, plan, table)
            count = _insert_rows(conn, plan, table, batches, operation_id=operation_id)
            _audit(conn, plan, table, count, operation_id)
            updated = conn.execute(
                f'UPDATE "main"."{FENCE_TABLE}" SET state = \'committed\', row_count = ?, '
                "content_digest = ?, committed_at = ? "
                "WHERE operation_id = ? AND epoch = ? AND state = 'prepared'",
                (count, content_digest, time.time(), operation_id, epoch),
            ).rowcount
            if updated != 1:  # impossible under the write lock; refuse rather than guess
                raise FencedOut(
                    "the fence moved during the write; nothing was written",
                    operation_id=operation_id,
                )
            if within is not None:
                within(conn)
            return count, current

        count, locked = self._write(body, action="mutate", operation_id=operation_id)
        # COMMIT returned: the row locked by BEGIN IMMEDIATE is committed as written
        committed = committed_fence(locked, row_count=count, content_digest=content_digest)
        return MutationReport(row_count=count, content_digest=content_digest, committed=committed)

    def _apply_strategy(self, conn: sqlite3.Connection, plan: LoadPlan, table: _Table) -> None:
        if plan.strategy is LoadStrategy.REPLACE:
            conn.execute(f"DELETE FROM {table.sql}")
        elif plan.strategy is LoadStrategy.REPLACE_INTERVAL:
            interval, column = plan.interval, plan.interval_column
            if interval is None or column is None:  # _validate_plan refused this already
                raise ConfigInvalid("replace_interval needs an interval", field="interval")
            # julianday() reads '2026-11-01 10:00:00' and '2026-11-01T10:00:00Z' alike.
            conn.execute(
                f"DELETE FROM {table.sql} WHERE julianday({_q(column)}) >= julianday(?) "
                f"AND julianday({_q(column)}) < julianday(?)",
                (_sql_moment(interval.start), _sql_moment(interval.end)),
            )
        elif plan.strategy is LoadStrategy.MERGE and not _has_unique_key(conn, table, plan.key):
            digest = hashlib.sha256(",".join(k.lower() for k in plan.key).encode()).hexdigest()
            index = f"dpone_merge_{table.name}_{digest[:8]}"
            try:
                conn.execute(
                    f"CREATE UNIQUE INDEX IF NOT EXISTS {_q(table.schema)}.{_q(index)} "
                    f"ON {_q(table.name)} ({', '.join(_q(k) for k in plan.key)})"
                )
            except sqlite3.IntegrityError as exc:
                raise TargetWriteFailed(
                    f"table {plan.table!r} already holds several rows with the same merge key "
                    f"({', '.join(plan.key)}), so the key cannot be made unique",
                    hint="remove the duplicate rows or choose a key that is unique",
                ) from exc

    def observe(self, *, operation_id: str) -> FenceObservation:
        """Read the fence without writing (a missing file or fence table reads as ABSENT)."""
        if not self._path.exists():
            return FenceObservation(status=FenceStatus.ABSENT)
        with self._connection(action="observe", write=False, operation_id=operation_id) as conn:
            try:
                has_fence = conn.execute(
                    "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?",
                    (FENCE_TABLE,),
                ).fetchone()
                if has_fence is None:
                    return FenceObservation(status=FenceStatus.ABSENT)
                return _observation(_read_fence(conn, operation_id))
            except sqlite3.Error as exc:
                raise self._translate(exc, "observe", operation_id) from exc

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        """Raise the fence to ``epoch`` under the write lock, proving a non-commit."""

        def body(conn: sqlite3.Connection) -> SealResult:
            row = _read_fence(conn, operation_id)
            if row is None:
                conn.execute(_FENCE_INSERT, (operation_id, None, epoch))
                return SealResult(
                    outcome=SealOutcome.NOT_COMMITTED,
                    observation=FenceObservation(status=FenceStatus.PREPARED, epoch=epoch),
                )
            current = _observation(row)
            if current.status is FenceStatus.COMMITTED:
                return SealResult(outcome=SealOutcome.COMMITTED, observation=current)
            if current.epoch is not None and current.epoch >= epoch:
                return SealResult(outcome=SealOutcome.FENCED, observation=current)
            conn.execute(
                f'UPDATE "main"."{FENCE_TABLE}" SET epoch = ? '
                "WHERE operation_id = ? AND state = 'prepared'",
                (epoch, operation_id),
            )
            return SealResult(
                outcome=SealOutcome.NOT_COMMITTED,
                observation=FenceObservation(
                    status=FenceStatus.PREPARED, epoch=epoch, intent_digest=current.intent_digest
                ),
            )

        return self._write(body, action="seal", operation_id=operation_id)

    # ----------------------------------------------------------------- certification probe

    def server_version(self) -> str:
        """The SQLite library version (the "server" of an embedded database)."""
        return f"SQLite {sqlite3.sqlite_version}"

    def count_rows(self, table: str, *, distinct: str) -> tuple[int, int]:
        """Rows and distinct values of one column; ``(0, 0)`` when the table is absent."""
        parsed = _parse_table(table)
        if not is_identifier(distinct) or not self._path.exists():
            return (0, 0)
        with self._connection(action="count", write=False) as conn:
            try:
                if not _table_columns(conn, parsed).names:
                    return (0, 0)
                row = conn.execute(
                    f"SELECT count(*), count(DISTINCT {_q(distinct)}) FROM {parsed.sql}"
                ).fetchone()
            except sqlite3.Error as exc:
                raise self._translate(exc, "count", None) from exc
        return (int(row[0]), int(row[1]))

    def drop_table(self, table: str) -> None:
        """Drop a certification scratch table."""
        parsed = _parse_table(table)

        def body(conn: sqlite3.Connection) -> None:
            conn.execute(f"DROP TABLE IF EXISTS {parsed.sql}")

        self._write(body, action="drop", operation_id="-")

    def close(self) -> None:
        """Close the connections this connector opened, in every thread. Idempotent."""
        with self._conns_lock:
            conns, self._conns = self._conns, []
        self._local = threading.local()
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
