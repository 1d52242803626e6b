"""MariaDB and DuckDB bulk loads, measured side by side in one run (issue 4 budgets).

1M CSV rows: `dpone run` (append, SQLite journal) against a plain load of the same parsed
rows in one transaction, both whole processes, alternating, best of N. Budget: ratio at
most 1.10 for each target.

- MariaDB baseline: csv.reader rows -> PyMySQL `executemany` (PyMySQL batches them into
  multi-row INSERT statements), one transaction.
- DuckDB baseline: csv.reader rows -> written to a temporary CSV -> one `read_csv` scan
  (the fastest plain way to bulk-load Python rows into DuckDB without pyarrow), one
  transaction.

Usage: python bench/bench_targets.py [--rows 1000000] [--repeat 3]
       [--mariadb mysql://root@127.0.0.1:3306/test]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
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

WORKLOAD = """\
workload: bench
release: "bench"
deployment: bench
journal: sqlite:///journal-{name}.db
source:
  kind: csv
  path: orders.csv
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target: {target}
load: {{strategy: append}}
"""


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--mariadb",
        default=os.environ.get("DPONE_TEST_MARIADB_DSN", "mysql://root@127.0.0.1:3306/test"),
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpone-targets-"))
    results: dict[str, dict[str, float]] = {}
    try:
        write_orders_csv(work / "orders.csv", args.rows)
        times: dict[str, list[float]] = {
            k: [] for k in ("mdb_plain", "mdb_dpone", "duck_plain", "duck_dpone")
        }
        base = args.mariadb.rsplit("/", 1)[0]
        for i in range(args.repeat):
            db = f"bench_{uuid.uuid4().hex[:8]}"
            mariadb_sql(args.mariadb, f"CREATE DATABASE {db}")
            try:
                times["mdb_plain"].append(
                    child(
                        [
                            sys.executable,
                            "-c",
                            PLAIN_MARIADB,
                            args.mariadb,
                            str(work / "orders.csv"),
                            db,
                        ],
                        work,
                    )
                )
                (work / f"m{i}.yaml").write_text(
                    WORKLOAD.format(
                        name=f"m{i}", target=f'{{kind: mariadb, url: "{base}/{db}", table: orders}}'
                    ),
                    encoding="utf-8",
                )
                times["mdb_dpone"].append(
                    child(
                        [
                            sys.executable,
                            "-m",
                            "dpone",
                            "run",
                            f"m{i}.yaml",
                            "--interval",
                            "2026-11-01/2026-11-02",
                            "--no-progress",
                            "-q",
                        ],
                        work,
                    )
                )
            finally:
                mariadb_sql(args.mariadb, f"DROP DATABASE {db}")
            times["duck_plain"].append(
                child(
                    [
                        sys.executable,
                        "-c",
                        PLAIN_DUCKDB,
                        str(work / "orders.csv"),
                        str(work / f"plain{i}.duckdb"),
                    ],
                    work,
                )
            )
            (work / f"d{i}.yaml").write_text(
                WORKLOAD.format(
                    name=f"d{i}",
                    target=f'{{kind: duckdb, url: "duckdb:///dp{i}.duckdb", table: orders}}',
                ),
                encoding="utf-8",
            )
            times["duck_dpone"].append(
                child(
                    [
                        sys.executable,
                        "-m",
                        "dpone",
                        "run",
                        f"d{i}.yaml",
                        "--interval",
                        "2026-11-01/2026-11-02",
                        "--no-progress",
                        "-q",
                    ],
                    work,
                )
            )
            print(
                f"  round {i + 1}: " + "  ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
                flush=True,
            )
        for target, plain, dpone in (
            ("mariadb", "mdb_plain", "mdb_dpone"),
            ("duckdb", "duck_plain", "duck_dpone"),
        ):
            results[target] = {
                "plain_s": round(min(times[plain]), 3),
                "dpone_s": round(min(times[dpone]), 3),
                "ratio": round(min(times[dpone]) / min(times[plain]), 3),
            }
        print(json.dumps(results, indent=2))
        for target, r in results.items():
            print(f"  {'PASS' if r['ratio'] <= 1.10 else 'FAIL'}  {target} ratio <= 1.10")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
