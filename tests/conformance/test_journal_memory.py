"""The journal conformance suite against the in-memory reference adapter."""

from __future__ import annotations

import pytest

from dpone.adapters.journal.memory import InMemoryCommitJournal
from dpone.ports.journal import CommitJournalPort
from dpone.testing.journal_conformance import JournalConformance


class TestMemoryJournal(JournalConformance):
    """InMemoryCommitJournal: every conformance test except the multi-process races."""

    multiprocess = False

    @pytest.fixture
    def journal(self) -> CommitJournalPort:
        return InMemoryCommitJournal()


def test_memory_journal_is_a_port() -> None:
    """InMemoryCommitJournal satisfies CommitJournalPort statically and at run time."""
    journal: CommitJournalPort = InMemoryCommitJournal()
    assert journal.get("sha256:" + "0" * 64) is None


def test_memory_lease_expiry_follows_the_injected_clock() -> None:
    """Lease expiry is judged by the journal's clock, not the caller's."""
    now = [1000.0]
    journal = InMemoryCommitJournal(clock=lambda: now[0])
    entry = journal.create_intent(
        operation_id="sha256:" + "a" * 64,
        intent_digest="sha256:" + "b" * 64,
        metadata={},
        actor="t",
    )
    held = journal.acquire_lease(operation_id=entry.operation_id, owner="a", ttl_seconds=10)
    assert held.lease_expires_at == 1010.0
    now[0] = 1010.0
    taken = journal.acquire_lease(operation_id=entry.operation_id, owner="b", ttl_seconds=10)
    assert (taken.lease_owner, taken.lease_epoch) == ("b", 2)
