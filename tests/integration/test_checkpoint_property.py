"""Property: over random interval orders and crash points, the watermark never lies.

Real SQLite source table, SQLite journal and SQLite target (forward recovery with a
separate journal file, atomic mode with the journal inside the target file). After every
step, whatever crashed where:

- no source row is in the target twice (no interval loaded twice);
- every source row older than the stream's watermark is in the target (the watermark
  never passes data that is not there, so no interval is skipped).

At the end every interval is run once more without faults: all complete, and the target
holds each source row exactly once.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.api import Runner
from dpone.config.workload import Workload, parse_workload
from dpone.contracts.checkpoint import to_micros
from dpone.contracts.identity import Interval
from dpone.contracts.states import CommitState
from dpone.errors import DponeError
from dpone.runtime import failpoints

H0 = datetime(2026, 11, 1, tzinfo=UTC)
HOURS = 4
ROWS_PER_HOUR = 3
CRASH_POINTS = (
    "after:journal.create",
    "before:COMMITTING",
    "after:COMMITTING",
    "before:fence.mutate",
    "fence.mutate.before_commit",
    "after:fence.mutate",
    "before:fence.observe",
    "before:fence.seal",
    "before:PREPARED",
    "before:TARGET_COMMITTED",
    "before:COMPLETE",
    "after:COMPLETE",
    "before:FAILED_PRE_COMMIT",
)


def _interval(index: int) -> Interval:
    return Interval(start=H0 + timedelta(hours=index), end=H0 + timedelta(hours=index + 1))


def _source(path: Path) -> dict[int, datetime]:
    rows: dict[int, datetime] = {}
    for hour in range(HOURS):
        for k in range(ROWS_PER_HOUR):
            rows[hour * 10 + k] = H0 + timedelta(hours=hour, minutes=20 * k)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, updated_at TEXT)")
        conn.executemany(
            "INSERT INTO events VALUES (?, ?)",
            [(i, t.isoformat(sep=" ")) for i, t in rows.items()],
        )
    return rows


def _workload(root: Path, *, atomic: bool) -> Workload:
    return parse_workload(
        {
            "workload": "events",
            "release": "r1",
            "deployment": "test",
            "journal": "sqlite:///wh.db" if atomic else "sqlite:///journal.db",
            "lease_ttl_seconds": 30,
            "source": {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "events"},
            "target": {"kind": "sqlite", "url": "sqlite:///wh.db", "table": "events"},
            "load": {"strategy": "append", "batch_size": 2},
            "incremental": {"start": H0.isoformat(), "max_interval_seconds": 3600},
        },
        base_dir=root,
    )


def _target_ids(root: Path) -> list[int]:
    with sqlite3.connect(root / "wh.db") as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone() is None:
            return []
        return [int(r[0]) for r in conn.execute("SELECT id FROM events")]


def _watermark(root: Path, *, atomic: bool) -> int | None:
    journal = SqliteCommitJournal(root / ("wh.db" if atomic else "journal.db"))
    try:
        found = journal.list_checkpoints()
    finally:
        journal.close()
    return found[0].watermark if found else None


def _run(w: Workload, index: int | None, crash: str | None) -> None:
    environ = {"DPONE_FAILPOINTS": f"{crash}=raise"} if crash else {}
    with Runner(w, environ=environ) as runner:
        try:
            runner.run(interval=None if index is None else _interval(index))
        except DponeError:
            pass  # an injected crash (or its consequence); the invariants must still hold


def _check(root: Path, rows: dict[int, datetime], *, atomic: bool) -> None:
    loaded = _target_ids(root)
    assert len(loaded) == len(set(loaded)), "a row was loaded twice"
    watermark = _watermark(root, atomic=atomic)
    if watermark is not None:
        behind = {i for i, t in rows.items() if to_micros(t) < watermark}
        assert behind <= set(loaded), "the watermark passed rows that are not in the target"


steps = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, HOURS - 1)),  # None: next from the checkpoint
        st.one_of(st.none(), st.sampled_from(CRASH_POINTS)),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=steps, atomic=st.booleans())
def test_watermark_never_passes_missing_data(
    steps: list[tuple[int | None, str | None]], atomic: bool
) -> None:
    """Random order of intervals, random crash points: no skip, no double load."""
    root = Path(tempfile.mkdtemp(prefix="dpone-prop-"))
    try:
        rows = _source(root / "src.db")
        w = _workload(root, atomic=atomic)
        for index, crash in steps:
            _run(w, index, crash)
            _check(root, rows, atomic=atomic)
        failpoints.configure(None)
        for index in range(HOURS):  # finish everything without faults
            with Runner(w) as runner:
                result = runner.run(interval=_interval(index))
            assert result.state is CommitState.COMPLETE
            _check(root, rows, atomic=atomic)
        assert sorted(_target_ids(root)) == sorted(rows)
        watermark = _watermark(root, atomic=atomic)
        assert watermark is not None
        assert watermark >= to_micros(_interval(HOURS - 1).end)
    finally:
        failpoints.configure(None)
        shutil.rmtree(root, ignore_errors=True)
