"""The delivery control plane on SQLite (embedded default): one file, BEGIN IMMEDIATE writes.

It can share the journal's file: its tables are prefixed ``dpone_delivery`` and its
schema version lives in its own table, so journal migrations and these never collide.
Because every write takes SQLite's write lock first, counting active reservations and
inserting one is serialized across processes: the capacity limit is never exceeded.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpone.adapters.delivery import _rules
from dpone.contracts.delivery import (
    DeliveryRecord,
    DeliveryState,
    DeliveryStep,
    JobObservation,
    PayloadRef,
    RemoteStatus,
)
from dpone.errors import (
    ConfigInvalid,
    DeliveryCapacityFull,
    DponeError,
    JournalUnavailable,
    RecoveryConflict,
)

__all__ = ["SCHEMA_VERSION", "SqliteDeliveryStore"]

_NOW_EXPR = "(julianday('now') - 2440587.5) * 86400.0"
_COLUMNS = ", ".join(_rules.RECORD_COLUMNS)

# Migrations, in order; entry N-1 brings the delivery schema to version N.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery (
            operation_id     TEXT PRIMARY KEY,
            intent_digest    TEXT NOT NULL,
            state            TEXT NOT NULL,
            version          INTEGER NOT NULL CHECK (version >= 1),
            receiver         TEXT NOT NULL,
            receiver_url     TEXT NOT NULL,
            credential_ref   TEXT,
            payload_path     TEXT NOT NULL,
            payload_digest   TEXT NOT NULL,
            payload_bytes    INTEGER NOT NULL,
            payload_rows     INTEGER NOT NULL,
            chunk_bytes      INTEGER NOT NULL,
            attempts         INTEGER NOT NULL DEFAULT 0,
            receipt          TEXT,
            remote_status    TEXT,
            rows_processed   INTEGER,
            due_at           REAL,
            next_check_at    REAL,
            lease_owner      TEXT,
            lease_expires_at REAL,
            block_reason     TEXT,
            detail           TEXT,
            created_at       REAL NOT NULL,
            updated_at       REAL NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_transitions (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL,
            version      INTEGER NOT NULL,
            from_state   TEXT,
            to_state     TEXT NOT NULL,
            actor        TEXT NOT NULL,
            detail       TEXT,
            at           REAL NOT NULL,
            UNIQUE (operation_id, version)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_attempts (
            operation_id TEXT NOT NULL,
            attempt      INTEGER NOT NULL,
            owner        TEXT NOT NULL,
            started_at   REAL NOT NULL,
            outcome      TEXT,
            http_status  INTEGER,
            ended_at     REAL,
            PRIMARY KEY (operation_id, attempt)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_receipts (
            operation_id TEXT PRIMARY KEY,
            receipt      TEXT NOT NULL,
            source       TEXT NOT NULL,
            attempt      INTEGER NOT NULL,
            recorded_at  REAL NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_observations (
            id             INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id   TEXT NOT NULL,
            receipt        TEXT NOT NULL,
            status         TEXT NOT NULL,
            rows_total     INTEGER,
            rows_processed INTEGER,
            rows_failed    INTEGER,
            observed_at    REAL NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_receivers (
            receiver       TEXT PRIMARY KEY,
            capacity_limit INTEGER CHECK (capacity_limit IS NULL OR capacity_limit >= 1)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_reservations (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL,
            receiver     TEXT NOT NULL,
            reserved_at  REAL NOT NULL,
            released_at  REAL,
            released_by  TEXT
        )
        """,
        "CREATE UNIQUE INDEX IF NOT EXISTS dpone_delivery_one_active_reservation "
        "ON dpone_delivery_reservations (operation_id) WHERE released_at IS NULL",
        "CREATE INDEX IF NOT EXISTS dpone_delivery_active_by_receiver "
        "ON dpone_delivery_reservations (receiver) WHERE released_at IS NULL",
        """
        CREATE TRIGGER IF NOT EXISTS dpone_delivery_transitions_append_only
        BEFORE UPDATE ON dpone_delivery_transitions
        BEGIN SELECT RAISE(ABORT, 'dpone_delivery_transitions is append-only'); END
        """,
        """
        CREATE TRIGGER IF NOT EXISTS dpone_delivery_observations_append_only
        BEFORE UPDATE ON dpone_delivery_observations
        BEGIN SELECT RAISE(ABORT, 'dpone_delivery_observations is append-only'); END
        """,
    ),
)
#: The delivery schema version this code writes and reads.
SCHEMA_VERSION = len(_MIGRATIONS)


class SqliteDeliveryStore:
    """A DeliveryStorePort on one SQLite file (the journal's file or its own).

    Args:
        path: the database file; its directory is created when missing.
        busy_timeout_s: how long a write waits for another writer before
            ``JournalUnavailable``.

    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        if str(path) in ("", ":memory:"):
            raise ConfigInvalid("the delivery store needs a file path", field="journal")
        self._path = Path(path).expanduser().resolve()
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        with self._guard():
            self._path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._conn()
            conn.execute("PRAGMA journal_mode=WAL")
            self._migrate()

    @property
    def locator(self) -> str:
        """``sqlite:`` + the resolved file path (no secret)."""
        return "sqlite:" + str(self._path)

    # ------------------------------------------------------------------ plumbing
    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(
                str(self._path), timeout=self._busy_timeout_s, isolation_level=None
            )
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
            self._pid = os.getpid()
            with self._lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except DponeError:
            raise
        except sqlite3.Error as exc:
            raise JournalUnavailable(
                f"the delivery store could not be used now ({type(exc).__name__}); "
                "nothing was decided, try again"
            ) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        cur = self._conn().cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def _migrate(self) -> None:
        with self._write() as cur:
            cur.execute(
                "CREATE TABLE IF NOT EXISTS dpone_delivery_schema (version INTEGER NOT NULL)"
            )
            row = cur.execute("SELECT MAX(version) FROM dpone_delivery_schema").fetchone()
            current = int(row[0] or 0)
            if current > SCHEMA_VERSION:
                raise ConfigInvalid(
                    f"the delivery store has schema {current}, newer than this dpone "
                    f"({SCHEMA_VERSION}); upgrade dpone",
                    field="journal",
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[version - 1]:
                    cur.execute(statement)
                cur.execute("INSERT INTO dpone_delivery_schema (version) VALUES (?)", (version,))

    def close(self) -> None:
        """Close every connection this store opened. Idempotent."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    # ------------------------------------------------------------------ reads
    def now(self) -> float:
        """Return SQLite's clock, seconds since the epoch."""
        with self._guard():
            return float(self._conn().execute(f"SELECT {_NOW_EXPR}").fetchone()[0])

    def get(self, operation_id: str) -> DeliveryRecord | None:
        """Return the record or None."""
        with self._guard():
            return _read(self._conn().cursor(), operation_id)

    def list_records(self, *, limit: int = 100) -> list[DeliveryRecord]:
        """Return records, newest update first."""
        with self._guard():
            rows = (
                self._conn()
                .execute(
                    f"SELECT {_COLUMNS} FROM dpone_delivery "
                    "ORDER BY updated_at DESC, rowid DESC LIMIT ?",
                    (max(int(limit), 0),),
                )
                .fetchall()
            )
        return [_rules.record_from_row(row) for row in rows]

    def history(self, operation_id: str) -> list[dict[str, object]]:
        """Return the append-only transitions of one delivery, in order."""
        return self._dicts(
            "SELECT version, from_state, to_state, actor, detail, at "
            "FROM dpone_delivery_transitions WHERE operation_id = ? ORDER BY version",
            operation_id,
        )

    def attempts(self, operation_id: str) -> list[dict[str, object]]:
        """Return the submit attempts of one delivery, in order."""
        return self._dicts(
            "SELECT attempt, owner, started_at, outcome, http_status, ended_at "
            "FROM dpone_delivery_attempts WHERE operation_id = ? ORDER BY attempt",
            operation_id,
        )

    def observations(self, operation_id: str) -> list[JobObservation]:
        """Return the recorded observations of one delivery, in order."""
        with self._guard():
            rows = (
                self._conn()
                .execute(
                    "SELECT receipt, status, rows_total, rows_processed, rows_failed "
                    "FROM dpone_delivery_observations WHERE operation_id = ? ORDER BY id",
                    (operation_id,),
                )
                .fetchall()
            )
        return [
            JobObservation(
                receipt=r[0],
                status=RemoteStatus(r[1]),
                rows_total=r[2],
                rows_processed=r[3],
                rows_failed=r[4],
            )
            for r in rows
        ]

    def active_reservations(self, receiver: str) -> int:
        """Return how many capacity slots of ``receiver`` are held now."""
        with self._guard():
            row = (
                self._conn()
                .execute(
                    "SELECT COUNT(*) FROM dpone_delivery_reservations "
                    "WHERE receiver = ? AND released_at IS NULL",
                    (receiver,),
                )
                .fetchone()
            )
        return int(row[0])

    def _dicts(self, sql: str, operation_id: str) -> list[dict[str, object]]:
        with self._guard():
            cur = self._conn().execute(sql, (operation_id,))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    # ------------------------------------------------------------------ writes
    def register(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        receiver: str,
        receiver_url: str,
        credential_ref: str | None,
        payload: PayloadRef,
        capacity_limit: int | None,
        actor: str,
    ) -> DeliveryRecord:
        """Create the record in STAGED if absent, else return it (same intent only)."""
        _rules.check_registration(
            operation_id=operation_id, intent_digest=intent_digest, payload=payload
        )
        if capacity_limit is not None and capacity_limit < 1:
            raise ConfigInvalid("a receiver's capacity limit must be >= 1", field="capacity")
        with self._guard(), self._write() as cur:
            if capacity_limit is not None:
                cur.execute(
                    "INSERT INTO dpone_delivery_receivers (receiver, capacity_limit) VALUES (?, ?) "
                    "ON CONFLICT (receiver) DO UPDATE SET capacity_limit = excluded.capacity_limit",
                    (receiver, capacity_limit),
                )
            existing = _read(cur, operation_id)
            if existing is not None:
                if existing.intent_digest != intent_digest:
                    raise _rules.intent_conflict(existing)
                return existing
            now = _now(cur)
            record = DeliveryRecord(
                operation_id=operation_id,
                intent_digest=intent_digest,
                state=DeliveryState.STAGED,
                version=1,
                receiver=receiver,
                receiver_url=receiver_url,
                credential_ref=credential_ref,
                payload=payload,
                attempts=0,
                receipt=None,
                remote_status=None,
                rows_processed=None,
                due_at=None,
                next_check_at=None,
                lease_owner=None,
                lease_expires_at=None,
                block_reason=None,
                detail=None,
                created_at=now,
                updated_at=now,
            )
            cur.execute(
                f"INSERT INTO dpone_delivery ({_COLUMNS}) "
                f"VALUES ({', '.join('?' * len(_rules.RECORD_COLUMNS))})",
                _rules.record_row(record),
            )
            _transition(cur, None, record, actor)
            return record

    def advance(
        self, *, operation_id: str, expected_version: int, step: DeliveryStep, actor: str
    ) -> DeliveryRecord:
        """Apply ``step`` in one transaction (CAS, capacity, attempt, receipt, observation)."""
        with self._guard(), self._write() as cur:
            record = _read(cur, operation_id)
            if record is None:
                raise _rules.not_found(operation_id)
            _rules.check_move(record, expected_version=expected_version, step=step)
            now = _now(cur)
            after = _rules.apply_step(record, step, now=now)
            _capacity(cur, record, after, actor=actor, now=now)
            if step.start_attempt:
                cur.execute(
                    "INSERT INTO dpone_delivery_attempts (operation_id, attempt, owner, "
                    "started_at) VALUES (?, ?, ?, ?)",
                    (operation_id, after.attempts, step.lease_owner or actor, now),
                )
            if step.attempt_outcome is not None:
                cur.execute(
                    "UPDATE dpone_delivery_attempts SET outcome = ?, http_status = ?, "
                    "ended_at = ? WHERE operation_id = ? AND attempt = ? AND outcome IS NULL",
                    (step.attempt_outcome, step.http_status, now, operation_id, record.attempts),
                )
            if step.receipt is not None:
                _receipt(cur, operation_id, step, attempt=after.attempts, now=now)
            if step.observation is not None:
                obs = step.observation
                cur.execute(
                    "INSERT INTO dpone_delivery_observations (operation_id, receipt, status, "
                    "rows_total, rows_processed, rows_failed, observed_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        operation_id,
                        obs.receipt,
                        obs.status.value,
                        obs.rows_total,
                        obs.rows_processed,
                        obs.rows_failed,
                        now,
                    ),
                )
            assignments = ", ".join(f"{c} = ?" for c in _rules.RECORD_COLUMNS[2:])
            updated = cur.execute(
                f"UPDATE dpone_delivery SET {assignments} WHERE operation_id = ? AND version = ?",
                (*_rules.record_row(after)[2:], operation_id, expected_version),
            ).rowcount
            if updated != 1:  # pragma: no cover - the row was read under the same lock
                raise _rules.conflict(record, expected_version)
            _transition(cur, record.state, after, actor)
            return after


def _now(cur: sqlite3.Cursor) -> float:
    return float(cur.execute(f"SELECT {_NOW_EXPR}").fetchone()[0])


def _read(cur: sqlite3.Cursor, operation_id: str) -> DeliveryRecord | None:
    row = cur.execute(
        f"SELECT {_COLUMNS} FROM dpone_delivery WHERE operation_id = ?", (operation_id,)
    ).fetchone()
    return _rules.record_from_row(row) if row else None


def _transition(
    cur: sqlite3.Cursor, frm: DeliveryState | None, after: DeliveryRecord, actor: str
) -> None:
    cur.execute(
        "INSERT INTO dpone_delivery_transitions (operation_id, version, from_state, to_state, "
        "actor, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            after.operation_id,
            after.version,
            frm.value if frm else None,
            after.state.value,
            actor,
            after.detail,
            after.updated_at,
        ),
    )


def _capacity(
    cur: sqlite3.Cursor, before: DeliveryRecord, after: DeliveryRecord, *, actor: str, now: float
) -> None:
    held: Any = cur.execute(
        "SELECT id FROM dpone_delivery_reservations WHERE operation_id = ? AND released_at IS NULL",
        (before.operation_id,),
    ).fetchone()
    if _rules.holds_capacity(after.state) and held is None:
        limit_row = cur.execute(
            "SELECT capacity_limit FROM dpone_delivery_receivers WHERE receiver = ?",
            (before.receiver,),
        ).fetchone()
        limit = limit_row[0] if limit_row else None
        active = cur.execute(
            "SELECT COUNT(*) FROM dpone_delivery_reservations "
            "WHERE receiver = ? AND released_at IS NULL",
            (before.receiver,),
        ).fetchone()[0]
        if limit is not None and active >= limit:
            raise DeliveryCapacityFull(
                f"all {limit} capacity slots of {before.receiver} are held by active jobs",
                operation_id=before.operation_id,
                state=before.state.value,
            )
        cur.execute(
            "INSERT INTO dpone_delivery_reservations (operation_id, receiver, reserved_at) "
            "VALUES (?, ?, ?)",
            (before.operation_id, before.receiver, now),
        )
    elif not _rules.holds_capacity(after.state) and held is not None:
        cur.execute(
            "UPDATE dpone_delivery_reservations SET released_at = ?, released_by = ? WHERE id = ?",
            (now, f"{actor} at {after.state.value}", held[0]),
        )


def _receipt(
    cur: sqlite3.Cursor, operation_id: str, step: DeliveryStep, *, attempt: int, now: float
) -> None:
    row = cur.execute(
        "SELECT receipt FROM dpone_delivery_receipts WHERE operation_id = ?", (operation_id,)
    ).fetchone()
    if row is not None:
        if row[0] != step.receipt:
            raise RecoveryConflict(
                "the receiver returned another receipt than the one recorded for this key",
                operation_id=operation_id,
            )
        return
    cur.execute(
        "INSERT INTO dpone_delivery_receipts (operation_id, receipt, source, attempt, "
        "recorded_at) VALUES (?, ?, ?, ?, ?)",
        (operation_id, step.receipt, step.receipt_source or "submit", attempt, now),
    )
