"""SIGKILL campaigns on PostgreSQL journal + PostgreSQL target: real processes, real server."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpone.contracts.journal import JournalEntry
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
from dpone.testing.pg_probe import fence_holders, idle_after, lock_waiters, wait_until

pytestmark = pytest.mark.crash

psycopg = pytest.importorskip("psycopg")

ROWS = 1_000
INTERVAL = "2026-11-01/2026-11-02"
RUN = ("run", "w.yaml", "--interval", INTERVAL, "--no-progress", "-q")
KILLED = -9

WORKLOAD = """\
workload: orders
release: "2026.11.0"
deployment: crash
journal: {journal}
journal_schema: {schema}
lease_ttl_seconds: {ttl}
source:
  kind: csv
  path: {data}
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target:
  kind: postgres
  url: {target}
  table: {schema}.orders
  fence_schema: {schema}
  lock_timeout_seconds: {lock}
load: {{strategy: append, key: [order_id], interval_column: ordered_at}}
"""


def with_db(dsn: str, db: str) -> str:
    """The same server, another database."""
    return dsn.rsplit("/", 1)[0] + "/" + db


@dataclass
class Route:
    """One isolated PostgreSQL route: a schema in the target DB (and in the journal DB)."""

    root: Path
    schema: str
    journal_dsn: str
    target_dsn: str

    def workload(
        self,
        *,
        rows: int = ROWS,
        ttl: float = 30,
        lock: float = 10,
        data: str = "orders.csv",
        name: str = "w.yaml",
        start_id: int = 0,
    ) -> None:
        if "{" not in data:
            write_orders_csv(self.root / data, rows, start_id=start_id)
        with psycopg.connect(self.target_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        (self.root / name).write_text(
            WORKLOAD.format(
                journal=self.journal_dsn,
                target=self.target_dsn,
                schema=self.schema,
                ttl=ttl,
                lock=lock,
                data=data,
            ),
            encoding="utf-8",
        )

    def counts(self) -> tuple[int, int]:
        with psycopg.connect(self.target_dsn) as conn:
            row = conn.execute(
                f'SELECT count(*), count(DISTINCT order_id) FROM "{self.schema}".orders'
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def journal(self):  # type: ignore[no-untyped-def]
        from dpone.adapters.journal.postgres import PostgresCommitJournal

        return PostgresCommitJournal(self.journal_dsn, schema=self.schema)

    def assert_exactly_once(self, rows: int = ROWS) -> None:
        assert self.counts() == (rows, rows)
        [entry] = self.assert_all_complete(1)
        assert entry.result is not None
        assert entry.result["rows_written"] == rows

    def assert_all_complete(self, operations: int) -> list[JournalEntry]:
        """``operations`` entries, each COMPLETE with a coherent history, and the run
        ledger telling the same truth (its runs, attempts, the last COMPLETE)."""
        journal = self.journal()
        try:
            entries = journal.list_entries()
            assert [e.state for e in entries] == [CommitState.COMPLETE] * operations
            for entry in entries:
                history = journal.history(entry.operation_id)
                assert check_history(history) == [], history
                problems = ledger_problems(
                    journal, operation_id=entry.operation_id, journal_epoch=entry.lease_epoch
                )
                assert problems == [], problems
        finally:
            journal.close()
        return entries


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["forward", "atomic"])
def route(request: pytest.FixtureRequest, pg_available: str, tmp_path: Path) -> Iterator[Route]:
    """Atomic: journal and target in one database. Forward: the journal in another one."""
    schema = f"c_{uuid.uuid4().hex[:10]}"
    journal_dsn = pg_available if request.param == "atomic" else with_db(pg_available, "postgres")
    yield Route(root=tmp_path, schema=schema, journal_dsn=journal_dsn, target_dsn=pg_available)
    _drop(pg_available, schema)
    if journal_dsn != pg_available:
        _drop(journal_dsn, schema)


@pytest.mark.parametrize("point", FAILPOINT_NAMES)
def test_kill_at_every_failpoint_then_rerun_writes_exactly_once(route: Route, point: str) -> None:
    """SIGKILL at the failpoint, rerun until it ends: every row exactly once, COMPLETE."""
    route.workload()
    first = run_dpone(RUN, cwd=route.root, failpoints=f"{point}=kill")
    assert first.returncode in (KILLED, 0), first.stderr
    outcome = run_until_done(RUN, cwd=route.root)
    assert outcome.final == 0, outcome.last_stderr
    assert EXIT_COMMIT_UNKNOWN not in outcome.codes
    route.assert_exactly_once()


def test_atomic_and_forward_modes_are_chosen_by_location(route: Route) -> None:
    """Same database: atomic; another database: forward recovery."""
    route.workload()
    proc = run_dpone((*RUN[:-1], "--json"), cwd=route.root)
    assert proc.returncode == 0, proc.stderr
    expected = "atomic" if route.journal_dsn == route.target_dsn else "forward_recovery"
    assert f'"mode": "{expected}"' in proc.stdout


FIRST_ATTEMPT = [
    "after:journal.create",
    "before:fence.mutate",
    "fence.mutate.before_commit",
    "after:fence.mutate",
    "before:COMPLETE",
    "after:COMPLETE",
]


def test_first_attempt_points_are_really_reached(route: Route) -> None:
    """Guard against a vacuous matrix: these points kill a first attempt on PostgreSQL."""
    for point in FIRST_ATTEMPT:
        _drop(route.target_dsn, route.schema)
        if route.journal_dsn != route.target_dsn:
            _drop(route.journal_dsn, route.schema)
        route.workload(rows=20)
        proc = run_dpone(RUN, cwd=route.root, failpoints=f"{point}=kill")
        assert proc.returncode == KILLED, f"{point} was not reached ({proc.returncode})"


def _wait_state(route: Route, state: CommitState, timeout: float = 30) -> None:
    journal = route.journal()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entries = journal.list_entries()
            if entries and entries[0].state is state:
                return
            time.sleep(0.05)
    finally:
        journal.close()
    raise AssertionError(f"the operation never reached {state.value}")


# the statement A's data transaction runs last before fence.mutate.before_commit
MARKED = "UPDATE %dpone_fence% SET state = 'committed'%"


def _lease_expired(route: Route) -> bool:
    """The journal's one entry has a lease that expired by the journal server's clock."""
    with psycopg.connect(route.journal_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT bool_and(lease_expires_at <= clock_timestamp()) "
            f'FROM "{route.schema}".dpone_journal'
        ).fetchone()
    return row is not None and row[0] is True


def _alive(proc: subprocess.Popen[str], name: str) -> None:
    if proc.poll() is not None:
        _, err = proc.communicate()
        raise AssertionError(f"{name} exited early with {proc.returncode}: {err}")


@pytest.mark.parametrize("variant", ["b_waits", "b_times_out"])
def test_zombie_writer_holding_the_fence_lock(
    pg_available: str, tmp_path: Path, variant: str
) -> None:
    """A frozen mid-transaction (SIGSTOP), lease expires, B takes over; A resumes: one mutation.

    Every step waits for what it needs to see, never for a fixed time, so a loaded machine
    only slows the test down: A is seen idle inside its transaction holding the fence lock
    before it is frozen (and again once frozen), the lease is seen expired by the journal
    server's clock before B starts, and B is seen blocked on the lock (or has given up on it)
    while A is still frozen.
    """
    schema = f"z_{uuid.uuid4().hex[:10]}"
    route = Route(
        root=tmp_path,
        schema=schema,
        journal_dsn=with_db(pg_available, "postgres"),
        target_dsn=pg_available,
    )
    started: list[subprocess.Popen[str]] = []
    try:
        # B's lock bound: long enough to outwait A, or short enough to give up first
        route.workload(ttl=1, lock=30 if variant == "b_waits" else 1)
        # the pause only has to outlast the poll below; time.sleep keeps an absolute
        # monotonic deadline, so once resumed A sleeps only what is left of it
        a = start_dpone(RUN, cwd=tmp_path, failpoints="fence.mutate.before_commit=sleep(6)")
        started.append(a)
        holders: set[int] = set()

        def a_holds_the_lock() -> bool:
            _alive(a, "A")
            holders.update(fence_holders(pg_available, schema, last_statement=MARKED))
            return bool(holders)

        wait_until("A to pause in its data transaction, fence marked", a_holds_the_lock)
        os.kill(a.pid, signal.SIGSTOP)
        # checked again once frozen: A did not slip past the commit before SIGSTOP
        assert fence_holders(pg_available, schema) == holders, "A froze too late"
        # A's lease (ttl 1 s) expires; its heartbeat is frozen too
        wait_until("A's lease to expire", lambda: _lease_expired(route))
        b = start_dpone(RUN, cwd=tmp_path)
        started.append(b)
        if variant == "b_waits":

            def b_blocked() -> bool:
                _alive(b, "B")
                return bool(lock_waiters(pg_available, schema))

            wait_until("B to wait for the zombie's fence lock", b_blocked)
            assert b.poll() is None, "B must wait for the zombie's lock, not guess"
        else:
            # B gives up on the lock while A still holds it, frozen
            b.wait(timeout=60)
            assert fence_holders(pg_available, schema) == holders
        os.kill(a.pid, signal.SIGCONT)
        _, a_err = a.communicate(timeout=60)
        _, b_err = b.communicate(timeout=60)
        if variant == "b_waits":
            assert b.returncode == 0, b_err
        else:
            assert b.returncode == 75, b_err  # FENCE_UNAVAILABLE: bounded, never a guess
            assert "DPONE_TARGET_COMMIT_FENCE_UNAVAILABLE" in b_err
        # A's stale CAS is refused; it re-reads and either replays B's COMPLETE, finishes
        # the journal itself at a new epoch, or finds B still holding the lease (5)
        assert a.returncode in (0, 5), a_err
        outcome = run_until_done(RUN, cwd=tmp_path)
        assert outcome.final == 0
        route.assert_exactly_once()
        journal = route.journal()
        try:
            [entry] = journal.list_entries()
            history = journal.history(entry.operation_id)
        finally:
            journal.close()
        # A wrote at epoch 1; the journal's COMPLETE came from a later epoch: A's own CAS
        # with its stale epoch was refused and A re-read the truth
        complete = [t for t in history if t.to_state is CommitState.COMPLETE and t.kind != "lease"]
        assert complete
        assert all(t.lease_epoch > 1 for t in complete), history
        # the ledger: A's attempt 1 was superseded by B's; A never completed the run
        ledger = route.journal()
        try:
            [run] = ledger.list_runs()
            attempts = ledger.attempts(run.run_id)
        finally:
            ledger.close()
        assert (attempts[0].attempt, attempts[0].state) == (1, AttemptState.SUPERSEDED), attempts
        assert attempts[1].attempt == 2
        assert attempts[-1].state is AttemptState.COMPLETE
    finally:
        for proc in started:  # a failed step must not leave a frozen process behind
            if proc.poll() is None:
                kill(proc)
        _drop(pg_available, schema)
        _drop(with_db(pg_available, "postgres"), schema)


RACE_WORKER = Path(__file__).with_name("_race_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forward", "atomic"])
def test_race_8_processes_50_operations_with_random_kills(
    pg_available: str, tmp_path: Path, mode: str
) -> None:
    """8 worker processes race over 50 operations while random ones are SIGKILLed.

    In atomic mode each worker's Runner tries an operation after a new one without a
    lookup (ADR 0019), so those tries race, are killed and meet finished operations too.
    """
    rng = random.Random(8050)
    schema = f"r_{uuid.uuid4().hex[:10]}"
    route = Route(
        root=tmp_path,
        schema=schema,
        journal_dsn=pg_available if mode == "atomic" else with_db(pg_available, "postgres"),
        target_dsn=pg_available,
    )
    ops = 50
    try:
        for i in range(ops):
            write_orders_csv(tmp_path / "data" / f"p{i}.csv", 200, start_id=i * 1000)
        route.workload(rows=1, ttl=2, data="data/p{partition}.csv")
        workers: list[subprocess.Popen[bytes]] = []

        def spawn(seed: int) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [sys.executable, str(RACE_WORKER), str(tmp_path / "w.yaml"), str(ops), str(seed)],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )

        workers = [spawn(n) for n in range(8)]
        kills = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(w.poll() is None for w in workers):
            # Short, random gaps: the workers finish the 50 operations in a few seconds,
            # and at least 6 kills must land among them.
            time.sleep(rng.uniform(0.05, 0.35))
            alive = [i for i, w in enumerate(workers) if w.poll() is None]
            if alive and kills < 12:
                victim = rng.choice(alive)
                workers[victim].kill()
                workers[victim].communicate()
                kills += 1
                workers[victim] = spawn(100 + kills)
        for w in workers:
            _, err = w.communicate(timeout=120)
            assert w.returncode in (0, -9), err.decode()
        assert kills >= 6
        # every operation finishes on a rerun, nothing written twice, nothing lost
        for i in range(ops):
            run = (
                "run",
                "w.yaml",
                "--interval",
                INTERVAL,
                "--partition",
                str(i),
                "-q",
                "--no-progress",
            )
            outcome = run_until_done(run, cwd=tmp_path)
            assert outcome.final == 0, outcome.last_stderr
            assert EXIT_COMMIT_UNKNOWN not in outcome.codes
        assert route.counts() == (ops * 200, ops * 200)
        journal = route.journal()
        try:
            entries = journal.list_entries(limit=1000)
            assert len(entries) == ops
            assert {e.state for e in entries} == {CommitState.COMPLETE}
            for e in entries:
                assert check_history(journal.history(e.operation_id)) == []
        finally:
            journal.close()
    finally:
        _drop(pg_available, schema)
        _drop(with_db(pg_available, "postgres"), schema)


# the journal's lookup of the run and its entry, its last statement before the birth
LOOKED_UP = "SELECT r.*, e.*%dpone_runs%dpone_journal%"


@pytest.fixture
def private_pg() -> Iterator[object]:
    """A throwaway PostgreSQL server of the test's own (never the shared one)."""
    from dpone.testing.pg_instance import PrivatePostgres

    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def test_journal_outage_mid_run(pg_available: str, tmp_path: Path, private_pg: object) -> None:
    """The journal's server stops before COMMITTING: no write, exit 75; after restart, once."""
    from dpone.testing.pg_instance import PrivatePostgres

    assert isinstance(private_pg, PrivatePostgres)
    schema = f"o_{uuid.uuid4().hex[:10]}"
    route = Route(root=tmp_path, schema=schema, journal_dsn=private_pg.dsn, target_dsn=pg_available)
    try:
        route.workload()
        run = start_dpone(RUN, cwd=tmp_path, failpoints="before:COMMITTING=sleep(2)")

        def paused_before_committing() -> bool:
            _alive(run, "the run")
            return idle_after(private_pg.dsn, LOOKED_UP)

        # the run looked its operation up, the last journal statement before the birth
        wait_until("the run to pause before COMMITTING", paused_before_committing)
        private_pg.stop(mode="immediate")
        _, err = run.communicate(timeout=60)
        assert run.returncode == 75, err
        assert "DPONE_TARGET_COMMIT_JOURNAL_UNAVAILABLE" in err
        with psycopg.connect(pg_available) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".orders',)).fetchone()
            rows = 0
            if exists and exists[0]:
                rows = conn.execute(f'SELECT count(*) FROM "{schema}".orders').fetchone()[0]
        assert rows == 0  # no target mutation began without a durable COMMITTING
        down = run_dpone(RUN, cwd=tmp_path)
        assert down.returncode == 75
        private_pg.start()
        outcome = run_until_done(RUN, cwd=tmp_path)
        assert outcome.final == 0, outcome.last_stderr
        route.assert_exactly_once()
    finally:
        _drop(pg_available, schema)


def test_journal_outage_after_the_target_commit(
    pg_available: str, tmp_path: Path, private_pg: object
) -> None:
    """The journal dies after the data committed: the rerun completes without writing again."""
    from dpone.testing.pg_instance import PrivatePostgres

    assert isinstance(private_pg, PrivatePostgres)
    schema = f"o_{uuid.uuid4().hex[:10]}"
    route = Route(root=tmp_path, schema=schema, journal_dsn=private_pg.dsn, target_dsn=pg_available)
    try:
        route.workload()
        run = start_dpone(RUN, cwd=tmp_path, failpoints="after:fence.mutate=sleep(2)")

        def target_committed() -> bool:
            assert run.poll() is None, "the run ended before the journal went down"
            try:
                return route.counts() == (ROWS, ROWS)
            except psycopg.errors.UndefinedTable:
                return False  # the data transaction has not committed the table yet

        wait_until("the target transaction to commit", target_committed)
        private_pg.stop(mode="immediate")
        _, err = run.communicate(timeout=60)
        assert run.returncode in (6, 75), err
        assert route.counts() == (ROWS, ROWS)
        private_pg.start()
        outcome = run_until_done(RUN, cwd=tmp_path)
        assert outcome.final == 0, outcome.last_stderr
        route.assert_exactly_once()
    finally:
        _drop(pg_available, schema)


# A Runner process that SIGKILLs itself right after run() returned, its COMPLETE sent
# behind it and not yet read (ADR 0017), or (with a failpoint) right after sending it.
BEHIND_CHILD = """
import os, signal, sys
from dpone.api import Runner
from dpone.runtime import failpoints
with Runner(sys.argv[1]) as runner:
    if len(sys.argv) > 2:
        failpoints.configure(sys.argv[2])
    result = runner.run(interval="2026-11-01/2026-11-02")
    assert result.rows_written == 1000 and not result.replayed, result
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    ("failpoint", "refused"),
    [(None, False), ("after:COMPLETE=kill", False), (None, True)],
    ids=["returned", "sent", "refused"],
)
def test_kill_with_the_complete_behind_the_caller_then_rerun(
    pg_available: str, tmp_path: Path, failpoint: str | None, refused: bool
) -> None:
    """Forward mode through a Runner: the process dies with its COMPLETE sent and unread.
    Whether the journal kept it (COMPLETE) or not (COMMITTING: ``refused`` makes the
    journal refuse it, with a trigger), a rerun ends COMPLETE with every row exactly once
    and a run ledger that agrees."""
    schema = f"b_{uuid.uuid4().hex[:10]}"
    route = Route(
        root=tmp_path,
        schema=schema,
        journal_dsn=with_db(pg_available, "postgres"),
        target_dsn=pg_available,
    )
    try:
        route.workload(ttl=1)
        s = f'"{schema}"'
        if refused:
            migrating = route.journal()
            migrating.migrate()
            migrating.close()
            with psycopg.connect(route.journal_dsn, autocommit=True) as conn:
                conn.execute(
                    f"CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "IF NEW.state = 'COMPLETE' THEN RAISE EXCEPTION 'refused'; END IF; "
                    "RETURN NEW; END $$"
                )
                conn.execute(
                    f"CREATE TRIGGER refuse BEFORE UPDATE ON {s}.dpone_journal "
                    f"FOR EACH ROW EXECUTE FUNCTION {s}.refuse()"
                )
        argv = [sys.executable, "-c", BEHIND_CHILD, str(tmp_path / "w.yaml")]
        child = subprocess.run(
            [*argv, *([failpoint] if failpoint else [])],
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == KILLED, child.stderr
        assert route.counts() == (ROWS, ROWS)
        journal = route.journal()
        try:
            [entry] = journal.list_entries()
            if refused:
                assert entry.state is CommitState.COMMITTING, entry
            else:
                assert entry.state in (CommitState.COMPLETE, CommitState.COMMITTING), entry
        finally:
            journal.close()
        if refused:
            with psycopg.connect(route.journal_dsn, autocommit=True) as conn:
                conn.execute(f"DROP TRIGGER refuse ON {s}.dpone_journal")
        time.sleep(1.2)  # a COMMITTING entry's lease (1 s) runs out
        outcome = run_until_done(RUN, cwd=tmp_path)
        assert outcome.final == 0, outcome.last_stderr
        assert EXIT_COMMIT_UNKNOWN not in outcome.codes
        route.assert_exactly_once()
    finally:
        _drop(pg_available, schema)
        _drop(with_db(pg_available, "postgres"), schema)


AHEAD_CHILD = """
import os, signal, sys, time
import psycopg
from dpone.adapters.journal import _ahead
from dpone.api import Runner
workload, when, journal, schema = sys.argv[1:5]
with Runner(workload) as runner:
    for partition in ("0", "1"):  # the table is created, then its plan checked
        runner.run(interval="2026-11-01/2026-11-02", partition=partition)
    real = _ahead.SendsAhead.send

    def send_then_die(self, statement, params):
        answer = real(self, statement, params)
        if answer is not None and when == "committed":
            with psycopg.connect(journal, autocommit=True) as conn:
                query = f'SELECT count(*) FROM "{schema}".dpone_journal WHERE operation_id = %s'
                while conn.execute(query, (params["operation_id"],)).fetchone() != (1,):
                    time.sleep(0.01)
        if answer is not None:  # the birth sent, its answer unread, the target untouched
            os.kill(os.getpid(), signal.SIGKILL)
        return answer

    _ahead.SendsAhead.send = send_then_die
    runner.run(interval="2026-11-01/2026-11-02", partition="2")
"""


@pytest.mark.parametrize("when", ["sent", "committed"])
def test_kill_with_the_birth_sent_ahead_and_unread_then_rerun(
    pg_available: str, tmp_path: Path, when: str
) -> None:
    """Forward mode through a Runner: the process dies right after sending a new operation's
    birth (ADR 0021), once at once and once after the birth committed. The target was not
    touched; a rerun ends COMPLETE with every row exactly once and a run ledger that
    agrees."""
    schema = f"a_{uuid.uuid4().hex[:10]}"
    route = Route(
        root=tmp_path,
        schema=schema,
        journal_dsn=with_db(pg_available, "postgres"),
        target_dsn=pg_available,
    )
    rows = 200
    try:
        for i in range(3):
            write_orders_csv(tmp_path / "data" / f"p{i}.csv", rows, start_id=i * 1000)
        route.workload(ttl=1, data="data/p{partition}.csv")
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                AHEAD_CHILD,
                str(tmp_path / "w.yaml"),
                when,
                route.journal_dsn,
                schema,
            ],
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == KILLED, child.stderr
        assert route.counts() == (2 * rows, 2 * rows)  # nothing of the third operation
        journal = route.journal()
        try:
            states = sorted(e.state.value for e in journal.list_entries())
        finally:
            journal.close()
        # the third operation's entry: born (the server read the birth before the kill),
        # or not; once the birth was seen committed, born
        landed = ["COMMITTING", "COMPLETE", "COMPLETE"]
        assert states == landed if when == "committed" else states in (landed[1:], landed)
        time.sleep(1.2)  # a COMMITTING entry's lease (1 s) runs out
        rerun = ("run", "w.yaml", "--interval", INTERVAL, "--partition", "2", "-q", "--no-progress")
        outcome = run_until_done(rerun, cwd=tmp_path)
        assert outcome.final == 0, outcome.last_stderr
        assert EXIT_COMMIT_UNKNOWN not in outcome.codes
        assert route.counts() == (3 * rows, 3 * rows)
        route.assert_all_complete(3)
    finally:
        _drop(pg_available, schema)
        _drop(with_db(pg_available, "postgres"), schema)


# An atomic Runner whose third operation is its first small one through the fused
# statement (ADR 0022): the first two create the table and check its plan. It waits for
# a go file before the third, so the test can block the fence table first.
FUSED_CHILD = """
import sys, time
from pathlib import Path
from dpone.api import Runner
workload, go = sys.argv[1], Path(sys.argv[2])
with Runner(workload) as runner:
    for partition in ("0", "1"):
        runner.run(interval="2026-11-01/2026-11-02", partition=partition)
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.01)
    runner.run(interval="2026-11-01/2026-11-02", partition="2")
"""

SMALL = 10  # rows per partition: the small path


@pytest.mark.parametrize("blocked", ["before the gate", "in its rows"])
def test_kill_while_the_fused_statement_waits_then_rerun(
    pg_available: str, tmp_path: Path, blocked: str
) -> None:
    """Atomic mode through a Runner: the process is SIGKILLed while its one fused
    statement is sent and waits on the server, either before it runs at all (the test
    locks the fence table) or past the operation's lock with its entry and fence row
    written (an uncommitted writer holds one of its rows' keys). The orphaned statement
    then runs to its commit, unread by anyone: a commit its client never saw. The rerun
    finds it COMPLETE and replays; every row is there exactly once, and the journal and
    the run ledger agree."""
    schema = f"f_{uuid.uuid4().hex[:10]}"
    route = Route(root=tmp_path, schema=schema, journal_dsn=pg_available, target_dsn=pg_available)
    try:
        for part in range(3):
            write_orders_csv(tmp_path / f"p{part}.csv", SMALL, start_id=part * SMALL)
        route.workload(data="p{partition}.csv")
        go = tmp_path / "go"
        child = subprocess.Popen(
            [sys.executable, "-c", FUSED_CHILD, str(tmp_path / "w.yaml"), str(go)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr
            with psycopg.connect(pg_available) as holder:
                if blocked == "before the gate":
                    holder.execute(f'LOCK TABLE "{schema}".dpone_fence IN EXCLUSIVE MODE')
                else:
                    holder.execute(f'CREATE UNIQUE INDEX ON "{schema}".orders (order_id)')
                    holder.commit()
                    holder.execute(
                        f'INSERT INTO "{schema}".orders VALUES (%s, %s, 0, now())',
                        (2 * SMALL, "held"),  # partition 2's first key, uncommitted
                    )
                go.touch()
                wait_until(
                    "the fused statement to wait", lambda: bool(lock_waiters(pg_available, schema))
                )
                [orphan] = lock_waiters(pg_available, schema)
                gated = holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory' "
                    "AND granted",
                    (orphan,),
                ).fetchone()
                assert gated == ((0,) if blocked == "before the gate" else (1,))
                kill(child)
                assert child.wait(30) == KILLED
                if blocked == "before the gate":
                    holder.commit()  # the orphaned statement now runs, commits, finds no one
                else:
                    holder.rollback()  # the held key is free: the orphan's rows go in
            with psycopg.connect(pg_available, autocommit=True) as conn:
                wait_until(
                    "the orphaned backend to end",
                    lambda: (
                        conn.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (orphan,)
                        ).fetchone()
                        == (0,)
                    ),
                )
        finally:
            if child.poll() is None:
                kill(child)
                child.wait(30)
        assert route.counts() == (3 * SMALL, 3 * SMALL)  # committed with no client to tell
        rerun = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys\nfrom dpone.api import Runner\n"
                "with Runner(sys.argv[1]) as r:\n"
                "    print(r.run(interval='2026-11-01/2026-11-02', partition='2').replayed)",
                str(tmp_path / "w.yaml"),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert rerun.returncode == 0, rerun.stderr
        assert rerun.stdout.strip() == "True"
        assert route.counts() == (3 * SMALL, 3 * SMALL)
        route.assert_all_complete(3)
    finally:
        _drop(pg_available, schema)
