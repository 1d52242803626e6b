"""One statement sent ahead of its answer, on a session of its own (ADR 0021).

The statement and its Sync are sent, and the caller goes on while the server runs
(and durably commits) it; the answer is read when the caller needs it. The session
stays in pipeline mode between uses: leaving pipeline mode costs a round trip. One
statement is outstanding at a time: while its answer is unread, ``send`` declines (the
caller writes the usual way), so a caller that never reads blocks nobody.

Like the write behind (ADR 0017), this reads its answer through the pipeline's own
bookkeeping: psycopg has no public call that sends a Sync without waiting for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

import psycopg

__all__ = ["Answer", "SendsAhead", "SessionLost"]

_Conn = psycopg.Connection[tuple[Any, ...]]

#: Reads the answer of a statement sent ahead: its one row (None: no row); raises the
#: statement's ``psycopg.Error``, or ``SessionLost``. Call it once.
Answer = Callable[[], "tuple[Any, ...] | None"]


class SessionLost(Exception):
    """The session was lost before the answer was read: the statement may have run."""


class SendsAhead:
    """A session for statements whose answers are read later, one at a time."""

    def __init__(self, connect: Callable[[], _Conn]) -> None:
        # opens and configures the session (autocommit: each Sync commits its statement)
        self._connect = connect
        self._busy = threading.Lock()  # held from a send until its answer is read
        self._held: tuple[_Conn, psycopg.Pipeline, ExitStack] | None = None
        self._pid = os.getpid()
        self._closed = False

    def send(self, statement: bytes | str, params: Mapping[str, object]) -> Answer | None:
        """Send ``statement`` and its Sync; None, sending nothing, while an answer is unread
        or once closed.

        Raises ``SessionLost`` when the session was lost while sending: the statement may
        have reached the server (the caller judges that, as for a reply lost in an
        ordinary round trip). Any other ``psycopg.Error`` means it was not sent (no
        session could be opened, a value could not be sent) or was refused at once:
        nothing of it was committed.
        """
        if os.getpid() != self._pid:  # a forked child: the parent's session is not ours
            self._busy = threading.Lock()
            self._held = None
            self._pid = os.getpid()
        if self._closed or not self._busy.acquire(blocking=False):
            return None
        try:
            conn, pipeline = self._session()
        except BaseException:
            self._busy.release()
            raise
        cur = conn.cursor()
        try:
            cur.execute(statement, params)
            pipeline._enqueue_sync()
            conn.wait(pipeline._communicate_gen())
        except BaseException as exc:
            lost = conn.broken or conn.closed
            cur.close()
            self.drop()  # aborted or lost mid-pipeline: not reused
            self._busy.release()
            if lost and isinstance(exc, psycopg.Error):
                raise SessionLost from exc
            raise
        read = False

        def answer() -> tuple[Any, ...] | None:
            nonlocal read
            if read:  # a second read would take the next statement's answer
                raise RuntimeError("the answer of a statement sent ahead was read already")
            read = True
            try:
                conn.wait(pipeline._fetch_gen(flush=False))
                return cur.fetchone()
            except psycopg.Error as exc:
                lost = conn.broken or conn.closed
                self.drop()  # the session, aborted or lost mid-pipeline, is not reused
                if lost:
                    raise SessionLost from exc
                raise
            except BaseException:
                self.drop()
                raise
            finally:
                cur.close()
                if self._closed:
                    self.drop()  # closed while this answer was unread
                self._busy.release()

        return answer

    def drop(self) -> None:
        """Close the session (a new one is opened on the next send)."""
        held, self._held = self._held, None
        if held is None:
            return
        conn, _, stack = held
        try:
            stack.close()  # out of pipeline mode: reads what is left, or fails at once
        except psycopg.Error:
            pass  # a lost session: closing it is all there is to do
        conn.close()

    def close(self) -> None:
        """Drop the session, no later send; with an answer unread, once it is read."""
        self._closed = True
        if os.getpid() != self._pid:
            self._held = None  # the parent's: never closed here
            return
        if self._busy.acquire(blocking=False):
            try:
                self.drop()
            finally:
                self._busy.release()

    def _session(self) -> tuple[_Conn, psycopg.Pipeline]:
        held = self._held
        if held is not None and not held[0].closed and not held[0].broken:
            return held[0], held[1]
        self.drop()
        conn = self._connect()
        try:
            stack = ExitStack()
            pipeline = stack.enter_context(conn.pipeline())
        except BaseException:
            conn.close()
            raise
        self._held = (conn, pipeline, stack)
        return conn, pipeline
