"""SIGKILL campaigns on the MariaDB and DuckDB routes: real processes, real targets."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dpone.runtime.failpoints import FAILPOINT_NAMES
from dpone.testing.crash import (
    EXIT_COMMIT_UNKNOWN,
    kill,
    run_dpone,
    run_until_done,
    start_dpone,
    write_orders_csv,
)

pytestmark = pytest.mark.crash

ROWS = 500
WORKLOAD = """\
workload: orders
release: "1"
deployment: crash
journal: sqlite:///journal.db
lease_ttl_seconds: 30
source:
  kind: csv
  path: {data}
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target: {target}
load: {{strategy: append}}
"""


@dataclass
class Target:
    """How to point a workload at the target and count what landed there."""

    name: str
    spec: str
    counts: Callable[[], tuple[int, int]]


def _duckdb(root: Path) -> Target:
    def counts() -> tuple[int, int]:
        import duckdb

        path = root / "wh.duckdb"
        if not path.exists():
            return (0, 0)
        with duckdb.connect(str(path), read_only=True) as db:
            found = db.execute(
                "SELECT 1 FROM duckdb_tables() WHERE table_name = 'orders'"
            ).fetchone()
            if not found:
                return (0, 0)
            row = db.execute("SELECT count(*), count(DISTINCT order_id) FROM orders").fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    return Target("duckdb", '{kind: duckdb, url: "duckdb:///wh.duckdb", table: orders}', counts)


def _mariadb(dsn: str) -> Target:
    def counts() -> tuple[int, int]:
        import pymysql

        parts = urlsplit(dsn)
        conn = pymysql.connect(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            database=parts.path.lstrip("/"),
            autocommit=True,
        )
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW TABLES LIKE 'orders'")
                if cur.fetchone() is None:
                    return (0, 0)
                cur.execute("SELECT count(*), count(DISTINCT order_id) FROM orders")
                row = cur.fetchone()
        finally:
            conn.close()
        assert row is not None
        return int(row[0]), int(row[1])

    return Target("mariadb", f'{{kind: mariadb, url: "{dsn}", table: orders}}', counts)


@pytest.fixture(params=["duckdb", "mariadb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "duckdb":
        yield _duckdb(tmp_path)
    else:
        yield _mariadb(request.getfixturevalue("mariadb_database"))


def workload(root: Path, target: Target, *, day: int = 1, rows: int = ROWS) -> tuple[str, ...]:
    data = f"d{day}.csv"
    write_orders_csv(root / data, rows, day=day, start_id=day * 1_000_000)
    (root / f"w{day}.yaml").write_text(
        WORKLOAD.format(data=data, target=target.spec), encoding="utf-8"
    )
    interval = f"2026-11-{day:02d}/2026-11-{day + 1:02d}"
    return ("run", f"w{day}.yaml", "--interval", interval, "--no-progress", "-q")


def wait_for_entry(child: subprocess.Popen[str], journal: Path, timeout: float = 30) -> None:
    """Poll the journal read-only until the run has written its newest entry (or ended)."""
    seen = _entries(journal)
    deadline = time.monotonic() + timeout
    while child.poll() is None and time.monotonic() < deadline:
        if _entries(journal) > seen:
            return
        time.sleep(0.002)


def _entries(journal: Path) -> int:
    if not journal.exists():
        return 0
    try:
        with closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=1)) as db:
            return int(db.execute("SELECT count(*) FROM dpone_journal").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize("point", FAILPOINT_NAMES)
def test_kill_at_every_failpoint_then_rerun_writes_exactly_once(
    tmp_path: Path, target: Target, point: str
) -> None:
    """SIGKILL at the failpoint, rerun until it ends: every row exactly once."""
    run = workload(tmp_path, target)
    first = run_dpone(run, cwd=tmp_path, failpoints=f"{point}=kill")
    assert first.returncode in (-9, 0), first.stderr
    outcome = run_until_done(run, cwd=tmp_path)
    assert outcome.final == 0, outcome.last_stderr
    assert EXIT_COMMIT_UNKNOWN not in outcome.codes
    assert target.counts() == (ROWS, ROWS)


@pytest.mark.slow
def test_random_kills_during_loads(tmp_path: Path, target: Target) -> None:
    """10 loads of 20k rows, each SIGKILLed at a random moment, rerun: no duplicate, no loss."""
    rng = random.Random(f"{target.name}-kills")
    rows, loads, killed = 20_000, 10, 0
    # calibrate: how long a warm load works after its journal entry appears; the
    # first load also creates the target table, so it is timed but not trusted alone
    work = min(_timed_load(tmp_path, target, day=day, rows=rows) for day in (27, 28))
    base = 2 * rows
    for trial in range(loads):
        run = workload(tmp_path, target, day=trial + 1, rows=rows)
        child = start_dpone(run, cwd=tmp_path)
        wait_for_entry(child, tmp_path / "journal.db")
        time.sleep(rng.uniform(0.0, work))
        running = child.poll() is None
        killed += running
        if not running:  # the machine got faster than the calibration: aim earlier
            work *= 0.7
        kill(child)
        outcome = run_until_done(run, cwd=tmp_path)
        assert EXIT_COMMIT_UNKNOWN not in outcome.codes, outcome.codes
        assert outcome.final == 0, outcome.last_stderr
        expected = base + (trial + 1) * rows
        assert target.counts() == (expected, expected)
    assert killed >= 5, f"only {killed} of {loads} loads were killed while running"


def _timed_load(root: Path, target: Target, *, day: int, rows: int) -> float:
    """Seconds one uninterrupted load runs after its journal entry appears."""
    child = start_dpone(workload(root, target, day=day, rows=rows), cwd=root)
    wait_for_entry(child, root / "journal.db")
    started = time.monotonic()
    assert child.wait(timeout=120) == 0
    child.communicate()
    return max(time.monotonic() - started, 0.05)
