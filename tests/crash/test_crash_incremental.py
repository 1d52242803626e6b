"""SIGKILL an incremental load: the retry takes the same interval and cut, moves the watermark once.

Real processes (`python -m dpone run` without --interval), real SQLite source, journal
and target. Between the kill and the retry, rows arrive in the source after the cut.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.testing.crash import check_history, run_dpone, run_until_done

pytestmark = pytest.mark.crash

KILLED = -9
WORKLOAD = """\
workload: events
release: r1
deployment: crash
journal: {journal}
lease_ttl_seconds: 30
source: {{kind: sqlite_table, url: "sqlite:///src.db", table: events}}
target: {{kind: sqlite, url: "sqlite:///wh.db", table: events}}
load: {{strategy: append, batch_size: 50}}
incremental: {{start: "2026-11-01T00:00:00Z", max_interval_seconds: 86400}}
"""


def _insert(root: Path, first: int, count: int, day: int) -> None:
    with closing(sqlite3.connect(root / "src.db")) as conn, conn:
        conn.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, updated_at TEXT)")
        conn.executemany(
            "INSERT INTO events VALUES (?, ?)",
            [
                (i, f"2026-11-{day:02d} {i % 24:02d}:{i % 60:02d}:00")
                for i in range(first, first + count)
            ],
        )


def _ids(root: Path) -> list[int]:
    with closing(sqlite3.connect(root / "wh.db")) as conn:
        return sorted(r[0] for r in conn.execute("SELECT id FROM events"))


@pytest.mark.parametrize("mode", ["forward", "atomic"])
@pytest.mark.parametrize(
    "point", ["fence.mutate.before_commit", "after:fence.mutate", "before:COMPLETE"]
)
def test_killed_incremental_run_resumes_the_same_interval(
    tmp_path: Path, mode: str, point: str
) -> None:
    """Kill -> late rows after the cut -> reruns: every row once, one operation per day."""
    journal = "sqlite:///journal.db" if mode == "forward" else "sqlite:///wh.db"
    (tmp_path / "w.yaml").write_text(WORKLOAD.format(journal=journal), encoding="utf-8")
    _insert(tmp_path, 1, 120, day=1)
    killed = run_dpone(["run", "w.yaml", "-q"], cwd=tmp_path, failpoints=f"{point}=kill")
    assert killed.returncode == KILLED, killed.stderr
    _insert(tmp_path, 1000, 30, day=2)  # arrives after the cut of the killed operation
    path = tmp_path / journal.removeprefix("sqlite:///")
    # rerun until the watermark has passed day 2 (in atomic mode a kill after the commit
    # already completed day 1 and moved the watermark: the first rerun loads day 2)
    for _ in range(3):
        done = run_until_done(["run", "w.yaml", "-q"], cwd=tmp_path)
        assert done.final == 0, done.last_stderr
        if _watermark(path) == "2026-11-03T00:00:00Z":
            break
    assert _ids(tmp_path) == [*range(1, 121), *range(1000, 1030)]  # each row once
    store = SqliteCommitJournal(path)
    try:
        entries = store.list_entries()
        intervals = sorted(str(e.metadata["interval"]) for e in entries)
        assert intervals == [  # the killed operation was resumed, not replaced
            "2026-11-01T00:00:00Z/2026-11-02T00:00:00Z",
            "2026-11-02T00:00:00Z/2026-11-03T00:00:00Z",
        ]
        for entry in entries:
            assert check_history(store.history(entry.operation_id)) == []
    finally:
        store.close()


def _watermark(path: Path) -> object:
    store = SqliteCommitJournal(path)
    try:
        found = store.list_checkpoints()
    finally:
        store.close()
    return found[0].as_dict()["watermark"] if found else None
