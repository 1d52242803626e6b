"""MariaDB and DuckDB bulk loads, measured side by side in one run (issue 4 budgets).

1M CSV rows: `dpone run` (append, SQLite journal) against a plain load of the same parsed
rows in one transaction, both whole processes, alternating, best of N. Budget: ratio at
most 1.10 for each target.

- MariaDB baseline: csv.reader rows -> PyMySQL `executemany` (PyMySQL batches them into
  multi-row INSERT statements), one transaction.
- DuckDB baseline (the budget's): one `INSERT ... SELECT FROM read_csv(file)` of the
  CSV file itself, columns declared, one transaction -- the fastest plain way, and the
  way dpone loads a file that passes through. For reference the older baseline is also
  run: csv.reader rows -> a temporary CSV -> one `read_csv` scan (how Python rows reach
  DuckDB fastest without pyarrow).

With ``--in-process`` the DuckDB rounds also time both loads inside one warmed-up
process (a child that has imported everything first): the plain connect, CREATE,
``INSERT ... SELECT FROM read_csv`` and COMMIT against ``Runner(workload).run()`` with
its journal and connector opened, alternating. That separates what the load itself
costs from what starting a ``dpone run`` process costs.

The CSV file is written, then left to settle for 3.5 s before the first round, as a file
an upstream step produced is: a file written less than 3 s before its checking read
opens it is "racy" and DuckDB's pass-through hashes it once more (ADR 0004 amendment).
``--racy`` skips the pause, so the first rounds measure that path.

Usage: python bench/bench_targets.py [--rows 1000000] [--repeat 3]
       [--mariadb mysql://root@127.0.0.1:3306/test] [--only mariadb|duckdb] [--warm]
       [--in-process] [--racy]
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
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from dpone.testing.crash import write_orders_csv

PLAIN_MARIADB = r"""
import csv, sys, pymysql
from urllib.parse import urlsplit
p = urlsplit(sys.argv[1])
conn = pymysql.connect(host=p.hostname, port=p.port or 3306, user=p.username or "root",
                       password=p.password or "", database=sys.argv[3], autocommit=False)
with conn.cursor() as cur:
    cur.execute("CREATE TABLE plain (order_id BIGINT, customer TEXT, amount DOUBLE, "
                "ordered_at DATETIME(6)) ENGINE=InnoDB")
    with open(sys.argv[2], newline="", encoding="utf-8") as fh:
        rows = csv.reader(fh)
        next(rows)
        batch = []
        sql = "INSERT INTO plain VALUES (%s, %s, %s, %s)"
        for r in rows:
            r[3] = r[3].replace("T", " ").rstrip("Z")
            batch.append(r)
            if len(batch) == 10000:
                cur.executemany(sql, batch)
                batch = []
        cur.executemany(sql, batch)
conn.commit()
conn.close()
"""

PLAIN_DUCKDB = r"""
import csv, os, sys, tempfile, duckdb
db = duckdb.connect(sys.argv[2])
db.execute("BEGIN TRANSACTION")
db.execute("CREATE TABLE plain (order_id BIGINT, customer VARCHAR, amount DOUBLE, "
           "ordered_at TIMESTAMPTZ)")
fd, tmp = tempfile.mkstemp(suffix=".csv")
with open(sys.argv[1], newline="", encoding="utf-8") as src, os.fdopen(fd, "w", newline="") as out:
    rows = csv.reader(src)
    next(rows)
    csv.writer(out).writerows(rows)
db.execute(f"INSERT INTO plain SELECT * FROM read_csv('{tmp}', header=false, "
           "columns={'order_id':'BIGINT','customer':'VARCHAR','amount':'DOUBLE',"
           "'ordered_at':'TIMESTAMPTZ'})")
db.execute("COMMIT")
db.close()
os.unlink(tmp)
"""

PLAIN_DUCKDB_FILE = r"""
import sys, duckdb
db = duckdb.connect(sys.argv[2])
db.execute("BEGIN TRANSACTION")
db.execute("CREATE TABLE plain (order_id BIGINT, customer VARCHAR, amount DOUBLE, "
           "ordered_at TIMESTAMPTZ)")
db.execute("INSERT INTO plain SELECT * FROM read_csv($1, header=true, "
           "columns={'order_id':'BIGINT','customer':'VARCHAR','amount':'DOUBLE',"
           "'ordered_at':'TIMESTAMPTZ'})", [sys.argv[1]])
db.execute("COMMIT")
db.close()
"""

IN_PROCESS = r"""
import json, sys, time
from pathlib import Path
import duckdb
from dpone.api import Runner
from dpone.config.workload import load_workload

data, work, rounds = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
cols = ("{'order_id':'BIGINT','customer':'VARCHAR','amount':'DOUBLE',"
        "'ordered_at':'TIMESTAMPTZ'}")


def plain(i):
    started = time.perf_counter()
    db = duckdb.connect(str(work / f"ip{i}.duckdb"))
    db.execute("BEGIN TRANSACTION")
    db.execute("CREATE TABLE plain (order_id BIGINT, customer VARCHAR, amount DOUBLE, "
               "ordered_at TIMESTAMPTZ)")
    db.execute(f"INSERT INTO plain SELECT * FROM read_csv($1, header=true, columns={cols})",
               [data])
    db.execute("COMMIT")
    db.close()
    return time.perf_counter() - started


def ours(i):
    workload = load_workload(work / f"inproc{i}.yaml")
    started = time.perf_counter()
    with Runner(workload) as runner:
        result = runner.run(interval="2026-11-01/2026-11-02")
    took = time.perf_counter() - started
    assert result.rows_written == int(sys.argv[4]), result
    return took


plain(-1), ours(-1)  # warm-up: imports, DuckDB's first connect, the journal's creation
out = {"plain": [], "dpone": []}
for i in range(rounds):
    first, second = (plain, ours) if i % 2 == 0 else (ours, plain)
    for fn in (first, second):
        out["plain" if fn is plain else "dpone"].append(fn(i))
print(json.dumps(out))
"""

WORKLOAD = """\
workload: bench
release: "bench"
deployment: bench
journal: sqlite:///journal-{journal}.db
source:
  kind: csv
  path: {source}
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target: {target}
load: {{strategy: append}}
"""


def compile_dpone() -> None:
    """Write dpone's bytecode once, as ``pip install`` does for an installed package.

    From a source checkout with PYTHONDONTWRITEBYTECODE set (this machine's default),
    every ``dpone run`` process would otherwise compile its ~40 modules again (about
    0.25 s of CPU) while the baselines import precompiled site-packages.
    """
    import compileall

    import dpone

    compileall.compile_dir(Path(dpone.__file__).parent, quiet=1)


def child(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {proc.stderr[-2000:]}")
    return took


def mariadb_sql(dsn: str, sql: str) -> None:
    import pymysql

    p = urlsplit(dsn)
    conn = pymysql.connect(
        host=p.hostname,
        port=p.port or 3306,
        user=p.username or "root",
        password=p.password or "",
        autocommit=True,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def write_workload(
    work: Path, name: str, target: str, *, journal: str | None = None, source: str = "orders.csv"
) -> Path:
    """Write the workload ``name`` (its journal too, unless ``journal``); return its path."""
    path = work / f"{name}.yaml"
    path.write_text(
        WORKLOAD.format(journal=journal or name, source=source, target=target), encoding="utf-8"
    )
    return path


def dpone_run(
    work: Path, name: str, target: str, *, journal: str | None = None, source: str = "orders.csv"
) -> float:
    """``dpone run`` of a workload named ``name`` (its journal too, unless ``journal``)."""
    write_workload(work, name, target, journal=journal, source=source)
    return child(
        [
            sys.executable,
            "-m",
            "dpone",
            "run",
            f"{name}.yaml",
            "--interval",
            "2026-11-01/2026-11-02",
            "--no-progress",
            "-q",
        ],
        work,
    )


def mariadb_round(work: Path, dsn: str, i: int) -> dict[str, float]:
    db = f"bench_{uuid.uuid4().hex[:8]}"
    mariadb_sql(dsn, f"CREATE DATABASE {db}")
    base = dsn.rsplit("/", 1)[0]
    try:
        plain = child(
            [sys.executable, "-c", PLAIN_MARIADB, dsn, str(work / "orders.csv"), db], work
        )
        ours = dpone_run(work, f"m{i}", f'{{kind: mariadb, url: "{base}/{db}", table: orders}}')
    finally:
        mariadb_sql(dsn, f"DROP DATABASE {db}")
    return {"mdb_plain": plain, "mdb_dpone": ours}


def duckdb_round(work: Path, i: int, *, warm: bool = False) -> dict[str, float]:
    """One round; who goes first rotates (page cache and disk state favour no one).

    With ``warm`` the journal exists beforehand (a 1-row load into another file, untimed)
    and so does the workload file's parse in the workload cache (ADR 0015), as on every
    later run of the same file.
    """
    data = str(work / "orders.csv")
    if warm:
        write_orders_csv(work / "one.csv", 1)
        dpone_run(
            work,
            f"w{i}",
            f'{{kind: duckdb, url: "duckdb:///w{i}.duckdb", table: orders}}',
            journal=f"d{i}",
            source="one.csv",
        )
        from dpone.config.workload import load_workload

        load_workload(
            write_workload(
                work, f"d{i}", f'{{kind: duckdb, url: "duckdb:///dp{i}.duckdb", table: orders}}'
            )
        )
    runs: dict[str, Callable[[], float]] = {
        "duck_plain_file": lambda: child(
            [sys.executable, "-c", PLAIN_DUCKDB_FILE, data, str(work / f"pf{i}.duckdb")], work
        ),
        "duck_dpone": lambda: dpone_run(
            work, f"d{i}", f'{{kind: duckdb, url: "duckdb:///dp{i}.duckdb", table: orders}}'
        ),
        "duck_plain_rows": lambda: child(
            [sys.executable, "-c", PLAIN_DUCKDB, data, str(work / f"pr{i}.duckdb")], work
        ),
    }
    names = list(runs)
    shift = i % len(names)
    out = {name: runs[name]() for name in names[shift:] + names[:shift]}
    for db in (f"pf{i}.duckdb", f"dp{i}.duckdb", f"pr{i}.duckdb", f"w{i}.duckdb"):
        (work / db).unlink(missing_ok=True)
    return {name: out[name] for name in names}


def duckdb_in_process(work: Path, rounds: int, rows: int) -> dict[str, list[float]]:
    """Both loads inside one warmed-up child process (see the module docstring)."""
    for i in range(-1, rounds):
        (work / f"inproc{i}.yaml").write_text(
            WORKLOAD.format(
                journal="inproc",
                source="orders.csv",
                target=f'{{kind: duckdb, url: "duckdb:///ipd{i}.duckdb", table: orders}}',
            ),
            encoding="utf-8",
        )
    argv = [sys.executable, "-c", IN_PROCESS, str(work / "orders.csv"), str(work)]
    proc = subprocess.run(
        [*argv, str(rounds), str(rows)], cwd=work, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"in-process round failed: {proc.stderr[-2000:]}")
    times: dict[str, list[float]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return times


def summary(times: dict[str, list[float]], plain: str, ours: str) -> dict[str, object]:
    return {
        "plain_best_s": round(min(times[plain]), 3),
        "dpone_best_s": round(min(times[ours]), 3),
        "ratio_best": round(min(times[ours]) / min(times[plain]), 3),
        "plain_median_s": round(statistics.median(times[plain]), 3),
        "dpone_median_s": round(statistics.median(times[ours]), 3),
        "ratio_median": round(statistics.median(times[ours]) / statistics.median(times[plain]), 3),
        "ratio_per_round": [
            round(o / p, 3) for p, o in zip(times[plain], times[ours], strict=True)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--mariadb",
        default=os.environ.get("DPONE_TEST_MARIADB_DSN", "mysql://root@127.0.0.1:3306/test"),
    )
    parser.add_argument("--only", choices=("mariadb", "duckdb"), default=None)
    parser.add_argument(
        "--warm",
        action="store_true",
        help="DuckDB: the SQLite journal exists before each round (created untimed), as "
        "every run after a deployment's first finds it",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="DuckDB: also time both loads inside one warmed-up process",
    )
    parser.add_argument(
        "--racy",
        action="store_true",
        help="do not let the CSV file settle before the first round",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpone-targets-"))
    # the runs' workload cache (ADR 0015), this bench's own: cold rounds never find their
    # file's parse there; --warm rounds find it, as every later run of a file does
    os.environ["DPONE_CACHE_DIR"] = str(work / "cache")
    compile_dpone()
    results: dict[str, dict[str, object]] = {}
    try:
        write_orders_csv(work / "orders.csv", args.rows)
        if not args.racy:
            time.sleep(3.5)  # settled, as an upstream step's file is (module docstring)
        times: dict[str, list[float]] = {}
        for i in range(args.repeat):
            measured: dict[str, float] = {}
            if args.only in (None, "mariadb"):
                measured.update(mariadb_round(work, args.mariadb, i))
            if args.only in (None, "duckdb"):
                measured.update(duckdb_round(work, i, warm=args.warm))
            for key, value in measured.items():
                times.setdefault(key, []).append(value)
            print(
                f"  round {i + 1}: " + "  ".join(f"{k} {v:.3f}s" for k, v in measured.items()),
                flush=True,
            )
        if args.in_process and args.only in (None, "duckdb"):
            inproc = duckdb_in_process(work, args.repeat, args.rows)
            times["inproc_plain"], times["inproc_dpone"] = inproc["plain"], inproc["dpone"]
            for i, (p, o) in enumerate(zip(inproc["plain"], inproc["dpone"], strict=True)):
                print(f"  in-process round {i + 1}: plain {p:.3f}s  dpone {o:.3f}s", flush=True)
        pairs = (
            ("mariadb", "mdb_plain", "mdb_dpone"),
            ("duckdb", "duck_plain_file", "duck_dpone"),
            ("duckdb (vs Python rows baseline)", "duck_plain_rows", "duck_dpone"),
            ("duckdb in one process (load only, not the budget)", "inproc_plain", "inproc_dpone"),
        )
        for target, plain, ours in pairs:
            if plain in times:
                results[target] = summary(times, plain, ours)
        print(json.dumps(results, indent=2))
        for target, r in results.items():
            if "vs" not in target and "process" not in target:
                ok = r["ratio_best"] <= 1.10  # type: ignore[operator]
                print(f"  {'PASS' if ok else 'FAIL'}  {target} ratio (best) <= 1.10")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
