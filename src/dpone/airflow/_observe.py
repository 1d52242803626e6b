"""The read-only observation loop behind ``DponeReceiptTrigger``: async clients only.

It runs in Airflow's triggerer, an asyncio event loop shared by many triggers, so every
call here is asynchronous (``aiosqlite`` or psycopg's ``AsyncConnection`` for the control
plane, ``httpx.AsyncClient`` for the receiver) and it imports nothing of dpone's runtime,
adapters, composition or API: the triggerer stays light, and the trigger cannot submit,
advance a delivery or promote a checkpoint even by mistake.

What it may do:
- resolve its locator: a plain URL, an environment variable of the triggerer
  (``url_env``) or an Airflow connection (``conn_id``, looked up by the caller-supplied
  ``connection_url``), so a journal password never enters the trigger's arguments;
- read one delivery's row of the control plane (state, receipt, receiver URL, credential
  reference); for a split delivery's parent, which has no row, its in-flight child's;
- take, renew and note results in the delivery's *observation lease* (its own table,
  ``dpone_delivery_observer_leases``), by compare-and-set on the database clock;
- GET ``{receiver}/jobs/{receipt}`` while it holds that lease.

Everything else (recording the observation, promoting, deciding) is the operator's, which
rereads the control plane when woken. The result is a hint: ``{"operation_id", "status",
"polls"}``, nothing secret, safe to receive twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from dpone.errors import ConfigInvalid

__all__ = [
    "HINTS",
    "ConnectionUrl",
    "LocatorUnresolved",
    "ObservationBounds",
    "carries_secret",
    "conn_locator",
    "env_locator",
    "journal_locator",
    "observe_once_woken",
    "settle",
]

_log = logging.getLogger("dpone.airflow.trigger")

LEASE_TABLE = "dpone_delivery_observer_leases"
#: the delivery schema version that has the observation lease table
LEASE_SCHEMA_VERSION = 2
_REMOTE_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
_RECEIPT_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_CRED_RE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
_CONN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,250}$")
#: the triggerer's lookup of an Airflow connection's URL (None: not defined there)
ConnectionUrl = Callable[[str], Awaitable[str | None]]
#: every status a hint can carry
HINTS = frozenset(
    {
        "succeeded",  # the receiver reports the job succeeded (terminal, to verify)
        "failed",
        "cancelled",
        "receipt_unknown",  # the receiver answered 404/401/403 for the receipt
        "not_pending",  # the control plane no longer waits for an observation
        "missing",  # no delivery row under this operation id
        "exhausted",  # polling bounds reached: wake up and decide again
        "locator_unresolved",  # the triggerer lacks the journal's variable or connection
    }
)


class LocatorUnresolved(ConfigInvalid):
    """The triggerer cannot turn the locator into a URL (variable unset, connection unknown).

    Not transient: the triggerer's environment will not change while it runs. The watch
    ends with the ``locator_unresolved`` hint and one clear log line (never a crash loop);
    the message names the variable or connection, never a value.
    """


def carries_secret(journal_url: str) -> bool:
    """Whether a PostgreSQL URL has a password, query or fragment (kept out of triggers)."""
    parts = urlsplit(journal_url)
    return parts.password is not None or bool(parts.query) or bool(parts.fragment)


def _checked_schema(schema: str) -> str:
    if not _SCHEMA_RE.match(schema):
        raise ConfigInvalid("the journal schema is not a plain identifier", field="schema")
    return schema


def env_locator(name: str, *, schema: str = "dpone") -> dict[str, str]:
    """The locator of a PostgreSQL journal whose URL is in the triggerer's variable ``name``.

    Only the variable's name is handed to the trigger; the triggerer reads its value.
    """
    if not _ENV_NAME_RE.match(name):
        raise ConfigInvalid(f"{name!r} is not an environment variable name", field="journal_env")
    return {"kind": "postgresql", "url_env": name, "schema": _checked_schema(schema)}


def conn_locator(conn_id: str, *, schema: str = "dpone") -> dict[str, str]:
    """The locator of a PostgreSQL journal given by the Airflow connection ``conn_id``.

    The triggerer looks the connection up itself and builds the URL as the worker does.
    """
    if not _CONN_ID_RE.match(conn_id):
        raise ConfigInvalid(f"{conn_id!r} is not an Airflow connection id", field="journal_conn_id")
    return {"kind": "postgresql", "conn_id": conn_id, "schema": _checked_schema(schema)}


def journal_locator(journal_url: str, *, schema: str = "dpone") -> dict[str, str]:
    """Return the trigger's non-secret locator of the control plane named by ``journal_url``.

    ``sqlite:////abs/path.db`` gives ``{"kind": "sqlite", "path": ...}`` (the path must be
    absolute: the triggerer has another working directory); ``postgresql://user@host/db``
    gives ``{"kind": "postgresql", "url": ..., "schema": ...}``.

    Raises:
        ConfigInvalid: another scheme, a relative SQLite path, or a PostgreSQL URL carrying a
            password or query (a secret must not enter trigger arguments: use
            :func:`env_locator` / :func:`conn_locator`, or let libpq find the password in
            the triggerer: ``PGPASSWORD``, ``~/.pgpass`` or ``PGPASSFILE``).

    """
    if journal_url.startswith("sqlite:"):
        path = journal_url.removeprefix("sqlite:").removeprefix("//")
        if not path.startswith("/"):
            raise ConfigInvalid(
                "the trigger needs an absolute SQLite journal path", field="journal"
            )
        # sqlite:////abs leaves "//abs": POSIX keeps a leading "//" (Path does too), but it
        # names the same file as "/abs", and the trigger's locator should say so
        return {"kind": "sqlite", "path": "/" + str(Path(path)).lstrip("/")}
    parts = urlsplit(journal_url)
    if parts.scheme in ("postgresql", "postgres"):
        if carries_secret(journal_url):
            raise ConfigInvalid(
                "the journal URL handed to the trigger may not carry a password or query",
                field="journal",
                hint="name the URL with journal_env (or DPONE_JOURNAL), or give the operator "
                "journal_conn_id, so the trigger gets only the variable's or connection's "
                "name; or give the triggerer the password through PGPASSWORD, ~/.pgpass or "
                "PGPASSFILE and drop it from the URL",
            )
        url = urlunsplit(("postgresql", parts.netloc, parts.path, "", ""))
        return {"kind": "postgresql", "url": url, "schema": _checked_schema(schema)}
    raise ConfigInvalid(
        "the trigger reads a sqlite:/// or postgresql:// control plane only", field="journal"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservationBounds:
    """Every wait of one trigger run is finite.

    ``max_polls`` counts loop rounds (a GET by the lease holder or a look at the control
    plane by a watcher); ``deadline`` is absolute (seconds since the epoch) so a triggerer
    restart does not extend it. ``lease_s`` is how long a holder may go silent before
    another trigger takes the observation over.
    """

    poll_interval_s: float = 10.0
    max_polls: int = 360
    deadline: float | None = None
    lease_s: float = 60.0
    request_timeout_s: float = 10.0

    def check(self) -> None:
        """Raise ConfigInvalid when a bound is not a positive finite number."""
        if not 0.05 <= self.poll_interval_s <= 86_400:
            raise ConfigInvalid("poll_interval_s must be in [0.05, 86400]", field="poll_interval_s")
        if not isinstance(self.max_polls, int) or self.max_polls < 1:
            raise ConfigInvalid("max_polls must be an integer >= 1", field="max_polls")
        if self.lease_s < 2 * self.poll_interval_s:
            raise ConfigInvalid(
                "lease_s must be at least twice poll_interval_s, or the holder loses the "
                "lease between its own polls",
                field="lease_s",
            )
        if self.request_timeout_s < 0.1:
            raise ConfigInvalid("request_timeout_s must be at least 0.1", field="request_timeout_s")

    @property
    def timeout_s(self) -> float:
        """The GET timeout: at most half the lease, so a slow answer cannot outlive it."""
        return min(self.request_timeout_s, self.lease_s / 2)


@dataclass(frozen=True, slots=True)
class _Row:
    state: str
    receipt: str | None
    receiver_url: str
    credential_ref: str | None


@dataclass(frozen=True, slots=True)
class _Lease:
    holder: str
    epoch: int
    last_status: str | None
    mine: bool


class _ControlPlane:
    """The few statements the trigger runs, over one async connection."""

    def __init__(self, conn: Any, *, placeholder: str, prefix: str, now_sql: str) -> None:
        self._conn = conn
        self._ph = placeholder
        self._p = prefix
        self._now = now_sql

    def _q(self, sql: str) -> str:
        return sql.replace("{p}", self._p).replace("{now}", self._now).replace("?", self._ph)

    async def _one(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        cur = await self._conn.execute(self._q(sql), params)
        row = await cur.fetchone()
        await cur.close()
        return tuple(row) if row is not None else None

    async def schema_version(self) -> int:
        row = await self._one("SELECT MAX(version) FROM {p}dpone_delivery_schema", ())
        return int(row[0] or 0) if row else 0

    async def read(self, operation_id: str) -> _Row | None:
        row = await self._one(
            "SELECT state, receipt, receiver_url, credential_ref "
            "FROM {p}dpone_delivery WHERE operation_id = ?",
            (operation_id,),
        )
        return _Row(*row) if row else None

    async def in_flight_child(self, parent_id: str) -> tuple[str, _Row] | None:
        """The first child of split delivery ``parent_id`` that is not COMPLETE, if any.

        Children run strictly in ``child_index`` order, so this is the one in flight (or
        the next to start).
        """
        row = await self._one(
            "SELECT operation_id, state, receipt, receiver_url, credential_ref "
            "FROM {p}dpone_delivery WHERE parent_id = ? AND state <> 'COMPLETE' "
            "ORDER BY child_index LIMIT 1",
            (parent_id,),
        )
        return (str(row[0]), _Row(*row[1:])) if row else None

    async def has_children(self, parent_id: str) -> bool:
        row = await self._one(
            "SELECT COUNT(*) FROM {p}dpone_delivery WHERE parent_id = ?", (parent_id,)
        )
        return bool(row and row[0])

    async def take_lease(self, operation_id: str, holder: str, ttl_s: float) -> _Lease:
        """Take or renew the lease if it is free, expired or already ours; return it."""
        await self._one(
            "INSERT INTO {p}" + LEASE_TABLE + " AS l "
            "(operation_id, holder, expires_at, epoch, polls) VALUES (?, ?, {now} + ?, 1, 0) "
            "ON CONFLICT (operation_id) DO UPDATE SET "
            "epoch = CASE WHEN l.holder = excluded.holder THEN l.epoch ELSE l.epoch + 1 END, "
            "holder = excluded.holder, expires_at = excluded.expires_at "
            "WHERE l.holder = excluded.holder OR l.expires_at <= {now} "
            "RETURNING epoch",
            (operation_id, holder, float(ttl_s)),
        )
        row = await self._one(
            "SELECT holder, epoch, last_status FROM {p}" + LEASE_TABLE + " WHERE operation_id = ?",
            (operation_id,),
        )
        assert row is not None  # noqa: S101 - the upsert above created it
        return _Lease(holder=row[0], epoch=int(row[1]), last_status=row[2], mine=row[0] == holder)

    async def note(self, operation_id: str, holder: str, epoch: int, status: str | None) -> bool:
        """Count one poll (and its status) on the lease, only while we still hold it."""
        row = await self._one(
            "UPDATE {p}" + LEASE_TABLE + " SET polls = polls + 1, "
            "last_status = COALESCE(?, last_status) "
            "WHERE operation_id = ? AND holder = ? AND epoch = ? RETURNING polls",
            (status, operation_id, holder, epoch),
        )
        return row is not None

    async def release(self, operation_id: str, holder: str) -> None:
        """Let the lease expire now if we hold it, so the next trigger need not wait."""
        await self._one(
            "UPDATE {p}" + LEASE_TABLE + " SET expires_at = {now} "
            "WHERE operation_id = ? AND holder = ? RETURNING epoch",
            (operation_id, holder),
        )

    async def close(self) -> None:
        await self._conn.close()


async def _postgres_url(locator: dict[str, Any], connection_url: ConnectionUrl | None) -> str:
    """The URL of a PostgreSQL locator, resolved in this process (never logged).

    Raises:
        LocatorUnresolved: the variable is unset, the connection is not defined here, or
            what they hold is not a PostgreSQL URL.
        Exception: whatever a connection lookup raises otherwise (maybe transient).

    """
    if "url_env" in locator:
        name = str(locator["url_env"])
        where = f"the environment variable {name}"
        value = os.environ.get(name, "").strip()
        if not value:
            raise LocatorUnresolved(
                f"the journal locator names the environment variable {name}, which is not "
                "set in the triggerer",
                field="journal_env",
                hint=f"set {name} in the triggerer's environment to the journal URL the "
                "workers use, restart the triggerer, then clear the task",
            )
    elif "conn_id" in locator:
        conn_id = str(locator["conn_id"])
        where = f"the Airflow connection {conn_id!r}"
        found = None if connection_url is None else await connection_url(conn_id)
        if not found:
            raise LocatorUnresolved(
                f"the journal locator names the Airflow connection {conn_id!r}, which the "
                "triggerer cannot read",
                field="journal_conn_id",
                hint=f"define the connection {conn_id!r} where the triggerer can read it "
                "(metadata database, secrets backend or AIRFLOW_CONN_ variable), then clear "
                "the task",
            )
        value = found
    else:
        return str(locator.get("url") or "")
    if urlsplit(value).scheme not in ("postgresql", "postgres"):
        raise LocatorUnresolved(
            f"{where} does not hold a postgresql:// URL in the triggerer", field="journal"
        )
    return value


async def _open(locator: dict[str, Any], connection_url: ConnectionUrl | None) -> _ControlPlane:
    kind = locator.get("kind")
    if kind == "sqlite":
        import aiosqlite

        path = str(locator.get("path") or "")
        if not path.startswith("/"):
            raise ConfigInvalid("the trigger's journal locator needs an absolute path")
        # mode=rw: never create a control plane that is not there; the path is quoted so
        # '#', '?' and '%' in it stay part of the file name
        lite = await aiosqlite.connect(
            f"file:{quote(path)}?mode=rw", uri=True, timeout=5.0, isolation_level=None
        )
        return _ControlPlane(
            lite,
            placeholder="?",
            prefix="",
            now_sql="((julianday('now') - 2440587.5) * 86400.0)",
        )
    if kind == "postgresql":
        import psycopg

        schema = str(locator.get("schema") or "dpone")
        if not _SCHEMA_RE.match(schema):
            raise ConfigInvalid("the trigger's journal schema is not a plain identifier")
        url = await _postgres_url(locator, connection_url)
        pg = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10)
        return _ControlPlane(
            pg,
            placeholder="%s",
            prefix=f'"{schema}".',
            now_sql="extract(epoch FROM clock_timestamp())::float8",
        )
    raise ConfigInvalid("the trigger's journal locator kind must be sqlite or postgresql")


async def _bearer(ref: str | None) -> str | None:
    """Resolve ``env:NAME`` / ``file:PATH`` in this process; the value is never logged."""
    if ref is None:
        return None
    if not _CRED_RE.match(ref):
        raise ConfigInvalid("the recorded credential is not a reference (env:NAME, file:PATH)")
    kind, _, name = ref.partition(":")
    if kind == "env":
        value = os.environ.get(name, "").strip()
        return value or None
    try:
        text = await asyncio.to_thread(Path(name).read_text, encoding="utf-8")
    except OSError:
        return None
    return text.strip() or None


async def _get_status(client: Any, row: _Row) -> str | None:
    """GET the job once; the remote status, ``receipt_unknown``, or None (no answer)."""
    import httpx

    receipt = row.receipt or ""
    if not _RECEIPT_RE.match(receipt):
        return "receipt_unknown"
    headers = {}
    token = await _bearer(row.credential_ref)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = await client.get(f"{row.receiver_url}/jobs/{receipt}", headers=headers)
    except httpx.HTTPError as exc:
        _log.info("dpone trigger: the receiver did not answer (%s)", type(exc).__name__)
        return None
    if response.status_code in (401, 403, 404):
        return "receipt_unknown"
    if response.status_code != 200:
        return None
    try:
        status = response.json().get("status")
    except (ValueError, AttributeError):
        return None
    return status if isinstance(status, str) else None


def _hint(operation_id: str, status: str, polls: int) -> dict[str, object]:
    return {"operation_id": operation_id, "status": status, "polls": polls}


async def observe_once_woken(
    operation_id: str,
    journal: dict[str, Any],
    bounds: ObservationBounds,
    *,
    connection_url: ConnectionUrl | None = None,
) -> dict[str, object]:
    """Watch one delivery until there is something for the operator to decide; return the hint.

    Each round rereads the control plane; a delivery no longer in ACCEPTED ends the watch.
    The trigger holding the observation lease GETs the receipt and notes the status on
    the lease; a trigger without it only rereads the lease, ends when the holder noted a
    terminal status, and takes over once the lease expires. Errors of one round (the
    receiver or the database not answering) count as a round; the bounds end the watch
    with ``exhausted``, never an exception loop. A locator the triggerer cannot resolve
    (its variable unset, its connection unknown here) ends the watch at once with
    ``locator_unresolved`` and one error log line naming what is missing.

    ``connection_url`` resolves a ``conn_id`` locator (the trigger passes Airflow's
    connection lookup); it returns None for a connection that is not defined.

    Raises:
        ConfigInvalid: the locator or a bound is malformed, or the control plane is older
            than the observation lease (upgrade it by running the operator once).

    """
    import httpx

    bounds.check()
    if journal.get("kind") not in ("sqlite", "postgresql"):
        raise ConfigInvalid("the trigger's journal locator kind must be sqlite or postgresql")
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    db: _ControlPlane | None = None
    polls = 0
    watched: set[str] = set()  # the ids whose lease this run may hold (a parent's child)
    try:
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(bounds.timeout_s),
            follow_redirects=False,
            trust_env=False,
        ) as client:
            for _round in range(bounds.max_polls):
                if bounds.deadline is not None and time.time() >= bounds.deadline:
                    break
                if db is None:
                    try:
                        db = await _connect(journal, connection_url)
                    except LocatorUnresolved as unresolved:
                        _log.error(
                            "dpone trigger: %s. Fix: %s.", unresolved.message, unresolved.hint
                        )
                        return _hint(operation_id, "locator_unresolved", polls)
                if db is not None:
                    status, polled = await _round_status(
                        db, client, operation_id, holder, bounds, watched
                    )
                    polls += polled
                    if status is not None:
                        return _hint(operation_id, status, polls)
                await asyncio.sleep(_pause(bounds))
            # bounds reached: hand the lease on at once (a terminal note is kept instead)
            if db is not None:
                try:
                    for leased in sorted(watched):
                        await db.release(leased, holder)
                except Exception as exc:  # noqa: BLE001 - it expires by itself anyway
                    _log.info("dpone trigger: could not release the lease (%s)", type(exc).__name__)
    finally:
        if db is not None:
            await db.close()
    return _hint(operation_id, "exhausted", polls)


async def _connect(
    journal: dict[str, Any], connection_url: ConnectionUrl | None
) -> _ControlPlane | None:
    """Open the control plane, or None (one round lost) when it does not answer now.

    Raises:
        ConfigInvalid: the locator is malformed or the control plane predates the lease
            (:class:`LocatorUnresolved`: the triggerer cannot resolve the locator).

    """
    try:
        db = await _open(journal, connection_url)
    except ConfigInvalid:
        raise
    except Exception as exc:  # noqa: BLE001 - a database down now is a lost round
        _log.info("dpone trigger: control plane not reachable now (%s)", type(exc).__name__)
        return None
    try:
        version = await db.schema_version()
    except Exception as exc:  # noqa: BLE001
        await db.close()
        _log.info("dpone trigger: control plane not readable now (%s)", type(exc).__name__)
        return None
    if version < LEASE_SCHEMA_VERSION:
        await db.close()
        raise ConfigInvalid(
            "the delivery control plane has no observation lease table yet; run the "
            "delivery once with this dpone version to migrate it",
            field="journal",
        )
    return db


def _pause(bounds: ObservationBounds) -> float:
    if bounds.deadline is None:
        return bounds.poll_interval_s
    return max(min(bounds.poll_interval_s, bounds.deadline - time.time()), 0.0)


async def _round_status(
    db: _ControlPlane,
    client: Any,
    operation_id: str,
    holder: str,
    bounds: ObservationBounds,
    watched: set[str],
) -> tuple[str | None, bool]:
    """One round: (a hint status to end with or None to go on, whether it sent a GET).

    A split delivery's parent has no row of its own: the round then watches the parent's
    first child that is not COMPLETE (the one in flight), under that child's observation
    lease. That child ending (or no longer waiting) wakes the operator, which completes
    it and submits the next child; all children COMPLETE is ``not_pending``; no row and
    no children is ``missing``. ``watched`` collects the ids whose lease may be ours.
    """
    try:
        watch, row = operation_id, await db.read(operation_id)
        if row is None:
            child = await db.in_flight_child(operation_id)
            if child is None:
                return ("not_pending" if await db.has_children(operation_id) else "missing"), False
            watch, row = child
        if row.state != "ACCEPTED":
            return "not_pending", False
        watched.add(watch)
        lease = await db.take_lease(watch, holder, bounds.lease_s)
    except Exception as exc:  # noqa: BLE001 - a busy or unreachable database is one round
        _log.info("dpone trigger: control plane not readable now (%s)", type(exc).__name__)
        return None, False
    if not lease.mine:
        # another trigger observes; its terminal note is enough to wake the operator
        if lease.last_status in _REMOTE_TERMINAL or lease.last_status == "receipt_unknown":
            return lease.last_status, False
        return None, False
    observed = await _get_status(client, row)
    try:
        await db.note(watch, holder, lease.epoch, observed)
    except Exception as exc:  # noqa: BLE001 - the note is a courtesy to other triggers
        _log.info("dpone trigger: could not note the poll (%s)", type(exc).__name__)
    if observed in _REMOTE_TERMINAL or observed == "receipt_unknown":
        return observed, True
    return None, True


async def settle(
    not_before: float | None,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Wait until ``not_before`` (seconds since the epoch) when it is still ahead.

    The trigger never wakes its task sooner than the operator's ``settle_s`` after the
    deferral: Airflow 3.3 can fail a task woken before the scheduler has processed the
    deferring process's exit (apache/airflow#67287). The bound is absolute, so a
    restarted triggerer does not wait again.
    """
    if not_before is None:
        return
    delay = not_before - clock()
    if delay > 0:
        await sleep(delay)
