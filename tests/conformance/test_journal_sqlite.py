"""The journal conformance suite against the SQLite adapter, including multi-process races."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.ports.journal import CommitJournalPort, TransactionalJournalPort
from dpone.testing.journal_conformance import AtomicTxn, JournalConformance, JournalFactory


class TestSqliteJournal(JournalConformance):
    """SqliteCommitJournal on a fresh file per test."""

    @pytest.fixture
    def journal_path(self, tmp_path: Path) -> Path:
        return tmp_path / "journal.db"

    @pytest.fixture
    def journal(self, journal_path: Path) -> Iterator[CommitJournalPort]:
        journal = SqliteCommitJournal(journal_path)
        yield journal
        journal.close()

    @pytest.fixture
    def race_factory(self, journal_path: Path) -> JournalFactory:
        return JournalFactory(SqliteCommitJournal, (str(journal_path),))

    @pytest.fixture
    def atomic_txn(self, journal_path: Path) -> AtomicTxn:
        @contextmanager
        def target_transaction() -> Iterator[object]:
            # a separate connection, as a target connector would open on the same file
            conn = sqlite3.connect(journal_path, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                conn.close()

        return target_transaction


def test_sqlite_journal_is_a_transactional_port(tmp_path: Path) -> None:
    """SqliteCommitJournal satisfies TransactionalJournalPort (checked by mypy and here)."""
    journal: TransactionalJournalPort = SqliteCommitJournal(tmp_path / "j.db")
    try:
        assert journal.shares_database_with("sqlite:" + str((tmp_path / "j.db").resolve()))
    finally:
        journal.close()
