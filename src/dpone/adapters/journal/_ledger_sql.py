"""Run ledger SQL shared by the SQLite and PostgreSQL journals: DDL, statements, rules.

The statements are written once with ``?`` placeholders; :class:`LedgerDialect` turns
them into each database's form (placeholders, schema prefix, clock, time and JSON
columns). Every function takes an open cursor inside the caller's write transaction.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from dpone.adapters.journal import _rules
from dpone.contracts.evidence import SafeMapping, safe_mapping
from dpone.contracts.run import (
    PROVENANCE_KEYS,
    AttemptRecord,
    AttemptState,
    RunError,
    RunRecord,
    RunStart,
    RunState,
)
from dpone.errors import LeaseLost, OperationNotFound

__all__ = [
    "POSTGRES_MIGRATION",
    "SQLITE_MIGRATION",
    "LedgerDialect",
    "begin_attempt",
    "begin_run",
    "complete_run_params",
    "end_attempt",
    "end_complete_ctes",
    "first_attempt_ctes",
    "first_attempt_sql",
    "get_run",
    "list_attempts",
    "list_runs",
]

_RUN_STATES = ", ".join(f"'{s.value}'" for s in RunState)
_ATTEMPT_STATES = ", ".join(f"'{s.value}'" for s in AttemptState)
_ACCESS_KEYS = frozenset({"principal", "connections"})

#: Appended to the SQLite journal's migrations: the run ledger tables.
SQLITE_MIGRATION: tuple[str, ...] = (
    f"""
    CREATE TABLE IF NOT EXISTS dpone_runs (
        run_id             TEXT PRIMARY KEY,
        idempotency_key    TEXT NOT NULL UNIQUE,
        operation_id       TEXT NOT NULL,
        request_hash       TEXT NOT NULL,
        definition_hash    TEXT NOT NULL,
        access_digest      TEXT NOT NULL,
        access             TEXT NOT NULL,
        provenance         TEXT NOT NULL,
        state              TEXT NOT NULL CHECK (state IN ({_RUN_STATES})),
        current_attempt    INTEGER NOT NULL DEFAULT 0 CHECK (current_attempt >= 0),
        error_code         TEXT,
        error_retryability TEXT,
        error_message      TEXT,
        created_at         REAL NOT NULL,
        updated_at         REAL NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS dpone_runs_state_updated ON dpone_runs (state, updated_at)",
    "CREATE INDEX IF NOT EXISTS dpone_runs_operation ON dpone_runs (operation_id)",
    f"""
    CREATE TABLE IF NOT EXISTS dpone_run_attempts (
        run_id      TEXT NOT NULL REFERENCES dpone_runs (run_id),
        attempt     INTEGER NOT NULL CHECK (attempt >= 1),
        owner       TEXT NOT NULL,
        provenance  TEXT NOT NULL,
        state       TEXT NOT NULL CHECK (state IN ({_ATTEMPT_STATES})),
        error_code  TEXT,
        started_at  REAL NOT NULL,
        ended_at    REAL,
        PRIMARY KEY (run_id, attempt)
    )
    """,
)

#: Appended to the PostgreSQL journal's migrations (``{s}`` is the quoted schema).
POSTGRES_MIGRATION: tuple[str, ...] = (
    f"""
    CREATE TABLE IF NOT EXISTS {{s}}.dpone_runs (
        run_id             text PRIMARY KEY,
        idempotency_key    text NOT NULL UNIQUE,
        operation_id       text NOT NULL,
        request_hash       text NOT NULL,
        definition_hash    text NOT NULL,
        access_digest      text NOT NULL,
        access             jsonb NOT NULL,
        provenance         jsonb NOT NULL,
        state              text NOT NULL CHECK (state IN ({_RUN_STATES})),
        current_attempt    bigint NOT NULL DEFAULT 0 CHECK (current_attempt >= 0),
        error_code         text,
        error_retryability text,
        error_message      text,
        created_at         timestamptz NOT NULL,
        updated_at         timestamptz NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS dpone_runs_state_updated "
    "ON {s}.dpone_runs (state, updated_at DESC)",
    "CREATE INDEX IF NOT EXISTS dpone_runs_operation ON {s}.dpone_runs (operation_id)",
    f"""
    CREATE TABLE IF NOT EXISTS {{s}}.dpone_run_attempts (
        run_id      text NOT NULL REFERENCES {{s}}.dpone_runs (run_id),
        attempt     bigint NOT NULL CHECK (attempt >= 1),
        owner       text NOT NULL,
        provenance  jsonb NOT NULL,
        state       text NOT NULL CHECK (state IN ({_ATTEMPT_STATES})),
        error_code  text,
        started_at  timestamptz NOT NULL,
        ended_at    timestamptz,
        PRIMARY KEY (run_id, attempt)
    )
    """,
)


class _Cursor(Protocol):
    """The part of a DB-API cursor (or psycopg connection) the statements use."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


class LedgerDialect(msgspec.Struct, frozen=True):
    """How one database spells placeholders, tables, the clock, times and JSON."""

    placeholder: str  # "?" (SQLite) or "%s" (psycopg)
    prefix: str  # "" or '"schema".'
    now: str  # the database clock, in the column type times are stored as
    postgres: bool = False

    def sql(self, text: str) -> str:
        """Return ``text`` with tables prefixed and ``?`` placeholders converted."""
        text = text.replace("dpone_run", f"{self.prefix}dpone_run")
        return text.replace("?", self.placeholder).replace("NOW", self.now)

    def ts(self, column: str) -> str:
        """A time column read as float epoch seconds."""
        return f"extract(epoch FROM {column})::float8" if self.postgres else column

    def js(self, column: str) -> str:
        """A JSON column read as text."""
        return f"{column}::text" if self.postgres else column

    def json_param(self) -> str:
        """A placeholder for JSON text written into a JSON column."""
        return "?::jsonb" if self.postgres else "?"


def _run_columns(d: LedgerDialect) -> str:
    return (
        "run_id, idempotency_key, operation_id, request_hash, definition_hash, "
        f"access_digest, {d.js('access')}, {d.js('provenance')}, state, current_attempt, "
        f"error_code, error_retryability, error_message, {d.ts('created_at')}, "
        f"{d.ts('updated_at')}"
    )


def _attempt_columns(d: LedgerDialect) -> str:
    return (
        f"run_id, attempt, owner, {d.js('provenance')}, state, error_code, "
        f"{d.ts('started_at')}, {d.ts('ended_at')}"
    )


def run_columns(d: LedgerDialect) -> str:
    """The columns :func:`run_from_row` decodes, in order (for statements that join)."""
    return _run_columns(d)


def run_from_row(row: tuple[Any, ...]) -> RunRecord:
    """Decode a row of ``_run_columns``."""
    error = None
    if row[10] is not None:
        error = RunError(code=row[10], retryability=row[11] or "", message=row[12] or "")
    return RunRecord(
        run_id=row[0],
        idempotency_key=row[1],
        operation_id=row[2],
        request_hash=row[3],
        definition_hash=row[4],
        access_digest=row[5],
        access=_rules.decode_mapping(row[6]),
        provenance=_rules.decode_mapping(row[7]),
        state=RunState(row[8]),
        current_attempt=int(row[9]),
        error=error,
        created_at=float(row[13]),
        updated_at=float(row[14]),
    )


def attempt_from_row(row: tuple[Any, ...]) -> AttemptRecord:
    """Decode a row of ``_attempt_columns``."""
    return AttemptRecord(
        run_id=row[0],
        attempt=int(row[1]),
        owner=row[2],
        provenance=_rules.decode_mapping(row[3]),
        state=AttemptState(row[4]),
        error_code=row[5],
        started_at=float(row[6]),
        ended_at=None if row[7] is None else float(row[7]),
    )


# ---------------------------------------------------------------------- rules
def check_start(start: RunStart) -> RunStart:
    """Refuse a run whose fields could carry a secret (same rules as the journal's)."""
    for name in (
        "run_id",
        "idempotency_key",
        "operation_id",
        "request_hash",
        "definition_hash",
        "access_digest",
    ):
        _rules.check_identity(name, getattr(start, name))
    safe_mapping(start.access, allowed=_ACCESS_KEYS)
    safe_mapping(start.provenance, allowed=PROVENANCE_KEYS)
    return start


def run_not_found(run_id: str) -> OperationNotFound:
    """The error for a run id with no ledger row."""
    return OperationNotFound(f"no run {run_id} is recorded in the ledger")


def stale_attempt(run_id: str, attempt: int, current: int) -> LeaseLost:
    """The error for a write by an attempt a newer one superseded (the fencing rule)."""
    return LeaseLost(
        f"attempt {attempt} of run {run_id} is stale (the run is at attempt {current}); "
        "its late ledger write is refused",
        hint="a newer attempt owns the run; this process must stop writing",
    )


def attempt_state(state: RunState) -> AttemptState:
    """The attempt state matching the run state an attempt ended the run in."""
    return AttemptState(state.value)


# ---------------------------------------------------------------------- statements
def begin_run(cur: _Cursor, d: LedgerDialect, start: RunStart) -> tuple[RunRecord, bool]:
    """Insert the run if its key is new; return ``(run, created)``."""
    check_start(start)
    j = d.json_param()
    insert = (
        "INSERT INTO dpone_runs (run_id, idempotency_key, operation_id, request_hash, "
        "definition_hash, access_digest, access, provenance, state, current_attempt, "
        f"created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, {j}, {j}, 'RUNNING', 0, NOW, NOW) "
        "ON CONFLICT DO NOTHING"
    )
    values = _run_values(start)
    if d.postgres:
        # One round trip: the new run, or the existing one under the key (a replay). The
        # fallback below covers a key committed by another session after this snapshot.
        row = cur.execute(
            d.sql(
                f"WITH ins AS ({insert} RETURNING {_run_columns(d)}) "
                "SELECT *, true FROM ins UNION ALL "
                f"SELECT {_run_columns(d)}, false FROM dpone_runs "
                "WHERE idempotency_key = ? AND NOT EXISTS (SELECT 1 FROM ins)"
            ),
            (*values, start.idempotency_key),
        ).fetchone()
        if row is not None:
            return run_from_row(tuple(row[:-1])), bool(row[-1])
    inserted = cur.execute(d.sql(f"{insert} RETURNING run_id"), values).fetchall()
    row = cur.execute(
        d.sql(f"SELECT {_run_columns(d)} FROM dpone_runs WHERE idempotency_key = ?"),
        (start.idempotency_key,),
    ).fetchone()
    if row is None:  # pragma: no cover - the key was just inserted or found
        raise run_not_found(start.run_id)
    return run_from_row(row), bool(inserted)


def complete_run_params(
    start: RunStart, *, owner: str, provenance: SafeMapping | None
) -> dict[str, object]:
    """Check a folded run's values (before any write); the parameters of
    :func:`first_attempt_ctes` (named ``run_*``, so they join a journal statement's)."""
    check_start(start)
    _rules.safe_actor(owner)
    origin = safe_mapping(provenance, allowed=PROVENANCE_KEYS)
    return {
        "run_id": start.run_id,
        "run_key": start.idempotency_key,
        "run_operation_id": start.operation_id,
        "run_request_hash": start.request_hash,
        "run_definition_hash": start.definition_hash,
        "run_access_digest": start.access_digest,
        "run_access": _rules.encode_mapping(start.access),
        "run_provenance": _rules.encode_mapping(start.provenance),
        "run_owner": owner,
        "run_attempt_provenance": _rules.encode_mapping(origin),
    }


def _run_values(start: RunStart) -> tuple[object, ...]:
    """A new run's row values, in the column order ``begin_run`` inserts."""
    return (
        start.run_id,
        start.idempotency_key,
        start.operation_id,
        start.request_hash,
        start.definition_hash,
        start.access_digest,
        _rules.encode_mapping(start.access),
        _rules.encode_mapping(start.provenance),
    )


def first_attempt_ctes(d: LedgerDialect, *, complete: bool, only_if: str | None = None) -> str:
    """CTEs ``run`` and ``attempt``: a new run at attempt 1 with that attempt, both
    COMPLETE or both RUNNING (ADR 0008). PostgreSQL only (data-modifying CTEs).

    Named parameters (:func:`complete_run_params`), so a journal statement can carry them
    as its first CTEs (ADR 0011): they run inside the write that also records what the
    attempt did, the entry born COMPLETE inside the target transaction of a folded atomic
    first attempt, or the entry born COMMITTING leased at epoch 1 (forward mode). The run
    and its attempt exist exactly when that write does. A key already recorded is a
    unique violation: the whole statement (and its transaction) fails, and the caller
    takes the unfolded path. ``only_if`` (an SQL condition, written as it is) makes the
    run's INSERT write nothing unless it holds, with no error (ADR 0018).
    """
    if not d.postgres:
        raise ValueError("data-modifying CTEs need PostgreSQL")
    state = "'COMPLETE'" if complete else "'RUNNING'"
    ended = "NOW" if complete else "NULL"
    # every value is text or cast: a SELECT list infers no type from the target columns
    values = (
        "%(run_id)s, %(run_key)s, "
        "%(run_operation_id)s, %(run_request_hash)s, %(run_definition_hash)s, "
        "%(run_access_digest)s, %(run_access)s::jsonb, %(run_provenance)s::jsonb, "
        f"{state}, 1, NOW, NOW"
    )
    rows = f"VALUES ({values})" if only_if is None else f"SELECT {values} WHERE {{only_if}}"
    run = d.sql(
        "run AS (INSERT INTO dpone_runs (run_id, idempotency_key, operation_id, "
        "request_hash, definition_hash, access_digest, access, provenance, state, "
        f"current_attempt, created_at, updated_at) {rows} RETURNING run_id), "
        "attempt AS (INSERT INTO dpone_run_attempts (run_id, attempt, owner, provenance, "
        "state, started_at, ended_at) SELECT run_id, 1, %(run_owner)s, "
        f"%(run_attempt_provenance)s::jsonb, {state}, NOW, {ended} FROM run)"
    )
    # the condition is the caller's SQL: inserted after the dialect's rewriting
    return run if only_if is None else run.replace("{only_if}", only_if)


def first_attempt_sql(d: LedgerDialect, *, complete: bool) -> str:
    """:func:`first_attempt_ctes` as a statement of its own (same parameters)."""
    return f"WITH {first_attempt_ctes(d, complete=complete)} SELECT run_id FROM run"


def end_complete_ctes(d: LedgerDialect, *, after: str) -> str:
    """CTEs ``run_ended`` and ``attempt_ended``: :func:`end_attempt` of a COMPLETE end.

    PostgreSQL only. The writes of ``end_attempt(state=COMPLETE, error=None)``'s
    PostgreSQL statement (run COMPLETE with no error, the attempt COMPLETE and ended
    while it is RUNNING), with named parameters ``end_run_id`` and ``end_attempt``, and
    only when the CTE ``after`` (the journal's move to COMPLETE) returned a row: a
    journal statement carries them so that the run ends with its operation's COMPLETE,
    never without it (ADR 0013). ``run_ended`` returns the run's id when the run was
    still at that attempt (a newer attempt's run is left alone, as ``end_attempt``
    refuses a stale attempt).
    """
    if not d.postgres:
        raise ValueError("data-modifying CTEs need PostgreSQL")
    complete = RunState.COMPLETE.value
    ended = attempt_state(RunState.COMPLETE).value
    return d.sql(
        f"run_ended AS (UPDATE dpone_runs SET state = '{complete}', error_code = NULL, "
        "error_retryability = NULL, error_message = NULL, updated_at = NOW "
        "WHERE run_id = %(end_run_id)s AND current_attempt = %(end_attempt)s "
        f"AND EXISTS (SELECT 1 FROM {after}) RETURNING run_id), "
        f"attempt_ended AS (UPDATE dpone_run_attempts SET state = '{ended}', "
        "error_code = NULL, ended_at = NOW WHERE run_id = %(end_run_id)s "
        "AND attempt = %(end_attempt)s AND state = 'RUNNING' "
        "AND EXISTS (SELECT 1 FROM run_ended))"
    )


def get_run(cur: _Cursor, d: LedgerDialect, run_id: str) -> RunRecord | None:
    """Return one run or None."""
    row = cur.execute(
        d.sql(f"SELECT {_run_columns(d)} FROM dpone_runs WHERE run_id = ?"), (run_id,)
    ).fetchone()
    return None if row is None else run_from_row(row)


def list_runs(
    cur: _Cursor, d: LedgerDialect, *, states: frozenset[RunState] | None, limit: int
) -> list[RunRecord]:
    """Return runs, newest update first."""
    if states is not None and not states:
        return []
    where = ""
    params: list[Any] = []
    if states is not None:
        where = f"WHERE state IN ({', '.join('?' * len(states))}) "
        params.extend(sorted(s.value for s in states))
    params.append(max(int(limit), 0))
    rows = cur.execute(
        d.sql(
            f"SELECT {_run_columns(d)} FROM dpone_runs {where}"
            # equal clock readings: SQLite lists the later-recorded run first
            f"ORDER BY updated_at DESC, {'run_id' if d.postgres else 'rowid'} DESC LIMIT ?"
        ),
        params,
    ).fetchall()
    return [run_from_row(r) for r in rows]


def list_attempts(cur: _Cursor, d: LedgerDialect, run_id: str) -> list[AttemptRecord]:
    """Return a run's attempts in order."""
    rows = cur.execute(
        d.sql(
            f"SELECT {_attempt_columns(d)} FROM dpone_run_attempts WHERE run_id = ? "
            "ORDER BY attempt"
        ),
        (run_id,),
    ).fetchall()
    return [attempt_from_row(r) for r in rows]


def _get_attempt(cur: _Cursor, d: LedgerDialect, run_id: str, attempt: int) -> AttemptRecord | None:
    row = cur.execute(
        d.sql(
            f"SELECT {_attempt_columns(d)} FROM dpone_run_attempts WHERE run_id = ? AND attempt = ?"
        ),
        (run_id, attempt),
    ).fetchone()
    return None if row is None else attempt_from_row(row)


def _refused_attempt(
    cur: _Cursor, d: LedgerDialect, *, run_id: str, attempt: int, owner: str
) -> AttemptRecord:
    """The run was not moved up to ``attempt``: a repeated call, or a stale attempt."""
    run = get_run(cur, d, run_id)
    if run is None:
        raise run_not_found(run_id)
    same = _get_attempt(cur, d, run_id, attempt)
    if run.current_attempt == attempt and same is not None and same.owner == owner:
        return same  # a repeated call (a lost reply): the same attempt again
    raise stale_attempt(run_id, attempt, run.current_attempt)


def begin_attempt(
    cur: _Cursor,
    d: LedgerDialect,
    *,
    run_id: str,
    attempt: int,
    owner: str,
    provenance: SafeMapping | None,
) -> AttemptRecord:
    """Make ``attempt`` current (only upward), supersede older running ones, insert it."""
    _rules.safe_actor(owner)
    origin = safe_mapping(provenance, allowed=PROVENANCE_KEYS)
    if int(attempt) < 1:
        raise ValueError("an attempt number is a lease epoch, at least 1")
    if d.postgres:
        # One round trip for the usual case (the attempt moves the run upward); a refused
        # or repeated call takes the statements below, which explain the refusal.
        row = cur.execute(
            d.sql(
                "WITH raised AS (UPDATE dpone_runs SET current_attempt = ?, state = 'RUNNING', "
                "error_code = NULL, error_retryability = NULL, error_message = NULL, "
                "updated_at = NOW WHERE run_id = ? AND current_attempt < ? RETURNING run_id), "
                "superseded AS (UPDATE dpone_run_attempts SET state = 'SUPERSEDED', "
                "ended_at = NOW WHERE run_id IN (SELECT run_id FROM raised) "
                "AND state = 'RUNNING' AND attempt < ?), "
                "ins AS (INSERT INTO dpone_run_attempts (run_id, attempt, owner, provenance, "
                f"state, started_at) SELECT run_id, ?, ?, {d.json_param()}, 'RUNNING', NOW "
                f"FROM raised RETURNING {_attempt_columns(d)}) SELECT * FROM ins"
            ),
            (attempt, run_id, attempt, attempt, attempt, owner, _rules.encode_mapping(origin)),
        ).fetchone()
        if row is not None:
            return attempt_from_row(tuple(row))
        return _refused_attempt(cur, d, run_id=run_id, attempt=attempt, owner=owner)
    raised = cur.execute(
        d.sql(
            "UPDATE dpone_runs SET current_attempt = ?, state = 'RUNNING', error_code = NULL, "
            "error_retryability = NULL, error_message = NULL, updated_at = NOW "
            "WHERE run_id = ? AND current_attempt < ? RETURNING run_id"
        ),
        (attempt, run_id, attempt),
    ).fetchall()
    if not raised:
        return _refused_attempt(cur, d, run_id=run_id, attempt=attempt, owner=owner)
    cur.execute(
        d.sql(
            "UPDATE dpone_run_attempts SET state = 'SUPERSEDED', ended_at = NOW "
            "WHERE run_id = ? AND state = 'RUNNING' AND attempt < ?"
        ),
        (run_id, attempt),
    )
    cur.execute(
        d.sql(
            "INSERT INTO dpone_run_attempts (run_id, attempt, owner, provenance, state, "
            f"started_at) VALUES (?, ?, ?, {d.json_param()}, 'RUNNING', NOW)"
        ),
        (run_id, attempt, owner, _rules.encode_mapping(origin)),
    )
    found = _get_attempt(cur, d, run_id, attempt)
    assert found is not None  # noqa: S101 - inserted just above
    return found


def end_attempt(
    cur: _Cursor,
    d: LedgerDialect,
    *,
    run_id: str,
    attempt: int,
    state: RunState,
    error: RunError | None,
) -> RunRecord:
    """Record the end of the current attempt; refuse a stale one (nothing changes)."""
    if state is RunState.RUNNING:
        raise ValueError("an attempt ends in COMPLETE, FAILED or UNRESOLVED, not RUNNING")
    code = None if error is None else error.code
    if d.postgres:
        # One round trip: the run and its attempt move together, or neither does.
        row = cur.execute(
            d.sql(
                "WITH ended AS (UPDATE dpone_runs SET state = ?, error_code = ?, "
                "error_retryability = ?, error_message = ?, updated_at = NOW "
                f"WHERE run_id = ? AND current_attempt = ? RETURNING {_run_columns(d)}), "
                "attempt_ended AS (UPDATE dpone_run_attempts SET state = ?, error_code = ?, "
                "ended_at = NOW WHERE run_id = ? AND attempt = ? AND state = 'RUNNING' "
                "AND EXISTS (SELECT 1 FROM ended)) SELECT * FROM ended"
            ),
            (
                state.value,
                code,
                None if error is None else error.retryability,
                None if error is None else error.message,
                run_id,
                attempt,
                attempt_state(state).value,
                code,
                run_id,
                attempt,
            ),
        ).fetchone()
        if row is not None:
            return run_from_row(tuple(row))
        run = get_run(cur, d, run_id)
        if run is None:
            raise run_not_found(run_id)
        raise stale_attempt(run_id, attempt, run.current_attempt)
    row = cur.execute(
        d.sql(
            "UPDATE dpone_runs SET state = ?, error_code = ?, error_retryability = ?, "
            "error_message = ?, updated_at = NOW WHERE run_id = ? AND current_attempt = ? "
            f"RETURNING {_run_columns(d)}"
        ),
        (
            state.value,
            None if error is None else error.code,
            None if error is None else error.retryability,
            None if error is None else error.message,
            run_id,
            attempt,
        ),
    ).fetchone()
    if row is None:
        run = get_run(cur, d, run_id)
        if run is None:
            raise run_not_found(run_id)
        raise stale_attempt(run_id, attempt, run.current_attempt)
    cur.execute(
        d.sql(
            "UPDATE dpone_run_attempts SET state = ?, error_code = ?, ended_at = NOW "
            "WHERE run_id = ? AND attempt = ? AND state = 'RUNNING'"
        ),
        (attempt_state(state).value, None if error is None else error.code, run_id, attempt),
    )
    return run_from_row(row)
