"""The journal conformance suite against the PostgreSQL adapter, including multi-process races."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from dpone.adapters.journal.postgres import PostgresCommitJournal
from dpone.ports.journal import CommitJournalPort, TransactionalJournalPort
from dpone.testing.journal_conformance import AtomicTxn, JournalConformance, JournalFactory


def open_journal(dsn: str, schema: str) -> PostgresCommitJournal:
    """Top-level (picklable) opener for the racing processes: same database, same schema."""
    return PostgresCommitJournal(dsn, schema=schema)


class TestPostgresJournal(JournalConformance):
    """PostgresCommitJournal in a fresh schema per test."""

    @pytest.fixture
    def journal(self, pg_available: str, pg_schema: str) -> Iterator[CommitJournalPort]:
        journal = PostgresCommitJournal(pg_available, schema=pg_schema)
        yield journal
        journal.close()

    @pytest.fixture
    def race_factory(self, pg_available: str, pg_schema: str) -> JournalFactory:
        return JournalFactory(open_journal, (pg_available, pg_schema))

    @pytest.fixture
    def atomic_txn(self, pg_available: str) -> AtomicTxn:
        import psycopg

        @contextmanager
        def target_transaction() -> Iterator[object]:
            # a separate connection, as the PostgreSQL connector would open on the database
            with (
                psycopg.connect(pg_available, autocommit=True) as conn,
                conn.transaction(),
            ):
                yield conn

        return target_transaction


def test_postgres_journal_is_a_transactional_port(pg_available: str, pg_schema: str) -> None:
    """PostgresCommitJournal satisfies TransactionalJournalPort (checked by mypy and here)."""
    journal: TransactionalJournalPort = PostgresCommitJournal(pg_available, schema=pg_schema)
    try:
        assert journal.shares_database_with("postgresql://127.0.0.1:5432/test") == (
            "127.0.0.1:5432/test" in pg_available
        )
        assert not journal.shares_database_with("sqlite:/tmp/journal.db")
    finally:
        journal.close()


class TestPostgresJournalOneSession(TestPostgresJournal):
    """PostgresCommitJournal with pooled=False (``dpone run``): the same suite on one session."""

    @pytest.fixture
    def journal(self, pg_available: str, pg_schema: str) -> Iterator[CommitJournalPort]:
        journal = PostgresCommitJournal(pg_available, schema=pg_schema, pooled=False)
        yield journal
        journal.close()
