"""The delivery control plane on PostgreSQL (production): beside the journal, own schema table.

Its tables live in the journal's schema with the ``dpone_delivery`` prefix and its
schema version in ``dpone_delivery_schema``, so journal migrations never collide with
these. Every write is one transaction; the record's row is locked ``FOR UPDATE`` and a
reservation first locks the receiver's row, so concurrent reservations for one
receiver queue there and the count they check is current (READ COMMITTED takes a new
snapshot per statement). Times are ``float8`` epoch seconds from the server's
``clock_timestamp()``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from dpone.adapters import _pg
from dpone.adapters.delivery import _store_sql as _sql
from dpone.contracts.delivery import (
    DeliveryRecord,
    DeliveryRegistration,
    DeliveryStep,
    JobObservation,
    PayloadRef,
)
from dpone.errors import ConfigInvalid, DponeError, JournalUnavailable

__all__ = ["SCHEMA_VERSION", "PostgresDeliveryStore"]

_T = TypeVar("_T")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
_LOCK_TIMEOUT = "10s"

# Migrations, in order; entry N-1 brings the delivery schema to version N. ``{p}`` is
# the quoted schema followed by a dot.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery (
            operation_id     text PRIMARY KEY,
            intent_digest    text NOT NULL,
            state            text NOT NULL,
            version          bigint NOT NULL CHECK (version >= 1),
            receiver         text NOT NULL,
            receiver_url     text NOT NULL,
            credential_ref   text,
            payload_path     text NOT NULL,
            payload_digest   text NOT NULL,
            payload_bytes    bigint NOT NULL,
            payload_rows     bigint NOT NULL,
            chunk_bytes      bigint NOT NULL,
            attempts         integer NOT NULL DEFAULT 0,
            receipt          text,
            remote_status    text,
            rows_processed   bigint,
            due_at           float8,
            next_check_at    float8,
            lease_owner      text,
            lease_expires_at float8,
            block_reason     text,
            detail           text,
            created_at       float8 NOT NULL,
            updated_at       float8 NOT NULL,
            parent_id        text,
            child_index      integer
        )
        """,
        "CREATE INDEX IF NOT EXISTS dpone_delivery_children "
        "ON {p}dpone_delivery (parent_id, child_index) WHERE parent_id IS NOT NULL",
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_transitions (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            operation_id text NOT NULL,
            version      bigint NOT NULL,
            from_state   text,
            to_state     text NOT NULL,
            actor        text NOT NULL,
            detail       text,
            at           float8 NOT NULL,
            UNIQUE (operation_id, version)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_attempts (
            operation_id text NOT NULL,
            attempt      integer NOT NULL,
            owner        text NOT NULL,
            started_at   float8 NOT NULL,
            outcome      text,
            http_status  integer,
            ended_at     float8,
            PRIMARY KEY (operation_id, attempt)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_receipts (
            operation_id text PRIMARY KEY,
            receipt      text NOT NULL,
            source       text NOT NULL,
            attempt      integer NOT NULL,
            recorded_at  float8 NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_observations (
            id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            operation_id   text NOT NULL,
            receipt        text NOT NULL,
            status         text NOT NULL,
            rows_total     bigint,
            rows_processed bigint,
            rows_failed    bigint,
            observed_at    float8 NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_receivers (
            receiver       text PRIMARY KEY,
            capacity_limit integer CHECK (capacity_limit IS NULL OR capacity_limit >= 1)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_reservations (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            operation_id text NOT NULL,
            receiver     text NOT NULL,
            reserved_at  float8 NOT NULL,
            released_at  float8,
            released_by  text
        )
        """,
        "CREATE UNIQUE INDEX IF NOT EXISTS dpone_delivery_one_active_reservation "
        "ON {p}dpone_delivery_reservations (operation_id) WHERE released_at IS NULL",
        "CREATE INDEX IF NOT EXISTS dpone_delivery_active_by_receiver "
        "ON {p}dpone_delivery_reservations (receiver) WHERE released_at IS NULL",
        """
        CREATE OR REPLACE FUNCTION {p}dpone_delivery_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$
        """,
        """
        CREATE OR REPLACE TRIGGER dpone_delivery_transitions_append_only
        BEFORE UPDATE OR DELETE ON {p}dpone_delivery_transitions
        FOR EACH ROW EXECUTE FUNCTION {p}dpone_delivery_append_only()
        """,
        """
        CREATE OR REPLACE TRIGGER dpone_delivery_observations_append_only
        BEFORE UPDATE OR DELETE ON {p}dpone_delivery_observations
        FOR EACH ROW EXECUTE FUNCTION {p}dpone_delivery_append_only()
        """,
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_audit (
            id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            operation_id   text NOT NULL,
            principal      text NOT NULL,
            action         text NOT NULL,
            reason         text NOT NULL,
            state          text NOT NULL,
            before_version bigint NOT NULL,
            after_version  bigint NOT NULL,
            at             float8 NOT NULL
        )
        """,
        """
        CREATE OR REPLACE TRIGGER dpone_delivery_audit_append_only
        BEFORE UPDATE OR DELETE ON {p}dpone_delivery_audit
        FOR EACH ROW EXECUTE FUNCTION {p}dpone_delivery_append_only()
        """,
    ),
    (
        # version 2: the observation lease of Airflow triggers (dpone.airflow.triggers).
        # One row per delivery: who may GET the receiver now, until when. Triggers take it
        # by compare-and-set on the database clock; nothing in the runtime reads it.
        """
        CREATE TABLE IF NOT EXISTS {p}dpone_delivery_observer_leases (
            operation_id text PRIMARY KEY,
            holder       text NOT NULL,
            expires_at   float8 NOT NULL,
            epoch        bigint NOT NULL CHECK (epoch >= 1),
            polls        bigint NOT NULL DEFAULT 0,
            last_status  text
        )
        """,
    ),
)
#: The delivery schema version this code writes and reads.
SCHEMA_VERSION = len(_MIGRATIONS)


class PostgresDeliveryStore:
    """A DeliveryStorePort on PostgreSQL (one connection per thread, explicit transactions).

    Args:
        dsn: a libpq URL or conninfo; it is never echoed or stored.
        schema: the schema holding the journal (created when missing).

    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "dpone",
        connect_timeout_s: int = 5,
        read_only: bool = False,
    ) -> None:
        if not isinstance(schema, str) or not _IDENTIFIER.fullmatch(schema):
            raise ConfigInvalid("the schema must be a plain identifier", field="schema")
        self._locator = _pg.pg_locator(dsn)
        self._dsn = dsn
        self._schema = schema
        self._connect_timeout_s = max(2, int(connect_timeout_s))
        self._dialect = _sql.Dialect(
            prefix=f'"{schema}".',
            placeholder="%s",
            now_sql="extract(epoch FROM clock_timestamp())::float8",
            for_update=" FOR UPDATE",
        )
        self._local = threading.local()
        self._conns: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._read_only = read_only
        if read_only:
            self._check_read_only()
        else:
            self._migrate()

    @property
    def locator(self) -> str:
        """``postgresql://host:port/db`` plus the schema; no credentials."""
        return f"{self._locator}#{self._schema}"

    # ------------------------------------------------------------------ plumbing
    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or self._pid != os.getpid():
            conn = psycopg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=self._connect_timeout_s,
                application_name="dpone-delivery",
            )
            conn.execute(f"SET lock_timeout = '{_LOCK_TIMEOUT}'")
            if self._read_only:
                conn.execute("SET default_transaction_read_only = on")
            self._local.conn = conn
            self._pid = os.getpid()
            with self._lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        try:
            yield
        except DponeError:
            raise
        except psycopg.Error as exc:
            self._local.conn = None
            raise _pg.translate(
                exc,
                action=action,
                unavailable=JournalUnavailable,
                rejected=JournalUnavailable,
                subject=f"the PostgreSQL delivery store {self._locator}",
            ) from exc

    def _tx(self, action: str, work: Callable[[Any], _T]) -> _T:
        with self._guard(action):
            conn = self._conn()
            with conn.transaction(), conn.cursor() as cur:
                return work(cur)

    def _check_read_only(self) -> None:
        """Read the schema version without DDL; refuse a missing or stale control plane."""

        def run(cur: Any) -> int | None:
            cur.execute("SELECT to_regclass(%s)", (f'"{self._schema}".dpone_delivery_schema',))
            if cur.fetchone()[0] is None:
                return None
            cur.execute(self._dialect.q("SELECT MAX(version) FROM {p}dpone_delivery_schema"))
            return int(cur.fetchone()[0] or 0)

        try:
            current = self._tx("reading the delivery schema version", run)
            _sql.check_read_only_schema(
                current, schema_version=SCHEMA_VERSION, locator=self.locator
            )
        except DponeError:
            self.close()
            raise

    def _migrate(self) -> None:
        def run(cur: Any) -> None:
            # one migrator at a time per schema, across processes
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.locator,))
            _pg.create_schema(cur.connection, self._schema)  # the journal may create it too
            cur.execute(
                self._dialect.q(
                    "CREATE TABLE IF NOT EXISTS {p}dpone_delivery_schema (version integer NOT NULL)"
                )
            )
            cur.execute(self._dialect.q("SELECT MAX(version) FROM {p}dpone_delivery_schema"))
            current = int(cur.fetchone()[0] or 0)
            if current > SCHEMA_VERSION:
                raise ConfigInvalid(
                    f"the delivery store has schema {current}, newer than this dpone "
                    f"({SCHEMA_VERSION}); upgrade dpone",
                    field="journal",
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[version - 1]:
                    cur.execute(statement.replace("{p}", self._dialect.prefix))
                cur.execute(
                    self._dialect.q("INSERT INTO {p}dpone_delivery_schema (version) VALUES (?)"),
                    (version,),
                )

        self._tx("migrating the delivery schema", run)

    def close(self) -> None:
        """Close every connection this store opened. Idempotent."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            if self._pid == os.getpid():
                conn.close()
        self._local = threading.local()

    # ------------------------------------------------------------------ port
    def now(self) -> float:
        """Return the server's clock, seconds since the epoch."""
        return self._tx("reading the clock", lambda cur: _sql.now(cur, self._dialect))

    def get(self, operation_id: str) -> DeliveryRecord | None:
        """Return the record or None."""
        return self._tx(
            "reading a delivery", lambda cur: _sql.read(cur, self._dialect, operation_id)
        )

    def list_records(self, *, limit: int = 100) -> list[DeliveryRecord]:
        """Return records, newest update first."""
        return self._tx(
            "listing deliveries", lambda cur: _sql.list_records(cur, self._dialect, limit)
        )

    def history(self, operation_id: str) -> list[dict[str, object]]:
        """Return the append-only transitions of one delivery, in order."""
        return self._tx(
            "reading history",
            lambda cur: _sql.dicts(cur, self._dialect, _sql.HISTORY_SQL, operation_id),
        )

    def attempts(self, operation_id: str) -> list[dict[str, object]]:
        """Return the submit attempts of one delivery, in order."""
        return self._tx(
            "reading attempts",
            lambda cur: _sql.dicts(cur, self._dialect, _sql.ATTEMPTS_SQL, operation_id),
        )

    def observations(self, operation_id: str) -> list[JobObservation]:
        """Return the recorded observations of one delivery, in order."""
        return self._tx(
            "reading observations",
            lambda cur: _sql.observations(cur, self._dialect, operation_id),
        )

    def active_reservations(self, receiver: str) -> int:
        """Return how many capacity slots of ``receiver`` are held now."""
        return self._tx(
            "counting reservations",
            lambda cur: _sql.active_reservations(cur, self._dialect, receiver),
        )

    def capacity_available(self, receiver: str) -> bool:
        """Return True when ``receiver`` has no limit or a free slot now (a hint, no lock)."""
        return self._tx(
            "reading capacity",
            lambda cur: _sql.capacity_available(cur, self._dialect, receiver),
        )

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
        return self._tx(
            "registering deliveries",
            lambda cur: _sql.register(
                cur, self._dialect, registrations, capacity_limit=capacity_limit, actor=actor
            ),
        )

    def children(self, parent_id: str) -> list[DeliveryRecord]:
        """Return the children of a split delivery, in order."""
        return self._tx(
            "reading children", lambda cur: _sql.children(cur, self._dialect, parent_id)
        )

    def advance(
        self, *, operation_id: str, expected_version: int, step: DeliveryStep, actor: str
    ) -> DeliveryRecord:
        """Apply ``step`` in one transaction (CAS, capacity, attempt, receipt, observation)."""
        return self._tx(
            "advancing a delivery",
            lambda cur: _sql.advance(
                cur,
                self._dialect,
                operation_id=operation_id,
                expected_version=expected_version,
                step=step,
                actor=actor,
            ),
        )

    def release_capacity(
        self, *, operation_id: str, expected_version: int, principal: str, reason: str
    ) -> DeliveryRecord:
        """An operator frees a BLOCKED delivery's slot (audited, one transaction)."""
        return self._tx(
            "releasing capacity",
            lambda cur: _sql.release_capacity(
                cur,
                self._dialect,
                operation_id=operation_id,
                expected_version=expected_version,
                principal=principal,
                reason=reason,
            ),
        )

    def audit_log(self, operation_id: str) -> list[dict[str, object]]:
        """Return the operator actions on one delivery, in order."""
        return self._tx(
            "reading the audit log",
            lambda cur: _sql.dicts(cur, self._dialect, _sql.AUDIT_SQL, operation_id),
        )
