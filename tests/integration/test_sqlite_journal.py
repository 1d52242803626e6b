"""SQLite journal behaviour beyond the port: atomic mode, locking, triggers, migration, files."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dpone.adapters.journal.sqlite import SCHEMA_VERSION, SqliteCommitJournal
from dpone.contracts.journal import JournalEntry
from dpone.contracts.states import CommitState as S
from dpone.errors import ConfigInvalid, DponeError, JournalConflict, JournalUnavailable
from dpone.testing.journal_conformance import ACTOR, AUDIT, OWNER_A, create, drive_to, leased

SQL_WORDS = ("SELECT", "INSERT", "UPDATE", "DELETE", "BEGIN", "WHERE")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def journal(path: Path) -> Iterator[SqliteCommitJournal]:
    journal = SqliteCommitJournal(path)
    yield journal
    journal.close()


@pytest.fixture
def target(path: Path) -> Iterator[sqlite3.Connection]:
    """A target connector's own connection to the journal's file, with a data table."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER)")
    yield conn
    conn.close()


def _prepared(journal: SqliteCommitJournal) -> JournalEntry:
    return drive_to(journal, leased(journal), S.PREPARED)


def _within(
    journal: SqliteCommitJournal, txn: object, entry: JournalEntry, *, version: int | None = None
) -> JournalEntry:
    return journal.compare_and_set_within(
        txn,
        operation_id=entry.operation_id,
        expected_version=entry.version if version is None else version,
        expected_states=frozenset({entry.state}),
        next_state=S.COMPLETE,
        lease_epoch=entry.lease_epoch,
        actor=ACTOR,
        result={"rows_written": 2},
        evidence={"mode": "atomic"},
    )


def _orders(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0])
    finally:
        conn.close()


def _assert_safe_message(err: DponeError, path: Path) -> None:
    text = str(err)
    assert str(path.resolve()) in text
    assert not any(word in text for word in SQL_WORDS), text
    assert not isinstance(err, sqlite3.Error)
    # a wrong path or file is permanent (exit 2); only an unreachable journal is retryable
    assert err.retryable == isinstance(err, JournalUnavailable)


# ---------------------------------------------------------------------- atomic mode
def test_within_commits_with_the_target_transaction(
    journal: SqliteCommitJournal, target: sqlite3.Connection, path: Path
) -> None:
    """An atomic fold written inside the target's transaction appears with its COMMIT."""
    entry = _prepared(journal)
    rows_before = journal.history(entry.operation_id)
    target.execute("BEGIN IMMEDIATE")
    target.execute("INSERT INTO orders (id, amount) VALUES (1, 10), (2, 20)")
    done = _within(journal, target, entry)
    assert (done.state, done.version) == (S.COMPLETE, entry.version + 1)
    assert journal.get(entry.operation_id) == entry, "invisible before the target commits"
    target.execute("COMMIT")
    assert journal.get(entry.operation_id) == done
    assert done.result is not None
    assert dict(done.result) == {"rows_written": 2}
    new_rows = journal.history(entry.operation_id)[len(rows_before) :]
    assert [(r.from_state, r.to_state) for r in new_rows] == [
        (S.PREPARED, S.COMMITTING),
        (S.COMMITTING, S.TARGET_COMMITTED),
        (S.TARGET_COMMITTED, S.COMPLETE),
    ]
    assert {(r.version, r.kind) for r in new_rows} == {(done.version, "fold")}
    assert _orders(path) == 2


def test_within_vanishes_on_rollback(
    journal: SqliteCommitJournal, target: sqlite3.Connection, path: Path
) -> None:
    """When the target rolls back, the journal write and its history rows vanish with it."""
    entry = _prepared(journal)
    rows_before = journal.history(entry.operation_id)
    target.execute("BEGIN IMMEDIATE")
    target.execute("INSERT INTO orders (id, amount) VALUES (1, 10)")
    _within(journal, target, entry)
    target.execute("ROLLBACK")
    assert journal.get(entry.operation_id) == entry
    assert journal.history(entry.operation_id) == rows_before
    assert _orders(path) == 0


def test_within_zero_row_cas_raises_so_the_caller_rolls_back(
    journal: SqliteCommitJournal, target: sqlite3.Connection, path: Path
) -> None:
    """A stale CAS inside the target transaction raises JournalConflict; rollback loses the data."""
    entry = _prepared(journal)
    target.execute("BEGIN IMMEDIATE")
    target.execute("INSERT INTO orders (id, amount) VALUES (1, 10)")
    with pytest.raises(JournalConflict) as info:
        _within(journal, target, entry, version=entry.version - 1)
    assert info.value.current_version == entry.version
    assert info.value.current_state == S.PREPARED.value
    assert target.in_transaction, "the journal never ends the caller's transaction"
    target.execute("ROLLBACK")
    assert journal.get(entry.operation_id) == entry
    assert _orders(path) == 0


def test_within_accepts_a_row_factory_connection(
    journal: SqliteCommitJournal, target: sqlite3.Connection
) -> None:
    """A target connection with sqlite3.Row as row factory works the same."""
    entry = _prepared(journal)
    target.row_factory = sqlite3.Row
    target.execute("BEGIN IMMEDIATE")
    done = _within(journal, target, entry)
    target.execute("COMMIT")
    assert journal.get(entry.operation_id) == done


def test_within_refuses_a_connection_outside_a_transaction(
    journal: SqliteCommitJournal, target: sqlite3.Connection
) -> None:
    """Atomic mode needs the caller's open transaction; autocommit would split the write."""
    entry = _prepared(journal)
    with pytest.raises(ValueError, match="BEGIN IMMEDIATE"):
        _within(journal, target, entry)
    with pytest.raises(TypeError):
        _within(journal, object(), entry)
    assert journal.get(entry.operation_id) == entry


def test_within_refuses_a_connection_to_another_database(
    journal: SqliteCommitJournal, tmp_path: Path
) -> None:
    """A transaction on another file cannot carry this journal's write."""
    entry = _prepared(journal)
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(ValueError, match="another database"):
            _within(journal, other, entry)
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert journal.get(entry.operation_id) == entry


# ---------------------------------------------------------------------- unavailability
def test_locked_journal_raises_journal_unavailable(path: Path) -> None:
    """A writer holding BEGIN IMMEDIATE past the busy timeout gives JournalUnavailable."""
    journal = SqliteCommitJournal(path, busy_timeout_s=0.2)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        entry = leased(journal)
        blocker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        attempts: list[Callable[[], object]] = [
            lambda: create(journal),
            lambda: journal.compare_and_set(
                operation_id=entry.operation_id,
                expected_version=entry.version,
                expected_states=frozenset({entry.state}),
                next_state=S.PREPARED,
                lease_epoch=entry.lease_epoch,
                actor=ACTOR,
            ),
            lambda: journal.acquire_lease(
                operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=5
            ),
            lambda: journal.renew_lease(
                operation_id=entry.operation_id,
                owner=OWNER_A,
                lease_epoch=entry.lease_epoch,
                ttl_seconds=5,
            ),
        ]
        for attempt in attempts:
            with pytest.raises(JournalUnavailable) as info:
                attempt()
            _assert_safe_message(info.value, path)
            assert "locked" in str(info.value)
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert time.monotonic() - started < 10
        assert journal.get(entry.operation_id) == entry, "WAL readers are not blocked"
        blocker.execute("ROLLBACK")
        assert (
            journal.acquire_lease(operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=5)
        ).lease_epoch == entry.lease_epoch + 1
    finally:
        blocker.close()
        journal.close()


def test_opening_a_locked_new_journal_raises_journal_unavailable(path: Path) -> None:
    """Creating the schema while another writer holds the file is JournalUnavailable."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("PRAGMA journal_mode = WAL").fetchall()
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(JournalUnavailable) as info:
            SqliteCommitJournal(path, busy_timeout_s=0.1)
        _assert_safe_message(info.value, path)
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()


def test_path_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    """A journal path naming a directory is a permanent mistake, not a raw sqlite3 error."""
    where = tmp_path / "adir"
    where.mkdir()
    with pytest.raises(ConfigInvalid) as info:
        SqliteCommitJournal(where)
    _assert_safe_message(info.value, where)


def test_file_that_is_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    """A file with other content is reported as not a dpone journal (a retry cannot help)."""
    where = tmp_path / "notes.db"
    where.write_bytes(b"this is not an sqlite database, just text " * 100)
    with pytest.raises(ConfigInvalid) as info:
        SqliteCommitJournal(where)
    _assert_safe_message(info.value, where)
    assert "not a dpone journal" in str(info.value)


def test_broken_schema_is_reported_without_sql(journal: SqliteCommitJournal, path: Path) -> None:
    """A journal whose tables are gone is translated too, naming the file, never the statement."""
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("ALTER TABLE dpone_journal RENAME TO gone")
    finally:
        raw.close()
    with pytest.raises(ConfigInvalid) as info:
        journal.get("sha256:" + "0" * 64)
    _assert_safe_message(info.value, path)
    assert "dpone_journal" not in str(info.value)


def test_closed_journal_raises_journal_unavailable(path: Path) -> None:
    """Calls after close() are JournalUnavailable, not a raw ProgrammingError."""
    journal = SqliteCommitJournal(path)
    journal.close()
    with pytest.raises(JournalUnavailable):
        journal.get("sha256:" + "0" * 64)
    journal.close()


# ---------------------------------------------------------------------- append-only
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE dpone_transitions SET to_state = 'COMPLETE'",
        "DELETE FROM dpone_transitions",
        "UPDATE dpone_audit SET outcome = 'applied'",
        "DELETE FROM dpone_audit",
    ],
    ids=["update-history", "delete-history", "update-audit", "delete-audit"],
)
def test_history_and_audit_rewrites_are_refused_by_triggers(
    journal: SqliteCommitJournal, path: Path, statement: str
) -> None:
    """UPDATE or DELETE on the history or audit table is aborted by a trigger."""
    entry = leased(journal)
    journal.append_audit(
        operation_id=entry.operation_id,
        request=AUDIT,
        outcome="refused",
        entry=entry,
    )
    history = journal.history(entry.operation_id)
    audit = journal.audit_log(entry.operation_id)
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            raw.execute(statement)
    finally:
        raw.close()
    assert journal.history(entry.operation_id) == history
    assert journal.audit_log(entry.operation_id) == audit


# ---------------------------------------------------------------------- schema and files
def _schema_objects(path: Path) -> list[tuple[str, str]]:
    raw = sqlite3.connect(path)
    try:
        return sorted(raw.execute("SELECT type, name FROM sqlite_master").fetchall())
    finally:
        raw.close()


def _schema_versions(path: Path) -> list[int]:
    raw = sqlite3.connect(path)
    try:
        return [r[0] for r in raw.execute("SELECT version FROM dpone_schema_version")]
    finally:
        raw.close()


def test_reopen_migrates_idempotently(path: Path) -> None:
    """Opening an existing journal again keeps its data and changes no schema object."""
    with SqliteCommitJournal(path) as first:
        entry = leased(first)
    objects = _schema_objects(path)
    assert ("table", "dpone_journal") in objects
    assert ("index", "dpone_journal_state_updated") in objects
    assert ("trigger", "dpone_transitions_no_update") in objects
    for _ in range(2):
        with SqliteCommitJournal(path) as again:
            assert again.get(entry.operation_id) == entry
    assert _schema_objects(path) == objects
    assert _schema_versions(path) == list(range(1, SCHEMA_VERSION + 1))


def test_partial_schema_is_completed_on_open(path: Path) -> None:
    """A file with only some of the tables (an interrupted first open) is completed."""
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute(
            "CREATE TABLE dpone_schema_version "
            "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
    finally:
        raw.close()
    with SqliteCommitJournal(path) as journal:
        assert journal.get(create(journal).operation_id) is not None
    assert _schema_versions(path) == list(range(1, SCHEMA_VERSION + 1))


def test_newer_schema_is_refused(path: Path) -> None:
    """A journal written by a newer dpone is refused with ConfigInvalid, not misread."""
    SqliteCommitJournal(path).close()
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute(
            "INSERT INTO dpone_schema_version (version, applied_at) VALUES (?, 0)",
            (SCHEMA_VERSION + 1,),
        )
    finally:
        raw.close()
    with pytest.raises(ConfigInvalid, match="newer"):
        SqliteCommitJournal(path)


def test_journal_uses_wal(journal: SqliteCommitJournal, path: Path) -> None:
    """The journal file is in WAL mode so readers never wait for the writer."""
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_missing_directory_is_created(tmp_path: Path) -> None:
    """Opening a journal under directories that do not exist creates them."""
    where = tmp_path / "a" / "b" / "journal.db"
    with SqliteCommitJournal(where) as journal:
        create(journal)
    assert where.is_file()


def test_memory_path_is_refused() -> None:
    """':memory:' is refused: each thread's connection would see another database."""
    with pytest.raises(ConfigInvalid):
        SqliteCommitJournal(":memory:")


def test_locator_and_shares_database_with(
    journal: SqliteCommitJournal, path: Path, tmp_path: Path
) -> None:
    """The locator is 'sqlite:' + resolved path; other spellings of the same file match."""
    assert journal.locator == "sqlite:" + str(path.resolve())
    assert journal.shares_database_with(journal.locator)
    assert journal.shares_database_with(f"sqlite:{tmp_path}/sub/../journal.db")
    link = tmp_path / "link.db"
    link.symlink_to(path)
    assert journal.shares_database_with(f"sqlite:{link}")
    assert not journal.shares_database_with(f"sqlite:{tmp_path / 'other.db'}")
    assert not journal.shares_database_with(f"postgresql:{path}")
    assert not journal.shares_database_with("sqlite::memory:")
    assert not journal.shares_database_with("sqlite:")


def test_thread_connections_are_closed_by_close(path: Path) -> None:
    """Connections opened by heartbeat threads are closed by close(), nothing keeps the file."""
    journal = SqliteCommitJournal(path)
    entry = leased(journal)

    def beat() -> None:
        journal.renew_lease(
            operation_id=entry.operation_id,
            owner=OWNER_A,
            lease_epoch=entry.lease_epoch,
            ttl_seconds=30,
        )

    for _ in range(3):
        thread = threading.Thread(target=beat)
        thread.start()
        thread.join()
    journal.close()
    # Leaving WAL needs exclusive access: it fails while any connection is still open.
    raw = sqlite3.connect(path, isolation_level=None, timeout=0.1)
    try:
        assert raw.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    finally:
        raw.close()


def test_two_journals_on_one_file_see_each_other(path: Path) -> None:
    """Two journal objects (two processes' view) on one file read each other's writes."""
    with SqliteCommitJournal(path) as one, SqliteCommitJournal(path) as two:
        entry = create(one)
        assert two.get(entry.operation_id) == entry
        moved = two.acquire_lease(operation_id=entry.operation_id, owner=OWNER_A, ttl_seconds=5)
        assert one.get(entry.operation_id) == moved


def test_time_comes_from_sqlite(journal: SqliteCommitJournal, path: Path) -> None:
    """Entry timestamps come from SQLite's clock, the one every process on the file shares."""
    entry = create(journal)
    raw = sqlite3.connect(path)
    try:
        sqlite_now = raw.execute("SELECT (julianday('now') - 2440587.5) * 86400.0").fetchone()[0]
    finally:
        raw.close()
    assert 0 <= sqlite_now - entry.created_at < 5
    assert abs(journal.now() - sqlite_now) < 5
    assert os.path.getsize(path) > 0


def _open_handles(path: Path) -> int:
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path.resolve()):
                count += 1
        except OSError:
            continue
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_connections_of_finished_threads_are_closed(path: Path) -> None:
    """Each short-lived heartbeat thread's connection is closed once a new thread connects."""
    with SqliteCommitJournal(path) as journal:
        entry = leased(journal)

        def beat() -> None:
            journal.renew_lease(
                operation_id=entry.operation_id,
                owner=OWNER_A,
                lease_epoch=entry.lease_epoch,
                ttl_seconds=30,
            )

        for _ in range(6):
            thread = threading.Thread(target=beat)
            thread.start()
            thread.join()
        # this thread's connection plus at most the last finished thread's
        assert _open_handles(path) <= 2
