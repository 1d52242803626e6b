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

from dpone.adapters.delivery import _store_sql as _sql
from dpone.contracts.delivery import (
    DeliveryRecord,
    DeliveryRegistration,
    DeliveryStep,
    JobObservation,
    PayloadRef,
)
from dpone.errors import ConfigInvalid, DponeError, JournalUnavailable

__all__ = ["SCHEMA_VERSION", "SqliteDeliveryStore"]

_DIALECT = _sql.Dialect(
    prefix="",
    placeholder="?",
    now_sql="(julianday('now') - 2440587.5) * 86400.0",
    for_update="",  # BEGIN IMMEDIATE already holds the database's write lock
)

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
            updated_at       REAL NOT NULL,
            parent_id        TEXT,
            child_index      INTEGER
        )
        """,
        "CREATE INDEX IF NOT EXISTS dpone_delivery_children "
        "ON dpone_delivery (parent_id, child_index) WHERE parent_id IS NOT NULL",
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
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_audit (
            id             INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id   TEXT NOT NULL,
            principal      TEXT NOT NULL,
            action         TEXT NOT NULL,
            reason         TEXT NOT NULL,
            state          TEXT NOT NULL,
            before_version INTEGER NOT NULL,
            after_version  INTEGER NOT NULL,
            at             REAL NOT NULL
        )
        """,
        """
        CREATE TRIGGER IF NOT EXISTS dpone_delivery_audit_append_only
        BEFORE UPDATE ON dpone_delivery_audit
        BEGIN SELECT RAISE(ABORT, 'dpone_delivery_audit is append-only'); END
        """,
    ),
    (
        # version 2: the observation lease of Airflow triggers (dpone.airflow.triggers).
        # One row per delivery: who may GET the receiver now, until when. Triggers take it
        # by compare-and-set on the database clock; nothing in the runtime reads it.
        """
        CREATE TABLE IF NOT EXISTS dpone_delivery_observer_leases (
            operation_id TEXT PRIMARY KEY,
            holder       TEXT NOT NULL,
            expires_at   REAL NOT NULL,
            epoch        INTEGER NOT NULL CHECK (epoch >= 1),
            polls        INTEGER NOT NULL DEFAULT 0,
            last_status  TEXT
        )
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
        read_only: for commands that only look (``status``): open the file with
            ``mode=ro``, never create a directory, file or table, never migrate; a
            missing control plane is ``ConfigInvalid`` ("no control plane at ...").

    """

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 10.0, read_only: bool = False
    ) -> None:
        if str(path) in ("", ":memory:"):
            raise ConfigInvalid("the delivery store needs a file path", field="journal")
        self._path = Path(path).expanduser().resolve()
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._read_only = read_only
        if read_only:
            if not self._path.is_file():
                raise ConfigInvalid(
                    f"no control plane at {self.locator}: the file does not exist",
                    field="journal",
                    hint="check the --journal URL (or the workload's journal)",
                )
            with self._guard():
                self._check_read_only()
            return
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
            if self._read_only:
                conn = sqlite3.connect(
                    f"{self._path.as_uri()}?mode=ro",
                    timeout=self._busy_timeout_s,
                    isolation_level=None,
                    uri=True,
                )
            else:
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

    def _check_read_only(self) -> None:
        cur = self._conn().cursor()
        table = cur.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'dpone_delivery_schema'"
        ).fetchone()
        current = None
        if table is not None:
            row = cur.execute("SELECT MAX(version) FROM dpone_delivery_schema").fetchone()
            current = int(row[0] or 0)
        try:
            _sql.check_read_only_schema(
                current, schema_version=SCHEMA_VERSION, locator=self.locator
            )
        except DponeError:
            self.close()
            raise

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
            return _sql.now(self._conn().cursor(), _DIALECT)

    def get(self, operation_id: str) -> DeliveryRecord | None:
        """Return the record or None."""
        with self._guard():
            return _sql.read(self._conn().cursor(), _DIALECT, operation_id)

    def list_records(self, *, limit: int = 100) -> list[DeliveryRecord]:
        """Return records, newest update first."""
        with self._guard():
            return _sql.list_records(self._conn().cursor(), _DIALECT, limit)

    def history(self, operation_id: str) -> list[dict[str, object]]:
        """Return the append-only transitions of one delivery, in order."""
        with self._guard():
            return _sql.dicts(self._conn().cursor(), _DIALECT, _sql.HISTORY_SQL, operation_id)

    def attempts(self, operation_id: str) -> list[dict[str, object]]:
        """Return the submit attempts of one delivery, in order."""
        with self._guard():
            return _sql.dicts(self._conn().cursor(), _DIALECT, _sql.ATTEMPTS_SQL, operation_id)

    def observations(self, operation_id: str) -> list[JobObservation]:
        """Return the recorded observations of one delivery, in order."""
        with self._guard():
            return _sql.observations(self._conn().cursor(), _DIALECT, operation_id)

    def active_reservations(self, receiver: str) -> int:
        """Return how many capacity slots of ``receiver`` are held now."""
        with self._guard():
            return _sql.active_reservations(self._conn().cursor(), _DIALECT, receiver)

    def capacity_available(self, receiver: str) -> bool:
        """Return True when ``receiver`` has no limit or a free slot now (a hint, no lock)."""
        with self._guard():
            return _sql.capacity_available(self._conn().cursor(), _DIALECT, receiver)

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
        return self.register_all(
            [
                DeliveryRegistration(
                    operation_id=operation_id,
                    intent_digest=intent_digest,
                    receiver=receiver,
                    receiver_url=receiver_url,
                    credential_ref=credential_ref,
                    payload=payload,
                )
            ],
            capacity_limit=capacity_limit,
            actor=actor,
        )[0]

    def register_all(
        self, registrations: list[DeliveryRegistration], *, capacity_limit: int | None, actor: str
    ) -> list[DeliveryRecord]:
        """Register several deliveries in one transaction (all or none)."""
        with self._guard(), self._write() as cur:
            return _sql.register(
                cur, _DIALECT, registrations, capacity_limit=capacity_limit, actor=actor
            )

    def children(self, parent_id: str) -> list[DeliveryRecord]:
        """Return the children of a split delivery, in order."""
        with self._guard():
            return _sql.children(self._conn().cursor(), _DIALECT, parent_id)

    def advance(
        self, *, operation_id: str, expected_version: int, step: DeliveryStep, actor: str
    ) -> DeliveryRecord:
        """Apply ``step`` in one transaction (CAS, capacity, attempt, receipt, observation)."""
        with self._guard(), self._write() as cur:
            return _sql.advance(
                cur,
                _DIALECT,
                operation_id=operation_id,
                expected_version=expected_version,
                step=step,
                actor=actor,
            )

    def release_capacity(
        self, *, operation_id: str, expected_version: int, principal: str, reason: str
    ) -> DeliveryRecord:
        """An operator frees a BLOCKED delivery's slot (audited, one transaction)."""
        with self._guard(), self._write() as cur:
            return _sql.release_capacity(
                cur,
                _DIALECT,
                operation_id=operation_id,
                expected_version=expected_version,
                principal=principal,
                reason=reason,
            )

    def audit_log(self, operation_id: str) -> list[dict[str, object]]:
        """Return the operator actions on one delivery, in order."""
        with self._guard():
            return _sql.dicts(self._conn().cursor(), _DIALECT, _sql.AUDIT_SQL, operation_id)
