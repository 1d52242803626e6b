"""Incremental SQL sources with fixed cuts, and checkpoints promoted with COMPLETE.

Real components: SQLite / PostgreSQL / MariaDB source tables, SQLite journal and target,
and the PostgreSQL journal for the contiguity rule.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpone.adapters.journal.memory import InMemoryCommitJournal
from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.api import Runner
from dpone.cli.main import app
from dpone.config.workload import Workload, parse_workload
from dpone.contracts.checkpoint import CheckpointAdvance, to_micros
from dpone.contracts.identity import parse_interval
from dpone.contracts.states import CommitState
from dpone.errors import ConfigInvalid, InjectedFault, IntentConflict, JournalConflict
from dpone.runtime import failpoints

ORIGIN = "2026-11-01T00:00:00Z"
DAY1 = "2026-11-01/2026-11-02"
#: a crash inside the write transaction, before it commits (Runner() reads the environment)
CRASH = {"DPONE_FAILPOINTS": "fence.mutate.before_commit=raise"}


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    failpoints.configure(None)


def _sqlite_source(path: Path, rows: list[tuple[int, str, str]]) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, body TEXT, "
            "updated_at TIMESTAMP)"
        )
        conn.executemany("INSERT INTO events VALUES (?, ?, ?)", rows)


def _workload(root: Path, source: dict[str, Any], **extra: Any) -> Workload:
    return parse_workload(
        {
            "workload": "events",
            "release": "r1",
            "deployment": "test",
            "journal": "sqlite:///journal.db",
            "source": source,
            "target": {"kind": "sqlite", "url": "sqlite:///wh.db", "table": "events"},
            "load": {"strategy": "append"},
            "incremental": {"start": ORIGIN},
            **extra,
        },
        base_dir=root,
    )


def _target_ids(root: Path) -> list[int]:
    """The ids in the target table ([] when nothing ever committed there)."""
    if not (root / "wh.db").exists():
        return []
    with sqlite3.connect(root / "wh.db") as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone() is None:
            return []
        return sorted(int(r[0]) for r in conn.execute("SELECT id FROM events"))


def _checkpoints(root: Path) -> list[dict[str, object]]:
    journal = SqliteCommitJournal(root / "journal.db")
    try:
        return [c.as_dict() for c in journal.list_checkpoints()]
    finally:
        journal.close()


def test_sqlite_table_loads_the_fixed_cut_and_moves_the_watermark(tmp_path: Path) -> None:
    """Only rows in [start, cut) are read; COMPLETE moves the watermark to the cut."""
    _sqlite_source(
        tmp_path / "src.db",
        [
            (1, "a", "2026-10-31 23:59:59"),  # before the origin
            (2, "b", "2026-11-01 00:00:00"),
            (3, "c", "2026-11-01T12:00:00Z"),
            (4, "d", "2026-11-02 00:00:00"),  # at the cut: excluded
        ],
    )
    w = _workload(tmp_path, {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"})
    with Runner(w) as runner:
        result = runner.run(interval=DAY1)
    assert result.rows_written == 2
    assert _target_ids(tmp_path) == [2, 3]
    [checkpoint] = _checkpoints(tmp_path)
    assert checkpoint["watermark"] == "2026-11-02T00:00:00Z"
    assert checkpoint["pending_intervals"] == 0


def test_no_interval_takes_the_next_one_from_the_checkpoint_and_a_retry_reuses_it(
    tmp_path: Path,
) -> None:
    """The claimed interval is recorded; a retry after a crash gets the same cut."""
    _sqlite_source(tmp_path / "src.db", [(1, "a", "2026-11-01 01:00:00")])
    w = _workload(
        tmp_path,
        {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"},
        incremental={"start": ORIGIN, "max_interval_seconds": 86400},
    )
    with Runner(w, environ=CRASH) as runner, pytest.raises(InjectedFault):
        runner.run()
    [claimed] = _checkpoints(tmp_path)
    assert claimed["next_interval"] == "2026-11-01T00:00:00Z/2026-11-02T00:00:00Z"
    assert claimed["watermark"] == ORIGIN
    # a row lands in the claimed interval's future part after the crash is irrelevant here;
    # the retry must use the same interval, hence the same operation
    failpoints.configure(None)
    with Runner(w) as runner:
        first = runner.run()
        second = runner.run()  # the next day, from the moved watermark
    assert first.rows_written == 1
    assert second.operation_id != first.operation_id
    journal = SqliteCommitJournal(tmp_path / "journal.db")
    try:
        entries = journal.list_entries()
        intervals = sorted(str(e.metadata["interval"]) for e in entries)
    finally:
        journal.close()
    # one operation per day: the crashed attempt and its retry were one operation
    assert intervals == [
        "2026-11-01T00:00:00Z/2026-11-02T00:00:00Z",
        "2026-11-02T00:00:00Z/2026-11-03T00:00:00Z",
    ]
    assert all(e.state is CommitState.COMPLETE for e in entries)
    [checkpoint] = _checkpoints(tmp_path)
    assert checkpoint["watermark"] == "2026-11-03T00:00:00Z"


def test_a_workload_without_incremental_needs_an_interval(tmp_path: Path) -> None:
    """No interval and no checkpoint configuration is a clear config error."""
    _sqlite_source(tmp_path / "src.db", [])
    w = parse_workload(
        {
            "workload": "events",
            "release": "r1",
            "deployment": "test",
            "journal": "sqlite:///journal.db",
            "source": {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"},
            "target": {"kind": "sqlite", "url": "sqlite:///wh.db", "table": "events"},
            "load": {"strategy": "append"},
        },
        base_dir=tmp_path,
    )
    with Runner(w) as runner, pytest.raises(ConfigInvalid, match="not incremental"):
        runner.run()


def test_a_changed_definition_under_the_same_operation_is_an_intent_conflict(
    tmp_path: Path,
) -> None:
    """Same interval (same operation id), another cursor column: refused before any I/O."""
    _sqlite_source(tmp_path / "src.db", [(1, "a", "2026-11-01 01:00:00")])
    with sqlite3.connect(tmp_path / "src.db") as conn:
        conn.execute("ALTER TABLE events ADD COLUMN changed_at TIMESTAMP")
    source = {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"}
    with Runner(_workload(tmp_path, source), environ=CRASH) as runner, pytest.raises(InjectedFault):
        runner.run(interval=DAY1)
    failpoints.configure(None)
    changed = _workload(tmp_path, {**source, "cursor_column": "changed_at"})
    with Runner(changed) as runner, pytest.raises(IntentConflict):
        runner.run(interval=DAY1)
    assert _target_ids(tmp_path) == []


def test_cli_lists_checkpoints(tmp_path: Path) -> None:
    """`dpone checkpoints list --json` shows the watermark the run moved."""
    _sqlite_source(tmp_path / "src.db", [(1, "a", "2026-11-01 01:00:00")])
    w = _workload(tmp_path, {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"})
    with Runner(w) as runner:
        runner.run(interval=DAY1)
    cli = CliRunner()
    result = cli.invoke(
        app, ["checkpoints", "list", "--journal", f"sqlite:///{tmp_path}/journal.db", "--json"]
    )
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert row["workload_id"] == "events"
    assert row["watermark"] == "2026-11-02T00:00:00Z"
    text = cli.invoke(app, ["checkpoints", "list", "--journal", f"sqlite:///{tmp_path}/journal.db"])
    assert "2026-11-02T00:00:00Z" in text.output


# ---------------------------------------------------------------------- contiguity
def _advance(start: str, end: str) -> CheckpointAdvance:
    return CheckpointAdvance.of(
        stream="sha256:" + "0" * 64,
        workload_id="events",
        partition="-",
        target_identity="sqlite:/x#events",
        origin=parse_interval(DAY1).start,
        interval=parse_interval(f"{start}/{end}"),
    )


def _complete(journal: Any, op: str, advance: CheckpointAdvance) -> None:
    entry = journal.create_intent(
        operation_id=op,
        intent_digest="sha256:" + "1" * 64,
        metadata={},
        actor="t",
        lease_owner="t",
        lease_ttl_seconds=60,
    )
    committing = journal.compare_and_set(
        operation_id=op,
        expected_version=entry.version,
        expected_states=frozenset({CommitState.PREPARING}),
        next_state=CommitState.COMMITTING,
        lease_epoch=entry.lease_epoch,
        actor="t",
    )
    journal.complete_with_checkpoint(
        operation_id=op,
        expected_version=committing.version,
        expected_states=frozenset({CommitState.COMMITTING}),
        lease_epoch=entry.lease_epoch,
        actor="t",
        checkpoint=advance,
    )


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def checkpoint_journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemoryCommitJournal()
        return
    if request.param == "sqlite":
        journal: Any = SqliteCommitJournal(tmp_path / "j.db")
    else:
        from dpone.adapters.journal.postgres import PostgresCommitJournal

        schema = request.getfixturevalue("pg_schema")
        journal = PostgresCommitJournal(request.getfixturevalue("pg_available"), schema=schema)
    try:
        yield journal
    finally:
        journal.close()


def test_the_watermark_moves_only_contiguously(checkpoint_journal: Any) -> None:
    """A later interval completing first waits; the gap's completion chains over both."""
    journal = checkpoint_journal
    stream = _advance("2026-11-01", "2026-11-02").stream_id
    _complete(journal, "sha256:" + "a" * 64, _advance("2026-11-02", "2026-11-03"))
    cp = journal.get_checkpoint(stream)
    assert cp.watermark == to_micros(parse_interval(DAY1).start)
    assert cp.pending == 1
    _complete(journal, "sha256:" + "b" * 64, _advance("2026-11-01", "2026-11-02"))
    cp = journal.get_checkpoint(stream)
    assert cp.watermark == to_micros(parse_interval("2026-11-02/2026-11-03").end)
    assert cp.pending == 0
    assert cp.operation_id == "sha256:" + "b" * 64
    [listed] = journal.list_checkpoints()
    assert listed.watermark == cp.watermark


def test_a_refused_complete_promotes_nothing(checkpoint_journal: Any) -> None:
    """A CAS conflict on COMPLETE leaves the checkpoint untouched (one transaction)."""
    journal = checkpoint_journal
    advance = _advance("2026-11-01", "2026-11-02")
    op = "sha256:" + "c" * 64
    entry = journal.create_intent(
        operation_id=op,
        intent_digest="sha256:" + "1" * 64,
        metadata={},
        actor="t",
        lease_owner="t",
        lease_ttl_seconds=60,
    )
    committing = journal.compare_and_set(
        operation_id=op,
        expected_version=entry.version,
        expected_states=frozenset({CommitState.PREPARING}),
        next_state=CommitState.COMMITTING,
        lease_epoch=entry.lease_epoch,
        actor="t",
    )
    with pytest.raises(JournalConflict):
        journal.complete_with_checkpoint(
            operation_id=op,
            expected_version=committing.version,
            expected_states=frozenset({CommitState.COMMITTING}),
            lease_epoch=entry.lease_epoch + 1,  # a stale epoch
            actor="t",
            checkpoint=advance,
        )
    assert journal.get_checkpoint(advance.stream_id) is None
    assert journal.get(op).state is CommitState.COMMITTING


def test_atomic_mode_on_postgres_promotes_in_the_target_transaction(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """Journal and target in one PostgreSQL database: data, COMPLETE, watermark in one commit."""
    from dpone.adapters.journal.postgres import PostgresCommitJournal

    _sqlite_source(tmp_path / "src.db", [(1, "a", "2026-11-01 01:00:00")])
    w = parse_workload(
        {
            "workload": "events",
            "release": "r1",
            "deployment": "test",
            "journal": pg_available,
            "journal_schema": pg_schema,
            "source": {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"},
            "target": {
                "kind": "postgres",
                "url": pg_available,
                "table": f"{pg_schema}.events",
                "fence_schema": pg_schema,
            },
            "load": {"strategy": "append"},
            "incremental": {"start": ORIGIN},
        },
        base_dir=tmp_path,
    )
    with Runner(w, environ=CRASH) as runner, pytest.raises(InjectedFault):
        runner.run(interval=DAY1)
    journal = PostgresCommitJournal(pg_available, schema=pg_schema)
    try:
        assert journal.list_checkpoints() == []  # the rolled-back transaction promoted nothing
    finally:
        journal.close()
    with Runner(w) as runner:
        result = runner.run(interval=DAY1)
    assert result.mode.value == "atomic"
    journal = PostgresCommitJournal(pg_available, schema=pg_schema)
    try:
        [checkpoint] = journal.list_checkpoints()
    finally:
        journal.close()
    assert checkpoint.as_dict()["watermark"] == "2026-11-02T00:00:00Z"
    assert checkpoint.operation_id == result.operation_id


def test_a_replay_catches_the_watermark_up_after_a_completion_without_it(
    tmp_path: Path,
) -> None:
    """COMPLETE written without the checkpoint (operator path): the next replay promotes."""
    _sqlite_source(tmp_path / "src.db", [(1, "a", "2026-11-01 01:00:00")])
    w = _workload(tmp_path, {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"})
    with (
        Runner(w, environ={"DPONE_FAILPOINTS": "after:fence.mutate=raise"}) as runner,
        pytest.raises(InjectedFault),
    ):
        runner.run(interval=DAY1)  # committed in the target, the journal says COMMITTING
    journal = SqliteCommitJournal(tmp_path / "journal.db")
    try:
        [entry] = journal.list_entries()
        assert entry.state is CommitState.COMMITTING
        lease = journal.acquire_lease(operation_id=entry.operation_id, owner="op", ttl_seconds=5)
        journal.compare_and_set(  # what a COMPLETE without checkpoint looks like
            operation_id=entry.operation_id,
            expected_version=lease.version,
            expected_states=frozenset({CommitState.COMMITTING}),
            next_state=CommitState.COMPLETE,
            lease_epoch=lease.lease_epoch,
            actor="op",
        )
        assert journal.list_checkpoints() == []
    finally:
        journal.close()
    with Runner(w) as runner:
        assert runner.run(interval=DAY1).replayed
    [checkpoint] = _checkpoints(tmp_path)
    assert checkpoint["watermark"] == "2026-11-02T00:00:00Z"
    assert _target_ids(tmp_path) == [1]


def test_cli_run_without_interval_uses_the_checkpoint(tmp_path: Path) -> None:
    """`dpone run WORKLOAD` with no --interval loads [watermark, next) and moves it."""
    _sqlite_source(
        tmp_path / "src.db", [(1, "a", "2026-11-01 01:00:00"), (2, "b", "2026-11-02 01:00:00")]
    )
    (tmp_path / "events.yaml").write_text(
        "workload: events\nrelease: r1\ndeployment: test\njournal: sqlite:///journal.db\n"
        "source: {kind: sqlite_table, url: 'sqlite:///src.db', table: events}\n"
        "target: {kind: sqlite, url: 'sqlite:///wh.db', table: events}\n"
        "load: {strategy: append}\n"
        "incremental: {start: '2026-11-01T00:00:00Z', max_interval_seconds: 86400}\n",
        encoding="utf-8",
    )
    cli = CliRunner()
    for expected in ([1], [1, 2]):
        result = cli.invoke(app, ["run", str(tmp_path / "events.yaml"), "--json", "-q"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["state"] == "COMPLETE"
        assert _target_ids(tmp_path) == expected
    [checkpoint] = _checkpoints(tmp_path)
    assert checkpoint["watermark"] == "2026-11-03T00:00:00Z"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_concurrent_completions_chain_the_watermark(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Six intervals completed at once by six threads: the watermark ends past all of them."""
    import threading

    def open_journal() -> Any:
        if kind == "sqlite":
            return SqliteCommitJournal(tmp_path / "j.db")
        from dpone.adapters.journal.postgres import PostgresCommitJournal

        return PostgresCommitJournal(
            request.getfixturevalue("pg_available"), schema=request.getfixturevalue("pg_schema")
        )

    days = [f"2026-11-{d:02d}" for d in range(1, 8)]
    open_journal().close()  # migrate once, before the race
    errors: list[BaseException] = []

    def complete(index: int) -> None:
        journal = open_journal()
        try:
            _complete(
                journal, "sha256:" + f"{index:x}" * 64, _advance(days[index], days[index + 1])
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            journal.close()

    threads = [threading.Thread(target=complete, args=(i,)) for i in reversed(range(6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    journal = open_journal()
    try:
        [checkpoint] = journal.list_checkpoints()
    finally:
        journal.close()
    assert checkpoint.as_dict()["watermark"] == "2026-11-07T00:00:00Z"
    assert checkpoint.pending == 0
