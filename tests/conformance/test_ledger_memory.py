"""The run ledger conformance suite against the in-memory journal."""

from __future__ import annotations

import pytest

from dpone.adapters.journal.memory import InMemoryCommitJournal
from dpone.ports.ledger import RunLedgerPort
from dpone.testing.ledger_conformance import LedgerConformance


class TestMemoryLedger(LedgerConformance):
    """InMemoryCommitJournal's run ledger."""

    @pytest.fixture
    def ledger(self) -> RunLedgerPort:
        return InMemoryCommitJournal()
