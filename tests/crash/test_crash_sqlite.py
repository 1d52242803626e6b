"""SIGKILL campaigns on the embedded default: real processes, real SQLite files."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path

import pytest

from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.contracts.run import AttemptState
from dpone.contracts.states import CommitState
from dpone.runtime.failpoints import FAILPOINT_NAMES
from dpone.testing.crash import (
    EXIT_COMMIT_UNKNOWN,
    check_history,
    kill,
    run_dpone,
    run_until_done,
    start_dpone,
    write_orders_csv,
)
from dpone.testing.ledger_conformance import ledger_problems

pytestmark = pytest.mark.crash

ROWS = 2_000
INTERVAL = "2026-11-01/2026-11-02"
KILLED = -9

WORKLOAD = """\
workload: orders
release: "2026.11.0"
deployment: crash
journal: {journal}
lease_ttl_seconds: 30
source:
  kind: csv
  path: {data}
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target: {target}
load: {{strategy: {strategy}, key: [order_id], interval_column: ordered_at}}
"""

MODES = {
    "forward": (
        "sqlite:///journal.db",
        "{kind: sqlite, url: sqlite:///warehouse.db, table: orders}",
    ),
    "atomic": (
        "sqlite:///warehouse.db",
        "{kind: sqlite, url: sqlite:///warehouse.db, table: orders}",
    ),
}


def make_workload(
    root: Path,
    mode: str,
    *,
    name: str = "w.yaml",
    data: str = "orders.csv",
    rows: int = ROWS,
    day: int = 1,
    start_id: int = 0,
    strategy: str = "append",
) -> Path:
    journal, target = MODES[mode]
    write_orders_csv(root / data, rows, day=day, start_id=start_id)
    path = root / name
    path.write_text(
        WORKLOAD.format(journal=journal, target=target, data=data, strategy=strategy),
        encoding="utf-8",
    )
    return path


def journal_of(root: Path, mode: str) -> SqliteCommitJournal:
    return SqliteCommitJournal(root / ("journal.db" if mode == "forward" else "warehouse.db"))


def target_counts(root: Path, where: str = "1=1") -> tuple[int, int]:
    with closing(sqlite3.connect(root / "warehouse.db")) as db:
        total, distinct = db.execute(
            f"SELECT count(*), count(DISTINCT order_id) FROM orders WHERE {where}"
        ).fetchone()
    return int(total), int(distinct)


def assert_exactly_once(root: Path, mode: str, rows: int = ROWS) -> None:
    """Target holds every row once, the journal is COMPLETE with a coherent history."""
    total, distinct = target_counts(root)
    assert (total, distinct) == (rows, rows)
    journal = journal_of(root, mode)
    try:
        [entry] = journal.list_entries()
        assert entry.state is CommitState.COMPLETE
        assert entry.result is not None
        assert entry.result["rows_written"] == rows
        history = journal.history(entry.operation_id)
        assert check_history(history) == []
        # the run ledger tells the same truth: one run, its attempts, the last one COMPLETE
        problems = ledger_problems(
            journal, operation_id=entry.operation_id, journal_epoch=entry.lease_epoch
        )
        assert problems == [], (problems, journal.attempts(journal.list_runs()[0].run_id))
    finally:
        journal.close()
    with closing(sqlite3.connect(root / "warehouse.db")) as db:
        fence = db.execute("SELECT state, row_count, epoch FROM dpone_fence").fetchall()
    assert [(state, count) for state, count, _ in fence] == [("committed", rows)], (fence, history)


RUN = ("run", "w.yaml", "--interval", INTERVAL, "--no-progress")


@pytest.mark.parametrize("mode", ["forward", "atomic"])
@pytest.mark.parametrize("point", FAILPOINT_NAMES)
def test_kill_at_every_failpoint_then_rerun_writes_exactly_once(
    tmp_path: Path, mode: str, point: str
) -> None:
    """SIGKILL at the failpoint, rerun until it ends: every row exactly once, COMPLETE."""
    make_workload(tmp_path, mode)
    first = run_dpone(RUN, cwd=tmp_path, failpoints=f"{point}=kill")
    assert first.returncode in (KILLED, 0), first.stderr
    outcome = run_until_done(RUN, cwd=tmp_path)
    assert outcome.final == 0, outcome.last_stderr
    assert EXIT_COMMIT_UNKNOWN not in outcome.codes
    assert_exactly_once(tmp_path, mode)


# Points a first attempt always reaches, so the test above really kills there.
FIRST_ATTEMPT = {
    "forward": [
        "after:journal.create",
        "before:COMMITTING",
        "after:COMMITTING",
        "before:fence.mutate",
        "fence.mutate.before_commit",
        "after:fence.mutate",
        # no fence read: the acknowledged commit reports its own fence row (ADR 0013);
        # a resume still observes (resume_points below)
        "before:COMPLETE",
        "after:COMPLETE",
    ],
    "atomic": [
        "after:journal.create",
        "before:fence.mutate",
        "fence.mutate.before_commit",
        "before:COMPLETE",
        "after:fence.mutate",
        "after:COMPLETE",
    ],
}


@pytest.mark.parametrize("mode", ["forward", "atomic"])
def test_first_attempt_points_are_really_reached(tmp_path: Path, mode: str) -> None:
    """Guard against a vacuous matrix: these points kill a first attempt."""
    for i, point in enumerate(FIRST_ATTEMPT[mode]):
        root = tmp_path / str(i)
        root.mkdir()
        make_workload(root, mode, rows=50)
        proc = run_dpone(RUN, cwd=root, failpoints=f"{point}=kill")
        assert proc.returncode == KILLED, f"{point} was not reached ({proc.returncode})"


RESUME_FROM = ["after:COMMITTING", "fence.mutate.before_commit", "after:fence.mutate"]


@pytest.mark.parametrize("second", FAILPOINT_NAMES)
@pytest.mark.parametrize("first", RESUME_FROM)
def test_kill_during_resume_then_rerun_writes_exactly_once(
    tmp_path: Path, first: str, second: str
) -> None:
    """A crash, then a crash of the resuming run at any point, then a clean rerun."""
    make_workload(tmp_path, "forward")
    assert run_dpone(RUN, cwd=tmp_path, failpoints=f"{first}=kill").returncode == KILLED
    resumed = run_dpone(RUN, cwd=tmp_path, failpoints=f"{second}=kill")
    assert resumed.returncode in (KILLED, 0), resumed.stderr
    outcome = run_until_done(RUN, cwd=tmp_path)
    assert outcome.final == 0, outcome.last_stderr
    assert_exactly_once(tmp_path, "forward")


def test_resume_path_points_are_really_reached(tmp_path: Path) -> None:
    """Observe, seal and the PREPARED step are met by a resume after a crash in COMMITTING."""
    resume_points = [
        "after:lease.acquire",
        "before:fence.observe",
        "after:fence.observe",
        "before:fence.seal",
        "after:fence.seal",
        "after:PREPARED",
    ]
    for i, point in enumerate(resume_points):
        root = tmp_path / str(i)
        root.mkdir()
        make_workload(root, "forward", rows=50)
        assert run_dpone(RUN, cwd=root, failpoints="after:COMMITTING=kill").returncode == KILLED
        proc = run_dpone(RUN, cwd=root, failpoints=f"{point}=kill")
        assert proc.returncode == KILLED, f"{point} was not reached ({proc.returncode})"


# Kill in the states only a failure leads to: raise at one point, SIGKILL at the next.
DETOURS = [
    ("before:COMPLETE=raise@1", "after:TARGET_COMMITTED"),
    ("before:COMPLETE=raise", "before:COMMITTED_INCOMPLETE"),
    ("before:COMPLETE=raise", "after:COMMITTED_INCOMPLETE"),
    ("fence.mutate.before_commit=raise", "after:PREPARED"),
    ("fence.mutate.before_commit=raise", "before:FAILED_PRE_COMMIT"),
    ("fence.mutate.before_commit=raise", "after:FAILED_PRE_COMMIT"),
]


@pytest.mark.parametrize(("fault", "point"), DETOURS)
def test_kill_in_failure_states_then_rerun_writes_exactly_once(
    tmp_path: Path, fault: str, point: str
) -> None:
    """TARGET_COMMITTED, COMMITTED_INCOMPLETE, PREPARED, FAILED_PRE_COMMIT: killed there too."""
    make_workload(tmp_path, "forward")
    first = run_dpone(RUN, cwd=tmp_path, failpoints=f"{fault};{point}=kill")
    assert first.returncode == KILLED, (point, first.returncode, first.stderr)
    again = run_dpone(RUN, cwd=tmp_path, failpoints="after:PREPARING=kill")
    assert again.returncode in (KILLED, 0), again.stderr
    outcome = run_until_done(RUN, cwd=tmp_path)
    assert outcome.final == 0, outcome.last_stderr
    assert_exactly_once(tmp_path, "forward")


NONE_WORKLOAD = """\
workload: events
release: "2026.11.0"
deployment: crash
journal: sqlite:///journal.db
source: {kind: csv, path: orders.csv}
target: {kind: jsonl_append, path: out/events.jsonl}
load: {strategy: append}
"""


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


@pytest.mark.parametrize("point", ["after:COMMITTING", "before:fence.mutate", "after:fence.mutate"])
def test_capability_none_kill_in_committing_is_commit_unknown(tmp_path: Path, point: str) -> None:
    """On a route that cannot prove anything, the rerun exits 3 and writes nothing."""
    write_orders_csv(tmp_path / "orders.csv", 300)
    (tmp_path / "w.yaml").write_text(NONE_WORKLOAD, encoding="utf-8")
    out = tmp_path / "out" / "events.jsonl"
    assert run_dpone(RUN, cwd=tmp_path, failpoints=f"{point}=kill").returncode == KILLED
    before = lines(out)
    for _ in range(2):
        rerun = run_dpone(RUN, cwd=tmp_path)
        assert rerun.returncode == EXIT_COMMIT_UNKNOWN, rerun.stderr
        assert "DPONE_TARGET_COMMIT_UNKNOWN" in rerun.stderr
        assert "dpone recovery target-commit plan" in rerun.stderr
        assert lines(out) == before
    journal = SqliteCommitJournal(tmp_path / "journal.db")
    try:
        [entry] = journal.list_entries()
        assert entry.state is CommitState.COMMIT_UNKNOWN
    finally:
        journal.close()


def test_capability_none_kill_before_committing_retries_normally(tmp_path: Path) -> None:
    """Before COMMITTING nothing was written, so even a none route retries and writes once."""
    write_orders_csv(tmp_path / "orders.csv", 300)
    (tmp_path / "w.yaml").write_text(NONE_WORKLOAD, encoding="utf-8")
    assert run_dpone(RUN, cwd=tmp_path, failpoints="after:journal.create=kill").returncode == KILLED
    assert run_until_done(RUN, cwd=tmp_path).final == 0
    assert lines(tmp_path / "out" / "events.jsonl") == 300


@pytest.mark.parametrize("mode", ["forward", "atomic"])
def test_two_processes_on_one_operation_mutate_once(tmp_path: Path, mode: str) -> None:
    """Two executors started at once on the same operation: exactly one mutation."""
    for trial in range(4):
        root = tmp_path / str(trial)
        root.mkdir()
        make_workload(root, mode, rows=5_000)
        procs = [start_dpone(RUN, cwd=root) for _ in range(2)]
        codes = sorted(p.wait(timeout=120) for p in procs)
        for p in procs:
            p.communicate()
        # 5: the other held the lease; 75: a bounded lock wait ran out under load (retryable)
        assert set(codes) <= {0, 5, 75}, codes
        assert 0 in codes
        outcome = run_until_done(RUN, cwd=root)
        assert outcome.final == 0
        assert_exactly_once(root, mode, rows=5_000)
        journal = journal_of(root, mode)
        try:
            [entry] = journal.list_entries()
            steps = [t.to_state for t in journal.history(entry.operation_id) if t.kind != "lease"]
        finally:
            journal.close()
        assert steps.count(CommitState.COMPLETE) == 1


def wait_for_entry(
    child: subprocess.Popen[str], root: Path, mode: str, journal: str | None = None
) -> None:
    """Poll (read-only) until the run has written its journal entry or ended."""
    deadline = time.monotonic() + 30
    while child.poll() is None and time.monotonic() < deadline:
        if has_entry(root / (journal or ("journal.db" if mode == "forward" else "warehouse.db"))):
            return
        time.sleep(0.002)


def has_entry(path: Path) -> bool:
    """True once the journal file holds an entry (read-only peek)."""
    if not path.exists():
        return False
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as db:
            return db.execute("SELECT count(*) FROM dpone_journal").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def state_after_kill(root: Path, mode: str) -> str:
    """The journal state a killed run left behind ('absent' before the intent was written)."""
    if not (root / ("journal.db" if mode == "forward" else "warehouse.db")).exists():
        return "absent"
    journal = journal_of(root, mode)
    try:
        entries = journal.list_entries()
    except Exception:  # killed before the schema existed
        return "absent"
    finally:
        journal.close()
    return entries[0].state.value if entries else "absent"


@pytest.mark.slow
def test_random_kills_during_a_100k_row_load(tmp_path: Path) -> None:
    """20 trials, SIGKILL at a random moment, rerun: no duplicate, no loss, never unknown."""
    rng = random.Random(20261130)
    rows = 100_000
    # calibrate: how long a run works after its journal entry appears
    make_workload(
        tmp_path, "forward", name="calibrate.yaml", data="d0.csv", rows=rows, day=1, start_id=0
    )
    child = start_dpone(
        ("run", "calibrate.yaml", "--interval", "2026-11-01/2026-11-02", "--no-progress", "-q"),
        cwd=tmp_path,
    )
    wait_for_entry(child, tmp_path, "forward", journal="journal.db")
    started = time.monotonic()
    assert child.wait(timeout=120) == 0
    child.communicate()
    load = max(time.monotonic() - started, 0.05)
    seen: list[str] = []
    for trial in range(20):
        mode = "forward" if trial % 2 == 0 else "atomic"
        root = tmp_path / f"t{trial}"
        root.mkdir()
        day = 1 + trial % 28
        make_workload(root, mode, rows=rows, day=day, start_id=trial * 1_000_000)
        run = (
            "run",
            "w.yaml",
            "--interval",
            f"2026-11-{day:02d}/2026-11-{day + 1:02d}",
            "--no-progress",
            "-q",
        )
        child = start_dpone(run, cwd=root)
        # wait until the operation exists, then kill at a random moment of its work
        wait_for_entry(child, root, mode)
        time.sleep(rng.uniform(0.0, load))
        kill(child)
        seen.append(state_after_kill(root, mode))
        outcome = run_until_done(run, cwd=root)
        assert EXIT_COMMIT_UNKNOWN not in outcome.codes, (trial, outcome.codes)
        assert outcome.final == 0, (trial, outcome.last_stderr)
        assert_exactly_once(root, mode, rows=rows)
    # the kills really landed inside the work, not only before or after it
    mid_load = sum(state in ("PREPARING", "COMMITTING") for state in seen)
    assert mid_load >= 6, seen


def test_journal_list_json_shows_the_truth_after_a_crash(tmp_path: Path) -> None:
    """After a kill in COMMITTING, `journal list --json` shows COMMITTING, then COMPLETE."""
    make_workload(tmp_path, "forward")
    assert run_dpone(RUN, cwd=tmp_path, failpoints="after:fence.mutate=kill").returncode == KILLED
    listed = run_dpone(
        ("journal", "list", "--journal", "sqlite:///journal.db", "--json"), cwd=tmp_path
    )
    assert [e["state"] for e in json.loads(listed.stdout)] == ["COMMITTING"]
    assert run_until_done(RUN, cwd=tmp_path).final == 0
    listed = run_dpone(
        ("journal", "list", "--journal", "sqlite:///journal.db", "--json"), cwd=tmp_path
    )
    assert [e["state"] for e in json.loads(listed.stdout)] == ["COMPLETE"]


def _wait_for_state(root: Path, state: CommitState, timeout: float = 30) -> None:
    """Poll (read-only peek) until the journal's one entry is in ``state``."""
    deadline = time.monotonic() + timeout
    path = root / "journal.db"
    while time.monotonic() < deadline:
        try:
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as db:
                found = db.execute("SELECT state FROM dpone_journal").fetchall()
        except sqlite3.Error:
            found = []  # not created yet
        if found == [(state.value,)]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the operation never reached {state.value}")


def test_a_stale_attempt_is_refused_by_fence_journal_and_ledger(tmp_path: Path) -> None:
    """A frozen attempt 1 loses its lease, attempt 2 completes; 1's late writes are refused."""
    path = make_workload(tmp_path, "forward", rows=500)
    path.write_text(
        path.read_text(encoding="utf-8").replace("lease_ttl_seconds: 30", "lease_ttl_seconds: 1"),
        encoding="utf-8",
    )
    a = start_dpone(RUN, cwd=tmp_path, failpoints="before:fence.mutate=sleep(2)")
    try:
        _wait_for_state(tmp_path, CommitState.COMMITTING)
        os.kill(a.pid, signal.SIGSTOP)  # frozen with its lease: the heartbeat stops too
        time.sleep(1.5)  # the lease (ttl 1 s) expires by the journal's clock
        b = run_dpone(RUN, cwd=tmp_path)
        assert b.returncode == 0, b.stderr  # seal at epoch 2: proven absent, written once
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _, a_err = a.communicate(timeout=60)
    # A's write at epoch 1 is refused by the fence; it re-reads the journal, finds B's
    # COMPLETE and returns it; its late ledger write for attempt 1 is refused too
    assert a.returncode == 0, a_err
    assert "did not record the end of attempt 1 (DPONE_LEASE_LOST)" in a_err
    assert_exactly_once(tmp_path, "forward", rows=500)
    journal = journal_of(tmp_path, "forward")
    try:
        [run] = journal.list_runs()
        attempts = [(x.attempt, x.state) for x in journal.attempts(run.run_id)]
        [entry] = journal.list_entries()
        history = journal.history(entry.operation_id)
    finally:
        journal.close()
    assert attempts == [(1, AttemptState.SUPERSEDED), (2, AttemptState.COMPLETE)]
    # the journal never took a state write from epoch 1 after B's lease
    assert all(t.lease_epoch >= 2 for t in history if t.to_state is CommitState.COMPLETE)
