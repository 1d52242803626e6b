"""WriteBehind: one write's answer read later, its failure handed to its own caller."""

from __future__ import annotations

import os

import pytest

from dpone.adapters.journal._behind import WriteBehind
from dpone.errors import DponeError, JournalUnavailable


def _sender(log: list[str], name: str, error: Exception | None = None):  # type: ignore[no-untyped-def]
    def send():  # type: ignore[no-untyped-def]
        log.append(f"send {name}")

        def finish() -> None:
            log.append(f"read {name}")
            if error is not None:
                raise error

        return finish

    return send


def test_the_answer_is_read_before_the_next_write_and_only_for_its_own_operation() -> None:
    log: list[str] = []
    behind = WriteBehind()
    behind.submit("op-a", _sender(log, "a"), on_failure=lambda exc: log.append("failed"))
    behind.settle(only="op-b")  # another operation's statement: a stays pending
    assert log == ["send a"]
    behind.submit("op-b", _sender(log, "b"), on_failure=lambda exc: log.append("failed"))
    assert log == ["send a", "read a", "send b"]
    behind.settle(only="op-b")
    behind.settle()  # nothing left: reads nothing
    assert log == ["send a", "read a", "send b", "read b"]


def test_a_failed_write_goes_to_its_own_caller_and_never_to_the_settling_call() -> None:
    failures: list[DponeError] = []
    behind = WriteBehind()
    lost = JournalUnavailable("the journal went away")
    behind.submit("op-a", _sender([], "a", lost), on_failure=failures.append)
    behind.settle()  # does not raise
    assert failures == [lost]
    behind.settle()
    assert failures == [lost]  # read once


def test_a_write_that_cannot_be_sent_raises_and_leaves_nothing_pending() -> None:
    behind = WriteBehind()

    def unsendable():  # type: ignore[no-untyped-def]
        raise JournalUnavailable("no session")

    with pytest.raises(JournalUnavailable):
        behind.submit("op-a", unsendable, on_failure=lambda exc: None)
    log: list[str] = []
    behind.submit("op-b", _sender(log, "b"), on_failure=lambda exc: None)
    assert log == ["send b"]


def test_a_bug_while_reading_the_answer_raises() -> None:
    behind = WriteBehind()
    behind.submit("op-a", _sender([], "a", KeyError("bug")), on_failure=lambda exc: None)
    with pytest.raises(KeyError):
        behind.settle()


def test_a_forked_child_forgets_the_parents_write() -> None:
    """In a real forked child: the parent's answer is the parent's to read."""
    log: list[str] = []
    behind = WriteBehind()
    behind.submit("op-a", _sender(log, "a"), on_failure=lambda exc: log.append("failed"))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            behind.settle()
            os.write(write, ",".join(log).encode() or b"-")
        finally:
            os._exit(0)
    os.close(write)
    seen = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    assert seen == "send a"  # the child read nothing
    behind.settle()
    assert log == ["send a", "read a"]  # the parent still does


def test_a_settle_waits_while_another_thread_reads_the_answer() -> None:
    """The answer being read by one thread is still pending for the others: a lookup of
    that operation from another thread waits until it has been read."""
    import threading

    reading, release = threading.Event(), threading.Event()
    log: list[str] = []

    def send():  # type: ignore[no-untyped-def]
        def finish() -> None:
            reading.set()
            release.wait(5)
            log.append("read a")

        return finish

    behind = WriteBehind()
    behind.submit("op-a", send, on_failure=lambda exc: None)
    first = threading.Thread(target=behind.settle)
    first.start()
    assert reading.wait(5)
    second = threading.Thread(target=lambda: (behind.settle(only="op-a"), log.append("looked up")))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the answer, not reading the journal yet
    release.set()
    first.join(5)
    second.join(5)
    assert log == ["read a", "looked up"]


def test_nothing_is_sent_behind_once_closed() -> None:
    """close() reads the pending answer; a later submit sends nothing and says so."""
    log: list[str] = []
    behind = WriteBehind()
    assert behind.submit("op-a", _sender(log, "a"), on_failure=lambda exc: None)
    behind.close(then=lambda: log.append("closed"))
    assert not behind.submit("op-b", _sender(log, "b"), on_failure=lambda exc: None)
    assert log == ["send a", "read a", "closed"]
