"""Lease acquisition (with dead-holder takeover) and a heartbeat that renews it."""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType

from dpone.contracts.journal import JournalEntry
from dpone.errors import DponeError, LeaseHeld
from dpone.ports.journal import CommitJournalPort
from dpone.runtime import failpoints
from dpone.runtime._log import LazyLogger
from dpone.runtime.executor import proven_dead

__all__ = ["LeaseKeeper", "acquire"]

_log = LazyLogger("dpone.runtime")


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


_NEVER = float("inf")


class _Timers:
    """One timer thread per process: starts a keeper's renewal thread when it is first due.

    Most operations end long before their first renewal (a third of the TTL); they then
    never pay for a thread of their own. A keeper that becomes due gets its own renewal
    thread, exactly as before, so one slow renewal never delays another keeper's.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._cond = threading.Condition()
        self._due: dict[LeaseKeeper, float] = {}
        # when the timer thread wakes next: a keeper due later needs no wake-up call (the
        # thread then waits again for the earliest one), so a short operation costs no
        # thread switch
        self._wake_at = _NEVER

    def add(self, keeper: LeaseKeeper, at: float) -> None:
        if self._pid != os.getpid():
            with _START:
                if self._pid != os.getpid():
                    # First use in this process (or a fork, whose copy of the condition
                    # may be held by a thread that does not exist here): start afresh.
                    self._cond = threading.Condition()
                    self._due = {}
                    self._wake_at = _NEVER
                    threading.Thread(
                        target=self._run, name="dpone-lease-timer", daemon=True
                    ).start()
                    self._pid = os.getpid()
        with self._cond:
            self._due[keeper] = at
            if at < self._wake_at:
                self._cond.notify()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            self._due.pop(keeper, None)

    def _run(self) -> None:
        cond, due = self._cond, self._due
        while True:
            with cond:
                now = time.monotonic()
                ready = [k for k, at in due.items() if at <= now]
                for keeper in ready:
                    del due[keeper]
                if not ready:
                    self._wake_at = min(due.values(), default=now + 3600.0)
                    cond.wait(self._wake_at - now)
                    continue
                self._wake_at = _NEVER  # renewing: whoever adds next wakes the thread
            for keeper in ready:
                keeper._start_renewing()


_START = threading.Lock()
_TIMERS = _Timers()


class LeaseKeeper:
    """Renews a lease every third of its TTL while long target work runs.

    A failed renewal is only logged: safety rests on the fence epoch, and a lost lease
    shows up as FencedOut or a CAS conflict where it matters. The renewal thread starts
    only when the first renewal is due (see ``_Timers``).
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
        self._interval = max(ttl_seconds / 3.0, 0.05)
        self._stopped = False
        # made only for a keeper that starts renewing (most never do)
        self._stop: threading.Event | None = None
        self._state = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseKeeper:
        _TIMERS.add(self, time.monotonic() + self._interval)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._state:
            self._stopped = True
            thread = self._thread
            if self._stop is not None:
                self._stop.set()
        _TIMERS.remove(self)
        if thread is not None:
            thread.join(timeout=5)

    def _start_renewing(self) -> None:
        with self._state:
            if self._stopped:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="dpone-lease", daemon=True
            )
            self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while True:  # the first renewal is due now
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
            if stop.wait(self._interval):
                return
