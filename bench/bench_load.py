"""Benchmarks for the embedded default, measured side by side in one run.

1. A 1M-row CSV into SQLite: `dpone run` (append) against a plain sqlite3 load of the
   same parsed rows in one transaction (both in a fresh process; best of N each,
   alternating). Budget: ratio <= 1.15, dpone peak RSS < 150 MB.
2. 1,000 operations of 10 rows through the Python API against plain sqlite3
   transactions of 10 rows: ms per operation, atomic and forward modes, and the
   replay of a finished operation (target untouched).

Usage: python bench/bench_load.py [--rows 1000000] [--repeat 3] [--ops 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

from dpone.testing.crash import write_orders_csv

BASELINE = r"""
import csv, sqlite3, sys
db = sqlite3.connect(sys.argv[2], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE orders (order_id INTEGER, customer TEXT, amount REAL, ordered_at TEXT)")
with open(sys.argv[1], newline="", encoding="utf-8") as fh:
    rows = csv.reader(fh)
    next(rows)
    db.execute("BEGIN")
    batch = []
    for row in rows:
        batch.append(row)
        if len(batch) == 10000:
            db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", batch)
            batch = []
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", batch)
    db.execute("COMMIT")
db.close()
"""

WORKLOAD = """\
workload: bench
release: "bench"
deployment: bench
journal: {journal}
source:
  kind: csv
  path: {data}
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target: {{kind: sqlite, url: sqlite:///{target}, table: orders}}
load: {{strategy: append}}
"""


def timed_child(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Run argv; return (seconds, peak RSS in MB) of that child alone."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    if proc.stderr:
        proc.stderr.close()
    return took, usage.ru_maxrss / 1024


def bench_bulk(work: Path, rows: int, repeat: int) -> dict[str, float]:
    data = work / "orders.csv"
    write_orders_csv(data, rows)
    size_mb = data.stat().st_size / 1e6
    base_times, dpone_times, rss = [], [], []
    for i in range(repeat):
        for f in work.glob("*.db*"):
            f.unlink()
        t, _ = timed_child(
            [sys.executable, "-c", BASELINE, str(data), str(work / f"base{i}.db")], work
        )
        base_times.append(t)
        (work / f"w{i}.yaml").write_text(
            WORKLOAD.format(
                journal=f"sqlite:///journal{i}.db", data="orders.csv", target=f"wh{i}.db"
            ),
            encoding="utf-8",
        )
        t, peak = timed_child(
            [
                sys.executable,
                "-m",
                "dpone",
                "run",
                f"w{i}.yaml",
                "--interval",
                "2026-11-01/2026-11-02",
                "--no-progress",
                "-q",
            ],
            work,
        )
        dpone_times.append(t)
        rss.append(peak)
        with closing(sqlite3.connect(work / f"wh{i}.db")) as db:
            assert db.execute("SELECT count(*) FROM orders").fetchone()[0] == rows
        print(
            f"  round {i + 1}: plain sqlite3 {base_times[-1]:.2f}s  dpone run {t:.2f}s  "
            f"(ratio {t / base_times[-1]:.3f}, peak RSS {peak:.0f} MB)",
            flush=True,
        )
    best_base, best_dpone = min(base_times), min(dpone_times)
    return {
        "rows": rows,
        "csv_mb": round(size_mb, 1),
        "plain_sqlite3_s": round(best_base, 3),
        "dpone_run_s": round(best_dpone, 3),
        "ratio_best": round(best_dpone / best_base, 3),
        "ratio_median": round(statistics.median(dpone_times) / statistics.median(base_times), 3),
        "dpone_peak_rss_mb": round(max(rss), 1),
    }


def bench_small_ops(work: Path, ops: int) -> dict[str, float]:
    from dpone.api import Runner
    from dpone.config.workload import parse_workload

    src = work / "small"
    src.mkdir()
    for i in range(ops):
        write_orders_csv(src / f"p{i}.csv", 10, start_id=i * 10)

    # plain sqlite3: one transaction of 10 rows per "operation"
    rows = [[(i * 10 + j, "c", 1.0, "2026-11-01T00:00:00Z") for j in range(10)] for i in range(ops)]
    db = sqlite3.connect(work / "plain.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(
        "CREATE TABLE orders (order_id INTEGER, customer TEXT, amount REAL, ordered_at TEXT)"
    )
    started = time.perf_counter()
    for batch in rows:
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", batch)
        db.execute("COMMIT")
    plain_ms = (time.perf_counter() - started) * 1000 / ops
    db.close()

    results: dict[str, float] = {"ops": ops, "plain_sqlite3_ms_per_op": round(plain_ms, 3)}
    for mode, journal in (
        ("forward", "sqlite:///small-journal.db"),
        ("atomic", "sqlite:///small-wh-atomic.db"),
    ):
        target = "small-wh-atomic.db" if mode == "atomic" else "small-wh.db"
        workload = parse_workload(
            {
                "workload": "small",
                "release": "bench",
                "deployment": "bench",
                "journal": journal,
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
                "target": {"kind": "sqlite", "url": f"sqlite:///{target}", "table": "orders"},
                "load": {"strategy": "append"},
            },
            base_dir=work,
        )
        with Runner(workload) as runner:
            started = time.perf_counter()
            for i in range(ops):
                r = runner.run(interval="2026-11-01/2026-11-02", partition=str(i))
                assert r.mode.value == ("atomic" if mode == "atomic" else "forward_recovery")
            took = time.perf_counter() - started
            results[f"dpone_{mode}_ms_per_op"] = round(took * 1000 / ops, 3)
            before = (work / target).stat().st_mtime_ns + (work / f"{target}-wal").stat().st_size
            started = time.perf_counter()
            for i in range(ops):
                assert runner.run(interval="2026-11-01/2026-11-02", partition=str(i)).replayed
            took = time.perf_counter() - started
            results[f"dpone_{mode}_replay_ms_per_op"] = round(took * 1000 / ops, 3)
            if mode == "forward":
                after = (work / target).stat().st_mtime_ns + (work / f"{target}-wal").stat().st_size
                assert after == before, "replay touched the target"
        with closing(sqlite3.connect(work / target)) as db:
            assert db.execute("SELECT count(*) FROM orders").fetchone()[0] == ops * 10
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpone-bench-"))
    try:
        print(f"bulk load: {args.rows:,} rows, best of {args.repeat}, alternating", flush=True)
        bulk = bench_bulk(work, args.rows, args.repeat)
        print(json.dumps(bulk, indent=2))
        print(f"small operations: {args.ops} x 10 rows through the Python API", flush=True)
        small = bench_small_ops(work, args.ops)
        print(json.dumps(small, indent=2))
        verdict = (
            "PASS" if bulk["ratio_best"] <= 1.15 and bulk["dpone_peak_rss_mb"] < 150 else "FAIL"
        )
        print(f"budget (ratio <= 1.15, RSS < 150 MB): {verdict}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
