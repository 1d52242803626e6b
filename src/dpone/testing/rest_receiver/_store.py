"""The reference receiver's durable state: one SQLite file, so a restart loses nothing.

Jobs are not executed: each job's life is a function of its recorded times
(``created_at``, accept phase, duration, outcome) and of an external cancel, so a
receiver that was down while a job "ran" reports the same status after restart.
Deduplication by idempotency key is done inside ``BEGIN IMMEDIATE``, and the key
column is deliberately *not* unique: a dedupe bug would show up as two rows, which
``jobs_created`` counts, instead of being hidden by a constraint.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FAULT_DEFAULTS", "Job", "ReceiverStore", "UploadConflict", "UploadInvalid"]

#: Fault switches and their defaults; tests change them through ``PUT /admin/faults``.
FAULT_DEFAULTS: dict[str, Any] = {
    # the next N job submissions are answered 503 before anything is recorded
    "unavailable_before_accept": 0,
    # the next N job submissions create the job and then lose the answer (connection cut)
    "drop_response_after_accept": 0,
    # the next N new jobs end ``failed`` instead of ``succeeded``
    "fail_next_jobs": 0,
    # how long a new job stays ``accepted`` and then ``running`` (seconds)
    "accept_phase_s": 0.0,
    "job_duration_s": 0.0,
    # answer GET /jobs?idempotency_key=K (False: a receiver without key lookup, 501)
    "key_lookup": True,
    # seconds to wait before answering a submission (to provoke client timeouts)
    "submit_delay_s": 0.0,
}

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS jobs (
        receipt         TEXT PRIMARY KEY,
        idempotency_key TEXT NOT NULL,
        payload_digest  TEXT NOT NULL,
        upload_id       TEXT NOT NULL,
        rows_total      INTEGER NOT NULL,
        bytes_total     INTEGER NOT NULL,
        outcome         TEXT NOT NULL,
        created_at      REAL NOT NULL,
        accept_phase_s  REAL NOT NULL,
        duration_s      REAL NOT NULL,
        cancelled_at    REAL
    )
    """,
    "CREATE INDEX IF NOT EXISTS jobs_key ON jobs (idempotency_key)",
    """
    CREATE TABLE IF NOT EXISTS chunks (
        upload_id TEXT NOT NULL,
        seq       INTEGER NOT NULL,
        data      BLOB NOT NULL,
        PRIMARY KEY (upload_id, seq)
    )
    """,
    "CREATE TABLE IF NOT EXISTS faults (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


class UploadConflict(Exception):
    """A chunk was uploaded again with other bytes."""


class UploadInvalid(Exception):
    """A submission names chunks that are missing or do not match its payload digest."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One remote job as the receiver reports it."""

    receipt: str
    idempotency_key: str
    payload_digest: str
    rows_total: int
    bytes_total: int
    outcome: str
    created_at: float
    accept_phase_s: float
    duration_s: float
    cancelled_at: float | None
    replayed: bool = field(default=False)

    @property
    def ends_at(self) -> float:
        """When the job reaches its outcome (unless cancelled before)."""
        return self.created_at + self.accept_phase_s + self.duration_s

    def status(self, now: float) -> str:
        """Return accepted / running / succeeded / failed / cancelled at ``now``."""
        if self.cancelled_at is not None and self.cancelled_at < self.ends_at:
            return "cancelled"
        elapsed = now - self.created_at
        if elapsed < self.accept_phase_s:
            return "accepted"
        if now < self.ends_at:
            return "running"
        return self.outcome

    def view(self, now: float) -> dict[str, Any]:
        """Return the JSON body of ``GET /jobs/{receipt}``."""
        status = self.status(now)
        if status in TERMINAL:
            processed = self.rows_total if status == "succeeded" else 0
        elif status == "running" and self.duration_s > 0:
            done = (now - self.created_at - self.accept_phase_s) / self.duration_s
            processed = int(self.rows_total * min(max(done, 0.0), 1.0))
        else:
            processed = 0
        return {
            "receipt": self.receipt,
            "status": status,
            "payload_digest": self.payload_digest,
            "rows_total": self.rows_total,
            "rows_processed": processed,
            "rows_failed": self.rows_total if status == "failed" else 0,
            "created_at": self.created_at,
        }


_JOB_COLUMNS = (
    "receipt, idempotency_key, payload_digest, rows_total, bytes_total, outcome, "
    "created_at, accept_phase_s, duration_s, cancelled_at"
)


def _job(row: tuple[Any, ...], *, replayed: bool = False) -> Job:
    return Job(
        receipt=row[0],
        idempotency_key=row[1],
        payload_digest=row[2],
        rows_total=row[3],
        bytes_total=row[4],
        outcome=row[5],
        created_at=row[6],
        accept_phase_s=row[7],
        duration_s=row[8],
        cancelled_at=row[9],
        replayed=replayed,
    )


class ReceiverStore:
    """Jobs, uploaded chunks, fault switches and counters in one SQLite file."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=10.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        with self._write() as cur:
            for statement in _SCHEMA:
                cur.execute(statement)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    # ------------------------------------------------------------------ faults
    def faults(self) -> dict[str, Any]:
        """Return every fault switch with its current value."""
        out = dict(FAULT_DEFAULTS)
        for name, value in self._conn.execute("SELECT name, value FROM faults"):
            out[name] = json.loads(value)
        return out

    def set_faults(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change some switches (unknown names raise KeyError); return all of them."""
        for name in changes:
            if name not in FAULT_DEFAULTS:
                raise KeyError(name)
        with self._write() as cur:
            for name, value in changes.items():
                cur.execute(
                    "INSERT INTO faults (name, value) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (name, json.dumps(value)),
                )
        return self.faults()

    def take_fault(self, name: str) -> bool:
        """Consume one shot of a counting switch; True when it fired."""
        with self._write() as cur:
            row = cur.execute("SELECT value FROM faults WHERE name = ?", (name,)).fetchone()
            left = int(json.loads(row[0])) if row else 0
            if left <= 0:
                return False
            cur.execute("UPDATE faults SET value = ? WHERE name = ?", (json.dumps(left - 1), name))
            return True

    def bump(self, name: str, by: int = 1) -> None:
        """Add ``by`` to the counter ``name``."""
        with self._write() as cur:
            _bump(cur, name, by)

    # ------------------------------------------------------------------ uploads
    def put_chunk(self, upload_id: str, seq: int, data: bytes) -> bool:
        """Store a chunk; True when new. The same bytes again are accepted as a no-op."""
        with self._write() as cur:
            row = cur.execute(
                "SELECT data FROM chunks WHERE upload_id = ? AND seq = ?", (upload_id, seq)
            ).fetchone()
            if row is not None:
                if bytes(row[0]) != data:
                    raise UploadConflict(upload_id)
                return False
            cur.execute(
                "INSERT INTO chunks (upload_id, seq, data) VALUES (?, ?, ?)", (upload_id, seq, data)
            )
            return True

    def _assemble(self, cur: sqlite3.Cursor, upload_id: str, chunk_count: int) -> tuple[str, bytes]:
        rows = cur.execute(
            "SELECT seq, data FROM chunks WHERE upload_id = ? AND seq < ? ORDER BY seq",
            (upload_id, chunk_count),
        ).fetchall()
        if [seq for seq, _ in rows] != list(range(chunk_count)):
            raise UploadInvalid("chunks are missing")
        data = b"".join(bytes(chunk) for _, chunk in rows)
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    # ------------------------------------------------------------------ jobs
    def find_by_key(self, key: str) -> list[Job]:
        """Return every job recorded for ``key`` (one, unless dedupe is broken)."""
        rows = self._conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE idempotency_key = ? ORDER BY created_at",
            (key,),
        ).fetchall()
        return [_job(row) for row in rows]

    def get(self, receipt: str) -> Job | None:
        """Return the job with ``receipt`` or None."""
        row = self._conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE receipt = ?", (receipt,)
        ).fetchone()
        return _job(row) if row else None

    def submit(self, *, key: str, payload_digest: str, upload_id: str, chunk_count: int) -> Job:
        """Create the job for ``key`` or return the one that exists (``replayed``).

        Raises:
            ValueError: the key exists with another payload digest.
            UploadInvalid: chunks are missing or their digest differs from ``payload_digest``.

        """
        faults = self.faults()
        with self._write() as cur:
            row = cur.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE idempotency_key = ? "
                "ORDER BY created_at LIMIT 1",
                (key,),
            ).fetchone()
            if row is not None:
                existing = _job(row, replayed=True)
                if existing.payload_digest != payload_digest:
                    raise ValueError(key)
                return existing
            digest, data = self._assemble(cur, upload_id, chunk_count)
            if digest != payload_digest:
                raise UploadInvalid("payload digest differs from the uploaded bytes")
            outcome = "succeeded"
            fail_left = int(faults["fail_next_jobs"])
            if fail_left > 0:
                outcome = "failed"
                cur.execute(
                    "UPDATE faults SET value = ? WHERE name = 'fail_next_jobs'",
                    (json.dumps(fail_left - 1),),
                )
            now = time.time()
            job = Job(
                receipt="rcpt-" + uuid.uuid4().hex,
                idempotency_key=key,
                payload_digest=payload_digest,
                rows_total=data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1),
                bytes_total=len(data),
                outcome=outcome,
                created_at=now,
                accept_phase_s=float(faults["accept_phase_s"]),
                duration_s=float(faults["job_duration_s"]),
                cancelled_at=None,
            )
            cur.execute(
                f"INSERT INTO jobs ({_JOB_COLUMNS}, upload_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job.receipt,
                    key,
                    payload_digest,
                    job.rows_total,
                    job.bytes_total,
                    outcome,
                    now,
                    job.accept_phase_s,
                    job.duration_s,
                    None,
                    upload_id,
                ),
            )
            _bump(cur, "jobs_created", 1)
            active = cur.execute(
                "SELECT COUNT(*) FROM jobs WHERE (cancelled_at IS NULL) "
                "AND created_at + accept_phase_s + duration_s > ?",
                (now,),
            ).fetchone()[0]
            cur.execute(
                "INSERT INTO counters (name, value) VALUES ('max_active', ?) "
                "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)",
                (active,),
            )
            return job

    def cancel(self, receipt: str) -> Job | None:
        """Cancel the job from outside (an operator at the receiver); None if unknown."""
        with self._write() as cur:
            cur.execute(
                "UPDATE jobs SET cancelled_at = ? WHERE receipt = ? AND cancelled_at IS NULL",
                (time.time(), receipt),
            )
        return self.get(receipt)

    def stats(self) -> dict[str, Any]:
        """Return counters and the number of jobs per idempotency key."""
        counters = dict(self._conn.execute("SELECT name, value FROM counters").fetchall())
        per_key = dict(
            self._conn.execute(
                "SELECT idempotency_key, COUNT(*) FROM jobs GROUP BY idempotency_key"
            ).fetchall()
        )
        return {"counters": counters, "jobs_by_key": per_key, "jobs_total": sum(per_key.values())}


def _bump(cur: sqlite3.Cursor, name: str, by: int) -> None:
    cur.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        (name, by),
    )
