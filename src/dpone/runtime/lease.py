"""Lease acquisition (with dead-holder takeover) and a heartbeat that renews it."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from dpone.contracts.journal import JournalEntry
from dpone.errors import DponeError, LeaseHeld
from dpone.ports.journal import CommitJournalPort
from dpone.runtime import failpoints
from dpone.runtime.executor import proven_dead

__all__ = ["LeaseKeeper", "acquire"]

_log = logging.getLogger("dpone.runtime")


def acquire(
    journal: CommitJournalPort, *, operation_id: str, owner: str, ttl_seconds: float
) -> JournalEntry:
    """Acquire the lease at a fresh epoch; take it from a holder proven dead on this host.

    Raises:
        LeaseHeld: a live executor (or one on another host, until expiry) holds it.

    """
    failpoints.hit("before:lease.acquire")
    try:
        entry = journal.acquire_lease(
            operation_id=operation_id, owner=owner, ttl_seconds=ttl_seconds
        )
    except LeaseHeld as held:
        if not proven_dead(held.lease_owner):
            raise
        _log.info(
            "lease holder is dead on this host; taking over",
            extra={"dpone": {"operation_id": operation_id, "event": "lease.takeover"}},
        )
        entry = journal.acquire_lease(
            operation_id=operation_id,
            owner=owner,
            ttl_seconds=ttl_seconds,
            break_owner=held.lease_owner,
        )
    try:
        failpoints.hit("after:lease.acquire")
    except DponeError:
        journal.release_lease(operation_id=operation_id, owner=owner, lease_epoch=entry.lease_epoch)
        raise
    return entry


class LeaseKeeper:
    """Renews a lease every third of its TTL while long target work runs.

    A failed renewal is only logged: safety rests on the fence epoch, and a lost lease
    shows up as FencedOut or a CAS conflict where it matters.
    """

    def __init__(
        self,
        journal: CommitJournalPort,
        *,
        operation_id: str,
        owner: str,
        lease_epoch: int,
        ttl_seconds: float,
    ) -> None:
        self._journal = journal
        self._operation_id = operation_id
        self._owner = owner
        self._epoch = lease_epoch
        self._ttl = ttl_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpone-lease", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        interval = max(self._ttl / 3.0, 0.05)
        while not self._stop.wait(interval):
            try:
                self._journal.renew_lease(
                    operation_id=self._operation_id,
                    owner=self._owner,
                    lease_epoch=self._epoch,
                    ttl_seconds=self._ttl,
                )
            except DponeError as exc:
                _log.warning(
                    "lease renewal failed: %s",
                    exc.code.value,
                    extra={"dpone": {"operation_id": self._operation_id, "event": "lease.renew"}},
                )
                if isinstance(exc, LeaseHeld) or exc.code.value == "DPONE_LEASE_LOST":
                    return
