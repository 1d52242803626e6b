"""PostgreSQL benchmarks, measured side by side in one run (issue 3 budgets).

1. 1M rows: `dpone run` (atomic: journal in the target database; forward: journal in
   another database) against a plain psycopg COPY of the same CSV in one transaction,
   all as whole processes. Budgets: ratio <= 1.05 atomic, <= 1.10 forward; RSS < 150 MB.
2. 2,000 operations of 10 rows through the Python API (one Runner) against one plain
   transaction per operation (INSERT of 10 rows). Budgets: ratio <= 1.5 atomic, <= 3 forward,
   judged on passes where the three take turns of 500 operations each (--turns; see
   _interleaved and INTERLEAVE_BLOCK); the separate rounds' ratios are printed beside them.
3. Replaying the 2,000 finished operations: <= 0.5 ms each, zero target writes.
4. WAL syncs per small operation from pg_stat_wal: <= 2 atomic, <= 4 forward.
5. (reported, no budget) The floor: the one statement an atomic small operation sends
   (ADR 0022), replayed alone (through psycopg as dpone sends it, and through libpq
   directly), beside the plain loop and dpone itself, and where dpone's client CPU goes
   by phase (bench_floor).

Every run first prints what the host gives every contender alike (host_profile): its Python
speed, a round trip and a commit. The small budgets are ratios over a plain loop whose time
is client CPU on one host and round trips and WAL flushes on another (docs/benchmarks.md).

Usage: python bench/bench_postgres.py [--dsn postgresql://postgres@127.0.0.1:5432/test]
       [--rows 1000000] [--repeat 3] [--ops 2000] [--turns 500] [--only bulk|small|floor]
       [--private] [--warm]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from dpone.testing.crash import write_orders_csv

if TYPE_CHECKING:
    from dpone.config.workload import Workload

PLAIN_COPY = r"""
import sys, psycopg
with psycopg.connect(sys.argv[1]) as conn:
    conn.execute(f'CREATE TABLE "{sys.argv[3]}".plain (order_id bigint, customer text, '
                 'amount double precision, ordered_at timestamptz)')
    sql = f'COPY "{sys.argv[3]}".plain FROM STDIN (FORMAT csv, HEADER true)'
    with conn.cursor().copy(sql) as cp:
        with open(sys.argv[2], "rb") as fh:
            while chunk := fh.read(1 << 20):
                cp.write(chunk)
"""

WORKLOAD = """\
workload: bench
release: "bench"
deployment: bench
journal: {journal}
journal_schema: {schema}
source:
  kind: csv
  path: {data}
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target: {{kind: postgres, url: {target}, table: {schema}.{table}, fence_schema: {schema}}}
load: {{strategy: append}}
"""


#: Operations per contender and turn in the interleaved passes (_interleaved). Short
#: turns cost the contender that does more per operation: each switch leaves it slower
#: for tens of operations (2026-12-02, 2,000 operations, forward / atomic over plain:
#: turns of 50 gave 3.19-3.34x / 2.04-2.15x, of 100 3.32x / 2.09x, of 250 2.81-2.95x /
#: 1.97-2.02x, of 500 2.81-2.82x / 1.78-1.85x, of 1,000 2.79-2.90x / 1.83-1.89x;
#: docs/benchmarks.md). A Runner's operations run back to back, so turns are long
#: enough for that to settle and still rotate, so that drift meets every contender.
INTERLEAVE_BLOCK = 500
#: The issue's small-operation budgets: a mode's time over the plain loop's.
SMALL_BUDGETS = {"atomic": 1.5, "forward": 3.0}


def other_db(dsn: str, db: str) -> str:
    return dsn.rsplit("/", 1)[0] + "/" + db


def compile_dpone() -> None:
    """Write dpone's bytecode once, as ``pip install`` does for an installed package.

    From a source checkout with PYTHONDONTWRITEBYTECODE set (this machine's default),
    every ``dpone run`` process would otherwise compile its ~40 modules again (about
    0.25 s of CPU) while the baselines import precompiled site-packages.
    """
    import compileall

    import dpone

    compileall.compile_dir(Path(dpone.__file__).parent, quiet=1)


def child(argv: list[str], cwd: Path) -> tuple[float, float, float]:
    """Run argv to the end; return (seconds, peak RSS MB, CPU seconds) of that child alone."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed: {err}")
    return took, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def schema_sql(dsn: str, sql: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql)


def _dpone_run(work: Path, name: str, interval: str = "2026-11-01/2026-11-02") -> list[str]:
    return [
        sys.executable,
        "-m",
        "dpone",
        "run",
        name,
        "--interval",
        interval,
        "--no-progress",
        "-q",
    ]


def remember_parse(path: Path) -> None:
    """Leave ``path``'s parse in the workload cache, as an earlier run of it did (ADR 0015)."""
    from dpone.config.workload import load_workload

    load_workload(path)


def _warm(work: Path, dsn: str, schema: str) -> None:
    """Create both modes' journal, fence and table in ``schema`` (untimed): a 1-row load
    each into the table the timed load then appends to, as every later daily load finds it."""
    write_orders_csv(work / "one.csv", 1)
    for mode, journal in (("atomic", dsn), ("forward", other_db(dsn, "postgres"))):
        name = f"warm-{mode}.yaml"
        (work / name).write_text(
            WORKLOAD.format(
                journal=journal, schema=schema, data="one.csv", target=dsn, table=f"{mode}_orders"
            ),
            encoding="utf-8",
        )
        # the day before: another operation into the same table (the timed load's own
        # interval would be the same operation with another intent, and be refused)
        child(_dpone_run(work, name, "2026-10-31/2026-11-01"), work)


def bench_bulk(
    work: Path, dsn: str, rows: int, repeat: int, *, warm: bool = False
) -> dict[str, object]:
    """The 1M-row loads; with ``warm``, the journal and fence tables exist beforehand."""
    data = work / "orders.csv"
    write_orders_csv(data, rows)
    # Settled, as an upstream step's file is: a file written less than 3 s before its
    # load is "racy" and its stream is hashed besides the stat check (ADR 0004).
    time.sleep(3.5)
    times: dict[str, list[float]] = {"plain_copy": [], "atomic": [], "forward": []}
    cpu: dict[str, list[float]] = {"plain_copy": [], "atomic": [], "forward": []}
    rss: list[float] = []
    for i in range(repeat):
        schema = f"b_{uuid.uuid4().hex[:8]}"
        schema_sql(dsn, f'CREATE SCHEMA "{schema}"')
        try:
            if warm:
                _warm(work, dsn, schema)
            # the contender that runs right after a 1M-row load pays for its WAL and dirty
            # pages being flushed: rotate who goes first, so every contender takes every slot
            contenders = ["plain_copy", "atomic", "forward"]
            shift = i % len(contenders)
            for mode in contenders[shift:] + contenders[:shift]:
                if mode == "plain_copy":
                    t, _, c = child(
                        [sys.executable, "-c", PLAIN_COPY, dsn, str(data), schema], work
                    )
                    times["plain_copy"].append(t)
                    cpu["plain_copy"].append(c)
                    continue
                journal = dsn if mode == "atomic" else other_db(dsn, "postgres")
                name = f"{mode}{i}.yaml"
                (work / name).write_text(
                    WORKLOAD.format(
                        journal=journal,
                        schema=schema,
                        data="orders.csv",
                        target=dsn,
                        table=f"{mode}_orders",
                    ),
                    encoding="utf-8",
                )
                if warm:
                    remember_parse(work / name)
                t, peak, c = child(_dpone_run(work, name), work)
                times[mode].append(t)
                cpu[mode].append(c)
                rss.append(peak)
            with psycopg.connect(dsn) as conn:
                for table in ("plain", "atomic_orders", "forward_orders"):
                    n = conn.execute(f'SELECT count(*) FROM "{schema}".{table}').fetchone()
                    assert n is not None
                    warmed = 1 if warm and table != "plain" else 0  # _warm's one row
                    assert n[0] == rows + warmed, (table, n)
            print(
                f"  round {i + 1}: plain COPY {times['plain_copy'][-1]:.2f}s  "
                f"atomic {times['atomic'][-1]:.2f}s  forward {times['forward'][-1]:.2f}s",
                flush=True,
            )
        finally:
            schema_sql(dsn, f'DROP SCHEMA "{schema}" CASCADE')
            schema_sql(other_db(dsn, "postgres"), f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    base = min(times["plain_copy"])
    return {
        "rows": rows,
        "journal_and_fence": "existing (--warm)" if warm else "created by each round's first run",
        "plain_copy_s": round(base, 3),
        "atomic_s": round(min(times["atomic"]), 3),
        "forward_s": round(min(times["forward"]), 3),
        "ratio_atomic": round(min(times["atomic"]) / base, 3),
        "ratio_forward": round(min(times["forward"]) / base, 3),
        "ratio_atomic_median": round(
            statistics.median(times["atomic"]) / statistics.median(times["plain_copy"]), 3
        ),
        "ratio_forward_median": round(
            statistics.median(times["forward"]) / statistics.median(times["plain_copy"]), 3
        ),
        "peak_rss_mb": round(max(rss), 1),
        # the client process's own CPU (user + system), median: steadier than wall time
        # on a shared machine; the server's work is the same for every contender
        "client_cpu_s_median": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
        "rounds_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "ratio_atomic_per_round": [
            round(a / p, 3) for p, a in zip(times["plain_copy"], times["atomic"], strict=True)
        ],
        "ratio_forward_per_round": [
            round(f / p, 3) for p, f in zip(times["plain_copy"], times["forward"], strict=True)
        ],
    }


def host_profile(dsn: str, *, batches: int = 3, each: int = 1000) -> dict[str, float]:
    """What this host gives every contender alike, printed before the figures that depend
    on it: the small budgets are ratios over the plain loop, whose time is mostly the
    client's CPU on one host and the server's round trips and WAL flush on another.

    ``python_ms``: one million iterations of a plain Python loop (this client's CPU speed);
    ``select1_ms``: a ``SELECT 1`` round trip; ``commit_ms``: a one-row INSERT and its
    COMMIT (the round trips and the WAL flush). Each the median of ``batches`` batches.
    """

    def python_loop() -> float:
        began = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        return (time.perf_counter() - began) * 1000

    def per_call(call: Callable[[], object]) -> float:
        began = time.perf_counter()
        for _ in range(each):
            call()
        return (time.perf_counter() - began) * 1000 / each

    def select_one() -> None:
        conn.execute("SELECT 1").fetchone()

    def commit_one() -> None:
        # a table of its own schema: a temporary table's commit flushes no WAL
        txn.execute(f'INSERT INTO "{schema}".host_profile VALUES (1)')
        txn.commit()

    with (
        _fresh_schema(dsn) as schema,
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn) as txn,
    ):
        txn.execute(f'CREATE TABLE "{schema}".host_profile (n int)')
        txn.commit()
        figures = {
            "python_ms": [python_loop() for _ in range(batches)],
            "select1_ms": [per_call(select_one) for _ in range(batches)],
            "commit_ms": [per_call(commit_one) for _ in range(batches)],
        }
    return {name: round(statistics.median(values), 4) for name, values in figures.items()}


def wal_syncs(dsn: str) -> int:
    """Cluster-wide WAL syncs, as the server's statistics have them after 1.2 s.

    A backend reports its syncs when it ends, or when idle at most once a second and
    otherwise only after a 10 s idle timeout: read this once the sessions whose syncs
    count have ended, or a count may miss up to all of them.
    """
    time.sleep(1.2)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


def _small_workload(work: Path, dsn: str, journal: str, schema: str, table: str) -> Workload:
    from dpone.config.workload import parse_workload

    return parse_workload(
        {
            "workload": "small",
            "release": "bench",
            "deployment": "bench",
            "journal": journal,
            "journal_schema": schema,
            "source": {
                "kind": "csv",
                "path": "small/p{partition}.csv",
                "columns": {
                    "order_id": "integer",
                    "customer": "text",
                    "amount": "real",
                    "ordered_at": "timestamp",
                },
            },
            "target": {
                "kind": "postgres",
                "url": dsn,
                "table": f"{schema}.{table}",
                "fence_schema": schema,
            },
            "load": {"strategy": "append"},
        },
        base_dir=work,
    )


def _table_writes(dsn: str, schema: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = %s",
            (schema, table),
        ).fetchone()
    return int(row[0]) if row else 0


def _plain_writer(conn: psycopg.Connection[Any], schema: str, ops: int) -> Callable[[int], None]:
    """Create the plain table; return the baseline's operation ``i``: one transaction of its
    10 rows (built beforehand, outside any timing) on ``conn``."""
    conn.execute(
        f'CREATE TABLE "{schema}".plain (order_id bigint, customer text, '
        "amount double precision, ordered_at timestamptz)"
    )
    conn.commit()
    insert = f'INSERT INTO "{schema}".plain VALUES (%s, %s, %s, %s)'
    rows = [[(i * 10 + j, "c", 1.0, "2026-11-01T00:00:00Z") for j in range(10)] for i in range(ops)]

    def write(i: int) -> None:
        with conn.cursor() as cur:
            cur.executemany(insert, rows[i])
        conn.commit()

    return write


@contextmanager
def _fresh_schema(dsn: str) -> Iterator[str]:
    """A new schema for one round or pass, dropped afterwards in both databases."""
    schema = f"s_{uuid.uuid4().hex[:8]}"
    schema_sql(dsn, f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        schema_sql(dsn, f'DROP SCHEMA "{schema}" CASCADE')
        schema_sql(other_db(dsn, "postgres"), f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _small_plain(dsn: str, schema: str, ops: int) -> dict[str, float]:
    """One plain transaction of 10 rows per operation, one connection."""
    with psycopg.connect(dsn) as conn:
        write = _plain_writer(conn, schema, ops)
        syncs = wal_syncs(dsn)
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(ops):
            write(i)
        took = (time.perf_counter() - started) * 1000 / ops
        cpu_ms = (time.process_time() - cpu) * 1000 / ops
    # counted once the session has ended: its statistics are then flushed (wal_syncs)
    return {"ms": took, "cpu_ms": cpu_ms, "wal": (wal_syncs(dsn) - syncs) / ops}


def _small_dpone(
    work: Path, dsn: str, journal: str, schema: str, mode: str, ops: int
) -> dict[str, float]:
    """ops operations through one Runner, then a replay of all of them through another."""
    from dpone.api import Runner

    table = f"{mode}_orders"
    workload = _small_workload(work, dsn, journal, schema, table)
    out: dict[str, float] = {}
    with Runner(workload) as runner:
        runner.run(interval="2026-11-01/2026-11-02", partition="0")  # warm up, DDL
        syncs = wal_syncs(dsn)
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(1, ops):
            runner.run(interval="2026-11-01/2026-11-02", partition=str(i))
        out["ms"] = (time.perf_counter() - started) * 1000 / (ops - 1)
        out["cpu_ms"] = (time.process_time() - cpu) * 1000 / (ops - 1)  # this client's
    # The writer's sessions have ended, so their statistics are flushed (an idle backend
    # may hold its own for 10 s; wal_syncs): any WAL sync or table write counted from
    # here on was made by the replays. The warm-up's own pending syncs count here too.
    out["wal"] = (wal_syncs(dsn) - syncs) / (ops - 1)
    before = _table_writes(dsn, schema, table)
    with Runner(workload) as runner:
        assert runner.run(interval="2026-11-01/2026-11-02", partition="0").replayed  # warm
        syncs = wal_syncs(dsn)
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(ops):
            r = runner.run(interval="2026-11-01/2026-11-02", partition=str(i))
            assert r.replayed
        out["replay_ms"] = (time.perf_counter() - started) * 1000 / ops
        out["replay_cpu_ms"] = (time.process_time() - cpu) * 1000 / ops
    out["replay_wal"] = wal_syncs(dsn) - syncs
    out["replay_target_writes"] = _table_writes(dsn, schema, table) - before
    with psycopg.connect(dsn) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{schema}".{table}').fetchone()
    assert count is not None
    assert count[0] == ops * 10, count
    return out


def _interleaved(work: Path, dsn: str, schema: str, ops: int, block: int) -> dict[str, float]:
    """Plain, atomic and forward in turns of ``block`` operations each, in one process.

    On a shared machine an operation's time drifts within seconds (the plain loop's rounds
    ranged 0.54-1.0 ms minutes apart on 2026-12-02), so the best round of one contender may
    meet a calmer machine than the best of another. In turns of ``block`` operations, the
    order rotated every turn, each contender meets the same drift: the ratio of their
    totals over the same turns is what the code costs. Every row is checked at the end.
    """
    from dpone.api import Runner

    interval = "2026-11-01/2026-11-02"
    with (
        psycopg.connect(dsn) as conn,
        Runner(_small_workload(work, dsn, dsn, schema, "atomic_orders")) as atomic,
        Runner(
            _small_workload(work, dsn, other_db(dsn, "postgres"), schema, "forward_orders")
        ) as forward,
    ):

        def through(runner: Runner) -> Callable[[int], None]:
            def run_one(i: int) -> None:
                runner.run(interval=interval, partition=str(i))

            return run_one

        contenders = {
            "plain": _plain_writer(conn, schema, ops),
            "atomic": through(atomic),
            "forward": through(forward),
        }
        for run_one in contenders.values():
            run_one(0)  # warm up: DDL, the journal's first statements
        names = list(contenders)
        totals = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)  # this client's CPU: the rest of the time is waiting
        turns: list[dict[str, float]] = []
        for turn, start in enumerate(range(1, ops, block)):
            ids = range(start, min(start + block, ops))
            took: dict[str, float] = {}
            for name in names[turn % 3 :] + names[: turn % 3]:
                began, began_cpu = time.perf_counter(), time.process_time()
                for i in ids:
                    contenders[name](i)
                took[name] = time.perf_counter() - began
                totals[name] += took[name]
                cpu[name] += time.process_time() - began_cpu
            turns.append(took)
        for table in ("plain", "atomic_orders", "forward_orders"):
            count = conn.execute(f'SELECT count(*) FROM "{schema}".{table}').fetchone()
            assert count is not None, table
            assert count[0] == ops * 10, (table, count)
    done = ops - 1
    out = {f"{name}_ms": totals[name] * 1000 / done for name in names}
    out.update({f"{name}_cpu_ms": cpu[name] * 1000 / done for name in names})
    for mode, budget in SMALL_BUDGETS.items():
        out[f"{mode}_ratio"] = totals[mode] / totals["plain"]
        out[f"{mode}_ratio_turns_median"] = statistics.median(t[mode] / t["plain"] for t in turns)
        # The ratio this mode would have if its client did no more work than the plain
        # loop's: only its extra waiting (its server statements, round trips, flushes)
        # added. What is left of the budget after that is all the extra client CPU it may
        # spend; compare it with the extra it spends.
        wait_extra = (out[f"{mode}_ms"] - out[f"{mode}_cpu_ms"]) - (
            out["plain_ms"] - out["plain_cpu_ms"]
        )
        out[f"{mode}_ratio_if_no_extra_cpu"] = (out["plain_ms"] + wait_extra) / out["plain_ms"]
        out[f"{mode}_extra_cpu_allowed_ms"] = budget * out["plain_ms"] - (
            out["plain_ms"] + wait_extra
        )
        out[f"{mode}_extra_cpu_ms"] = out[f"{mode}_cpu_ms"] - out["plain_cpu_ms"]
    return out


def bench_small(
    work: Path, dsn: str, ops: int, repeat: int, turns: int = INTERLEAVE_BLOCK
) -> dict[str, object]:
    """Rounds alternate plain, atomic, forward; each round in a fresh schema."""
    src = work / "small"
    src.mkdir(exist_ok=True)
    for i in range(ops):
        write_orders_csv(src / f"p{i}.csv", 10, start_id=i * 10)
    rounds: list[dict[str, dict[str, float]]] = []
    for n in range(repeat):
        with _fresh_schema(dsn) as schema:
            got = {"plain": _small_plain(dsn, schema, ops)}
            for mode, journal in (("atomic", dsn), ("forward", other_db(dsn, "postgres"))):
                got[mode] = _small_dpone(work, dsn, journal, schema, mode, ops)
        rounds.append(got)
        print(
            f"  round {n + 1}: plain {got['plain']['ms']:.3f} ms  "
            f"atomic {got['atomic']['ms']:.3f} ms (replay {got['atomic']['replay_ms']:.3f})  "
            f"forward {got['forward']['ms']:.3f} ms (replay {got['forward']['replay_ms']:.3f})",
            flush=True,
        )
    passes: list[dict[str, float]] = []
    for n in range(repeat):
        with _fresh_schema(dsn) as schema:
            passes.append(_interleaved(work, dsn, schema, ops, turns))
        got_pass = passes[-1]
        print(
            f"  interleaved {n + 1} (turns of {turns}): plain "
            f"{got_pass['plain_ms']:.3f} ms  atomic {got_pass['atomic_ms']:.3f} ms "
            f"({got_pass['atomic_ratio']:.2f}x)  forward {got_pass['forward_ms']:.3f} ms "
            f"({got_pass['forward_ratio']:.2f}x)",
            flush=True,
        )
        for mode in ("atomic", "forward"):
            print(
                f"    {mode}: {got_pass[f'{mode}_ratio_if_no_extra_cpu']:.2f}x if its client "
                f"did no more than the plain loop's; the budget then leaves "
                f"{got_pass[f'{mode}_extra_cpu_allowed_ms']:.3f} ms of extra client CPU, "
                f"it spends {got_pass[f'{mode}_extra_cpu_ms']:.3f} ms",
                flush=True,
            )

    def col(mode: str, key: str) -> list[float]:
        return [r[mode][key] for r in rounds]

    out: dict[str, object] = {"ops": ops, "rounds": repeat}
    plain_best, plain_median = min(col("plain", "ms")), statistics.median(col("plain", "ms"))
    out["plain_ms_per_op"] = round(plain_best, 3)
    out["plain_ms_per_op_median"] = round(plain_median, 3)
    out["plain_wal_syncs_per_op"] = round(statistics.median(col("plain", "wal")), 2)
    out["plain_cpu_ms_per_op_median"] = round(statistics.median(col("plain", "cpu_ms")), 3)
    for mode in ("atomic", "forward"):
        best, median = min(col(mode, "ms")), statistics.median(col(mode, "ms"))
        out[f"{mode}_ms_per_op"] = round(best, 3)
        out[f"{mode}_ms_per_op_median"] = round(median, 3)
        out[f"{mode}_ratio"] = round(best / plain_best, 2)
        out[f"{mode}_ratio_median"] = round(median / plain_median, 2)
        out[f"{mode}_wal_syncs_per_op"] = round(statistics.median(col(mode, "wal")), 2)
        out[f"{mode}_cpu_ms_per_op_median"] = round(statistics.median(col(mode, "cpu_ms")), 3)
        out[f"{mode}_replay_cpu_ms_per_op_median"] = round(
            statistics.median(col(mode, "replay_cpu_ms")), 3
        )
        out[f"{mode}_replay_ms_per_op"] = round(min(col(mode, "replay_ms")), 3)
        out[f"{mode}_replay_ms_per_op_median"] = round(statistics.median(col(mode, "replay_ms")), 3)
        out[f"{mode}_replay_wal_syncs"] = max(col(mode, "replay_wal"))
        out[f"{mode}_replay_target_writes"] = max(col(mode, "replay_target_writes"))
    for mode in ("atomic", "forward"):
        # the budget's judge: the median pass of the interleaved turns (_interleaved)
        out[f"{mode}_ratio_interleaved"] = round(
            statistics.median(p[f"{mode}_ratio"] for p in passes), 2
        )
    out["each_round"] = [{m: {k: round(v, 3) for k, v in r[m].items()} for m in r} for r in rounds]
    out["each_interleaved"] = [{k: round(v, 3) for k, v in p.items()} for p in passes]
    return out


def bench_small_private(work: Path, ops: int, repeat: int, turns: int) -> dict[str, object]:
    """bench_small on a throwaway cluster (same machine and disk, no other sessions)."""
    from dpone.testing.pg_instance import PrivatePostgres

    with PrivatePostgres() as server:
        server.wait_ready()
        schema_sql(server.dsn, "CREATE DATABASE bench")
        out = bench_small(work, other_db(server.dsn, "bench"), ops, repeat, turns)
    out["server"] = "private (initdb, fsync on)"
    return out


@contextmanager
def _wrapped(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """``owner.name`` replaced by ``wrap(original)`` inside the block; measurement only."""
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _record_statements(runner: Any, interval: str, partition: str) -> list[tuple[Any, Any]]:
    """The statement (and parameters) one operation of ``runner`` sends, as psycopg got it,
    then ``(operation_id, run_id)``.

    Recorded by wrapping ``psycopg.Cursor.execute`` for that one call; measurement only.
    """
    sent: list[tuple[Any, Any]] = []

    def recording(execute: Any) -> Any:
        def record(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            sent.append((query, params))
            return execute(self, query, params, **kw)

        return record

    with _wrapped(psycopg.Cursor, "execute", recording):
        result = runner.run(interval=interval, partition=partition)
    # the atomic first attempt (ADR 0022): ONE statement, the lock, the journal's birth,
    # the fence row and the rows
    if len(sent) != 1 or not bytes(sent[0][0]).startswith(FUSED_HEAD):
        heads = [bytes(q).split()[:3] for q, _ in sent]
        raise SystemExit(f"floor: expected the one fused statement of ADR 0022, got {heads}")
    sent.append((result.operation_id, result.run_id))
    return sent


#: how the fused statement of an atomic first attempt begins (ADR 0022)
FUSED_HEAD = b"WITH gate AS MATERIALIZED"


def _renamer(recorded: list[tuple[Any, Any]]) -> Callable[[object, int], object]:
    """A value of the recorded operation with every mention of its operation and run
    renamed for replay ``i`` (under a tag of this writer's, so that writers never meet)."""
    operation_id, run_id = recorded[-1]
    tag = uuid.uuid4().hex[:8]

    def renamed(value: object, i: int) -> object:
        if isinstance(value, str):
            return value.replace(operation_id, f"{operation_id}-{tag}-{i}").replace(
                run_id, f"{run_id}-{tag}-{i}"
            )
        return value

    return renamed


def _statements_writer(
    conn: psycopg.Connection[Any], recorded: list[tuple[Any, Any]]
) -> Callable[[int], None]:
    """Operation ``i``: the recorded statement again, sent as dpone sends it (a
    ``RawCursor`` on an autocommit connection), under fresh identities (every parameter
    naming the recorded operation or run is renamed). The advisory lock key stays the
    recorded one: taken and released by each statement, it is never contended here."""
    (statement, params) = recorded[0]
    renamed = _renamer(recorded)

    def write(i: int) -> None:
        with psycopg.RawCursor(conn) as cur:
            cur.execute(statement, [renamed(v, i) for v in params])
            cur.fetchone()

    return write


def _libpq_writer(
    conn: psycopg.Connection[Any], recorded: list[tuple[Any, Any]]
) -> Callable[[int], None]:
    """Operation ``i``: the recorded statement as "statements" sends it (fresh identities),
    but through libpq directly: prepared once on the server, then sent with
    ``PQsendQueryPrepared``. The parameters are still dumped by psycopg's own adapters on
    every operation. This is the floor under any client that hands psycopg's
    per-statement work (its cursor and prepared-statement cache) to libpq; measurement
    only (psycopg internals)."""
    from psycopg import generators, pq
    from psycopg._queries import PostgresRawQuery
    from psycopg.adapt import Transformer

    renamed = _renamer(recorded)
    pgconn = conn.pgconn
    query, params = recorded[0]
    converted = PostgresRawQuery(Transformer(conn))
    converted.convert(query, params)
    name = f"dpone_floor_{uuid.uuid4().hex[:8]}".encode()
    made = pgconn.prepare(name, converted.query, converted.types)
    if made.status != pq.ExecStatus.COMMAND_OK:
        raise SystemExit("floor: libpq could not prepare the fused statement")

    def write(i: int) -> None:
        converted.dump([renamed(v, i) for v in params])
        pgconn.send_query_prepared(name, converted.params, converted.formats)
        while pgconn.flush():
            pass
        results = conn.wait(generators.fetch_many(pgconn))
        if [r.status for r in results] != [pq.ExecStatus.TUPLES_OK]:
            raise SystemExit(f"floor: libpq replay failed: {results[-1].error_message!r}")

    return write


def bench_floor(work: Path, dsn: str, ops: int, turns: int) -> dict[str, float]:
    """What the atomic small operation's statements cost on their own, beside the plain
    loop and dpone's own operations, in interleaved turns (as _interleaved).

    "statements": the one statement dpone sends for an atomic operation (ADR 0022,
    recorded from a real one), replayed with fresh identities; "libpq": the same
    statement through libpq's calls directly (_libpq_writer). dpone's time over
    "statements" is its client's own work: the source read, planning, identity, the
    journal's parameters and psycopg's handling of them. The budget (1.5x plain) leaves
    it what "statements" does not use.
    """
    from dpone.api import Runner

    src = work / "small"
    src.mkdir(exist_ok=True)
    for i in range(ops + 1):
        write_orders_csv(src / f"p{i}.csv", 10, start_id=i * 10)
    interval = "2026-11-01/2026-11-02"
    with (
        _fresh_schema(dsn) as schema,
        psycopg.connect(dsn, autocommit=True) as replay,
        psycopg.connect(dsn, autocommit=True) as raw,
        psycopg.connect(dsn) as conn,
        Runner(_small_workload(work, dsn, dsn, schema, "atomic_orders")) as atomic,
    ):
        # warm up: the DDL, then an operation that still reads the run ledger and the
        # table's shape (a Runner's first ones do); the third is the steady state
        atomic.run(interval=interval, partition=str(ops))
        atomic.run(interval=interval, partition=str(ops - 1))
        recorded = _record_statements(atomic, interval, str(ops - 2))

        def through(i: int) -> None:
            atomic.run(interval=interval, partition=str(i))

        contenders = {
            "plain": _plain_writer(conn, schema, ops),
            "statements": _statements_writer(replay, recorded),
            "libpq": _libpq_writer(raw, recorded),
            "atomic": through,
        }
        for run_one in contenders.values():
            run_one(0)  # warm up
        names = list(contenders)
        wall = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)
        for turn, start in enumerate(range(1, ops - 2, turns)):
            ids = range(start, min(start + turns, ops - 2))
            shift = turn % len(names)
            for name in names[shift:] + names[:shift]:
                began, began_cpu = time.perf_counter(), time.process_time()
                for i in ids:
                    contenders[name](i)
                wall[name] += time.perf_counter() - began
                cpu[name] += time.process_time() - began_cpu
        done = ops - 3
        count = conn.execute(f'SELECT count(*) FROM "{schema}".atomic_orders').fetchone()
        assert count is not None
        # dpone's rows, and the replays' (written into the same table), every one once
        replays = len(contenders) - 2  # all but plain and atomic
        assert count[0] == 10 * (ops + 1) + 10 * replays * (done + 1), count
    out = {f"{n}_ms": wall[n] * 1000 / done for n in names}
    out.update({f"{n}_cpu_ms": cpu[n] * 1000 / done for n in names})
    out.update({f"{n}_ratio": wall[n] / wall["plain"] for n in names if n != "plain"})
    out["atomic_over_statements_ms"] = out["atomic_ms"] - out["statements_ms"]
    out["budget_left_for_client_ms"] = (
        SMALL_BUDGETS["atomic"] * out["plain_ms"] - out["statements_ms"]
    )
    out.update(_client_phases(work, dsn, ops, interval))
    return out


def _client_phases(work: Path, dsn: str, ops: int, interval: str) -> dict[str, float]:
    """Where an atomic small operation's client CPU goes, in three phases of each
    ``Runner.run``: before its one statement is sent, inside that ``execute`` (psycopg's
    dump, send and wait, and reading the answer), and after it. The first and the last
    cannot overlap the server's work. Measured in a separate pass (wrapping
    ``psycopg.Cursor.execute``, which adds a little to each)."""
    from dpone.api import Runner

    marks: dict[str, int] = {}

    def marking(execute: Any) -> Any:
        def execute_marked(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            fused = isinstance(query, bytes) and query.startswith(FUSED_HEAD)
            if fused:
                marks["send"] = time.process_time_ns()
            try:
                return execute(self, query, params, **kw)
            finally:
                if fused:
                    marks["sent"] = time.process_time_ns()

        return execute_marked

    spent = dict.fromkeys(("before_send", "execute", "after"), 0)
    with (
        _fresh_schema(dsn) as schema,
        Runner(_small_workload(work, dsn, dsn, schema, "atomic_orders")) as runner,
    ):
        for i in (ops, ops - 1, ops - 2):  # warm up, as bench_floor
            runner.run(interval=interval, partition=str(i))
        with _wrapped(psycopg.Cursor, "execute", marking):
            for i in range(ops - 3):
                marks.clear()
                began = time.process_time_ns()
                runner.run(interval=interval, partition=str(i))
                ended = time.process_time_ns()
                if marks.keys() != {"send", "sent"}:
                    raise SystemExit(f"phases: operation {i} did not take ADR 0022's path")
                spent["before_send"] += marks["send"] - began
                spent["execute"] += marks["sent"] - marks["send"]
                spent["after"] += ended - marks["sent"]
    return {f"atomic_cpu_{k}_ms": v / 1e6 / (ops - 3) for k, v in spent.items()}


def small_checks(small: dict[str, object]) -> dict[str, bool]:
    """The issue's small-operation budgets: the ratios judged on the interleaved passes'
    median (the rounds' best and median ratios are reported beside them)."""
    num = {k: float(v) for k, v in small.items() if isinstance(v, int | float)}
    return {
        **{
            f"small {mode} <= {budget:g}x (interleaved)": num[f"{mode}_ratio_interleaved"] <= budget
            for mode, budget in SMALL_BUDGETS.items()
        },
        "replay <= 0.5 ms": max(num["atomic_replay_ms_per_op"], num["forward_replay_ms_per_op"])
        <= 0.5,
        "replay writes nothing": num["atomic_replay_target_writes"] == 0
        and num["forward_replay_target_writes"] == 0,
        "wal syncs atomic <= 2": num["atomic_wal_syncs_per_op"] <= 2,
        "wal syncs forward <= 4": num["forward_wal_syncs_per_op"] <= 4,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("DPONE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument(
        "--turns",
        type=int,
        default=INTERLEAVE_BLOCK,
        help="small: operations per contender and turn in the interleaved passes",
    )
    parser.add_argument(
        "--only",
        choices=("bulk", "small", "floor"),
        default=None,
        help="run one part of the benchmark (floor: the atomic small operation's statement "
        "alone, beside the plain loop and dpone; see bench_floor)",
    )
    parser.add_argument(
        "--private",
        action="store_true",
        help="small operations on a private PostgreSQL (initdb in a temp dir): pg_stat_wal "
        "then counts only this benchmark's WAL syncs, not other sessions' on a shared server",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="bulk: create the journal and fence tables before each round (untimed), as "
        "every run after a deployment's first finds them; by default each round's dpone "
        "runs create them in a fresh schema",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpone-pgbench-"))
    # the runs' workload cache (ADR 0015), this bench's own: cold rounds never find their
    # file's parse there; --warm rounds find it, as every later run of a file does
    os.environ["DPONE_CACHE_DIR"] = str(work / "cache")
    compile_dpone()
    print("host:", json.dumps(host_profile(args.dsn)), flush=True)
    checks: dict[str, bool] = {}
    try:
        if args.only in (None, "bulk"):
            print(f"bulk: {args.rows:,} rows into PostgreSQL, best of {args.repeat}", flush=True)
            bulk = bench_bulk(work, args.dsn, args.rows, args.repeat, warm=args.warm)
            print(json.dumps(bulk, indent=2))
            checks.update(
                {
                    "bulk atomic <= 1.05": bulk["ratio_atomic"] <= 1.05,  # type: ignore[operator]
                    "bulk forward <= 1.10": bulk["ratio_forward"] <= 1.10,  # type: ignore[operator]
                    "rss < 150 MB": bulk["peak_rss_mb"] < 150,  # type: ignore[operator]
                }
            )
        if args.only in (None, "small"):
            print(
                f"small operations: {args.ops} x 10 rows through the Python API, "
                f"{args.repeat} alternating rounds",
                flush=True,
            )
            if args.private:
                small = bench_small_private(work, args.ops, args.repeat, args.turns)
            else:
                small = bench_small(work, args.dsn, args.ops, args.repeat, args.turns)
            print(json.dumps(small, indent=2))
            checks.update(small_checks(small))
        if args.only in (None, "floor"):
            print(
                f"floor: the atomic small operation's statements alone, {args.ops} operations "
                f"in turns of {args.turns}",
                flush=True,
            )
            print(json.dumps(bench_floor(work, args.dsn, args.ops, args.turns), indent=2))
        for name, ok in checks.items():
            print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
