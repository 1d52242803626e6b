"""The run ledger conformance suite against the PostgreSQL journal."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpone.adapters.journal.postgres import PostgresCommitJournal
from dpone.ports.ledger import RunLedgerPort
from dpone.testing.ledger_conformance import LedgerConformance


class TestPostgresLedger(LedgerConformance):
    """PostgresCommitJournal's run ledger in a fresh schema per test."""

    @pytest.fixture
    def ledger(self, pg_available: str, pg_schema: str) -> Iterator[RunLedgerPort]:
        journal = PostgresCommitJournal(pg_available, schema=pg_schema)
        yield journal
        journal.close()


class TestPostgresLedgerOneSession(TestPostgresLedger):
    """The run ledger on the journal's one session (pooled=False, ``dpone run``)."""

    @pytest.fixture
    def ledger(self, pg_available: str, pg_schema: str) -> Iterator[RunLedgerPort]:
        journal = PostgresCommitJournal(pg_available, schema=pg_schema, pooled=False)
        yield journal
        journal.close()
