"""Runner on real SQLite files: executors in one process, durability points per operation."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.api import Runner
from dpone.config.workload import parse_workload
from dpone.contracts.states import CommitState
from dpone.errors import DponeError, LeaseHeld
from dpone.runtime import failpoints
from dpone.testing.crash import write_orders_csv

INTERVAL = "2026-11-01/2026-11-02"


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    failpoints.configure(None)


def workload(root: Path, journal: str):  # type: ignore[no-untyped-def]
    write_orders_csv(root / "orders.csv", 50)
    return parse_workload(
        {
            "workload": "orders",
            "release": "r1",
            "deployment": "test",
            "journal": journal,
            "source": {"kind": "csv", "path": "orders.csv"},
            "target": {"kind": "sqlite", "url": "sqlite:///wh.db", "table": "orders"},
            "load": {"strategy": "append"},
        },
        base_dir=root,
    )


def test_two_executors_in_one_process_never_share_an_epoch(tmp_path: Path) -> None:
    """Threads of one Runner are distinct lease owners: one writes, the other is refused."""
    w = workload(tmp_path, "sqlite:///journal.db")
    failpoints.configure("after:journal.create=sleep(0.5)")
    outcomes: list[object] = []
    with Runner(w) as runner:

        def go() -> None:
            try:
                outcomes.append(runner.run(interval=INTERVAL))
            except DponeError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=go) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    done = [o for o in outcomes if not isinstance(o, DponeError)]
    refused = [o for o in outcomes if isinstance(o, DponeError)]
    assert len(done) >= 1
    assert all(isinstance(o, LeaseHeld) for o in refused)
    journal = SqliteCommitJournal(tmp_path / "journal.db")
    try:
        [entry] = journal.list_entries()
        history = journal.history(entry.operation_id)
    finally:
        journal.close()
    assert entry.state is CommitState.COMPLETE
    owners_by_epoch: dict[int, set[str]] = {}
    for t in history:
        owners_by_epoch.setdefault(t.lease_epoch, set()).add(t.actor)
    assert all(len(owners) == 1 for owners in owners_by_epoch.values()), owners_by_epoch


@pytest.mark.parametrize(
    ("journal", "writes"), [("sqlite:///journal.db", 3), ("sqlite:///wh.db", 2)]
)
def test_journal_writes_per_operation(tmp_path: Path, journal: str, writes: int) -> None:
    """Forward: create+lease, COMMITTING, COMPLETE. Atomic: create+lease, then COMPLETE."""
    with Runner(workload(tmp_path, journal)) as runner:
        result = runner.run(interval=INTERVAL)
    assert result.rows_written == 50
    store = SqliteCommitJournal(tmp_path / journal.removeprefix("sqlite:///"), read_only=True)
    try:
        [entry] = store.list_entries()
    finally:
        store.close()
    assert entry.version == writes
    assert entry.lease_owner is None  # COMPLETE ended the lease in the same write
