"""One journal write at a time, sent ahead of its answer (ADR 0017).

The write's statements are sent and the caller goes on while the server runs them; its
answer is read (the write *settled*) before any later use of the journal that could
depend on it. What a failed write means is its caller's to say: ``settle`` hands its
``DponeError`` to the ``on_failure`` the write was sent with and never raises it into
the unrelated call that happened to settle it (any other exception is a bug, and
raises).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from dpone.errors import DponeError

__all__ = ["WriteBehind"]

#: Reads a sent write's answer; raises its error.
Finish = Callable[[], None]

# Bumped in every forked child: cheaper than asking the kernel for the pid on every call.
_forks = 0


def _forked() -> None:
    global _forks  # noqa: PLW0603 - the one counter every WriteBehind compares with
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def _nothing() -> None:
    """The answer of a write still being sent (never read: the sender holds the lock)."""


class WriteBehind:
    """At most one write whose answer is not read yet."""

    def __init__(self) -> None:
        # held while a write is sent or its answer read: one session, one caller at a time
        self._lock = threading.RLock()
        self._pending: tuple[str, Finish, Callable[[DponeError], None]] | None = None
        self._closed = False
        self._forks = _forks

    def submit(
        self,
        operation_id: str,
        send: Callable[[], Finish],
        *,
        on_failure: Callable[[DponeError], None],
    ) -> bool:
        """Settle the write before, then ``send`` this one; its answer is read later.

        ``send`` raises for a write it could not send (nothing is pending then); it
        returns what reads the answer. False, sending nothing, once closed: the caller
        then writes the way it would without this.
        """
        self._adopt_fork()
        with self._lock:
            if self._closed:
                return False
            self._settle(None)
            # pending while it is being sent: another thread's settle waits for the lock
            self._pending = (operation_id, _nothing, on_failure)
            try:
                finish = send()
            except BaseException:
                self._pending = None
                raise
            self._pending = (operation_id, finish, on_failure)
            return True

    def settle(self, *, only: str | None = None) -> None:
        """Read the pending write's answer; with ``only``, only a write of that operation.

        ``only`` names the one operation a caller's statement touches (a lookup, or the
        birth of a new entry with its new run): a write pending for another operation
        cannot change what that statement reads or writes, so it stays pending.
        """
        if self._pending is None:
            # nothing to read: a write is pending until its answer has been read (below),
            # so another thread reading it makes this one wait for the lock instead
            return
        self._adopt_fork()
        with self._lock:
            self._settle(only)

    def close(self, then: Callable[[], None]) -> None:
        """Read the pending answer, then ``then`` (closing the session); no later submit."""
        self._adopt_fork()
        with self._lock:
            self._closed = True
            self._settle(None)
            then()

    def _settle(self, only: str | None) -> None:
        pending = self._pending
        if pending is None or (only is not None and pending[0] != only):
            return
        _, finish, on_failure = pending
        try:
            finish()
        except DponeError as exc:  # the write's own outcome: its caller says what it means
            on_failure(exc)
        finally:
            self._pending = None

    def _adopt_fork(self) -> None:
        """In a forked child, forget the parent's write: its session is the parent's."""
        if self._forks == _forks:
            return
        self._lock = threading.RLock()  # another thread may have held it at the fork
        self._pending = None
        self._forks = _forks
