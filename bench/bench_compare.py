"""dpone beside plain psycopg, dlt and DBOS on the issue-3 PostgreSQL workloads, in one run.

Workloads (the same as bench/bench_postgres.py):

a. bulk: ``--rows`` rows of one CSV file into a PostgreSQL table, each contender a whole
   process: plain psycopg COPY of the file in one transaction (the baseline), ``dpone
   run`` in atomic and forward mode, dlt (rows from ``csv.DictReader`` with column hints;
   and, when pyarrow is installed, the file read by ``pyarrow.csv.read_csv``), DBOS (one
   workflow whose datasource transaction COPYs the file).
b. small operations: ``--ops`` operations of 10 rows each through a Python API in one
   process, one durable unit per operation: one plain transaction per operation (the
   baseline), a dpone ``Runner``, one DBOS workflow per operation (a datasource
   transaction inserting the 10 rows), one dlt ``pipeline.run`` per operation (append,
   and merge on ``order_id``). dlt runs ``--dlt-ops`` operations (~0.2 s each).
c. re-running the finished operations of (b): dpone replays them from its journal, DBOS
   returns the recorded result of the same workflow id; dlt has no per-operation replay,
   so the same loads are run again: append loads them twice, merge deduplicates by key.

Contenders run in turn, in a rotated order each round; every round is printed, then
best, median and ratios to the plain baseline. A contender whose package is missing is
reported as "not installed" (install the ``bench`` extra: ``pip install -e '.[bench]'``).

Each round uses its own schemas (and DBOS its own system database ``dpone_bench_dbos``
on the same server); all are dropped at the end.

Usage: PYTHONPATH=src python bench/bench_compare.py [--dsn URL] [--rows 1000000]
       [--ops 2000] [--dlt-ops 100] [--repeat 3] [--only plain,dpone-atomic,...]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from bench_postgres import PLAIN_COPY, WORKLOAD, child, other_db, schema_sql, wal_syncs

from dpone.testing.crash import write_orders_csv

DBOS_SYSTEM_DB = "dpone_bench_dbos"
INTERVAL = "2026-11-01/2026-11-02"
STAMP = "2026-11-01T00:00:00Z"
T = TypeVar("T")
# no network calls from dlt during the measurement (its anonymous telemetry is on by default)
os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")

DLT_ROWS = r"""
import csv, sys, dlt
dsn, path, dataset, pipes = sys.argv[1:5]
columns = {"order_id": {"data_type": "bigint"}, "customer": {"data_type": "text"},
           "amount": {"data_type": "double"}, "ordered_at": {"data_type": "timestamp"}}
pipeline = dlt.pipeline(pipeline_name=dataset, pipelines_dir=pipes,
                        destination=dlt.destinations.postgres(credentials=dsn),
                        dataset_name=dataset)
with open(path, newline="", encoding="utf-8") as fh:
    info = pipeline.run(csv.DictReader(fh), table_name="orders", write_disposition="append",
                        columns=columns)
info.raise_on_failed_jobs()
"""

DLT_ARROW = r"""
import sys, dlt, pyarrow.csv
dsn, path, dataset, pipes = sys.argv[1:5]
pipeline = dlt.pipeline(pipeline_name=dataset, pipelines_dir=pipes,
                        destination=dlt.destinations.postgres(credentials=dsn),
                        dataset_name=dataset)
info = pipeline.run(pyarrow.csv.read_csv(path), table_name="orders", write_disposition="append")
info.raise_on_failed_jobs()
"""

DBOS_COPY = r"""
import sys
from dbos import DBOS, SetWorkflowID, SQLAlchemyDatasource
dsn, path, schema, system_db = sys.argv[1:5]
DBOS(config={"name": "dpone_bench", "system_database_url": system_db, "log_level": "WARNING"})
ds = SQLAlchemyDatasource.create(dsn, schema=schema)

@ds.transaction(isolation_level="READ COMMITTED")
def copy_file() -> int:
    raw = ds.sql_session().connection().connection.driver_connection
    with raw.cursor() as cur:
        cur.execute(f'CREATE TABLE "{schema}".dbos_orders (order_id bigint, customer text, '
                    'amount double precision, ordered_at timestamptz)')
        with cur.copy(f'COPY "{schema}".dbos_orders FROM STDIN (FORMAT csv, HEADER true)') as cp:
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    cp.write(chunk)
        return cur.rowcount

@DBOS.workflow()
def load() -> int:
    return copy_file()

DBOS.launch()
with SetWorkflowID(f"bulk-{schema}"):
    load()
DBOS.destroy()
"""

DLT_COLUMNS = {
    "order_id": {"data_type": "bigint"},
    "customer": {"data_type": "text"},
    "amount": {"data_type": "double"},
    "ordered_at": {"data_type": "timestamp"},
}


# ------------------------------------------------------------------ helpers


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def dlt_dsn(dsn: str) -> str:
    """dlt refuses credentials without a password; a trust-auth server ignores this one."""
    parts = urlsplit(dsn)
    if parts.password is not None or "@" not in parts.netloc:
        return dsn
    user, host = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=f"{user}:unused@{host}"))


def count(dsn: str, table: str) -> tuple[int, int]:
    """(rows, distinct order ids) of a schema-qualified table."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT order_id) FROM {table}").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def table_writes(dsn: str, schema: str, table: str | None = None) -> int:
    """Rows inserted, updated or deleted since the server started, from the statistics
    views: in one table, or without ``table`` in every table of ``schema``. Backends flush
    their statistics when idle (at most once a second) and when they close."""
    try:
        conn = psycopg.connect(dsn)
    except psycopg.OperationalError:
        return 0  # DBOS's system database before its first launch
    with conn:
        row = conn.execute(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND (%s::text IS NULL OR relname = %s)",
            (schema, table, table),
        ).fetchone()
    return int(row[0]) if row else 0


def footprint_writes(places: list[tuple[str, str]]) -> int:
    """Row writes in every (database, schema) a contender writes to."""
    return sum(table_writes(db, schema) for db, schema in places)


def drop_database(dsn: str, name: str) -> None:
    with psycopg.connect(other_db(dsn, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rows_of(first: int) -> list[dict[str, Any]]:
    """The 10 rows of the operation starting at order id ``first``."""
    return [
        {
            "order_id": first + j,
            "customer": "c",
            "amount": 1.0,
            "ordered_at": "2026-11-01T00:00:00Z",
        }
        for j in range(10)
    ]


def rotated(items: list[T], i: int) -> list[T]:
    """The contenders in round ``i``'s order (each round starts with the next one)."""
    k = i % len(items)
    return items[k:] + items[:k]


# ------------------------------------------------------------------ (a) bulk


Bulk = Callable[[str], tuple[list[str], str]]


def bulk_contenders(dsn: str, data: Path, work: Path) -> dict[str, Bulk]:
    """name -> f(schema) giving the argv of one whole process and the table it loads."""
    sysdb = other_db(dsn, DBOS_SYSTEM_DB)
    py = sys.executable

    def plain(schema: str) -> tuple[list[str], str]:
        return [py, "-c", PLAIN_COPY, dsn, str(data), schema], f'"{schema}".plain'

    def dpone(mode: str, journal: str) -> Bulk:
        def run(schema: str) -> tuple[list[str], str]:
            name = f"{mode}-{schema}.yaml"
            (work / name).write_text(
                WORKLOAD.format(
                    journal=journal,
                    schema=schema,
                    data=data.name,
                    target=dsn,
                    table=f"{mode}_orders",
                ),
                encoding="utf-8",
            )
            argv = [py, "-m", "dpone", "run", name, "--interval", INTERVAL, "--no-progress", "-q"]
            return argv, f'"{schema}".{mode}_orders'

        return run

    def dlt(script: str, suffix: str) -> Bulk:
        def run(schema: str) -> tuple[list[str], str]:
            dataset = f"{schema}_{suffix}"
            argv = [py, "-c", script, dlt_dsn(dsn), str(data), dataset, str(work / "dlt")]
            return argv, f'"{dataset}".orders'

        return run

    def dbos(schema: str) -> tuple[list[str], str]:
        return [py, "-c", DBOS_COPY, dsn, str(data), schema, sysdb], f'"{schema}".dbos_orders'

    out: dict[str, Bulk] = {
        "plain": plain,
        "dpone-atomic": dpone("atomic", dsn),
        "dpone-forward": dpone("forward", other_db(dsn, "postgres")),
    }
    if installed("dlt"):
        out["dlt-rows"] = dlt(DLT_ROWS, "dltrows")
        if installed("pyarrow"):
            out["dlt-arrow"] = dlt(DLT_ARROW, "dltarrow")
    if installed("dbos"):
        out["dbos"] = dbos
    return out


def bench_bulk(work: Path, dsn: str, rows: int, repeat: int, only: set[str] | None) -> dict:
    data = work / "orders.csv"
    write_orders_csv(data, rows)
    contenders = {
        k: v for k, v in bulk_contenders(dsn, data, work).items() if not only or k in only
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    rss: dict[str, float] = dict.fromkeys(contenders, 0.0)
    for i in range(repeat):
        schema = f"cmp_{uuid.uuid4().hex[:8]}"
        schema_sql(dsn, f'CREATE SCHEMA "{schema}"')
        line = []
        try:
            for name in rotated(list(contenders), i):
                argv, table = contenders[name](schema)
                took, peak = child(argv, work)
                loaded, distinct = count(dsn, table)
                assert loaded == distinct == rows, (name, loaded, distinct)
                times[name].append(took)
                rss[name] = max(rss[name], peak)
                line.append(f"{name} {took:.2f}s")
            print(f"  round {i + 1}: " + "  ".join(line), flush=True)
        finally:
            for suffix in ("", "_dltrows", "_dltarrow"):
                schema_sql(dsn, f'DROP SCHEMA IF EXISTS "{schema}{suffix}" CASCADE')
            schema_sql(other_db(dsn, "postgres"), f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            shutil.rmtree(work / "dlt", ignore_errors=True)
    return summarize(times, "plain", unit="s") | {"peak_rss_mb": rss}


# ------------------------------------------------------------------ (b), (c) small operations


class Small:
    """One contender of the small-operation workload: load ops, then re-run them."""

    name = ""

    def prepare(self, schema: str) -> None:
        """Prepare the round: its target table in ``schema``, its ids."""
        self.schema = schema

    def setup(self) -> None:
        """Open connections (once for the loads, once more for the re-run)."""

    def load(self, first_ids: range) -> None:
        raise NotImplementedError

    def rerun(self, first_ids: range) -> None:
        """Run the finished operations again (replay where the tool has one)."""
        raise NotImplementedError

    def table(self) -> tuple[str, str]:
        """(schema, table) holding the loaded rows."""
        raise NotImplementedError

    def footprint(self) -> list[tuple[str, str]]:
        """Every (database URL, schema) the contender writes to: target and bookkeeping."""
        raise NotImplementedError

    def teardown(self) -> None:
        """Close what setup opened (a closing backend flushes its statistics)."""

    def cleanup(self) -> None:
        """Drop what the round left outside its schema."""


class PlainSmall(Small):
    """One plain transaction (executemany of 10 rows + COMMIT) per operation."""

    name = "plain"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def prepare(self, schema: str) -> None:
        self.schema = schema
        schema_sql(
            self.dsn,
            f'CREATE TABLE "{schema}".plain (order_id bigint, customer text, '
            "amount double precision, ordered_at timestamptz)",
        )

    def setup(self) -> None:
        self.conn = psycopg.connect(self.dsn)

    def load(self, first_ids: range) -> None:
        sql = f'INSERT INTO "{self.schema}".plain VALUES (%s, %s, %s, %s)'
        for first in first_ids:
            with self.conn.cursor() as cur:
                cur.executemany(sql, [tuple(r.values()) for r in rows_of(first)])
            self.conn.commit()

    def table(self) -> tuple[str, str]:
        return self.schema, "plain"

    def footprint(self) -> list[tuple[str, str]]:
        return [(self.dsn, self.schema)]

    def teardown(self) -> None:
        self.conn.close()


class DponeSmall(Small):
    """A dpone Runner; each operation is one partition (a 10-row CSV file)."""

    def __init__(self, dsn: str, work: Path, mode: str) -> None:
        self.dsn, self.work, self.mode = dsn, work, mode
        self.name = f"dpone-{mode}"
        self.journal = dsn if mode == "atomic" else other_db(dsn, "postgres")

    def prepare(self, schema: str) -> None:
        self.schema = schema
        self.path = self.work / f"small-{self.mode}-{schema}.yaml"
        self.path.write_text(
            WORKLOAD.format(
                journal=self.journal,
                schema=schema,
                data="small/p{partition}.csv",
                target=self.dsn,
                table=f"{self.mode}_orders",
            ),
            encoding="utf-8",
        )

    def setup(self) -> None:
        from dpone.api import Runner

        self.runner = Runner(self.path)

    def load(self, first_ids: range) -> None:
        for first in first_ids:
            self.runner.run(interval=INTERVAL, partition=str(first // 10))

    def rerun(self, first_ids: range) -> None:
        for first in first_ids:
            assert self.runner.run(interval=INTERVAL, partition=str(first // 10)).replayed

    def table(self) -> tuple[str, str]:
        return self.schema, f"{self.mode}_orders"

    def footprint(self) -> list[tuple[str, str]]:
        places = [(self.dsn, self.schema)]  # target, fence (and the journal when atomic)
        return places if self.journal == self.dsn else [*places, (self.journal, self.schema)]

    def teardown(self) -> None:
        self.runner.close()

    def cleanup(self) -> None:
        schema_sql(other_db(self.dsn, "postgres"), f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class DbosSmall(Small):
    """One DBOS workflow per operation; its one step is a datasource transaction (10 rows).

    DBOS is launched at the start of each of its turns and destroyed at the end (the
    launch time is reported); the workflow id is the operation's id, so re-running it
    returns the recorded result.
    """

    name = "dbos"
    _app: dict[str, Any] | None = None

    def __init__(self, dsn: str, ds_schema: str) -> None:
        self.dsn, self.ds_schema = dsn, ds_schema
        self.launch_s: list[float] = []

    def _build(self) -> dict[str, Any]:
        """Register the datasource, transaction and workflow once per process."""
        if DbosSmall._app is None:
            import sqlalchemy as sa
            from dbos import DBOS, SetWorkflowID, SQLAlchemyDatasource

            ds = SQLAlchemyDatasource.create(self.dsn, schema=self.ds_schema)

            @ds.transaction(isolation_level="READ COMMITTED")
            def insert_rows(table: str, first: int) -> int:
                sql = sa.text(
                    f"INSERT INTO {table} VALUES (:order_id, :customer, :amount, :ordered_at)"
                )
                rows = rows_of(first)
                ds.sql_session().execute(sql, rows)
                return len(rows)

            @DBOS.workflow()
            def load_op(table: str, first: int) -> int:
                return insert_rows(table, first)

            DbosSmall._app = {
                "DBOS": DBOS,
                "SetWorkflowID": SetWorkflowID,
                "load_op": load_op,
                "engine": ds.engine,
            }
        return DbosSmall._app

    def prepare(self, schema: str) -> None:
        self.schema = schema
        self.run_id = uuid.uuid4().hex[:8]
        schema_sql(
            self.dsn,
            f'CREATE TABLE "{schema}".dbos_orders (order_id bigint, customer text, '
            "amount double precision, ordered_at timestamptz)",
        )

    def setup(self) -> None:
        from dbos import DBOS

        started = time.perf_counter()
        DBOS(
            config={
                "name": "dpone_bench",
                "system_database_url": other_db(self.dsn, DBOS_SYSTEM_DB),
                "log_level": "WARNING",
            }
        )
        self.app = self._build()
        DBOS.launch()
        self.launch_s.append(time.perf_counter() - started)

    def _run(self, first_ids: range) -> None:
        set_id, load_op = self.app["SetWorkflowID"], self.app["load_op"]
        for first in first_ids:
            with set_id(f"{self.run_id}-{first}"):
                assert load_op(f'"{self.schema}".dbos_orders', first) == 10

    load = _run
    rerun = _run

    def table(self) -> tuple[str, str]:
        return self.schema, "dbos_orders"

    def footprint(self) -> list[tuple[str, str]]:
        return [
            (self.dsn, self.schema),
            (self.dsn, self.ds_schema),  # the datasource's transaction outputs
            (other_db(self.dsn, DBOS_SYSTEM_DB), "dbos"),  # the system database
        ]

    def teardown(self) -> None:
        self.app["DBOS"].destroy()
        # the datasource's pool outlives DBOS.destroy; closing it makes its backends flush
        # their statistics now (an idle backend may wait 10 s), so each phase counts its own
        self.app["engine"].dispose()


class DltSmall(Small):
    """One ``pipeline.run`` of 10 rows per operation (append, or merge on order_id)."""

    def __init__(self, dsn: str, work: Path, disposition: str) -> None:
        self.dsn, self.work, self.disposition = dsn, work, disposition
        self.name = f"dlt-{disposition}"

    def prepare(self, schema: str) -> None:
        self.dataset = f"{schema}_dlt{self.disposition}"
        self.hints: dict[str, Any] = {"columns": DLT_COLUMNS}
        if self.disposition == "merge":
            self.hints["primary_key"] = "order_id"

    def setup(self) -> None:
        """The same pipeline (name, working directory) each time, as a rerun script would."""
        import dlt

        self.pipeline = dlt.pipeline(
            pipeline_name=self.dataset,
            pipelines_dir=str(self.work / "dlt"),
            destination=dlt.destinations.postgres(credentials=dlt_dsn(self.dsn)),
            dataset_name=self.dataset,
        )

    def load(self, first_ids: range) -> None:
        for first in first_ids:
            info = self.pipeline.run(
                rows_of(first),
                table_name="orders",
                write_disposition=self.disposition,
                **self.hints,
            )
            info.raise_on_failed_jobs()

    rerun = load

    def table(self) -> tuple[str, str]:
        return self.dataset, "orders"

    def footprint(self) -> list[tuple[str, str]]:
        # the dataset holds the table and _dlt_loads/_dlt_version/_dlt_pipeline_state
        return [(self.dsn, self.dataset), (self.dsn, f"{self.dataset}_staging")]

    def cleanup(self) -> None:
        schema_sql(self.dsn, f'DROP SCHEMA IF EXISTS "{self.dataset}" CASCADE')
        schema_sql(self.dsn, f'DROP SCHEMA IF EXISTS "{self.dataset}_staging" CASCADE')


def settled_writes(c: Small) -> int:
    """Footprint row writes once the contender's closed backends have flushed statistics."""
    time.sleep(1.0)
    return footprint_writes(c.footprint())


def small_round(c: Small, dsn: str, schema: str, ops: int, out: dict[str, dict]) -> str:
    """One round of one contender: ops (the first is a warm-up), then re-run them all.

    The loads and the re-run each open and close the contender's connections, so that
    the row writes of each phase are counted from flushed statistics (the counts include
    the warm-up operation; the times do not).
    """
    c.prepare(schema)
    r = out.setdefault(c.name, {k: [] for k in ("ms", "wal", "rows", "re_ms", "re_wal")})
    try:
        writes = settled_writes(c)
        c.setup()
        try:
            c.load(range(0, 10, 10))  # warm up: connections, DDL, caches
            syncs = wal_syncs(dsn)
            started = time.perf_counter()
            c.load(range(10, ops * 10, 10))
            ms = (time.perf_counter() - started) * 1000 / (ops - 1)
            syncs = (wal_syncs(dsn) - syncs) / (ops - 1)
        finally:
            c.teardown()
        writes = (settled_writes(c) - writes) / ops
        r["ms"].append(ms)
        r["wal"].append(syncs)
        r["rows"].append(writes)
        text = f"{c.name} {ms:.2f} ms ({syncs:.2f} syncs, {writes:.1f} row writes)"
        if isinstance(c, PlainSmall):
            return text  # no replay: a re-run would insert the rows again
        sch, tbl = c.table()
        target, writes = table_writes(dsn, sch, tbl), footprint_writes(c.footprint())
        c.setup()
        try:
            syncs = wal_syncs(dsn)
            started = time.perf_counter()
            c.rerun(range(0, ops * 10, 10))
            rerun_ms = (time.perf_counter() - started) * 1000 / ops
            syncs = (wal_syncs(dsn) - syncs) / ops
        finally:
            c.teardown()
        writes = (settled_writes(c) - writes) / ops
        r["re_ms"].append(rerun_ms)
        r["re_wal"].append(syncs)
        r["re_rows_per_op"] = writes
        r["re_target_writes"] = table_writes(dsn, sch, tbl) - target
        loaded, distinct = count(dsn, f'"{sch}".{tbl}')
        assert distinct == ops * 10, (c.name, distinct)
        r["rows_after_rerun"] = loaded
        r["duplicates_after_rerun"] = loaded - distinct
        return text + (
            f", re-run {rerun_ms:.2f} ms ({syncs:.2f} syncs, {writes:.1f} row writes, "
            f"+{loaded - distinct} duplicates)"
        )
    finally:
        c.cleanup()


def bench_small(
    work: Path, dsn: str, ops: int, dlt_ops: int, repeat: int, only: set[str] | None
) -> dict:
    src = work / "small"
    for i in range(ops):
        write_orders_csv(src / f"p{i}.csv", 10, start_id=i * 10)
    ds_schema = f"cmpds_{uuid.uuid4().hex[:8]}"
    contenders: list[Small] = [
        PlainSmall(dsn),
        DponeSmall(dsn, work, "atomic"),
        DponeSmall(dsn, work, "forward"),
    ]
    if installed("dbos"):
        contenders.append(DbosSmall(dsn, ds_schema))
    if installed("dlt"):
        contenders += [DltSmall(dsn, work, "append"), DltSmall(dsn, work, "merge")]
    contenders = [c for c in contenders if not only or c.name in only]
    out: dict[str, dict] = {}
    try:
        for i in range(repeat):
            line = []
            for c in rotated(contenders, i):
                schema = f"cmp_{uuid.uuid4().hex[:8]}"
                schema_sql(dsn, f'CREATE SCHEMA "{schema}"')
                try:
                    n = min(ops, dlt_ops) if isinstance(c, DltSmall) else ops
                    line.append(small_round(c, dsn, schema, n, out))
                finally:
                    schema_sql(dsn, f'DROP SCHEMA "{schema}" CASCADE')
                    shutil.rmtree(work / "dlt", ignore_errors=True)
            print(f"  round {i + 1}: " + "; ".join(line), flush=True)
    finally:
        schema_sql(dsn, f'DROP SCHEMA IF EXISTS "{ds_schema}" CASCADE')
        drop_database(dsn, DBOS_SYSTEM_DB)
    result = summarize({k: v["ms"] for k, v in out.items()}, "plain", unit="ms")
    for name, r in out.items():
        result[name]["wal_syncs_per_op"] = round(statistics.median(r["wal"]), 2)
        result[name]["row_writes_per_op"] = round(statistics.median(r["rows"]), 1)
        if r["re_ms"]:
            result[name]["rerun_ms_best"] = round(min(r["re_ms"]), 3)
            result[name]["rerun_ms_median"] = round(statistics.median(r["re_ms"]), 3)
            result[name]["rerun_wal_syncs_per_op"] = round(statistics.median(r["re_wal"]), 2)
            result[name]["rerun_row_writes_per_op"] = round(r["re_rows_per_op"], 1)
            for key in ("re_target_writes", "rows_after_rerun", "duplicates_after_rerun"):
                result[name][key] = r[key]
    for c in contenders:
        if isinstance(c, DbosSmall) and c.launch_s:
            result["dbos"]["launch_s_median"] = round(statistics.median(c.launch_s), 3)
    return result


def summarize(times: dict[str, list[float]], base: str, unit: str) -> dict[str, Any]:
    """best, median and ratios to the baseline (best to best, median to median)."""
    out: dict[str, Any] = {}
    b_best, b_med = min(times[base]), statistics.median(times[base])
    for name, xs in times.items():
        best, med = min(xs), statistics.median(xs)
        out[name] = {
            f"best_{unit}": round(best, 3),
            f"median_{unit}": round(med, 3),
            "ratio_best": round(best / b_best, 2),
            "ratio_median": round(med / b_med, 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("DPONE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--dlt-ops", type=int, default=100, help="operations for dlt (slow)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated contender names")
    parser.add_argument("--skip-bulk", action="store_true")
    parser.add_argument("--skip-small", action="store_true")
    args = parser.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()} or None
    if only:
        only.add("plain")  # the baseline of every ratio
    with psycopg.connect(args.dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()
    versions = {
        "python": sys.version.split()[0],
        "postgresql": server[0] if server else "?",
        "dpone": version("dpone"),
        "psycopg": version("psycopg"),
        "dlt": version("dlt"),
        "pyarrow": version("pyarrow"),
        "dbos": version("dbos"),
    }
    print("versions: " + json.dumps(versions), flush=True)
    work = Path(tempfile.mkdtemp(prefix="dpone-cmpbench-"))
    results: dict[str, Any] = {"versions": versions}
    try:
        if not args.skip_bulk:
            print(f"bulk: {args.rows:,} rows, whole processes, {args.repeat} rounds", flush=True)
            results["bulk"] = bench_bulk(work, args.dsn, args.rows, args.repeat, only)
        if not args.skip_small:
            print(
                f"small: {args.ops} ops x 10 rows (dlt: {min(args.ops, args.dlt_ops)}), "
                f"{args.repeat} rounds; ms per op (WAL syncs per op), then re-run",
                flush=True,
            )
            results["small"] = bench_small(
                work, args.dsn, args.ops, args.dlt_ops, args.repeat, only
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, module in (("dlt", "dlt"), ("dbos", "dbos")):
        if not installed(module):
            results[name] = "not installed"
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
