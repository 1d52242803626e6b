"""Sessions kept in pipeline mode; one statement sent ahead of its answer (ADR 0021).

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

__all__ = ["Answer", "PipelineSession", "SendsAhead", "SessionLost"]

_Conn = psycopg.Connection[tuple[Any, ...]]

#: Reads the answer of a statement sent ahead: its one row (None: no row); raises the
#: statement's ``psycopg.Error``, or ``SessionLost``. Call it once.
Answer = Callable[[], "tuple[Any, ...] | None"]


class SessionLost(Exception):
    """The session was lost before the answer was read: the statement may have run."""


class PipelineSession:
    """One session of this process kept in pipeline mode between uses, opened on demand.

    Leaving pipeline mode costs a round trip, so the session stays in it; a pooled
    connection cannot. In a forked child the parent's session is forgotten, never used
    or closed. The caller gives it to one user at a time.
    """

    def __init__(self, connect: Callable[[], _Conn]) -> None:
        self._connect = connect  # opens and configures a new session
        self._held: tuple[_Conn, psycopg.Pipeline, ExitStack] | None = None
        self._pid = os.getpid()

    @property
    def connection(self) -> _Conn | None:
        """The session held now, if any (for tests and diagnostics)."""
        self._adopt_fork()
        return None if self._held is None else self._held[0]

    def get(self) -> tuple[_Conn, psycopg.Pipeline]:
        """The session and its pipeline; a new one when none is held or it was lost."""
        self._adopt_fork()
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

    def drop(self) -> None:
        """Close the session (a new one is opened by the next ``get``)."""
        self._adopt_fork()
        held, self._held = self._held, None
        if held is None:
            return
        conn, _, stack = held
        try:
            stack.close()  # out of pipeline mode: reads what is left, or fails at once
        except psycopg.Error:
            pass  # a lost session: closing it is all there is to do
        conn.close()

    def _adopt_fork(self) -> None:
        if self._pid != os.getpid():
            self._held = None  # the parent's: never used or closed here
            self._pid = os.getpid()


class SendsAhead:
    """A session for statements whose answers are read later, one at a time."""

    def __init__(self, connect: Callable[[], _Conn]) -> None:
        # the session: autocommit, so each Sync commits its statement
        self._session = PipelineSession(connect)
        self._busy = threading.Lock()  # held from a send until its answer is read
        self._pid = os.getpid()
        self._closed = False

    @property
    def connection(self) -> _Conn | None:
        """The session held now, if any (for tests and diagnostics)."""
        return self._session.connection

    def send(self, statement: bytes | str, params: Mapping[str, object]) -> Answer | None:
        """Send ``statement`` and its Sync; None, sending nothing, while an answer is unread
        or once closed.

        Raises ``SessionLost`` when the session was lost while sending: the statement may
        have reached the server (the caller judges that, as for a reply lost in an
        ordinary round trip). Any other ``psycopg.Error`` means it was not sent (no
        session could be opened, a value could not be sent) or was refused at once:
        nothing of it was committed.
        """
        if os.getpid() != self._pid:  # a forked child: the parent's answer is not ours
            self._busy = threading.Lock()
            self._pid = os.getpid()
        if self._closed or not self._busy.acquire(blocking=False):
            return None
        try:
            conn, pipeline = self._session.get()
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
            self._session.drop()  # aborted or lost mid-pipeline: not reused
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
                self._session.drop()  # aborted or lost mid-pipeline: not reused
                if lost:
                    raise SessionLost from exc
                raise
            except BaseException:
                self._session.drop()
                raise
            finally:
                cur.close()
                if self._closed:
                    self._session.drop()  # closed while this answer was unread
                self._busy.release()

        return answer

    def close(self) -> None:
        """Drop the session, no later send; with an answer unread, once it is read."""
        self._closed = True
        if self._busy.acquire(blocking=False):
            try:
                self._session.drop()
            finally:
                self._busy.release()
