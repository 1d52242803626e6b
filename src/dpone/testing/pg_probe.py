"""Watch a PostgreSQL server from a test: who holds the fence lock, who waits for a lock.

Race tests must not guess how long a process takes to reach a point (a loaded machine
makes every guess wrong sometimes); they wait until the server shows it. Each probe opens
its own short autocommit connection, so it never holds a lock itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["fence_holders", "idle_after", "lock_waiters", "wait_until"]

FENCE_TABLE = "dpone_fence"


def wait_until(what: str, check: Callable[[], bool], *, timeout: float = 60.0) -> None:
    """Poll ``check`` until it holds; raise AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def fence_holders(dsn: str, schema: str, *, last_statement: str | None = None) -> set[int]:
    """Backend pids paused inside a transaction that holds a lock on ``schema``'s fence.

    Paused: ``idle in transaction``, its client runs no statement (for example it sleeps
    in the ``fence.mutate.before_commit`` failpoint). A transaction that touched the fence
    table locked the operation's fence row with that statement and holds it to its end.
    ``last_statement`` (an ILIKE pattern) narrows it to where the client paused.
    """
    import psycopg  # the postgres extra; only tests that talk to PostgreSQL call this

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT a.pid FROM pg_stat_activity AS a "
            "JOIN pg_locks AS l ON l.pid = a.pid AND l.granted "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "WHERE a.datname = current_database() AND a.state = 'idle in transaction' "
            "AND l.relation = to_regclass(%s) AND a.query ILIKE %s",
            (f'"{schema}".{FENCE_TABLE}', last_statement or "%"),
        ).fetchall()
    return {int(row[0]) for row in rows}


def idle_after(dsn: str, last_statement: str) -> bool:
    """Whether another session on ``dsn``'s server is idle with ``last_statement`` (an
    ILIKE pattern) as its last statement: its client paused right after running it."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND state = 'idle' AND query ILIKE %s",
            (last_statement,),
        ).fetchone()
    return row is not None and row[0] > 0


def lock_waiters(dsn: str, schema: str) -> set[int]:
    """Backend pids blocked on a lock by a statement that names ``schema``."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'active' AND wait_event_type = 'Lock' AND position(%s IN query) > 0",
            (schema,),
        ).fetchall()
    return {int(row[0]) for row in rows}
