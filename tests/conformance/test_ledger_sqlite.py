"""The run ledger conformance suite against the SQLite journal, plus its migration."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from dpone.adapters.journal import sqlite as sqlite_journal
from dpone.adapters.journal.sqlite import SCHEMA_VERSION, SqliteCommitJournal
from dpone.ports.ledger import RunLedgerPort
from dpone.testing.ledger_conformance import LedgerConformance, new_start


class TestSqliteLedger(LedgerConformance):
    """SqliteCommitJournal's run ledger on a fresh file per test."""

    @pytest.fixture
    def ledger(self, tmp_path: Path) -> Iterator[RunLedgerPort]:
        journal = SqliteCommitJournal(tmp_path / "journal.db")
        yield journal
        journal.close()


def test_an_older_journal_file_gains_the_ledger_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal from before the run ledger is migrated: entries kept, ledger usable."""
    path = tmp_path / "journal.db"
    # build the file as a dpone before the ledger did: the migrations before the ledger's
    before_ledger = sqlite_journal._MIGRATIONS.index(sqlite_journal._ledger_sql.SQLITE_MIGRATION)
    monkeypatch.setattr(sqlite_journal, "SCHEMA_VERSION", before_ledger)
    old = SqliteCommitJournal(path)
    old.create_intent(
        operation_id="sha256:" + "a" * 64,
        intent_digest="sha256:" + "b" * 64,
        metadata={},
        actor="t",
    )
    old.close()
    monkeypatch.setattr(sqlite_journal, "SCHEMA_VERSION", SCHEMA_VERSION)
    journal = SqliteCommitJournal(path)
    try:
        assert journal.migrate() == list(range(before_ledger + 1, SCHEMA_VERSION + 1))
        assert journal.get("sha256:" + "a" * 64) is not None
        run, created = journal.begin_run(new_start())
        assert created
        assert journal.get_run(run.run_id) == run
    finally:
        journal.close()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT max(version) FROM dpone_schema_version").fetchone() == (
            SCHEMA_VERSION,
        )
