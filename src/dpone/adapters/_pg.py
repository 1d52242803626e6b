"""Shared PostgreSQL helpers for the journal and the connector: locator, error translation
and a pipeline that raises a statement's error once it has ended."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict

from dpone.errors import ConfigInvalid, DponeError

__all__ = [
    "create_schema",
    "describe",
    "is_unavailable",
    "pg_locator",
    "pipeline_quietly",
    "translate",
]

_DEFAULT_PORT = "5432"

# SQLSTATE classes after which nothing was decided and a retry may succeed: connection
# exceptions, transaction rollback (serialization, deadlock), insufficient resources,
# operator intervention (cancel, shutdown), system errors.
_UNAVAILABLE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_UNAVAILABLE_STATES = frozenset({"55P03", "55006"})  # lock_not_available, object_in_use

# Server messages quote values; only these identifier-shaped diag fields are echoed.
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
# "COPY items, line 3, column amount: ..." (the value after the colon is never echoed).
_COPY_CONTEXT_RE = re.compile(r"^COPY [^,\n]+, line (\d+)(?:, column ([A-Za-z_][A-Za-z0-9_$]*))?")


def pg_locator(dsn: str) -> str:
    """Return ``postgresql://<host>:<port>/<dbname>`` for a DSN: no user, password or options.

    Raises:
        ConfigInvalid: the DSN cannot be parsed (the DSN is not echoed).

    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigInvalid(
            "the PostgreSQL URL cannot be parsed",
            field="dsn",
            hint="use postgresql://user@host:5432/dbname",
        ) from exc
    host = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")[0]
    port = str(params.get("port") or _DEFAULT_PORT).split(",")[0] or _DEFAULT_PORT
    dbname = str(params.get("dbname") or params.get("user") or "postgres")
    return f"postgresql://{host.strip().lower()}:{port.strip()}/{dbname}"


@contextmanager
def pipeline_quietly(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Pipeline]:
    """``conn.pipeline()``, raising a statement's error only once the pipeline has ended.

    In pipeline mode a later ``execute`` raises an earlier statement's error, inside the
    block. Ending the aborted pipeline then fails as well, and psycopg logs that second
    error as a warning ("error ignored terminating ...: pipeline aborted") while the first
    propagates. Here the first error is held while the pipeline ends, then raised alone,
    the same exception as without this helper.
    """
    failed: psycopg.Error | None = None
    try:
        with conn.pipeline() as pipeline:
            try:
                yield pipeline
            except psycopg.Error as exc:
                failed = exc
    except psycopg.Error:
        if failed is None:
            raise
    if failed is not None:
        raise failed


def create_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """``CREATE SCHEMA IF NOT EXISTS`` that tolerates a concurrent creator, in a transaction.

    ``IF NOT EXISTS`` does not cover a creator whose transaction is still open: the
    statement waits for it and then fails with a unique violation in ``pg_namespace``.
    The journal and the delivery store migrate under different advisory locks, so on a
    fresh schema they can be that creator for each other. The statement runs in a
    savepoint; after such a failure the schema exists (the other side committed it),
    so the caller's migration goes on. ``schema`` must be a checked identifier.
    """
    try:
        with conn.transaction():  # a savepoint inside the caller's transaction
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema):
        pass  # created and committed by a concurrent migration meanwhile


def _sqlstate(exc: BaseException) -> str:
    return getattr(exc, "sqlstate", None) or ""


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the server could not decide (lock wait, connection, cancel)."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = _sqlstate(exc)
    if not state:
        # No SQLSTATE: libpq failed to connect or lost the connection.
        return isinstance(exc, psycopg.OperationalError)
    return state in _UNAVAILABLE_STATES or state[:2] in _UNAVAILABLE_CLASSES


def describe(exc: BaseException) -> str:
    """Return a safe description: condition name, SQLSTATE and identifier-shaped names only."""
    if not isinstance(exc, psycopg.Error):
        return type(exc).__name__
    state = _sqlstate(exc)
    parts = [type(exc).__name__ + (f" {state}" if state else "")]
    diag = exc.diag
    for label, value in (
        ("table", diag.table_name),
        ("column", diag.column_name),
        ("constraint", diag.constraint_name),
    ):
        if value and _NAME_RE.match(value):
            parts.append(f"{label} {value}")
    match = _COPY_CONTEXT_RE.match(diag.context or "")
    if match:
        if match.group(2):
            parts.append(f"column {match.group(2)}")
        parts.append(f"row {match.group(1)} of the load")
    return ", ".join(parts)


def translate(
    exc: BaseException,
    *,
    action: str,
    unavailable: type[DponeError],
    rejected: type[DponeError],
    operation_id: str | None = None,
    lock_timeout_s: float | None = None,
    subject: str = "PostgreSQL",
) -> DponeError:
    """Map a psycopg error to ``unavailable`` (nothing decided, retry) or ``rejected``.

    The message names the action, the condition and identifier-shaped names; never the
    DSN, the SQL text, the server's message (it quotes values) or row values.
    """
    detail = describe(exc)
    if _sqlstate(exc) == "55P03":
        bound = f" ({lock_timeout_s:g}s)" if lock_timeout_s is not None else ""
        return unavailable(
            f"{action}: {subject} could not get a lock within lock_timeout{bound} ({detail}); "
            "nothing was decided",
            operation_id=operation_id,
            hint="retry later; a transaction still holding the lock will finish or be fenced out",
        )
    if is_unavailable(exc):
        return unavailable(
            f"{action}: {subject} was unreachable or interrupted the statement ({detail})",
            operation_id=operation_id,
            hint="check that the server is up and reachable, then retry",
        )
    return rejected(
        f"{action}: {subject} refused the statement ({detail})", operation_id=operation_id
    )
