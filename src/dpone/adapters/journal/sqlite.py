"""SQLite commit journal, the embedded default: WAL, BEGIN IMMEDIATE, one-statement CAS."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dpone.adapters.journal import _checkpoint_sql, _ledger_sql, _rules
from dpone.adapters.journal._rows import audit_from_row as _audit
from dpone.adapters.journal._rows import entry_from_row as _entry
from dpone.adapters.journal._rows import transition_from_row as _transition
from dpone.contracts.checkpoint import Checkpoint, CheckpointAdvance
from dpone.contracts.evidence import SafeMapping
from dpone.contracts.journal import AuditRecord, AuditRequest, JournalEntry, Transition
from dpone.contracts.run import AttemptRecord, RunError, RunRecord, RunStart, RunState
from dpone.contracts.states import CommitState
from dpone.errors import ConfigInvalid, DponeError, JournalUnavailable

if TYPE_CHECKING:
    from dpone.ports.checkpoint import TransactionalCheckpointStorePort
    from dpone.ports.journal import TransactionalJournalPort
    from dpone.ports.ledger import RunLedgerPort

__all__ = ["LOCATOR_PREFIX", "SCHEMA_VERSION", "SqliteCommitJournal"]

#: A journal's or target's database identity is this prefix plus the resolved file path.
LOCATOR_PREFIX = "sqlite:"

# Seconds since the Unix epoch from SQLite itself. Every process sharing a SQLite file
# runs on the file's machine, so this is the one clock all of them agree on.
_NOW_EXPR = "(julianday('now') - 2440587.5) * 86400.0"
_NOW_SQL = f"SELECT {_NOW_EXPR}"
_LEDGER = _ledger_sql.LedgerDialect(placeholder="?", prefix="", now=f"({_NOW_EXPR})")

_ENTRY_COLUMNS = (
    "operation_id, intent_digest, state, version, lease_owner, lease_epoch, "
    "lease_expires_at, metadata, result, created_at, updated_at, previous_state"
)
_TRANSITION_COLUMNS = (
    "operation_id, version, seq, from_state, to_state, kind, actor, lease_epoch, evidence, at"
)
_AUDIT_COLUMNS = (
    "operation_id, principal, action, reason, attestation, before_state, after_state, "
    "before_version, after_version, outcome, at"
)

# Migrations, in order; entry N-1 brings the schema to version N. Never edit a released
# one: add a new entry. Each statement runs separately (executescript would COMMIT).
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE IF NOT EXISTS dpone_journal (
            operation_id     TEXT PRIMARY KEY,
            intent_digest    TEXT NOT NULL,
            state            TEXT NOT NULL CHECK (state IN (
                'PREPARING', 'PREPARED', 'COMMITTING', 'TARGET_COMMITTED',
                'COMMITTED_INCOMPLETE', 'COMPLETE', 'COMMIT_UNKNOWN', 'FAILED_PRE_COMMIT')),
            previous_state   TEXT,
            version          INTEGER NOT NULL CHECK (version >= 1),
            lease_owner      TEXT,
            lease_epoch      INTEGER NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),
            lease_expires_at REAL,
            metadata         TEXT NOT NULL DEFAULT '{}',
            result           TEXT,
            created_at       REAL NOT NULL,
            updated_at       REAL NOT NULL
        )
        """,
        "CREATE INDEX IF NOT EXISTS dpone_journal_state_updated "
        "ON dpone_journal (state, updated_at)",
        """
        CREATE TABLE IF NOT EXISTS dpone_transitions (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL REFERENCES dpone_journal (operation_id),
            version      INTEGER NOT NULL,
            seq          INTEGER NOT NULL,
            from_state   TEXT,
            to_state     TEXT NOT NULL,
            kind         TEXT NOT NULL,
            actor        TEXT NOT NULL,
            lease_epoch  INTEGER NOT NULL,
            evidence     TEXT NOT NULL,
            at           REAL NOT NULL,
            UNIQUE (operation_id, version, seq)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_audit (
            id             INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id   TEXT NOT NULL,
            principal      TEXT NOT NULL,
            action         TEXT NOT NULL,
            reason         TEXT NOT NULL,
            attestation    TEXT,
            before_state   TEXT,
            after_state    TEXT,
            before_version INTEGER,
            after_version  INTEGER,
            outcome        TEXT NOT NULL,
            at             REAL NOT NULL
        )
        """,
        "CREATE INDEX IF NOT EXISTS dpone_audit_operation ON dpone_audit (operation_id, id)",
        # History and audit are evidence: the database itself refuses to rewrite them.
        """
        CREATE TRIGGER IF NOT EXISTS dpone_transitions_no_update
        BEFORE UPDATE ON dpone_transitions
        BEGIN SELECT RAISE(ABORT, 'dpone_transitions is append-only'); END
        """,
        """
        CREATE TRIGGER IF NOT EXISTS dpone_transitions_no_delete
        BEFORE DELETE ON dpone_transitions
        BEGIN SELECT RAISE(ABORT, 'dpone_transitions is append-only'); END
        """,
        """
        CREATE TRIGGER IF NOT EXISTS dpone_audit_no_update
        BEFORE UPDATE ON dpone_audit
        BEGIN SELECT RAISE(ABORT, 'dpone_audit is append-only'); END
        """,
        """
        CREATE TRIGGER IF NOT EXISTS dpone_audit_no_delete
        BEFORE DELETE ON dpone_audit
        BEGIN SELECT RAISE(ABORT, 'dpone_audit is append-only'); END
        """,
    ),
    # checkpoints of incremental streams (watermarks promoted with COMPLETE)
    (
        """
        CREATE TABLE IF NOT EXISTS dpone_checkpoints (
            stream_id       TEXT PRIMARY KEY,
            workload_id     TEXT NOT NULL,
            partition       TEXT NOT NULL,
            target_identity TEXT NOT NULL,
            origin_us       INTEGER NOT NULL,
            watermark_us    INTEGER NOT NULL,
            operation_id    TEXT,
            claim_start_us  INTEGER,
            claim_end_us    INTEGER,
            updated_at      REAL NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS dpone_checkpoint_intervals (
            stream_id    TEXT NOT NULL REFERENCES dpone_checkpoints (stream_id),
            start_us     INTEGER NOT NULL,
            end_us       INTEGER NOT NULL CHECK (end_us > start_us),
            operation_id TEXT NOT NULL,
            completed_at REAL NOT NULL,
            PRIMARY KEY (stream_id, start_us, end_us)
        )
        """,
    ),
    # the run ledger: runs and their attempts (docs/runs-and-retries.md)
    _ledger_sql.SQLITE_MIGRATION,
    # what a REST delivery promotes once its success is verified (docs/delivery.md)
    _checkpoint_sql.SQLITE_BINDINGS_MIGRATION,
)
#: The schema version this code writes and reads.
SCHEMA_VERSION = len(_MIGRATIONS)


class SqliteCommitJournal:
    """A CommitJournalPort (and TransactionalJournalPort) on one SQLite file.

    Every write runs in ``BEGIN IMMEDIATE`` so writers queue on the file lock instead of
    failing on lock upgrades; each CAS is a single conditional ``UPDATE``. Connections
    are per thread (the runtime renews leases from a heartbeat thread) and all are
    closed by :meth:`close`.

    Args:
        path: the journal file; its directory is created when missing.
        busy_timeout_s: how long a write waits for another writer's lock before
            ``JournalUnavailable``.

    Raises:
        JournalUnavailable: the file cannot be created, opened, or migrated now.
        ConfigInvalid: the path is ``:memory:`` or the file has a newer schema.
    """

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 10.0, read_only: bool = False
    ) -> None:
        if str(path) in ("", ":memory:"):
            raise ConfigInvalid(
                "the SQLite journal needs a file path; an in-memory database is private "
                "to one connection",
                field="journal",
            )
        self._path = Path(path).expanduser().resolve()
        self._busy_timeout_s = float(busy_timeout_s)
        self._local = threading.local()
        self._conns: list[tuple[threading.Thread, sqlite3.Connection]] = []
        # Connections inherited through fork belong to the parent: never used, never closed.
        self._inherited: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        # read_only (inspect, plan, list, history): never create, convert or migrate the
        # file; a journal that does not exist yet reads as empty.
        self._read_only = read_only
        self._applied: list[int] = []  # schema versions this process applied on open
        self._missing = read_only and not self._path.is_file()
        if read_only:
            return
        try:
            with self._guard():
                self._path.parent.mkdir(parents=True, exist_ok=True)
                conn = self._connection()
                self._use_wal(conn)
                self._migrate(conn)
        except BaseException:
            self.close()
            raise

    def migrate(self) -> list[int]:
        """Return the schema versions applied when this journal was opened (it migrates then).

        Opening is idempotent and safe under concurrency (``BEGIN IMMEDIATE``), so the
        schema is always current once the constructor returns.
        """
        return list(self._applied)

    # ------------------------------------------------------------------ identity
    @property
    def path(self) -> Path:
        """The resolved journal file."""
        return self._path

    @property
    def locator(self) -> str:
        """This journal's database identity: ``"sqlite:" + resolved path``; holds no secret."""
        return LOCATOR_PREFIX + str(self._path)

    def shares_database_with(self, locator: str) -> bool:
        """Return True when ``locator`` names this journal's file (atomic mode possible)."""
        if not locator.startswith(LOCATOR_PREFIX):
            return False
        raw = locator[len(LOCATOR_PREFIX) :]
        if not raw or raw == ":memory:":
            return False
        try:
            return Path(raw).expanduser().resolve() == self._path
        except (OSError, RuntimeError):
            return False

    # ------------------------------------------------------------------ reads
    def get(self, operation_id: str) -> JournalEntry | None:
        """Return the entry or None; reads see every committed write."""
        if self._missing:
            return None
        with self._guard():
            cur = self._connection().cursor()
            return _read_entry(cur, operation_id)

    def list_entries(
        self,
        *,
        states: frozenset[CommitState] | None = None,
        updated_before: float | None = None,
        limit: int = 100,
    ) -> list[JournalEntry]:
        """Return entries, newest update first, filtered by state and age."""
        if (states is not None and not states) or self._missing:
            return []
        clauses: list[str] = []
        params: list[Any] = []
        if states is not None:
            clauses.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(s.value for s in states)
        if updated_before is not None:
            clauses.append("updated_at < ?")
            params.append(float(updated_before))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        params.append(max(int(limit), 0))
        with self._guard():
            rows = (
                self._connection()
                .execute(
                    f"SELECT {_ENTRY_COLUMNS} FROM dpone_journal {where} "
                    "ORDER BY updated_at DESC, rowid DESC LIMIT ?",
                    params,
                )
                .fetchall()
            )
        return [_entry(row) for row in rows]

    def history(self, operation_id: str) -> list[Transition]:
        """Return the append-only transition history in order."""
        if self._missing:
            return []
        with self._guard():
            rows = (
                self._connection()
                .execute(
                    f"SELECT {_TRANSITION_COLUMNS} FROM dpone_transitions "
                    "WHERE operation_id = ? ORDER BY version, seq",
                    (operation_id,),
                )
                .fetchall()
            )
        return [_transition(row) for row in rows]

    def audit_log(self, operation_id: str | None = None) -> list[AuditRecord]:
        """Return audit records in order, for one operation or all."""
        if self._missing:
            return []
        sql = f"SELECT {_AUDIT_COLUMNS} FROM dpone_audit"
        params: tuple[Any, ...] = ()
        if operation_id is not None:
            sql += " WHERE operation_id = ?"
            params = (operation_id,)
        with self._guard():
            rows = self._connection().execute(sql + " ORDER BY id", params).fetchall()
        return [_audit(row) for row in rows]

    def now(self) -> float:
        """Return the journal's clock (SQLite's), seconds since the epoch."""
        if self._missing:
            return time.time()  # SQLite's clock is this machine's clock
        with self._guard():
            return _now(self._connection().cursor())

    # ------------------------------------------------------------------ writes
    def create_intent(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_owner: str | None = None,
        lease_ttl_seconds: float | None = None,
    ) -> JournalEntry:
        """Create the entry in PREPARING if absent (leased at epoch 1 when asked)."""
        _rules.check_identity("operation_id", operation_id)
        _rules.check_identity("intent_digest", intent_digest)
        safe_metadata = _rules.safe_values(metadata)
        _rules.safe_actor(actor)
        ttl = _rules.lease_request(lease_owner, lease_ttl_seconds)
        with self._guard(), self._write() as cur:
            at = _now(cur)
            rows = cur.execute(
                "INSERT INTO dpone_journal (operation_id, intent_digest, state, version, "
                "lease_owner, lease_epoch, lease_expires_at, metadata, created_at, updated_at) "
                "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?) "
                f"ON CONFLICT (operation_id) DO NOTHING RETURNING {_ENTRY_COLUMNS}",
                (
                    operation_id,
                    intent_digest,
                    CommitState.PREPARING.value,
                    lease_owner if ttl is not None else None,
                    1 if ttl is not None else 0,
                    at + ttl if ttl is not None else None,
                    _rules.encode_mapping(safe_metadata),
                    at,
                    at,
                ),
            ).fetchall()
            if rows:
                entry = _entry(rows[0])
                created = [_rules.create_row(entry, actor=actor)]
                if ttl is not None:
                    created.append(_rules.lease_row(entry, seq=1))
                _insert_transitions(cur, tuple(created))
                return entry
            existing = _read_entry(cur, operation_id)
            if existing is None:  # pragma: no cover - the insert conflicted on this key
                raise _rules.not_found(operation_id)
            if existing.intent_digest != intent_digest:
                raise _rules.intent_conflict(existing)
            return existing

    def compare_and_set(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        next_state: CommitState,
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
        audit: AuditRequest | None = None,
        release_lease: bool = False,
    ) -> JournalEntry:
        """Move the entry to ``next_state`` in one conditional UPDATE; version + 1."""
        _rules.check_move(
            operation_id=operation_id,
            expected_states=expected_states,
            next_state=next_state,
            atomic=False,
            audited=audit is not None,
        )
        safe_evidence = _rules.safe_values(evidence)
        safe_result = _rules.safe_values(result) if result is not None else None
        _rules.safe_actor(actor)
        if audit is not None:
            _rules.safe_audit(audit, "applied")
        with self._guard(), self._write() as cur:
            return _cas(
                cur,
                operation_id=operation_id,
                expected_version=expected_version,
                expected_states=expected_states,
                next_state=next_state,
                lease_epoch=lease_epoch,
                actor=actor,
                evidence=safe_evidence,
                result=safe_result,
                audit=audit,
                release_lease=release_lease,
            )

    def compare_and_set_within(
        self,
        txn: object,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        next_state: CommitState,
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
        release_lease: bool = False,
    ) -> JournalEntry:
        """Run the CAS on the target's open transaction ``txn``; atomic folds allowed.

        Args:
            txn: an ``sqlite3.Connection`` to this journal's file, inside ``BEGIN
                IMMEDIATE``. It is never begun, committed or rolled back here.

        Raises:
            TypeError: ``txn`` is not an ``sqlite3.Connection``.
            ValueError: ``txn`` is not in a transaction or opened another database.
            IllegalTransition, JournalConflict, OperationNotFound: as ``compare_and_set``;
                the caller must roll its transaction back.
            JournalUnavailable: the statement failed in SQLite.
        """
        if not isinstance(txn, sqlite3.Connection):
            raise TypeError("txn must be the target's sqlite3.Connection")
        _rules.check_move(
            operation_id=operation_id,
            expected_states=expected_states,
            next_state=next_state,
            atomic=True,
            audited=False,
        )
        safe_evidence = _rules.safe_values(evidence)
        safe_result = _rules.safe_values(result) if result is not None else None
        _rules.safe_actor(actor)
        with self._guard():
            if not txn.in_transaction:
                raise ValueError("txn must be inside BEGIN IMMEDIATE: atomic mode needs it")
            cur = txn.cursor()
            cur.row_factory = None  # the target may use sqlite3.Row; decoding expects tuples
            if not self._is_our_file(cur):
                raise ValueError("txn is connected to another database than this journal's")
            return _cas(
                cur,
                operation_id=operation_id,
                expected_version=expected_version,
                expected_states=expected_states,
                next_state=next_state,
                lease_epoch=lease_epoch,
                actor=actor,
                evidence=safe_evidence,
                result=safe_result,
                audit=None,
                release_lease=release_lease,
            )

    def acquire_lease(
        self,
        *,
        operation_id: str,
        owner: str,
        ttl_seconds: float,
        expected_version: int | None = None,
        break_owner: str | None = None,
    ) -> JournalEntry:
        """Grant the lease to ``owner`` at epoch + 1 in one conditional UPDATE; version + 1."""
        ttl = _rules.check_ttl(ttl_seconds)
        _rules.safe_actor(owner)
        with self._guard(), self._write() as cur:
            at = _now(cur)
            # The lease predicate mirrors _rules.lease_is_free, judged by SQLite's clock.
            rows = cur.execute(
                "UPDATE dpone_journal SET lease_owner = ?, lease_epoch = lease_epoch + 1, "
                "lease_expires_at = ?, version = version + 1, updated_at = ? "
                "WHERE operation_id = ? AND (? IS NULL OR version = ?) "
                "AND (lease_owner IS NULL OR lease_expires_at IS NULL "
                "OR lease_expires_at <= ? OR lease_owner = ? OR lease_owner = ?) "
                f"RETURNING {_ENTRY_COLUMNS}",
                (
                    owner,
                    at + ttl,
                    at,
                    operation_id,
                    expected_version,
                    expected_version,
                    at,
                    owner,
                    break_owner,
                ),
            ).fetchall()
            if rows:
                entry = _entry(rows[0])
                _insert_transitions(cur, (_rules.lease_row(entry),))
                return entry
            current = _read_entry(cur, operation_id)
            if current is None:
                raise _rules.not_found(operation_id)
            if expected_version is not None and current.version != expected_version:
                raise _rules.conflict(
                    expected_version=expected_version,
                    expected_states=None,
                    lease_epoch=None,
                    current=current,
                )
            raise _rules.lease_held(current, now=at)

    def renew_lease(
        self, *, operation_id: str, owner: str, lease_epoch: int, ttl_seconds: float
    ) -> JournalEntry:
        """Extend the caller's lease; the version does not change."""
        ttl = _rules.check_ttl(ttl_seconds)
        with self._guard(), self._write() as cur:
            at = _now(cur)
            rows = cur.execute(
                "UPDATE dpone_journal SET lease_expires_at = ? "
                "WHERE operation_id = ? AND lease_owner = ? AND lease_epoch = ? "
                f"RETURNING {_ENTRY_COLUMNS}",
                (at + ttl, operation_id, owner, lease_epoch),
            ).fetchall()
            if rows:
                return _entry(rows[0])
            current = _read_entry(cur, operation_id)
            if current is None:
                raise _rules.not_found(operation_id)
            raise _rules.lease_lost(current, lease_epoch=lease_epoch)

    def release_lease(self, *, operation_id: str, owner: str, lease_epoch: int) -> None:
        """Expire the caller's lease now if it still holds it; otherwise do nothing."""
        with self._guard(), self._write() as cur:
            at = _now(cur)
            cur.execute(
                "UPDATE dpone_journal SET lease_owner = NULL, lease_expires_at = ? "
                "WHERE operation_id = ? AND lease_owner = ? AND lease_epoch = ?",
                (at, operation_id, owner, lease_epoch),
            )

    def append_audit(
        self,
        *,
        operation_id: str,
        request: AuditRequest,
        outcome: str,
        entry: JournalEntry | None,
    ) -> AuditRecord:
        """Record an operator action that changed no state."""
        _rules.check_identity("operation_id", operation_id)
        _rules.safe_audit(request, outcome)
        with self._guard(), self._write() as cur:
            record = _rules.audit_record(
                operation_id=operation_id,
                request=request,
                outcome=outcome,
                before_state=None if entry is None else entry.state,
                before_version=None if entry is None else entry.version,
                after=entry,
                at=_now(cur),
            )
            _insert_audit(cur, record)
            return record

    # ------------------------------------------------------------------ checkpoints
    def complete_with_checkpoint(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        checkpoint: CheckpointAdvance,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """CAS to COMPLETE and promote the checkpoint in one ``BEGIN IMMEDIATE``."""
        _rules.check_move(
            operation_id=operation_id,
            expected_states=expected_states,
            next_state=CommitState.COMPLETE,
            atomic=False,
            audited=False,
        )
        safe_evidence = _rules.safe_values(evidence)
        safe_result = _rules.safe_values(result) if result is not None else None
        _rules.safe_actor(actor)
        with self._guard(), self._write() as cur:
            entry = _cas(
                cur,
                operation_id=operation_id,
                expected_version=expected_version,
                expected_states=expected_states,
                next_state=CommitState.COMPLETE,
                lease_epoch=lease_epoch,
                actor=actor,
                evidence=safe_evidence,
                result=safe_result,
                audit=None,
                release_lease=True,
            )
            _checkpoint_sql.promote(
                cur, _CHECKPOINTS, checkpoint, operation_id=operation_id, at=_now(cur)
            )
            return entry

    def complete_with_checkpoint_within(
        self,
        txn: object,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        checkpoint: CheckpointAdvance,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """``compare_and_set_within`` to COMPLETE, then promote the checkpoint on ``txn``."""
        entry = self.compare_and_set_within(
            txn,
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            next_state=CommitState.COMPLETE,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
            release_lease=True,
        )
        assert isinstance(txn, sqlite3.Connection)  # noqa: S101 - checked by the CAS above
        with self._guard():
            cur = txn.cursor()
            cur.row_factory = None
            _checkpoint_sql.promote(
                cur, _CHECKPOINTS, checkpoint, operation_id=operation_id, at=_now(cur)
            )
        return entry

    def promote_completed(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Promote the checkpoint of an already COMPLETE operation (state checked here)."""
        with self._guard(), self._write() as cur:
            entry = _read_entry(cur, operation_id)
            if entry is None or entry.state is not CommitState.COMPLETE:
                return False
            _checkpoint_sql.promote(
                cur, _CHECKPOINTS, checkpoint, operation_id=operation_id, at=_now(cur)
            )
            return True

    def bind_delivery_checkpoint(
        self, *, operation_id: str, checkpoint: CheckpointAdvance
    ) -> CheckpointAdvance:
        """Record what a delivery promotes once it succeeds; return the recorded binding."""
        with self._guard(), self._write() as cur:
            return _checkpoint_sql.bind(
                cur, _CHECKPOINTS, checkpoint, operation_id=operation_id, at=_now(cur)
            )

    def delivery_checkpoint(self, operation_id: str) -> CheckpointAdvance | None:
        """Return what a delivery promotes, or None when it promotes nothing."""
        if self._missing:
            return None
        with self._guard():
            cur = self._connection().cursor()
            cur.row_factory = None
            # a read-only open never migrates: a file from before schema version 4 has
            # no bindings table, so it binds nothing (a writable open has migrated it)
            exists = (
                not self._read_only
                or cur.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' "
                    "AND name = 'dpone_checkpoint_bindings'"
                ).fetchone()
            )
            return _checkpoint_sql.bound(cur, _CHECKPOINTS, operation_id) if exists else None

    def promote_delivered(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Absolute checkpoint write for a delivery whose remote success is verified.

        Returns False when the interval was already recorded (a repeated promotion:
        nothing changes).
        """
        with self._guard(), self._write() as cur:
            return _checkpoint_sql.promote_unrecorded(
                cur, _CHECKPOINTS, checkpoint, operation_id=operation_id, at=_now(cur)
            )

    def get_checkpoint(self, stream_id: str) -> Checkpoint | None:
        """Return the stream's checkpoint, or None."""
        if self._missing or not self._has_checkpoints():
            return None
        with self._guard():
            return _checkpoint_sql.read(self._connection().cursor(), _CHECKPOINTS, stream_id)

    def list_checkpoints(self) -> list[Checkpoint]:
        """Return every stream's checkpoint."""
        if self._missing or not self._has_checkpoints():
            return []
        with self._guard():
            return _checkpoint_sql.list_all(self._connection().cursor(), _CHECKPOINTS)

    def claim_interval(
        self,
        *,
        stream_id: str,
        workload_id: str,
        partition: str,
        target_identity: str,
        origin: int,
        proposed_end: int,
    ) -> tuple[int, int] | None:
        """Return and record the stream's next interval (the recorded claim is reused)."""
        template = CheckpointAdvance(
            stream_id=stream_id,
            workload_id=workload_id,
            partition=partition,
            target_identity=target_identity,
            origin=origin,
            start=origin,
            end=origin,
        )
        with self._guard(), self._write() as cur:
            return _checkpoint_sql.claim(
                cur, _CHECKPOINTS, template, proposed_end=proposed_end, at=_now(cur)
            )

    def _has_checkpoints(self) -> bool:
        """False on a read-only journal written by a dpone before checkpoints existed."""
        with self._guard():
            row = (
                self._connection()
                .execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' "
                    "AND name = 'dpone_checkpoints'"
                )
                .fetchone()
            )
        return row is not None

    # ------------------------------------------------------------------ run ledger
    def begin_run(self, start: RunStart) -> tuple[RunRecord, bool]:
        """Record the run if its idempotency key is new; else return the existing run."""
        with self._guard(), self._ledger_write() as cur:
            return _ledger_sql.begin_run(cur, _LEDGER, start)

    def get_run(self, run_id: str) -> RunRecord | None:
        """Return one run or None."""
        if self._missing:
            return None
        with self._guard():
            return _ledger_sql.get_run(self._connection().cursor(), _LEDGER, run_id)

    def list_runs(
        self, *, states: frozenset[RunState] | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """Return runs, newest update first."""
        if self._missing:
            return []
        with self._guard():
            cur = self._connection().cursor()
            return _ledger_sql.list_runs(cur, _LEDGER, states=states, limit=limit)

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Return a run's attempts in order."""
        if self._missing:
            return []
        with self._guard():
            return _ledger_sql.list_attempts(self._connection().cursor(), _LEDGER, run_id)

    def begin_attempt(
        self, *, run_id: str, attempt: int, owner: str, provenance: SafeMapping | None = None
    ) -> AttemptRecord:
        """Record attempt ``attempt`` (the lease epoch) and make it current; refuse stale ones."""
        with self._guard(), self._ledger_write() as cur:
            return _ledger_sql.begin_attempt(
                cur, _LEDGER, run_id=run_id, attempt=attempt, owner=owner, provenance=provenance
            )

    def end_attempt(
        self, *, run_id: str, attempt: int, state: RunState, error: RunError | None = None
    ) -> RunRecord:
        """Record how the current attempt ended; refuse a stale attempt's write."""
        with self._guard(), self._ledger_write() as cur:
            return _ledger_sql.end_attempt(
                cur, _LEDGER, run_id=run_id, attempt=attempt, state=state, error=error
            )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close every connection this journal opened, in any thread. Idempotent."""
        with self._conns_lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for _, conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def __enter__(self) -> SqliteCommitJournal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteCommitJournal({str(self._path)!r})"

    # ------------------------------------------------------------------ internals
    def _connection(self) -> sqlite3.Connection:
        """Return this thread's connection, opening it on first use."""
        if self._closed:
            raise JournalUnavailable(
                f"the journal {self._path} was closed by this process; open it again",
                hint="create a new SqliteCommitJournal",
            )
        if os.getpid() != self._pid:
            self._forget_inherited()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        with self._conns_lock:
            if self._closed:  # close() ran in another thread meanwhile
                raise JournalUnavailable(
                    f"the journal {self._path} was closed by this process; open it again"
                )
            # Heartbeat threads come and go: close the connections of finished ones.
            alive = []
            for thread, old in self._conns:
                if thread.is_alive():
                    alive.append((thread, old))
                    continue
                try:
                    old.close()
                except sqlite3.Error:
                    pass  # a finished thread's connection; nothing depends on it
            self._conns = alive
            conn = sqlite3.connect(
                _read_only_uri(self._path) if self._read_only else str(self._path),
                uri=self._read_only,
                timeout=self._busy_timeout_s,
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,  # only close() touches another thread's connection
            )
            self._conns.append((threading.current_thread(), conn))
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            # FULL: a commit the caller was told about survives power loss, not only a crash.
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error:
            with self._conns_lock:
                self._conns = [(t, c) for t, c in self._conns if c is not conn]
            conn.close()
            raise
        self._local.conn = conn
        return conn

    def _forget_inherited(self) -> None:
        """After fork: drop the parent's connections without closing them (SQLite rule)."""
        with self._conns_lock:
            self._inherited.extend(conn for _, conn in self._conns)
            self._conns = []
            self._local = threading.local()
            self._pid = os.getpid()

    @staticmethod
    def _use_wal(conn: sqlite3.Connection) -> None:
        # WAL lets readers (inspect, the heartbeat's peers) run beside the one writer.
        # The mode is stored in the file: switch only when needed, it takes a lock.
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL").fetchall()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the schema to SCHEMA_VERSION; a no-op read when it is already there."""
        if self._schema_version(conn) == SCHEMA_VERSION:
            return
        before = self._schema_version(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS dpone_schema_version ("
                "version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            current = self._schema_version(conn)  # again, under the write lock
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[version - 1]:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO dpone_schema_version (version, applied_at) "
                    f"VALUES (?, {_NOW_EXPR})",
                    (version,),
                )
            conn.execute("COMMIT")
            self._applied = list(range(before + 1, SCHEMA_VERSION + 1))
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'dpone_schema_version'"
        ).fetchone()
        if exists is None:
            return 0
        version = int(
            conn.execute("SELECT COALESCE(MAX(version), 0) FROM dpone_schema_version").fetchone()[0]
        )
        if version > SCHEMA_VERSION:
            raise ConfigInvalid(
                f"the journal {self._path} has schema version {version}, newer than this "
                f"dpone supports ({SCHEMA_VERSION})",
                field="journal",
                hint="upgrade dpone, or point it at another journal file",
            )
        return version

    def _is_our_file(self, cur: sqlite3.Cursor) -> bool:
        for _, name, file in cur.execute("PRAGMA database_list").fetchall():
            if name == "main":
                return bool(file) and Path(file).resolve() == self._path
        return False

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        """Run the block in BEGIN IMMEDIATE; commit on success, roll back on any error."""
        if self._read_only:
            raise JournalUnavailable(
                f"the journal {self._path} was opened read-only", hint="open it for writing"
            )
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn.cursor()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the original error matters; SQLite rolls back on close anyway
            raise

    @contextmanager
    def _ledger_write(self) -> Iterator[sqlite3.Cursor]:
        """A run-ledger write without its own fsync (``synchronous = NORMAL`` in WAL mode).

        Still atomic, and durable across a process crash. Against power loss it becomes
        durable with the journal's next FULL commit (one fsync of the WAL covers every
        frame before it), and every ledger write that precedes execution is followed by
        such a commit before the target is written. Saves one fsync per ledger write.
        """
        conn = self._connection()
        conn.execute("PRAGMA synchronous = NORMAL")
        try:
            with self._write() as cur:
                yield cur
        finally:
            conn.execute("PRAGMA synchronous = FULL")

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Translate every sqlite3 and file-system error raised in the block."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: BaseException) -> DponeError:
        """Map a driver or file-system error to a DponeError naming the file, never SQL."""
        where = f"the journal file {self._path}"
        if isinstance(exc, OSError):
            return JournalUnavailable(
                f"cannot create the directory of {where} ({exc.strerror or 'OS error'})",
                hint="check the path and the permissions of its parent directories",
            )
        name = str(getattr(exc, "sqlite_errorname", "") or type(exc).__name__)
        text = str(exc).lower()
        if isinstance(exc, sqlite3.ProgrammingError) and "closed" in text:
            return JournalUnavailable(
                f"{where} was closed by this process", hint="open the journal again"
            )
        if "locked" in text or "busy" in text or name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return JournalUnavailable(
                f"{where} stayed locked by another writer for more than {self._busy_timeout_s:g} s",
                hint="retry later, or find the process holding a long write on the file",
            )
        if self._path.is_dir():
            return ConfigInvalid(
                f"{where} is a directory",
                field="journal",
                hint="point the journal URL at a file, e.g. sqlite:///.dpone/journal.db",
            )
        if (
            "not a database" in text
            or name.startswith("SQLITE_NOTADB")
            or ("no such table" in text and "dpone_" in text)
        ):
            return ConfigInvalid(
                f"{where} is not a dpone journal",
                field="journal",
                hint="point the journal URL at the journal file (or a new path)",
            )
        if "unable to open" in text or name.startswith("SQLITE_CANTOPEN"):
            return JournalUnavailable(
                f"cannot open {where}",
                hint="check that the path is a file and that its directory is writable",
            )
        if "readonly" in text or name.startswith("SQLITE_READONLY"):
            return JournalUnavailable(
                f"{where} is read-only",
                hint="dpone needs write access to the file and its directory (WAL files)",
            )
        if (
            "not a database" in text
            or "malformed" in text
            or name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT"))
        ):
            return JournalUnavailable(
                f"{where} is not a readable dpone journal (not SQLite, or damaged)",
                hint="point dpone at the right file, or restore it from a backup",
            )
        if "disk" in text or name.startswith(("SQLITE_IOERR", "SQLITE_FULL")):
            return JournalUnavailable(
                f"{where} hit an I/O error ({name})", hint="check the disk and free space"
            )
        return JournalUnavailable(f"{where} failed ({name})", hint="retry, or check the file")


_CHECKPOINTS = _checkpoint_sql.Dialect(ph="?")


# ---------------------------------------------------------------------- statements
def _now(cur: sqlite3.Cursor) -> float:
    return float(cur.execute(_NOW_SQL).fetchone()[0])


def _read_entry(cur: sqlite3.Cursor, operation_id: str) -> JournalEntry | None:
    row = cur.execute(
        f"SELECT {_ENTRY_COLUMNS} FROM dpone_journal WHERE operation_id = ?", (operation_id,)
    ).fetchone()
    return None if row is None else _entry(row)


def _cas(
    cur: sqlite3.Cursor,
    *,
    operation_id: str,
    expected_version: int,
    expected_states: frozenset[CommitState],
    next_state: CommitState,
    lease_epoch: int,
    actor: str,
    evidence: SafeMapping,
    result: SafeMapping | None,
    audit: AuditRequest | None,
    release_lease: bool = False,
) -> JournalEntry:
    """The CAS write: one conditional UPDATE, then its history (and audit) rows.

    Must run inside a write transaction; on a conflict it raises and writes nothing.
    """
    at = _now(cur)
    states = sorted(s.value for s in expected_states)
    # previous_state = state captures the old state in the same statement, so a CAS
    # that accepts several states still records the exact fold path it took.
    rows = cur.execute(
        "UPDATE dpone_journal SET previous_state = state, state = ?, version = version + 1, "
        "result = COALESCE(?, result), updated_at = ?, "
        # release_lease: the lease ends with this write (no separate release round trip)
        "lease_owner = CASE WHEN ? THEN NULL ELSE lease_owner END, "
        "lease_expires_at = CASE WHEN ? THEN ? ELSE lease_expires_at END "
        "WHERE operation_id = ? AND version = ? AND lease_epoch = ? "
        f"AND state IN ({', '.join('?' * len(states))}) "
        f"RETURNING {_ENTRY_COLUMNS}",
        (
            next_state.value,
            None if result is None else _rules.encode_mapping(result),
            at,
            release_lease,
            release_lease,
            at,
            operation_id,
            expected_version,
            lease_epoch,
            *states,
        ),
    ).fetchall()
    if not rows:
        current = _read_entry(cur, operation_id)
        if current is None:
            raise _rules.not_found(operation_id)
        raise _rules.conflict(
            expected_version=expected_version,
            expected_states=expected_states,
            lease_epoch=lease_epoch,
            current=current,
        )
    new = _entry(rows[0])
    before = CommitState(rows[0][11])
    _insert_transitions(
        cur,
        _rules.transition_rows(
            operation_id=operation_id,
            from_state=before,
            to_state=next_state,
            version=new.version,
            actor=actor,
            lease_epoch=lease_epoch,
            evidence=evidence,
            at=at,
        ),
    )
    if audit is not None:
        _insert_audit(
            cur,
            _rules.audit_record(
                operation_id=operation_id,
                request=audit,
                outcome="applied",
                before_state=before,
                before_version=expected_version,
                after=new,
                at=at,
            ),
        )
    return new


def _insert_transitions(cur: sqlite3.Cursor, rows: tuple[Transition, ...]) -> None:
    cur.executemany(
        f"INSERT INTO dpone_transitions ({_TRANSITION_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                t.operation_id,
                t.version,
                t.seq,
                None if t.from_state is None else t.from_state.value,
                t.to_state.value,
                t.kind,
                t.actor,
                t.lease_epoch,
                _rules.encode_mapping(t.evidence),
                t.at,
            )
            for t in rows
        ],
    )


def _insert_audit(cur: sqlite3.Cursor, record: AuditRecord) -> None:
    cur.execute(
        f"INSERT INTO dpone_audit ({_AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.operation_id,
            record.principal,
            record.action,
            record.reason,
            record.attestation,
            None if record.before_state is None else record.before_state.value,
            None if record.after_state is None else record.after_state.value,
            record.before_version,
            record.after_version,
            record.outcome,
            record.at,
        ),
    )


if TYPE_CHECKING:

    def _conforms(journal: SqliteCommitJournal) -> TransactionalJournalPort:
        # mypy proves here that the adapter matches the port, without inheriting from it
        return journal

    def _keeps_runs(journal: SqliteCommitJournal) -> RunLedgerPort:
        return journal


def _read_only_uri(path: Path) -> str:
    """A URI that reads ``path`` without creating anything next to it.

    Without a ``-wal`` file every committed page is in the main file (the last writer
    checkpointed on close), so ``immutable=1`` reads it without a ``-shm`` file; with a
    ``-wal`` file present the WAL must be read, which ``mode=ro`` does.
    """
    wal = path.with_name(path.name + "-wal")
    return f"{path.as_uri()}?mode=ro" + ("" if wal.exists() else "&immutable=1")

    def _stores_checkpoints(journal: SqliteCommitJournal) -> TransactionalCheckpointStorePort:
        # the same static proof for the checkpoint port
        return journal
