"""Append-only SQLite target with a transactional-marker fence: the guide's worked example.

Everything a recoverable connector needs, and nothing else:

* one fence row per operation, written in the same transaction as the data;
* ``prepare`` and ``seal`` as *locking* writes (``BEGIN IMMEDIATE``), so a seal waits
  for a writer still inside its transaction and afterwards that writer can never commit;
* epochs that only go up, and a ``committed`` row that nothing ever changes again;
* driver errors translated in one place into dpone's error tree.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path

from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
)
from dpone.contracts.load import LoadPlan, LoadStrategy, MutationReport, is_identifier
from dpone.errors import (
    ConfigInvalid,
    DponeError,
    FencedOut,
    FenceUnavailable,
    TargetSchemaMismatch,
    TargetWriteFailed,
)
from dpone.ports.connector import Rows, WithinTransaction

FENCE_DDL = (
    "CREATE TABLE IF NOT EXISTS example_fence (operation_id TEXT PRIMARY KEY, "
    "intent_digest TEXT, epoch INTEGER NOT NULL, state TEXT NOT NULL, row_count INTEGER, "
    "content_digest TEXT)"
)


def build(
    options: Mapping[str, object], *, base_dir: Path, environ: Mapping[str, str]
) -> ExampleConnector:
    """The ``dpone.connectors`` entry point: workload options -> connector."""
    del environ  # this target needs no credentials
    path, table = options.get("path"), options.get("table")
    if not isinstance(path, str) or not isinstance(table, str):
        raise ConfigInvalid(
            "target needs path: FILE and table: NAME",
            field="target",
            hint="e.g. target: {kind: example_append, path: out.db, table: events}",
        )
    unknown = set(options) - {"path", "table"}
    if unknown:
        raise ConfigInvalid(f"unknown target option(s) {sorted(unknown)}", field="target")
    file = Path(path) if Path(path).is_absolute() else base_dir / path
    return ExampleConnector(file, table=table)


class ExampleConnector:
    """Appends rows to one SQLite table; proves each operation's outcome with a fence row."""

    kind = "example_append"
    capability = FenceCapability.TRANSACTIONAL_MARKER  # declared as data

    def __init__(self, path: Path, *, table: str, lock_timeout_s: float = 5.0) -> None:
        if not is_identifier(table):
            raise ConfigInvalid("table must be a plain identifier", field="target.table")
        self._path = path.resolve()
        self._table = table
        self._timeout = lock_timeout_s
        self._local = threading.local()  # sqlite3 connections stay in their thread
        self._opened: list[sqlite3.Connection] = []

    # -- identity
    def target_identity(self) -> str:
        return f"example:{self._path}#{self._table}"

    def database_locator(self) -> str:
        return f"example:{self._path}"

    # -- one connection, one transaction helper, one error translator
    def _db(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(FENCE_DDL)
            self._local.conn = conn
            self._opened.append(conn)
        return conn

    def _write(self, body, *, operation_id: str):  # type: ignore[no-untyped-def]
        conn = self._db()
        try:
            conn.execute("BEGIN IMMEDIATE")  # the locking write that makes seal wait
            result = body(conn)
            conn.execute("COMMIT")
            return result
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _translate(exc, operation_id) from exc
            raise

    def _fence(self, conn: sqlite3.Connection, operation_id: str) -> FenceObservation:
        row = conn.execute(
            "SELECT state, epoch, intent_digest, row_count, content_digest FROM example_fence "
            "WHERE operation_id = ?",
            (operation_id,),
        ).fetchone()
        if row is None:
            return FenceObservation(status=FenceStatus.ABSENT)
        status = FenceStatus.COMMITTED if row[0] == "committed" else FenceStatus.PREPARED
        return FenceObservation(
            status=status,
            epoch=row[1],
            intent_digest=row[2],
            row_count=row[3],
            content_digest=row[4],
        )

    def _raise_to(self, conn: sqlite3.Connection, op: str, intent: str, epoch: int) -> None:
        """Install the fence or raise its epoch; never lower it, never touch a committed one."""
        seen = self._fence(conn, op)
        if seen.status is FenceStatus.COMMITTED:
            return
        if seen.epoch is not None and seen.epoch > epoch:
            raise FencedOut("the fence holds a higher epoch", operation_id=op)
        conn.execute(
            "INSERT INTO example_fence (operation_id, intent_digest, epoch, state) "
            "VALUES (?, ?, ?, 'prepared') ON CONFLICT (operation_id) DO UPDATE SET "
            "epoch = excluded.epoch WHERE state = 'prepared'",
            (op, intent, epoch),
        )

    # -- the port
    def check_plan(self, plan: LoadPlan) -> None:
        if plan.strategy is not LoadStrategy.APPEND:
            raise TargetSchemaMismatch("this example connector only appends", field="load")

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        def body(conn: sqlite3.Connection) -> FenceObservation:
            self._raise_to(conn, operation_id, intent_digest, epoch)
            return self._fence(conn, operation_id)

        return self._write(body, operation_id=operation_id)  # type: ignore[no-any-return]

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
        self.check_plan(plan)
        names = [c.name for c in plan.columns]
        if plan.table != self._table or not all(is_identifier(n) for n in names):
            raise ConfigInvalid("the plan does not fit this target", field="target.table")
        columns = ", ".join(f'"{n}"' for n in names)
        placeholders = ", ".join(["NULLIF(?, '')"] * len(names))  # '' loads as NULL
        insert = f'INSERT INTO "{self._table}" ({columns}) VALUES ({placeholders})'

        def body(conn: sqlite3.Connection) -> int:
            if prepare:
                self._raise_to(conn, operation_id, intent_digest, epoch)
            seen = self._fence(conn, operation_id)
            if seen.status is not FenceStatus.PREPARED or seen.epoch != epoch:
                raise FencedOut(
                    "the fence is not prepared at this epoch", operation_id=operation_id
                )
            conn.execute(f'CREATE TABLE IF NOT EXISTS "{self._table}" ({columns})')
            count = 0
            for batch in batches:
                if any(len(row) != len(names) for row in batch):
                    raise TargetWriteFailed("a row has the wrong width", operation_id=operation_id)
                conn.executemany(insert, batch)
                count += len(batch)
            conn.execute(
                "UPDATE example_fence SET state = 'committed', row_count = ?, content_digest = ? "
                "WHERE operation_id = ? AND epoch = ? AND state = 'prepared'",
                (count, content_digest, operation_id, epoch),
            )
            if within is not None:
                within(conn)
            return count

        count = self._write(body, operation_id=operation_id)
        return MutationReport(row_count=count, content_digest=content_digest)

    def observe(self, *, operation_id: str) -> FenceObservation:
        if not self._path.exists():
            return FenceObservation(status=FenceStatus.ABSENT)
        try:
            return self._fence(self._db(), operation_id)
        except sqlite3.Error as exc:
            raise _translate(exc, operation_id) from exc

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        def body(conn: sqlite3.Connection) -> SealResult:
            seen = self._fence(conn, operation_id)
            if seen.status is FenceStatus.COMMITTED:
                return SealResult(outcome=SealOutcome.COMMITTED, observation=seen)
            if seen.epoch is not None and seen.epoch >= epoch:
                return SealResult(outcome=SealOutcome.FENCED, observation=seen)
            self._raise_to(conn, operation_id, seen.intent_digest or "", epoch)
            return SealResult(
                outcome=SealOutcome.NOT_COMMITTED, observation=self._fence(conn, operation_id)
            )

        return self._write(body, operation_id=operation_id)  # type: ignore[no-any-return]

    # -- optional probe for `dpone certify` (TargetProbePort): lets it count rows
    def server_version(self) -> str:
        return f"SQLite {sqlite3.sqlite_version} (example connector)"

    def count_rows(self, table: str, *, distinct: str) -> tuple[int, int]:
        if not (is_identifier(table) and is_identifier(distinct)) or not self._path.exists():
            return (0, 0)
        conn = self._db()
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            return (0, 0)
        row = conn.execute(f'SELECT count(*), count(DISTINCT "{distinct}") FROM "{table}"')
        total, unique = row.fetchone()
        return (int(total), int(unique))

    def drop_table(self, table: str) -> None:
        if is_identifier(table):
            self._write(
                lambda conn: conn.execute(f'DROP TABLE IF EXISTS "{table}"'), operation_id="-"
            )

    def close(self) -> None:
        for conn in self._opened:
            conn.close()
        self._opened.clear()
        self._local = threading.local()


def _translate(exc: sqlite3.Error, operation_id: str) -> DponeError:
    """The one place driver errors become dpone errors: never SQL, never row values."""
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return FenceUnavailable(
            "the target stayed locked past its bound", operation_id=operation_id
        )
    return TargetWriteFailed(
        f"the target refused the write ({type(exc).__name__})", operation_id=operation_id
    )
