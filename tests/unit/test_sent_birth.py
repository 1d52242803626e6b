"""SentBirth: a birth sent ahead, its answer read once at the gate (ADR 0021)."""

from __future__ import annotations

from typing import Any

import pytest

from dpone.contracts.evidence import safe_mapping
from dpone.contracts.journal import JournalEntry
from dpone.contracts.states import CommitState
from dpone.errors import JournalUnavailable
from dpone.runtime.birth import BirthUnread, NotBorn, SentBirth

OP = "sha256:" + "ab" * 32
DIGEST = "sha256:" + "cd" * 32


def _entry(owner: str = "host-a:1", state: CommitState = CommitState.COMMITTING) -> JournalEntry:
    return JournalEntry(
        operation_id=OP,
        intent_digest=DIGEST,
        state=state,
        version=2,
        lease_owner=owner,
        lease_epoch=1,
        lease_expires_at=1030.0,
        metadata=safe_mapping({"workload_id": "orders"}),
        result=None,
        created_at=1000.0,
        updated_at=1000.0,
    )


def _sent(answers: list[Any], born: list[JournalEntry]) -> SentBirth:
    def answer() -> Any:
        reply = answers.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    return SentBirth(
        answer, operation_id=OP, intent_digest=DIGEST, owner="host-a:1", on_born=born.append
    )


def test_the_stand_in_is_what_a_birth_bears_and_the_gate_hands_over_the_journals_entry() -> None:
    real = _entry()
    born: list[JournalEntry] = []
    sent = _sent([(None, real, True)], born)
    expected = sent.expected
    assert (expected.state, expected.version, expected.lease_owner, expected.lease_epoch) == (
        CommitState.COMMITTING,
        2,
        "host-a:1",
        1,
    )
    assert (expected.operation_id, expected.intent_digest) == (OP, DIGEST)
    assert sent.unread
    sent()  # the gate
    assert not sent.unread
    assert born == [real]
    assert sent.confirm() is real  # read once: the answer is not asked again
    assert born == [real]


def test_an_answer_that_found_the_operation_stops_every_later_confirm() -> None:
    other = _entry(owner="host-b:2")
    born: list[JournalEntry] = []
    sent = _sent([(None, other, False)], born)
    for _ in range(2):
        with pytest.raises(NotBorn) as caught:
            sent()
        assert caught.value.found == (None, other)
    assert born == []


def test_a_journal_error_reading_the_answer_is_handed_over_unchanged() -> None:
    error = JournalUnavailable("could not read the run and record the intent", operation_id=OP)
    sent = _sent([error], [])
    for _ in range(2):
        with pytest.raises(BirthUnread) as caught:
            sent.confirm()
        assert caught.value.error is error
    assert not sent.unread


def test_an_interrupt_while_the_answer_is_read_is_never_taken_for_not_born() -> None:
    """Ctrl-C (or any error that is not the journal's) during the read leaves the birth's
    fate unknown: every later confirm raises it again, never ``NotBorn``."""
    sent = _sent([KeyboardInterrupt()], [])
    with pytest.raises(KeyboardInterrupt):
        sent()
    with pytest.raises(KeyboardInterrupt):
        sent.confirm()  # as the lease release in a finally block would
    assert not sent.unread
