"""Checkpoint statements shared by the SQLite and PostgreSQL journals (DB-API cursors).

``ph`` is the driver's placeholder (``?`` or ``%s``), ``prefix`` the quoted schema plus a
dot (or empty), ``lock`` the row-lock clause of the dialect (``FOR UPDATE`` or empty:
SQLite's ``BEGIN IMMEDIATE`` already serializes writers). Callers run these inside the
same write transaction as the COMPLETE CAS.
"""

from __future__ import annotations

from typing import Any

from dpone.contracts.checkpoint import (
    Checkpoint,
    CheckpointAdvance,
    advance_watermark,
    next_claim,
)

__all__ = [
    "POSTGRES_BINDINGS_MIGRATION",
    "SQLITE_BINDINGS_MIGRATION",
    "Dialect",
    "bind",
    "bound",
    "claim",
    "interval_recorded",
    "list_all",
    "promote",
    "read",
]

_COLUMNS = (
    "c.stream_id, c.workload_id, c.partition, c.target_identity, c.origin_us, "
    "c.watermark_us, c.operation_id, c.claim_start_us, c.claim_end_us, c.updated_at"
)


class Dialect:
    """Placeholder, schema prefix and row-lock clause of one journal database."""

    __slots__ = ("lock", "ph", "prefix")

    def __init__(self, *, ph: str, prefix: str = "", lock: str = "") -> None:
        self.ph = ph
        self.prefix = prefix
        self.lock = lock

    def sql(self, text: str) -> str:
        """Fill ``{p}`` (schema prefix) and ``?`` (placeholder) into ``text``."""
        return text.replace("{p}", self.prefix).replace("?", self.ph)


def _ensure(cur: Any, d: Dialect, advance: CheckpointAdvance, at: float) -> int:
    """Create the stream's row if absent (watermark = origin); lock it; return the watermark."""
    cur.execute(
        d.sql(
            "INSERT INTO {p}dpone_checkpoints (stream_id, workload_id, partition, "
            "target_identity, origin_us, watermark_us, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (stream_id) DO NOTHING"
        ),
        (
            advance.stream_id,
            advance.workload_id,
            advance.partition,
            advance.target_identity,
            advance.origin,
            advance.origin,
            at,
        ),
    )
    row = cur.execute(
        d.sql("SELECT watermark_us FROM {p}dpone_checkpoints WHERE stream_id = ? ") + d.lock,
        (advance.stream_id,),
    ).fetchone()
    return int(row[0])


def promote(
    cur: Any, d: Dialect, advance: CheckpointAdvance, *, operation_id: str, at: float
) -> int:
    """Record the interval as complete and chain the watermark over it; return the watermark."""
    watermark = _ensure(cur, d, advance, at)
    cur.execute(
        d.sql(
            "INSERT INTO {p}dpone_checkpoint_intervals (stream_id, start_us, end_us, "
            "operation_id, completed_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (stream_id, start_us, end_us) DO NOTHING"
        ),
        (advance.stream_id, advance.start, advance.end, operation_id, at),
    )
    rows = cur.execute(
        d.sql(
            "SELECT start_us, end_us FROM {p}dpone_checkpoint_intervals "
            "WHERE stream_id = ? AND end_us > ?"
        ),
        (advance.stream_id, watermark),
    ).fetchall()
    moved = advance_watermark(watermark, ((int(a), int(b)) for a, b in rows))
    if moved != watermark:
        cur.execute(
            d.sql(
                "UPDATE {p}dpone_checkpoints SET watermark_us = ?, operation_id = ?, "
                "updated_at = ? WHERE stream_id = ?"
            ),
            (moved, operation_id, at, advance.stream_id),
        )
    return moved


def claim(
    cur: Any, d: Dialect, template: CheckpointAdvance, *, proposed_end: int, at: float
) -> tuple[int, int] | None:
    """Return (and record) the stream's next interval; see ``CheckpointStorePort``."""
    watermark = _ensure(cur, d, template, at)
    row = cur.execute(
        d.sql("SELECT claim_start_us, claim_end_us FROM {p}dpone_checkpoints WHERE stream_id = ?"),
        (template.stream_id,),
    ).fetchone()
    start, end = (None, None) if row is None else (row[0], row[1])
    chosen = next_claim(
        watermark=watermark,
        claim_start=None if start is None else int(start),
        claim_end=None if end is None else int(end),
        proposed_end=proposed_end,
    )
    if chosen is not None and chosen != (start, end):
        cur.execute(
            d.sql(
                "UPDATE {p}dpone_checkpoints SET claim_start_us = ?, claim_end_us = ?, "
                "updated_at = ? WHERE stream_id = ?"
            ),
            (chosen[0], chosen[1], at, template.stream_id),
        )
    return chosen


def _select(d: Dialect, where: str) -> str:
    return d.sql(
        f"SELECT {_COLUMNS}, (SELECT count(*) FROM {{p}}dpone_checkpoint_intervals i "
        "WHERE i.stream_id = c.stream_id AND i.start_us > c.watermark_us) "
        f"FROM {{p}}dpone_checkpoints c {where}"
    )


def _decode(row: Any) -> Checkpoint:
    return Checkpoint(
        stream_id=str(row[0]),
        workload_id=str(row[1]),
        partition=str(row[2]),
        target_identity=str(row[3]),
        origin=int(row[4]),
        watermark=int(row[5]),
        operation_id=None if row[6] is None else str(row[6]),
        claim_start=None if row[7] is None else int(row[7]),
        claim_end=None if row[8] is None else int(row[8]),
        updated_at=float(row[9]),
        pending=int(row[10]),
    )


def read(cur: Any, d: Dialect, stream_id: str) -> Checkpoint | None:
    """Return one stream's checkpoint, or None."""
    row = cur.execute(_select(d, "WHERE c.stream_id = ?"), (stream_id,)).fetchone()
    return None if row is None else _decode(row)


def list_all(cur: Any, d: Dialect) -> list[Checkpoint]:
    """Return every checkpoint, by workload, partition and stream id."""
    rows = cur.execute(
        _select(d, "ORDER BY c.workload_id, c.partition, c.stream_id"), ()
    ).fetchall()
    return [_decode(r) for r in rows]


# ---------------------------------------------------------------- delivery bindings
# A delivery (REST bulk job) promotes its workload's checkpoint once the remote job is
# proven successful, possibly in another process than the one that submitted it (a
# ``dpone delivery resume``, an Airflow execute_complete). The binding records, before
# anything is sent, what the operation promotes. Its table is journal schema version 4
# (the adapters list these in their migrations, which run serialized: SQLite under
# ``BEGIN IMMEDIATE``, PostgreSQL under an advisory lock). ``IF NOT EXISTS``: a journal
# used by the first delivery code, which created the table on first use, migrates too.
SQLITE_BINDINGS_MIGRATION: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS dpone_checkpoint_bindings (
        operation_id    TEXT PRIMARY KEY,
        stream_id       TEXT NOT NULL,
        workload_id     TEXT NOT NULL,
        partition       TEXT NOT NULL,
        target_identity TEXT NOT NULL,
        origin_us       INTEGER NOT NULL,
        start_us        INTEGER NOT NULL,
        end_us          INTEGER NOT NULL,
        created_at      REAL NOT NULL
    )
    """,
)
POSTGRES_BINDINGS_MIGRATION: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS {s}.dpone_checkpoint_bindings (
        operation_id    text PRIMARY KEY,
        stream_id       text NOT NULL,
        workload_id     text NOT NULL,
        partition       text NOT NULL,
        target_identity text NOT NULL,
        origin_us       bigint NOT NULL,
        start_us        bigint NOT NULL,
        end_us          bigint NOT NULL,
        created_at      float8 NOT NULL
    )
    """,
)
_BINDING_COLUMNS = "stream_id, workload_id, partition, target_identity, origin_us, start_us, end_us"


def _bound_row(cur: Any, d: Dialect, operation_id: str) -> CheckpointAdvance | None:
    row = cur.execute(
        d.sql(
            f"SELECT {_BINDING_COLUMNS} FROM {{p}}dpone_checkpoint_bindings WHERE operation_id = ?"
        ),
        (operation_id,),
    ).fetchone()
    if row is None:
        return None
    return CheckpointAdvance(
        stream_id=str(row[0]),
        workload_id=str(row[1]),
        partition=str(row[2]),
        target_identity=str(row[3]),
        origin=int(row[4]),
        start=int(row[5]),
        end=int(row[6]),
    )


def bind(
    cur: Any, d: Dialect, advance: CheckpointAdvance, *, operation_id: str, at: float
) -> CheckpointAdvance:
    """Record what ``operation_id`` promotes (create-if-absent); return the recorded binding."""
    cur.execute(
        d.sql(
            f"INSERT INTO {{p}}dpone_checkpoint_bindings (operation_id, {_BINDING_COLUMNS}, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (operation_id) DO NOTHING"
        ),
        (
            operation_id,
            advance.stream_id,
            advance.workload_id,
            advance.partition,
            advance.target_identity,
            advance.origin,
            advance.start,
            advance.end,
            at,
        ),
    )
    return _bound_row(cur, d, operation_id) or advance  # inserted or present: never None


def bound(cur: Any, d: Dialect, operation_id: str) -> CheckpointAdvance | None:
    """Return what ``operation_id`` promotes, or None (no binding)."""
    return _bound_row(cur, d, operation_id)


def interval_recorded(cur: Any, d: Dialect, advance: CheckpointAdvance, *, at: float) -> bool:
    """True when the advance's interval is already recorded as complete for its stream.

    Creates and locks the stream's row first, so two promoters of one stream are
    serialized here and the second sees the first's committed interval.
    """
    _ensure(cur, d, advance, at)
    row = cur.execute(
        d.sql(
            "SELECT 1 FROM {p}dpone_checkpoint_intervals "
            "WHERE stream_id = ? AND start_us = ? AND end_us = ?"
        ),
        (advance.stream_id, advance.start, advance.end),
    ).fetchone()
    return row is not None


def promote_unrecorded(
    cur: Any, d: Dialect, advance: CheckpointAdvance, *, operation_id: str, at: float
) -> bool:
    """Promote the advance unless its interval is already recorded; True when it promoted.

    The body of the adapters' ``promote_delivered``: absolute and idempotent, on the
    caller's open transaction (the stream's row is locked by ``interval_recorded``).
    """
    if interval_recorded(cur, d, advance, at=at):
        return False
    promote(cur, d, advance, operation_id=operation_id, at=at)
    return True
