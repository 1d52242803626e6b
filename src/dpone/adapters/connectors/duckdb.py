"""DuckDB target connector: rows and a fence row committed in one DuckDB transaction."""

from __future__ import annotations

import csv
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import duckdb
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
from dpone.ports.source import RAW_CSV_DELIMITERS, RawCsv, RawCsvRefused, raw_csv_of

__all__ = ["FENCE_TABLE", "DuckDbConnector"]

_T = TypeVar("_T")

FENCE_TABLE = "dpone_fence"
_FENCE = f'"main"."{FENCE_TABLE}"'

_FENCE_DDL = (
    f"CREATE TABLE IF NOT EXISTS {_FENCE} ("
    "operation_id VARCHAR PRIMARY KEY, "
    "intent_digest VARCHAR, "
    "epoch BIGINT NOT NULL, "
    "state VARCHAR NOT NULL CHECK (state IN ('prepared','committed')), "
    "row_count BIGINT, "
    "content_digest VARCHAR, "
    "committed_at DOUBLE, "
    # Every fence write sets a fresh token: DuckDB detects write conflicts per column and
    # skips updates that change no value, so only a common, always-changing column makes
    # two concurrent fence writes (a seal and a zombie's commit) collide.
    "write_token VARCHAR)"
)
_FENCE_SELECT = (
    "SELECT state, epoch, intent_digest, row_count, content_digest "
    f"FROM {_FENCE} WHERE operation_id = ?"
)
_FENCE_INSERT = (
    f"INSERT INTO {_FENCE} (operation_id, intent_digest, epoch, state) VALUES (?, ?, ?, 'prepared')"
)

_SQL_TYPES: dict[ColumnType, str] = {
    ColumnType.INTEGER: "BIGINT",
    ColumnType.REAL: "DOUBLE",
    ColumnType.TEXT: "VARCHAR",
    ColumnType.BOOLEAN: "BOOLEAN",
    ColumnType.TIMESTAMP: "TIMESTAMPTZ",
}

# DuckDB's messages quote values next to names; only a bare identifier is ever echoed.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_COLUMN_RES = (
    re.compile(rf'converting column "({_NAME})"'),
    re.compile(rf"NOT NULL constraint failed: (?:{_NAME}\.)?({_NAME})"),
    re.compile(rf'Duplicate key "({_NAME}):'),
)
_LOCK_HELD_RE = re.compile(r"Could not set lock|Conflicting lock")
_FIRST_BACKOFF_S = 0.005
_MAX_BACKOFF_S = 0.1


class _Busy(Exception):
    """Another transaction of this process holds the fence row (DuckDB write conflict)."""


def _column_named(message: str) -> str | None:
    for pattern in _COLUMN_RES:
        match = pattern.search(message)
        if match:
            return match.group(1)
    return None


def _translate(
    exc: BaseException, *, action: str, lock_timeout_s: float, operation_id: str | None = None
) -> DponeError:
    """Map a driver error to the DponeError the port promises (the one place that does it)."""
    if isinstance(exc, _Busy):
        return FenceUnavailable(
            f"{action}: another transaction held the DuckDB fence row for more than "
            f"{lock_timeout_s:g}s; nothing was decided",
            operation_id=operation_id,
            hint="retry later; a writer still holding the fence will finish or be fenced out",
        )
    if not isinstance(exc, duckdb.Error):
        return TargetWriteFailed(
            f"{action}: unexpected {type(exc).__name__}; the transaction was rolled back",
            operation_id=operation_id,
        )
    name = type(exc).__name__
    message = str(exc)
    if isinstance(exc, duckdb.IOException) and _LOCK_HELD_RE.search(message):
        return FenceUnavailable(
            f"{action}: the DuckDB file is held by another process for more than "
            f"{lock_timeout_s:g}s; nothing was decided",
            operation_id=operation_id,
            hint="retry later, or stop the process that keeps the DuckDB file open",
        )
    if isinstance(exc, duckdb.IOException) and "not a valid DuckDB database" in message:
        return TargetWriteFailed(
            f"{action}: the target file is not a usable DuckDB database ({name})",
            operation_id=operation_id,
            hint="check that the target path points at the right file",
        )
    if isinstance(
        exc, duckdb.IOException | duckdb.OutOfMemoryException | duckdb.InterruptException
    ):
        return FenceUnavailable(
            f"{action}: the DuckDB target could not be read or written ({name}); "
            "nothing was decided",
            operation_id=operation_id,
            hint="check that the database file and its directory are reachable and have space",
        )
    if isinstance(exc, duckdb.TransactionException):
        return FenceUnavailable(
            f"{action}: the DuckDB transaction conflicted with another one ({name}); "
            "nothing was written",
            operation_id=operation_id,
            hint="retry; conflicting writers to one DuckDB table run one after the other",
        )
    if isinstance(exc, duckdb.CatalogException | duckdb.BinderException):
        return TargetSchemaMismatch(
            f"{action}: the target table does not have the columns the load writes",
            operation_id=operation_id,
            hint="align the workload's columns with the target table",
        )
    if isinstance(
        exc,
        duckdb.ConstraintException
        | duckdb.ConversionException
        | duckdb.OutOfRangeException
        | duckdb.InvalidInputException
        | duckdb.TypeMismatchException
        | duckdb.DataError
        | duckdb.IntegrityError,
    ):
        column = _column_named(message)
        detail = f" in column {column}" if column else ""
        return TargetWriteFailed(
            f"{action}: the DuckDB target rejected a value ({name}{detail}); "
            "the transaction was rolled back",
            operation_id=operation_id,
            hint="fix the source rows or the target table's constraints, then run again",
        )
    return TargetWriteFailed(
        f"{action}: the DuckDB target failed ({name}); nothing was written",
        operation_id=operation_id,
    )


def _q(name: str) -> str:
    """Quote an identifier; callers pass only names validated by ``is_identifier``."""
    return f'"{name}"'


def _audit(conn: Any, plan: LoadPlan, table: _Table, rows: int, operation_id: str) -> None:
    """Write-audit-publish: the plan's audits on this transaction, before the commit."""

    def count(query: str) -> int:
        row = conn.execute(query).fetchone()
        return int(row[0]) if row is not None else 0

    audit_staged(
        plan, rows=rows, count=count, table_sql=table.sql, quote=_q, operation_id=operation_id
    )


class _Table(msgspec.Struct, frozen=True):
    name: str

    @property
    def sql(self) -> str:
        return f'"main".{_q(self.name)}'

    @property
    def normalized(self) -> str:
        # DuckDB matches identifiers case-insensitively, quoted or not.
        return self.name.lower()


def _parse_table(table: str) -> _Table:
    parts = table.split(".") if isinstance(table, str) else []
    if not parts or len(parts) > 2 or not all(is_identifier(p) for p in parts):
        raise ConfigInvalid(
            "the target table name is not a plain identifier",
            field="table",
            hint="use [A-Za-z_][A-Za-z0-9_]* or main.table, e.g. main.orders",
        )
    if len(parts) == 2 and parts[0].lower() != "main":
        raise ConfigInvalid(
            "a DuckDB target table can only live in the schema 'main' of its file",
            field="table",
            hint="write the table as 'orders' or 'main.orders' and point the path at the file",
        )
    name = parts[-1]
    lowered = name.lower()
    if lowered == FENCE_TABLE or lowered.startswith(("duckdb_", "sqlite_", "pg_")):
        raise ConfigInvalid(
            "the target table name is reserved (dpone_fence, duckdb_*, sqlite_*, pg_*)",
            field="table",
        )
    return _Table(name=name)


def _validate_plan(plan: LoadPlan) -> _Table:
    table = _parse_table(plan.table)
    check_plan_shape(plan)
    return table


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


def _read_fence(conn: duckdb.DuckDBPyConnection, operation_id: str) -> _FenceRow | None:
    row = conn.execute(_FENCE_SELECT, [operation_id]).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), row[2], row[3], row[4])


def _fence_write(conn: duckdb.DuckDBPyConnection, sql: str, params: list[object]) -> int:
    """Run a write on the fence row; a concurrent writer of the same row raises ``_Busy``.

    DuckDB's concurrency is optimistic: a second writer of a row fails at once ("Conflict
    on update", or a duplicate key for two inserts) instead of waiting, so the caller
    retries within its bound rather than reading that as an answer.
    """
    try:
        row = conn.execute(sql, params).fetchone()
    except (duckdb.TransactionException, duckdb.ConstraintException) as exc:
        raise _Busy from exc
    return int(row[0]) if row else 0


class _Existing(msgspec.Struct, frozen=True):
    """An existing table's lower-cased columns, and those that must be given a value."""

    names: frozenset[str]
    required: frozenset[str]  # NOT NULL without a default


def _table_columns(conn: duckdb.DuckDBPyConnection, table: _Table) -> _Existing:
    """Describe ``table``; ``names`` is empty when it does not exist."""
    rows = conn.execute(
        "SELECT column_name, is_nullable, column_default FROM duckdb_columns() "
        "WHERE database_name = current_database() AND schema_name = 'main' "
        "AND lower(table_name) = ?",
        [table.normalized],
    ).fetchall()
    return _Existing(
        names=frozenset(str(r[0]).lower() for r in rows),
        required=frozenset(str(r[0]).lower() for r in rows if not r[1] and r[2] is None),
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


def _has_unique_key(conn: duckdb.DuckDBPyConnection, table: _Table, key: tuple[str, ...]) -> bool:
    want = {k.lower() for k in key}
    rows = conn.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE database_name = current_database() AND schema_name = 'main' "
        "AND lower(table_name) = ? AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')",
        [table.normalized],
    ).fetchall()
    return any({str(n).lower() for n in names} == want for (names,) in rows)


def _create_sql(plan: LoadPlan, table: _Table) -> str:
    parts = [f"{_q(c.name)} {_SQL_TYPES[c.type]}" for c in plan.columns]
    if plan.strategy is LoadStrategy.MERGE:
        parts.append(f"PRIMARY KEY ({', '.join(_q(k) for k in plan.key)})")
    return f"CREATE TABLE IF NOT EXISTS {table.sql} ({', '.join(parts)})"


def _csv_scan(
    plan: LoadPlan, *, header: bool = False, delimiter: str = ",", new_line: str | None = "\\n"
) -> str:
    """Return a ``read_csv($1, ...)`` that types each column as the table does.

    Names and types are validated identifiers and fixed type names, and the delimiter
    is one of ``RAW_CSV_DELIMITERS``, so they are safe inside the literal; the
    file path is a bound parameter. ``nullstr = ''`` with DuckDB's default
    ``allow_quoted_nulls`` makes every empty field NULL, quoted or not.
    """
    if delimiter not in RAW_CSV_DELIMITERS:
        raise ValueError("unsupported delimiter")
    columns = ", ".join(f"'{c.name}': '{_SQL_TYPES[c.type]}'" for c in plan.columns)
    return (
        f"read_csv($1, header = {str(header).lower()}, auto_detect = false, "
        f"delim = '{delimiter}', quote = '\"', "
        "escape = '\"', nullstr = '', "
        + (f"new_line = '{new_line}', " if new_line else "")
        + "strict_mode = true, "
        f"columns = {{{columns}}})"
    )


class _RowsInstead(Exception):
    """DuckDB's reader refused the raw file: roll back and load the rows instead."""


class _FileCheck:
    """Reads a ``RawCsv`` to its end in a thread (checks, hash); ``result`` re-raises.

    DuckDB's scan releases the GIL, but on a two-core machine the read's CPU (about
    70 ms for 1M rows) is taken from the scan's threads: ``dpone run`` checks a file
    ahead instead when it can (``RawCsv.records_checked_ahead``, ADR 0004).
    """

    def __init__(self, raw: RawCsv) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._read, args=(raw,), name="dpone-csv-check", daemon=True
        )
        self._thread.start()

    def _read(self, raw: RawCsv) -> None:
        try:
            # DuckDB reads the file itself: verify_unchanged() proves it read these bytes
            # (a file whose identity this process hashed, unchanged since, is not hashed
            # again; ADR 0004).
            for _ in raw.chunks(crlf=True, verified_after=True):
                pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            self._error = exc

    def join(self) -> None:
        """Wait for the read to end."""
        self._thread.join()

    def result(self) -> None:
        """Re-raise what the read raised (after ``join``)."""
        if self._error is not None:
            raise self._error


class _CsvBuffer:
    """A private temporary CSV file the rows are streamed into before one bulk scan.

    DuckDB's CSV reader parses in C++ and in parallel; Python only runs ``csv.writer``
    (also C), so no Python code runs per value. Empty strings and None both write an
    empty field, which ``nullstr = ''`` loads as NULL.
    """

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="dpone-duckdb-", suffix=".csv")
        self.path = name
        self._file = os.fdopen(fd, "w", encoding="utf-8", newline="")

    def write(self, batches: Rows, *, width: int, operation_id: str) -> int:
        writerows = csv.writer(self._file, lineterminator="\n").writerows
        expected = {width}
        count = 0
        for batch in batches:
            if not len(batch):
                continue
            # A short row would be padded or shifted by the reader: refuse it here.
            if set(map(len, batch)) != expected:
                raise TargetWriteFailed(
                    f"a row does not have the plan's {width} values; nothing was written",
                    operation_id=operation_id,
                )
            writerows(batch)
            count += len(batch)
        self._file.close()
        return count

    def discard(self) -> None:
        self._file.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _rollback(conn: duckdb.DuckDBPyConnection) -> None:
    try:
        conn.execute("ROLLBACK")
    except duckdb.Error:
        # No transaction open (it failed at BEGIN or COMMIT): nothing to undo.
        pass


def _prepare_in(
    conn: duckdb.DuckDBPyConnection, operation_id: str, intent_digest: str, epoch: int
) -> FenceObservation:
    """Install the fence or raise it to ``epoch`` inside the caller's transaction."""
    row = _read_fence(conn, operation_id)
    if row is None:
        _fence_write(conn, _FENCE_INSERT, [operation_id, intent_digest, epoch])
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
        _fence_write(
            conn,
            f"UPDATE {_FENCE} SET epoch = ?, intent_digest = ?, write_token = ? "
            "WHERE operation_id = ? AND state = 'prepared'",
            [epoch, intent_digest, _token(), operation_id],
        )
    return FenceObservation(status=FenceStatus.PREPARED, epoch=epoch, intent_digest=intent_digest)


def _lock_prepared(
    conn: duckdb.DuckDBPyConnection, operation_id: str, intent_digest: str, epoch: int
) -> FenceObservation:
    """Write the fence row (a fresh token) if it is prepared at ``epoch`` for this intent.

    Returns the row as this transaction now holds it.
    """
    locked = _fence_write(
        conn,
        f"UPDATE {_FENCE} SET write_token = ? "
        "WHERE operation_id = ? AND epoch = ? AND state = 'prepared'",
        [_token(), operation_id, epoch],
    )
    current = _observation(_read_fence(conn, operation_id))
    require_prepared(current, operation_id=operation_id, intent_digest=intent_digest, epoch=epoch)
    if locked != 1:  # read prepared at epoch in this transaction: impossible; refuse
        raise FencedOut(
            "the fence moved during the write; nothing was written", operation_id=operation_id
        )
    return current


class DuckDbConnector:
    """Target connector for one DuckDB file with a ``transactional_marker`` fence.

    DuckDB locks its file for one read-write process, and inside that process its
    transactions are optimistic: a second writer of the fence row fails at once instead
    of waiting. This connector therefore keeps one connection (opened lazily, closed by
    ``close``), retries a held file or a conflicting fence write until ``lock_timeout_s``
    and then raises ``FenceUnavailable``: it never guesses.

    Args:
        path: the database file; its directory is created on the first write.
        table: the target table (``orders`` or ``main.orders``) this connector names.
        lock_timeout_s: how long to retry a file held by another process or a fence row
            held by another transaction.
    """

    def __init__(self, path: str | Path, *, table: str, lock_timeout_s: float = 10.0) -> None:
        if str(path) in {"", ":memory:"} or str(path).startswith(("md:", "file:")):
            raise ConfigInvalid(
                "the DuckDB target must be a file path (not :memory: or a URI)", field="path"
            )
        if not lock_timeout_s > 0:
            raise ConfigInvalid("lock_timeout_s must be positive", field="lock_timeout_s")
        self._path = Path(path).expanduser().resolve()
        self._table = _parse_table(table)
        self._lock_timeout_s = float(lock_timeout_s)
        self._conn: duckdb.DuckDBPyConnection | None = None
        # One DuckDB connection is not safe for concurrent use: one caller at a time.
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        """Connector name."""
        return "duckdb"

    @property
    def capability(self) -> FenceCapability:
        """A fence row in the same transaction as the data."""
        return FenceCapability.TRANSACTIONAL_MARKER

    @property
    def path(self) -> Path:
        """The resolved absolute database file."""
        return self._path

    def target_identity(self) -> str:
        """Return ``duckdb:<abs path>#<table>`` (table lower-cased, without ``main.``)."""
        return f"{self.database_locator()}#{self._table.normalized}"

    def database_locator(self) -> str:
        """Return ``duckdb:<abs path>``, the identity atomic mode compares with the journal's."""
        return f"duckdb:{self._path}"

    # ----------------------------------------------------------------- connections

    def _translate(self, exc: BaseException, action: str, operation_id: str | None) -> DponeError:
        return _translate(
            exc, action=action, lock_timeout_s=self._lock_timeout_s, operation_id=operation_id
        )

    def _open(
        self, *, read_only: bool, action: str, operation_id: str | None
    ) -> duckdb.DuckDBPyConnection:
        """Open the file, retrying while another process holds its lock, up to the bound."""
        deadline = time.monotonic() + self._lock_timeout_s
        backoff = _FIRST_BACKOFF_S
        while True:
            try:
                conn = duckdb.connect(str(self._path), read_only=read_only)
            except duckdb.ConnectionException as exc:
                if read_only and "different configuration" in str(exc):
                    # This process already has the file open read-write (another
                    # connector): share that instance; the file exists, nothing is created.
                    read_only = False
                    continue
                raise self._translate(exc, action, operation_id) from exc
            except duckdb.IOException as exc:
                if not _LOCK_HELD_RE.search(str(exc)) or time.monotonic() >= deadline:
                    raise self._translate(exc, action, operation_id) from exc
                time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            except duckdb.Error as exc:
                raise self._translate(exc, action, operation_id) from exc
            try:
                # Timestamps without a zone are UTC, whatever the machine's zone.
                conn.execute("SET SESSION TimeZone = 'UTC'")
                if not read_only:
                    conn.execute(_FENCE_DDL)
            except duckdb.Error as exc:
                conn.close()
                raise self._translate(exc, action, operation_id) from exc
            return conn

    @contextmanager
    def _locked(self, *, action: str, operation_id: str | None) -> Iterator[None]:
        if not self._lock.acquire(timeout=self._lock_timeout_s):
            raise FenceUnavailable(
                f"{action}: this connector stayed busy with another call for more than "
                f"{self._lock_timeout_s:g}s; nothing was decided",
                operation_id=operation_id,
            )
        try:
            yield
        finally:
            self._lock.release()

    def _writer(self, *, action: str, operation_id: str) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise FenceUnavailable(
                    f"{action}: the DuckDB target's directory could not be created "
                    f"({type(exc).__name__})",
                    operation_id=operation_id,
                ) from exc
            self._conn = self._open(read_only=False, action=action, operation_id=operation_id)
        return self._conn

    def _read(
        self,
        body: Callable[[duckdb.DuckDBPyConnection], _T],
        *,
        action: str,
        operation_id: str | None,
    ) -> _T:
        """Run ``body`` on the open connection, or on a read-only one closed afterwards."""
        with self._locked(action=action, operation_id=operation_id):
            conn = self._conn
            reader = None
            if conn is None:
                # Looking never creates, converts or checkpoints the file.
                conn = reader = self._open(read_only=True, action=action, operation_id=operation_id)
            try:
                return body(conn)
            except duckdb.Error as exc:
                raise self._translate(exc, action, operation_id) from exc
            finally:
                if reader is not None:
                    reader.close()

    def _write(
        self,
        body: Callable[[duckdb.DuckDBPyConnection], _T],
        *,
        action: str,
        operation_id: str,
        retry: bool,
    ) -> _T:
        """Run ``body`` in one transaction; any failure rolls it all back.

        With ``retry``, a fence row held by another transaction of this process is retried
        (from a fresh snapshot) until ``lock_timeout_s``; then ``FenceUnavailable``.
        """
        deadline = time.monotonic() + self._lock_timeout_s
        backoff = _FIRST_BACKOFF_S
        with self._locked(action=action, operation_id=operation_id):
            conn = self._writer(action=action, operation_id=operation_id)
            while True:
                try:
                    conn.execute("BEGIN TRANSACTION")
                    result = body(conn)
                    try:
                        conn.execute("COMMIT")
                    except duckdb.TransactionException as exc:
                        # A commit-time conflict: DuckDB rolled the transaction back.
                        raise _Busy from exc
                    return result
                except BaseException as exc:
                    _rollback(conn)
                    if isinstance(exc, _Busy):
                        if retry and time.monotonic() < deadline:
                            time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                            backoff = min(backoff * 2, _MAX_BACKOFF_S)
                            continue
                        raise self._translate(exc, action, operation_id) from exc
                    if isinstance(exc, duckdb.Error):
                        raise self._translate(exc, action, operation_id) from exc
                    raise

    # ----------------------------------------------------------------- port

    def _plan_table(self, plan: LoadPlan) -> _Table:
        table = _validate_plan(plan)
        if table.normalized != self._table.normalized:
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
        existing = self._read(
            lambda conn: _table_columns(conn, table), action="check_plan", operation_id=None
        )
        if existing.names:
            _check_columns(existing, plan, table)

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        """Install the fence or raise its epoch; never lower it, never touch a committed row."""

        def body(conn: duckdb.DuckDBPyConnection) -> FenceObservation:
            return _prepare_in(conn, operation_id, intent_digest, epoch)

        return self._write(body, action="prepare", operation_id=operation_id, retry=True)

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
        pass_through = True

        def body(conn: duckdb.DuckDBPyConnection) -> tuple[int, FenceObservation]:
            count: int | None = None
            # Write the fence row first: a seal running meanwhile conflicts with this
            # transaction at once, and a seal that committed first leaves no row here.
            # A prepare that inserted or raised the row in this transaction has written
            # it already, at this epoch and intent (a committed row it leaves alone).
            locked = _prepare_in(conn, operation_id, intent_digest, epoch) if prepare else None
            if locked is None or locked.status is not FenceStatus.PREPARED:
                locked = _lock_prepared(conn, operation_id, intent_digest, epoch)
            existing = _table_columns(conn, table)
            if existing.names:
                _check_columns(existing, plan, table)
            else:
                conn.execute(_create_sql(plan, table))
            raw = raw_csv_of(batches) if pass_through else None
            if raw is not None:
                count = self._load_file(conn, plan, table, raw)
            if raw is None or count is None:
                count = self._load(conn, plan, table, batches, operation_id=operation_id)
            _audit(conn, plan, table, count, operation_id)
            _fence_write(
                conn,
                f"UPDATE {_FENCE} SET state = 'committed', row_count = ?, "
                "content_digest = ?, committed_at = ?, write_token = ? "
                "WHERE operation_id = ? AND epoch = ? AND state = 'prepared'",
                [count, content_digest, time.time(), _token(), operation_id, epoch],
            )
            if within is not None:
                within(conn)
            return count, locked

        try:
            try:
                count, locked = self._write(
                    body, action="mutate", operation_id=operation_id, retry=False
                )
            except _RowsInstead:
                # Rolled back; the rows path reports the refused record as it always has.
                pass_through = False
                count, locked = self._write(
                    body, action="mutate", operation_id=operation_id, retry=False
                )
        except FenceUnavailable:
            # A conflict may mean the fence moved (a seal won): say so when it did.
            seen = self.observe(operation_id=operation_id)
            if seen.status is not FenceStatus.PREPARED or seen.epoch != epoch:
                raise FencedOut(
                    f"the fence moved to {seen.status.value} at epoch {seen.epoch} during "
                    "the write; nothing was written",
                    operation_id=operation_id,
                ) from None
            raise
        # the commit returned: the fence row this transaction wrote is committed as written
        committed = committed_fence(locked, row_count=count, content_digest=content_digest)
        return MutationReport(row_count=count, content_digest=content_digest, committed=committed)

    def _load_file(
        self, conn: duckdb.DuckDBPyConnection, plan: LoadPlan, table: _Table, raw: RawCsv
    ) -> int | None:
        """Load the source file with DuckDB's own CSV reader; None: use the rows instead.

        While DuckDB scans the file, a thread reads it too (``RawCsv.chunks``): it must
        be the snapshot (hashed, unless the identity's hash vouches for this very file)
        and hold RFC 4180 records that the rows path reads the same way, as many as
        DuckDB loaded. A file checked ahead (``RawCsv.records_checked_ahead``, the same
        checks on the same bytes) is not read again. After the scan it must still be the
        file that was opened and checked (``verify_unchanged``: its stat, and a new hash
        if it was racy; ADR 0004). All of it runs inside the transaction: a changed file raises
        "source changed" and nothing commits; a refusal rolls back and the rows path runs
        (``_RowsInstead``).
        """
        if raw.columns != tuple(c.name for c in plan.columns):
            return None
        # The line ending is left to DuckDB (LF or CRLF); the record count proves it
        # read the records Python would.
        scan = _csv_scan(plan, header=True, delimiter=raw.delimiter, new_line=None)
        try:
            # checked ahead, beside start-up (``dpone run``): the scan has every core
            ahead = raw.records_checked_ahead(crlf=True)
        except RawCsvRefused:
            return None
        check = None if ahead is not None else _FileCheck(raw)
        failed: duckdb.Error | None = None
        try:
            count = self._apply(conn, plan, table, scan, str(raw.path))
        except duckdb.Error as exc:
            failed = exc
        finally:
            if check is not None:
                check.join()
        try:
            if check is not None:
                check.result()  # "source changed" wins over any other outcome
        except RawCsvRefused:
            raise _RowsInstead from None
        if failed is not None:
            raise _RowsInstead from failed
        if count != raw.records():
            raise _RowsInstead
        raw.verify_unchanged()
        raw.loaded(count)
        return count

    def _apply(
        self,
        conn: duckdb.DuckDBPyConnection,
        plan: LoadPlan,
        table: _Table,
        scan: str,
        path: str,
    ) -> int:
        """Apply the strategy with the rows of ``scan`` over ``path``; return their count."""
        if plan.strategy is LoadStrategy.REPLACE:
            conn.execute(f"DELETE FROM {table.sql}")
        elif plan.strategy is LoadStrategy.REPLACE_INTERVAL:
            self._delete_interval(conn, plan, table)
        names = ", ".join(_q(c.name) for c in plan.columns)
        if plan.strategy is LoadStrategy.MERGE:
            return self._merge(conn, plan, table, scan, path)
        row = conn.execute(
            f"INSERT INTO {table.sql} ({names}) SELECT {names} FROM {scan}", [path]
        ).fetchone()
        return int(row[0]) if row else 0

    def _load(
        self,
        conn: duckdb.DuckDBPyConnection,
        plan: LoadPlan,
        table: _Table,
        batches: Rows,
        *,
        operation_id: str,
    ) -> int:
        """Apply the strategy and bulk-load the rows through one CSV scan; return the count."""
        buffer = _CsvBuffer()
        try:
            count = buffer.write(batches, width=len(plan.columns), operation_id=operation_id)
            self._apply(conn, plan, table, _csv_scan(plan), buffer.path)
            return count
        finally:
            buffer.discard()

    def _delete_interval(
        self, conn: duckdb.DuckDBPyConnection, plan: LoadPlan, table: _Table
    ) -> None:
        interval, column = plan.interval, plan.interval_column
        if interval is None or column is None:  # _validate_plan refused this already
            raise ConfigInvalid("replace_interval needs an interval", field="interval")
        # CAST: an existing table may keep the column as text; a TIMESTAMPTZ is unchanged.
        conn.execute(
            f"DELETE FROM {table.sql} WHERE CAST({_q(column)} AS TIMESTAMPTZ) >= ?::TIMESTAMPTZ "
            f"AND CAST({_q(column)} AS TIMESTAMPTZ) < ?::TIMESTAMPTZ",
            [_iso(interval.start), _iso(interval.end)],
        )

    def _merge(
        self,
        conn: duckdb.DuckDBPyConnection,
        plan: LoadPlan,
        table: _Table,
        scan: str,
        path: str,
    ) -> int:
        """Upsert the scanned rows (the last of a repeated key wins); return their count."""
        names = ", ".join(_q(c.name) for c in plan.columns)
        keys = ", ".join(_q(k) for k in plan.key)
        # Staged in file order (rowid), so the last row of a repeated key wins, as in SQL
        # upserts applied one row after another.
        conn.execute("DROP TABLE IF EXISTS temp.dpone_stage")
        conn.execute(f"CREATE TEMP TABLE dpone_stage AS SELECT {names} FROM {scan}", [path])
        staged = conn.execute("SELECT count(*) FROM temp.dpone_stage").fetchone()
        latest = (
            f"SELECT {names} FROM temp.dpone_stage "
            f"QUALIFY row_number() OVER (PARTITION BY {keys} ORDER BY rowid DESC) = 1"
        )
        if _has_unique_key(conn, table, plan.key):
            key_set = {k.lower() for k in plan.key}
            updates = [
                f"{_q(c.name)} = excluded.{_q(c.name)}"
                for c in plan.columns
                if c.name.lower() not in key_set
            ]
            action = f"DO UPDATE SET {', '.join(updates)}" if updates else "DO NOTHING"
            conn.execute(
                f"INSERT INTO {table.sql} ({names}) {latest} ON CONFLICT ({keys}) {action}"
            )
        else:
            # No unique key to upsert on: replace the rows of every loaded key instead.
            conn.execute(
                f"DELETE FROM {table.sql} WHERE ({keys}) IN (SELECT ({keys}) FROM temp.dpone_stage)"
            )
            conn.execute(f"INSERT INTO {table.sql} ({names}) {latest}")
        conn.execute("DROP TABLE temp.dpone_stage")
        return int(staged[0]) if staged else 0

    def observe(self, *, operation_id: str) -> FenceObservation:
        """Read the fence without writing (a missing file or fence table reads as ABSENT)."""
        if self._conn is None and not self._path.exists():
            return FenceObservation(status=FenceStatus.ABSENT)

        def body(conn: duckdb.DuckDBPyConnection) -> FenceObservation:
            # One query when the fence table exists (always, once a write opened the
            # file); the catalog is asked only when the read fails.
            try:
                return _observation(_read_fence(conn, operation_id))
            except duckdb.CatalogException:
                has_fence = conn.execute(
                    "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
                    "AND schema_name = 'main' AND table_name = ?",
                    [FENCE_TABLE],
                ).fetchone()
                if has_fence is None:
                    return FenceObservation(status=FenceStatus.ABSENT)
                raise

        return self._read(body, action="observe", operation_id=operation_id)

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        """Raise the fence to ``epoch`` with a write, proving a non-commit; retried on conflict."""

        def body(conn: duckdb.DuckDBPyConnection) -> SealResult:
            row = _read_fence(conn, operation_id)
            if row is None:
                _fence_write(conn, _FENCE_INSERT, [operation_id, None, epoch])
                return SealResult(
                    outcome=SealOutcome.NOT_COMMITTED,
                    observation=FenceObservation(status=FenceStatus.PREPARED, epoch=epoch),
                )
            current = _observation(row)
            if current.status is FenceStatus.COMMITTED:
                return SealResult(outcome=SealOutcome.COMMITTED, observation=current)
            if current.epoch is not None and current.epoch >= epoch:
                return SealResult(outcome=SealOutcome.FENCED, observation=current)
            _fence_write(
                conn,
                f"UPDATE {_FENCE} SET epoch = ?, write_token = ? "
                "WHERE operation_id = ? AND state = 'prepared'",
                [epoch, _token(), operation_id],
            )
            return SealResult(
                outcome=SealOutcome.NOT_COMMITTED,
                observation=FenceObservation(
                    status=FenceStatus.PREPARED, epoch=epoch, intent_digest=current.intent_digest
                ),
            )

        return self._write(body, action="seal", operation_id=operation_id, retry=True)

    # ----------------------------------------------------------------- certification probe

    def server_version(self) -> str:
        """The DuckDB library version (the engine of an embedded database)."""
        return f"DuckDB {duckdb.__version__}"

    def count_rows(self, table: str, *, distinct: str) -> tuple[int, int]:
        """Rows and distinct values of one column; ``(0, 0)`` when the table is absent."""
        parsed = _parse_table(table)
        if not is_identifier(distinct) or (self._conn is None and not self._path.exists()):
            return (0, 0)

        def body(conn: duckdb.DuckDBPyConnection) -> tuple[int, int]:
            exists = conn.execute(
                "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND table_name = ?",
                [parsed.name],
            ).fetchone()
            if exists is None:
                return (0, 0)
            row = conn.execute(
                f"SELECT count(*), count(DISTINCT {_q(distinct)}) FROM {parsed.sql}"
            ).fetchone()
            return (int(row[0]), int(row[1])) if row else (0, 0)

        return self._read(body, action="count", operation_id=None)

    def drop_table(self, table: str) -> None:
        """Drop a certification scratch table."""
        parsed = _parse_table(table)

        def body(conn: duckdb.DuckDBPyConnection) -> None:
            conn.execute(f"DROP TABLE IF EXISTS {parsed.sql}")

        self._write(body, action="drop", operation_id="-", retry=False)

    def close(self) -> None:
        """Close the connection (releasing the file lock). Idempotent."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except duckdb.Error:
                pass


def _token() -> str:
    return secrets.token_hex(8)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()
