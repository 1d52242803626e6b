"""The CSV pass-through: the file's own bytes into PostgreSQL COPY and DuckDB read_csv.

Each target loads the same file twice, once by pass-through and once by the rows path
(Python's csv module), and the tables must be identical. A file that changed after its
identity was taken never commits; files the target's parser could read differently fall
back to the rows path; every strategy keeps working; counts are right.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from dpone.adapters.connectors import duckdb as duckdb_connector
from dpone.adapters.connectors import postgres as pg_connector
from dpone.adapters.connectors.duckdb import DuckDbConnector
from dpone.adapters.connectors.postgres import PostgresConnector
from dpone.adapters.sources import _passthrough, _prefetch
from dpone.adapters.sources._passthrough import CsvFileBytes
from dpone.adapters.sources.csv import CsvSource
from dpone.contracts.fence import FenceStatus
from dpone.contracts.identity import parse_interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy
from dpone.errors import SourceInvalid, TargetWriteFailed
from dpone.ports.source import raw_csv_of
from dpone.runtime.rows import RowTally, counted, within_interval

TYPES = {"id": "integer", "name": "text", "amount": "real", "note": "text"}
COLUMNS = tuple(Column(name=n, type=ColumnType(t)) for n, t in TYPES.items())

# Quotes, doubled quotes, delimiters and line breaks inside quotes, empty fields quoted
# and not, surrounding spaces, unicode, a byte order mark, no newline at the end.
TRICKY = (
    "\ufeffid,name,amount,note\n"
    '1,"say ""hi""",1.5,plain\n'
    '2,"a,b","2","line one\nline two"\n'
    '3,,,""\n'
    '4,"  ",,  spaced  \n'
    '5,Ünïcødé 日本 ✓,-0.25,"""lead"\n'
    '6,"trail""",1e3,"x""y""z"\n'
    '7,"",,"\n"\n'
    "8,it's,3,'single'"
)

# TRICKY's records, for a file large enough to be read in chunks and checked ahead (over
# the 1 MiB a small file is read in one go, as ``dpone run`` checks ahead from 1 MiB).
TRICKY_RECORDS = (
    '{},"say ""hi""",1.5,plain',
    '{},"a,b","2","line one\nline two"',
    '{},,,""',
    '{},"  ",,  spaced  ',
    '{},Ünïcødé 日本 ✓,-0.25,"""lead"',
    '{},"trail""",1e3,"x""y""z"',
    '{},"",,"\n"',
    "{},it's,3,'single'",
)


def _tricky_big(n: int) -> str:
    rows = (TRICKY_RECORDS[i % len(TRICKY_RECORDS)].format(i + 1) for i in range(n))
    return "\ufeffid,name,amount,note\n" + "\n".join(rows)  # no line end after the last


_ops = count(1)
_started: list[str] = []  # operation ids, latest last


def _op() -> tuple[str, str]:
    n = next(_ops)
    return (
        "sha256:" + hashlib.sha256(f"pt-op{n}".encode()).hexdigest(),
        "sha256:" + hashlib.sha256(f"pt-intent{n}".encode()).hexdigest(),
    )


@pytest.fixture(autouse=True)
def no_vouched_identities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_prefetch, "_VOUCHED", {})


@pytest.fixture
def passed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Row counts reported by pass-through loads (empty: every load took the rows path)."""
    calls: list[int] = []
    monkeypatch.setattr(CsvFileBytes, "loaded", lambda self, rows: calls.append(rows))
    return calls


def _write(path: Path, text: str, *, newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def _plan(table: str, strategy: LoadStrategy = LoadStrategy.APPEND, **kw: Any) -> LoadPlan:
    return LoadPlan(table=table, strategy=strategy, columns=COLUMNS, **kw)


def _mutate(
    connector: Any,
    path: Path,
    plan: LoadPlan,
    *,
    raw: bool,
    identity: str | None = None,
) -> tuple[int, int, str]:
    """Load ``path``; return (reported count, tallied rows, operation id)."""
    source = CsvSource(path, columns=TYPES)
    identity = identity or source.snapshot_identity()
    rows = source.batches(batch_size=3, expected_identity=identity)
    tally = RowTally()
    stream = counted(rows if raw else (b for b in rows), tally, None)
    assert (raw_csv_of(stream) is not None) is raw
    op, intent = _op()
    _started.append(op)
    report = connector.mutate(
        operation_id=op,
        intent_digest=intent,
        epoch=1,
        plan=plan,
        batches=stream,
        content_digest=identity,
        prepare=True,
    )
    return report.row_count or 0, tally.rows, op


# ----------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg(pg_available: str, pg_schema: str) -> tuple[str, str]:
    return pg_available, pg_schema


def _pg_connector(pg: tuple[str, str], table: str) -> PostgresConnector:
    dsn, schema = pg
    return PostgresConnector(dsn, table=f"{schema}.{table}", fence_schema=schema)


def _pg_rows(pg: tuple[str, str], table: str) -> list[tuple[Any, ...]]:
    dsn, schema = pg
    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT * FROM "{schema}".{table} ORDER BY id').fetchall()


def _pg_both(pg: tuple[str, str], path: Path, passed: list[int]) -> list[tuple[Any, ...]]:
    """Load ``path`` by both paths; assert identical tables; return the rows."""
    schema = pg[1]
    results = []
    for table, raw in (("by_file", True), ("by_rows", False)):
        connector = _pg_connector(pg, table)
        try:
            reported, tallied, _ = _mutate(connector, path, _plan(f"{schema}.{table}"), raw=raw)
        finally:
            connector.close()
        results.append((reported, tallied, _pg_rows(pg, table)))
    assert results[0] == results[1]
    assert results[0][0] == results[0][1] == len(results[0][2])
    return results[0][2]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_pg_tricky_csv_loads_identically_by_file_and_by_rows(
    pg: tuple[str, str], tmp_path: Path, passed: list[int], newline: str
) -> None:
    path = _write(tmp_path / "tricky.csv", TRICKY, newline=newline)
    rows = _pg_both(pg, path, passed)
    assert passed == [8]  # the file went through COPY (FORMAT csv) once, 8 rows
    inner = "\n" if newline == "\n" else "\r\n"  # line breaks inside quotes are kept as is
    assert rows[0] == (1, 'say "hi"', 1.5, "plain")
    assert rows[1] == (2, "a,b", 2.0, f"line one{inner}line two")
    assert rows[2] == (3, None, None, None)  # empty, quoted or not, is NULL
    assert rows[3] == (4, "  ", None, "  spaced  ")
    assert rows[4][1] == "Ünïcødé 日本 ✓"
    assert rows[6] == (7, None, None, inner)


@pytest.mark.parametrize(
    "body",
    [
        '1,ab"c,1,"d\n2,x,2,y\n',  # a quote inside an unquoted field is data for Python
        "1,a,1,b\n\n2,x,2,y\n",  # a blank line is skipped by the rows path
        "1,a,1,b\n\\.\n2,x,2,y\n",  # PostgreSQL's end-of-data marker
        "1,a,1,b\r2,x,2,y\n",  # a lone CR ends a record for Python
        '1,"a" "b",1,c\n',  # text after a closing quote, then a quote
    ],
)
def test_pg_files_a_server_could_read_differently_take_the_rows_path(
    pg: tuple[str, str], tmp_path: Path, passed: list[int], body: str
) -> None:
    path = _write(tmp_path / "odd.csv", "id,name,amount,note\n" + body)
    schema = pg[1]
    outcomes = []
    for table, raw in (("by_file", True), ("by_rows", False)):
        connector = _pg_connector(pg, table)
        try:
            _mutate(connector, path, _plan(f"{schema}.{table}"), raw=raw)
            outcomes.append(_pg_rows(pg, table))
        except SourceInvalid as exc:
            outcomes.append([str(exc)])
        finally:
            connector.close()
    assert passed == []
    assert outcomes[0] == outcomes[1]


def test_pg_a_bad_record_is_reported_by_the_rows_path(
    pg: tuple[str, str], tmp_path: Path, passed: list[int]
) -> None:
    path = _write(tmp_path / "short.csv", "id,name,amount,note\n1,a,1,b\n2,x\n")
    connector = _pg_connector(pg, "t")
    try:
        with pytest.raises(SourceInvalid, match="line 3 has 2 fields"):
            _mutate(connector, path, _plan(f"{pg[1]}.t"), raw=True)
    finally:
        connector.close()
    assert passed == []


def test_pg_a_file_changed_after_its_identity_never_commits(
    pg: tuple[str, str], tmp_path: Path, passed: list[int]
) -> None:
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n2,x,2,y\n")
    identity = CsvSource(path, columns=TYPES).snapshot_identity()
    _write(path, "id,name,amount,note\n1,a,1,b\n2,x,2,CHANGED\n")
    connector = _pg_connector(pg, "t")
    try:
        with pytest.raises(SourceInvalid, match="source changed"):
            _mutate(connector, path, _plan(f"{pg[1]}.t"), raw=True, identity=identity)
    finally:
        connector.close()
    assert passed == []
    dsn, schema = pg
    with psycopg.connect(dsn) as conn:
        fence = conn.execute(f'SELECT state FROM "{schema}".dpone_fence').fetchall()
        table = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = 't'", (schema,)
        ).fetchone()
    assert fence == []  # the fence raise rolled back with the write
    assert table == (0,)  # so did the table created for the load


def test_pg_a_record_count_the_server_disagrees_with_takes_the_rows_path(
    pg: tuple[str, str], tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n2,x,2,y\n")
    monkeypatch.setattr(CsvFileBytes, "records", lambda self: 3)
    connector = _pg_connector(pg, "t")
    try:
        assert _mutate(connector, path, _plan(f"{pg[1]}.t"), raw=True)[:2] == (2, 2)
    finally:
        connector.close()
    assert passed == []
    assert len(_pg_rows(pg, "t")) == 2  # the savepoint undid the COPY; the rows loaded once


def test_pg_a_mixed_case_header_passes_through_into_folded_columns(
    pg: tuple[str, str], tmp_path: Path, passed: list[int]
) -> None:
    path = _write(tmp_path / "a.csv", "Id,Name\n1,a\n2,b\n")
    source = CsvSource(path, columns={"Id": "integer", "Name": "text"})
    identity = source.snapshot_identity()
    tally = RowTally()
    plan = LoadPlan(table=f"{pg[1]}.mixed", strategy=LoadStrategy.APPEND, columns=source.columns())
    op, intent = _op()
    connector = _pg_connector(pg, "mixed")
    try:
        connector.mutate(
            operation_id=op,
            intent_digest=intent,
            epoch=1,
            plan=plan,
            batches=counted(source.batches(batch_size=10, expected_identity=identity), tally, None),
            content_digest=identity,
            prepare=True,
        )
    finally:
        connector.close()
    assert passed == [2]
    assert tally.rows == 2
    assert _pg_rows(pg, "mixed") == [(1, "a"), (2, "b")]


def test_pg_merge_and_replace_pass_through(
    pg: tuple[str, str], tmp_path: Path, passed: list[int]
) -> None:
    schema = pg[1]
    first = _write(tmp_path / "1.csv", "id,name,amount,note\n1,a,1,x\n2,b,2,x\n")
    second = _write(tmp_path / "2.csv", "id,name,amount,note\n2,B,20,y\n3,c,3,y\n2,BB,21,y\n")
    merge = _plan(f"{schema}.m", LoadStrategy.MERGE, key=("id",))
    connector = _pg_connector(pg, "m")
    try:
        assert _mutate(connector, first, merge, raw=True)[:2] == (2, 2)
        assert _mutate(connector, second, merge, raw=True)[:2] == (3, 3)
    finally:
        connector.close()
    assert _pg_rows(pg, "m") == [(1, "a", 1.0, "x"), (2, "BB", 21.0, "y"), (3, "c", 3.0, "y")]
    connector = _pg_connector(pg, "r")
    try:
        _mutate(connector, first, _plan(f"{schema}.r", LoadStrategy.REPLACE), raw=True)
        _mutate(connector, second, _plan(f"{schema}.r", LoadStrategy.REPLACE), raw=True)
    finally:
        connector.close()
    assert [r[0] for r in _pg_rows(pg, "r")] == [2, 2, 3]
    assert passed == [2, 3, 2, 3]


def test_pg_a_large_file_into_a_table_already_checked_still_passes_through(
    pg: tuple[str, str], tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the table is checked, a small load is read ahead for the one-statement path;
    a large file must not be: its rows would be taken from the stream, and the file
    parsed in Python instead of passing through COPY (every daily load into an existing
    table did this before)."""
    schema = pg[1]
    monkeypatch.setattr(pg_connector, "SMALL_FILE_BYTES", 64)  # a test-sized "large" file
    header = "id,name,amount,note\n"
    first = _write(tmp_path / "1.csv", header + "1,a,1,x\n")
    second = _write(tmp_path / "2.csv", header + "2,b,2,x\n")
    large = _write(tmp_path / "3.csv", header + "".join(f"{i},n,{i},x\n" for i in range(3, 1204)))
    small = _write(tmp_path / "4.csv", header + "1204,c,3,y\n")
    assert pg_connector.SMALL_ROWS < 1201
    assert small.stat().st_size <= 64 < large.stat().st_size
    connector = _pg_connector(pg, "big")
    try:
        # the first load creates the table, the second finds it and checks it
        for path, count in ((first, 1), (second, 1), (large, 1201), (small, 1)):
            assert _mutate(connector, path, _plan(f"{schema}.big"), raw=True)[:2] == (count, count)
    finally:
        connector.close()
    assert passed == [1, 1, 1201]  # the last, small file took the one-statement path
    assert [r[0] for r in _pg_rows(pg, "big")] == list(range(1, 1205))


# ----------------------------------------------------------------- DuckDB


def _duck_rows(db: Path, table: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(db), read_only=True) as conn:
        rows: list[tuple[Any, ...]] = conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
        return rows


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_duckdb_tricky_csv_loads_identically_by_file_and_by_rows(
    tmp_path: Path, passed: list[int], newline: str
) -> None:
    path = _write(tmp_path / "tricky.csv", TRICKY, newline=newline)
    results = []
    for table, raw in (("by_file", True), ("by_rows", False)):
        db = tmp_path / f"{table}.duckdb"
        connector = DuckDbConnector(db, table=table)
        try:
            reported, tallied, _ = _mutate(connector, path, _plan(table), raw=raw)
        finally:
            connector.close()
        results.append((reported, tallied, _duck_rows(db, table)))
    assert passed == [8]
    assert results[0] == results[1]
    rows = results[0][2]
    assert rows[1] == (2, "a,b", 2.0, f"line one{newline}line two")
    assert rows[2] == (3, None, None, None)
    assert rows[3] == (4, "  ", None, "  spaced  ")
    assert rows[4][1] == "Ünïcødé 日本 ✓"


def test_duckdb_a_record_count_the_reader_disagrees_with_takes_the_rows_path(
    tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were a target's parser to read other records than Python, the count gives it away."""
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n2,x,2,y\n")
    monkeypatch.setattr(CsvFileBytes, "records", lambda self: 3)
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="t")
    try:
        assert _mutate(connector, path, _plan("t"), raw=True)[:2] == (2, 2)
    finally:
        connector.close()
    assert passed == []
    assert len(_duck_rows(db, "t")) == 2


@pytest.mark.parametrize(
    "body",
    [
        '1,ab"c,1,"d\n2,x,2,y\n',  # a quote inside an unquoted field is data for Python
        "1,a,1,b\n\n2,x,2,y\n",  # a blank line is skipped by the rows path
    ],
)
def test_duckdb_files_a_reader_could_read_differently_take_the_rows_path(
    tmp_path: Path, passed: list[int], body: str
) -> None:
    """DuckDB has scanned the file when the check refuses it: all of that rolls back."""
    path = _write(tmp_path / "odd.csv", "id,name,amount,note\n" + body)
    tables = []
    for table, raw in (("by_file", True), ("by_rows", False)):
        db = tmp_path / f"{table}.duckdb"
        connector = DuckDbConnector(db, table=table)
        try:
            _mutate(connector, path, _plan(table), raw=raw)
        finally:
            connector.close()
        tables.append(_duck_rows(db, table))
    assert passed == []
    assert tables[0] == tables[1]


def test_duckdb_a_file_changed_during_the_transaction_never_commits(
    tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is hashed, then scanned by DuckDB, then changed: the re-check refuses it."""
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n2,x,2,y\n")
    original = CsvFileBytes.chunks

    def chunks_then_change(self: CsvFileBytes, **kwargs: Any) -> Iterator[bytes]:
        yield from original(self, **kwargs)
        path.write_bytes(path.read_bytes().replace(b"2,x,2,y", b"2,x,2,z"))

    monkeypatch.setattr(CsvFileBytes, "chunks", chunks_then_change)
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="t")
    try:
        with pytest.raises(SourceInvalid, match="source changed"):
            _mutate(connector, path, _plan("t"), raw=True)
        assert connector.observe(operation_id=_started[-1]).status is FenceStatus.ABSENT
    finally:
        connector.close()
    with duckdb.connect(str(db), read_only=True) as conn:
        tables = conn.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 't'")
        assert tables.fetchone() == (0,)  # the table created for the load rolled back too


def _load_changing_after_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None], rows: int = 2
) -> Path:
    """Pass ``a.csv`` through DuckDB, calling ``change`` between the scan and the re-check."""
    body = "".join(f"{n},n{n},{n},y\n" for n in range(1, rows + 1))
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n" + body)
    original = DuckDbConnector._apply

    def scan_then_change(self: DuckDbConnector, *args: Any) -> int:
        count = original(self, *args)
        change(path)
        return count

    monkeypatch.setattr(DuckDbConnector, "_apply", scan_then_change)
    return path


def _overwrite_in_place(path: Path, last: bytes = b"z\n") -> None:
    """Same size, same inode, other bytes: only the file's timestamps can tell."""
    with path.open("r+b") as handle:
        handle.seek(-2, 2)
        handle.write(last)


def _duckdb_refuses_as_changed(tmp_path: Path, path: Path, passed: list[int]) -> None:
    """Pass ``path`` through DuckDB: "source changed", and nothing committed."""
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="t")
    try:
        with pytest.raises(SourceInvalid, match="source changed"):
            _mutate(connector, path, _plan("t"), raw=True)
        _assert_nothing_committed(connector, db)
    finally:
        connector.close()
    assert passed == []


def _assert_nothing_committed(connector: DuckDbConnector, db: Path) -> None:
    assert connector.observe(operation_id=_started[-1]).status is FenceStatus.ABSENT
    connector.close()
    with duckdb.connect(str(db), read_only=True) as conn:
        tables = conn.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 't'")
        assert tables.fetchone() == (0,)


@pytest.mark.parametrize("settled", [True, False])
def test_duckdb_a_file_written_after_the_scan_never_commits(
    tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch, settled: bool
) -> None:
    """Settled or racy (written just before the load), a write after the scan is caught."""
    if settled:  # pretend the file was written long ago: its stat alone is trusted
        monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    hashed_again: list[bool] = []
    rehash = CsvFileBytes._hash_again
    monkeypatch.setattr(
        CsvFileBytes, "_hash_again", lambda self: hashed_again.append(True) or rehash(self)
    )

    path = _load_changing_after_scan(tmp_path, monkeypatch, _overwrite_in_place)
    _duckdb_refuses_as_changed(tmp_path, path, passed)
    if settled:  # its new mtime and ctime gave the write away, without a re-hash
        assert hashed_again == []


def test_duckdb_a_racy_file_is_hashed_again_even_when_its_stat_did_not_change(
    tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write in the same timestamp tick as the file's last one leaves its stat as it was.

    The stat the checking read saw is pinned, as a coarse clock would leave it: only the
    re-hash of a file written just before the load can notice the new bytes.
    """
    seen: list[tuple[int, ...]] = []
    real_state = _passthrough.stat_key

    def pinned(stat: os.stat_result) -> tuple[int, int, int, int, int]:
        seen.append(real_state(stat))
        return seen[0]  # type: ignore[return-value]

    monkeypatch.setattr(_passthrough, "stat_key", pinned)

    path = _load_changing_after_scan(tmp_path, monkeypatch, _overwrite_in_place)
    _duckdb_refuses_as_changed(tmp_path, path, passed)
    assert len(set(seen)) > 1  # the file's real stat did change; the pinned one did not


@pytest.fixture
def checked_ahead(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """Hash and check a settled file ahead, in a forked child, as ``dpone run`` does."""
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    monkeypatch.setattr(_prefetch, "_PREFETCHED", {})
    monkeypatch.setattr(_prefetch, "_PREFETCHED_CHECKS", {})
    # threads other tests left running: the child runs only what was imported before
    monkeypatch.setattr(_prefetch, "_may_fork", lambda: True)
    monkeypatch.setattr(_prefetch, "_CHECK_WAIT_S", 30.0)  # a busy machine is no failure

    def check(path: Path) -> None:
        _prefetch.prefetch_identity(path, check_csv=",")
        assert isinstance(_prefetch._PREFETCHED[str(path.resolve())], _prefetch._ForkedPrefetch)

    yield check
    _prefetch._end_children(wait=True)  # a failed test leaves no child and no pipe behind


def _no_checking_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duckdb_connector, "_FileCheck", lambda raw: pytest.fail("read again"))


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_duckdb_loads_a_file_checked_ahead_without_reading_it_beside_the_scan(
    tmp_path: Path,
    passed: list[int],
    monkeypatch: pytest.MonkeyPatch,
    checked_ahead: Callable[[Path], None],
    newline: str,
) -> None:
    path = _write(tmp_path / "tricky.csv", _tricky_big(60_000), newline=newline)
    by_rows = tmp_path / "by_rows.duckdb"
    connector = DuckDbConnector(by_rows, table="by_rows")
    try:
        _mutate(connector, path, _plan("by_rows"), raw=False)
    finally:
        connector.close()
    checked_ahead(path)
    _no_checking_read(monkeypatch)
    counting = _CountingSha256()
    monkeypatch.setattr(_passthrough, "hashlib", counting)
    by_file = tmp_path / "by_file.duckdb"
    connector = DuckDbConnector(by_file, table="by_file")
    try:
        assert _mutate(connector, path, _plan("by_file"), raw=True)[:2] == (60_000, 60_000)
    finally:
        connector.close()
    assert passed == [60_000]
    assert counting.started == 0  # the stat vouched for the bytes: no hash in the load
    assert _duck_rows(by_file, "by_file") == _duck_rows(by_rows, "by_rows")


def test_duckdb_a_file_refused_ahead_takes_the_rows_path_without_a_scan(
    tmp_path: Path,
    passed: list[int],
    monkeypatch: pytest.MonkeyPatch,
    checked_ahead: Callable[[Path], None],
) -> None:
    rows = "".join(f"{n},n{n},{n},w\n" for n in range(1, 80_001))
    path = _write(tmp_path / "odd.csv", "id,name,amount,note\n1,a,1,b\n\n" + rows)
    checked_ahead(path)
    _no_checking_read(monkeypatch)
    scanned: list[str] = []
    apply = DuckDbConnector._apply
    monkeypatch.setattr(DuckDbConnector, "_apply", lambda *a: scanned.append(a[-1]) or apply(*a))
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="t")
    try:
        assert _mutate(connector, path, _plan("t"), raw=True)[:2] == (80_001, 80_001)
    finally:
        connector.close()
    assert passed == []  # the rows path loaded it: the blank line skipped, as Python reads it
    assert len(_duck_rows(db, "t")) == 80_001
    assert str(path) not in scanned  # refused before DuckDB read the file


def test_duckdb_a_file_checked_ahead_and_written_after_the_scan_never_commits(
    tmp_path: Path,
    passed: list[int],
    monkeypatch: pytest.MonkeyPatch,
    checked_ahead: Callable[[Path], None],
) -> None:
    path = _load_changing_after_scan(tmp_path, monkeypatch, _overwrite_in_place, rows=80_000)
    checked_ahead(path)
    _no_checking_read(monkeypatch)
    _duckdb_refuses_as_changed(tmp_path, path, passed)


def test_duckdb_reads_beside_the_scan_a_file_written_after_its_check_ahead(
    tmp_path: Path,
    passed: list[int],
    monkeypatch: pytest.MonkeyPatch,
    checked_ahead: Callable[[Path], None],
) -> None:
    """The identity hash and the check saw other bytes: both are made again, in the load."""
    rows = "".join(f"{n},n{n},{n},y\n" for n in range(1, 80_001))
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n" + rows)
    checked_ahead(path)
    pending = _prefetch._PREFETCHED[str(path.resolve())]
    assert isinstance(pending, _prefetch._ForkedPrefetch)
    assert pending._pid is not None
    os.waitpid(pending._pid, 0)  # the child hashed and checked the first bytes
    pending._pid = None
    time.sleep(0.01)
    path.write_bytes(path.read_bytes()[:-2] + b"z\n")
    reads: list[bool] = []
    real = duckdb_connector._FileCheck
    monkeypatch.setattr(duckdb_connector, "_FileCheck", lambda raw: reads.append(True) or real(raw))
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="t")
    try:
        assert _mutate(connector, path, _plan("t"), raw=True)[:2] == (80_000, 80_000)
    finally:
        connector.close()
    assert reads == [True]
    assert passed == [80_000]
    assert _duck_rows(db, "t")[-1][-1] == "z"


def test_duckdb_an_unchanged_settled_file_is_not_hashed_again(
    tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    monkeypatch.setattr(CsvFileBytes, "_hash_again", lambda self: pytest.fail("hashed again"))
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n2,x,2,y\n")
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="t")
    try:
        assert _mutate(connector, path, _plan("t"), raw=True)[:2] == (2, 2)
    finally:
        connector.close()
    assert passed == [2]


@pytest.mark.parametrize("settled", [True, False])
def test_duckdb_a_file_changed_after_its_identity_never_commits(
    tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch, settled: bool
) -> None:
    """Settled, the identity was vouched for by the stat the file no longer has."""
    if settled:
        monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n")
    source = CsvSource(path, columns=TYPES)
    identity = source.snapshot_identity()
    # offering the file vouches for the identity of a settled read, by its stat then
    assert source.raw_csv(identity) is not None
    assert (_prefetch._VOUCHED != {}) is settled
    _overwrite_in_place(path, b"B\n")
    connector = DuckDbConnector(tmp_path / "t.duckdb", table="t")
    try:
        with pytest.raises(SourceInvalid, match="source changed"):
            _mutate(connector, path, _plan("t"), raw=True, identity=identity)
    finally:
        connector.close()
    assert passed == []


class _CountingSha256:
    """Counts the hashes ``_passthrough`` starts."""

    def __init__(self) -> None:
        self.started = 0

    def sha256(self) -> Any:
        self.started += 1
        return hashlib.sha256()


@pytest.mark.parametrize("settled", [True, False])
def test_duckdb_checks_without_hashing_a_file_its_identity_hash_vouches_for(
    tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch, settled: bool
) -> None:
    """The identity was hashed from this file, settled, with the stat it still has."""
    if settled:
        monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    counting = _CountingSha256()
    monkeypatch.setattr(_passthrough, "hashlib", counting)
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n2,x,2,y\n")
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="t")
    try:
        assert _mutate(connector, path, _plan("t"), raw=True)[:2] == (2, 2)
    finally:
        connector.close()
    assert passed == [2]
    # settled: neither the checking read nor the re-check hashed; racy: both did
    assert counting.started == (0 if settled else 2)


@pytest.mark.parametrize("settled", [True, False])
def test_pg_streams_a_vouched_file_without_hashing_it(
    pg: tuple[str, str],
    tmp_path: Path,
    passed: list[int],
    monkeypatch: pytest.MonkeyPatch,
    settled: bool,
) -> None:
    """The identity was hashed from this file, settled, with the stat it still has."""
    if settled:
        monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    counting = _CountingSha256()
    monkeypatch.setattr(_passthrough, "hashlib", counting)
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n2,x,2,y\n")
    connector = _pg_connector(pg, "t")
    try:
        assert _mutate(connector, path, _plan(f"{pg[1]}.t"), raw=True)[:2] == (2, 2)
    finally:
        connector.close()
    assert passed == [2]
    assert _pg_rows(pg, "t") == [(1, "a", 1.0, "b"), (2, "x", 2.0, "y")]
    # settled: the stat after the last read proves the bytes; racy: they are hashed
    assert counting.started == (0 if settled else 1)


@pytest.mark.parametrize("settled", [True, False])
def test_pg_a_file_overwritten_in_place_while_it_streams_never_commits(
    pg: tuple[str, str],
    tmp_path: Path,
    passed: list[int],
    monkeypatch: pytest.MonkeyPatch,
    settled: bool,
) -> None:
    """Same size, same inode, new bytes after the first chunk: settled (no hash) or racy."""
    if settled:  # the identity is vouched for: only the stat after the last read can tell
        monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    counting = _CountingSha256()
    monkeypatch.setattr(_passthrough, "hashlib", counting)
    monkeypatch.setattr(_passthrough, "CHUNK_SIZE", 24)  # several chunks, the header in the first
    rows = "".join(f"{n},n{n},{n},w\n" for n in range(1, 11))  # read after the overwrite
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n" + rows)
    check = _passthrough.Checker.check
    calls = count()

    def check_then_overwrite(self: Any, chunk: bytes, *, final: bool) -> None:
        check(self, chunk, final=final)
        if next(calls) == 0:  # after the first chunk was read (and the second)
            # a settled file's next write is stamped in a later clock tick than its last
            time.sleep(0.05)
            _overwrite_in_place(path, b"Z\n")

    monkeypatch.setattr(_passthrough.Checker, "check", check_then_overwrite)
    connector = _pg_connector(pg, "t")
    try:
        with pytest.raises(SourceInvalid, match="source changed"):
            _mutate(connector, path, _plan(f"{pg[1]}.t"), raw=True)
    finally:
        connector.close()
    assert passed == []
    assert counting.started == (0 if settled else 1)
    dsn, schema = pg
    with psycopg.connect(dsn) as conn:
        fence = conn.execute(f'SELECT state FROM "{schema}".dpone_fence').fetchall()
        table = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = 't'", (schema,)
        ).fetchone()
    assert fence == []  # nothing committed: no fence, no table
    assert table == (0,)


def test_pg_a_file_changed_after_its_vouched_identity_never_commits(
    pg: tuple[str, str], tmp_path: Path, passed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written after its identity was vouched for: the stream's open sees another stat."""
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    counting = _CountingSha256()
    monkeypatch.setattr(_passthrough, "hashlib", counting)
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n")
    source = CsvSource(path, columns=TYPES)
    identity = source.snapshot_identity()
    # offering the file vouches for the identity of a settled read, by its stat then
    assert source.raw_csv(identity) is not None
    assert _prefetch._VOUCHED != {}
    _overwrite_in_place(path, b"B\n")
    connector = _pg_connector(pg, "t")
    try:
        with pytest.raises(SourceInvalid, match="source changed"):
            _mutate(connector, path, _plan(f"{pg[1]}.t"), raw=True, identity=identity)
    finally:
        connector.close()
    assert passed == []
    assert counting.started == 1  # not vouched at the stream's open: hashed, and refused


def test_duckdb_a_value_duckdb_refuses_is_reported_as_by_the_rows_path(
    tmp_path: Path, passed: list[int]
) -> None:
    path = _write(tmp_path / "bad.csv", "id,name,amount,note\n1,a,1,b\n2,x,notanumber,y\n")
    errors = []
    for table, raw in (("by_file", True), ("by_rows", False)):
        connector = DuckDbConnector(tmp_path / f"{table}.duckdb", table=table)
        try:
            with pytest.raises(TargetWriteFailed) as caught:
                _mutate(connector, path, _plan(table), raw=raw)
            errors.append(type(caught.value))
        finally:
            connector.close()
    assert errors[0] is errors[1]
    assert passed == []


def test_duckdb_merge_and_replace_pass_through(tmp_path: Path, passed: list[int]) -> None:
    first = _write(tmp_path / "1.csv", "id,name,amount,note\n1,a,1,x\n2,b,2,x\n")
    second = _write(tmp_path / "2.csv", "id,name,amount,note\n2,B,20,y\n3,c,3,y\n2,BB,21,y\n")
    db = tmp_path / "t.duckdb"
    connector = DuckDbConnector(db, table="m")
    try:
        merge = _plan("m", LoadStrategy.MERGE, key=("id",))
        assert _mutate(connector, first, merge, raw=True)[:2] == (2, 2)
        assert _mutate(connector, second, merge, raw=True)[:2] == (3, 3)
    finally:
        connector.close()
    assert _duck_rows(db, "m") == [(1, "a", 1.0, "x"), (2, "BB", 21.0, "y"), (3, "c", 3.0, "y")]
    connector = DuckDbConnector(db, table="r")
    try:
        _mutate(connector, first, _plan("r", LoadStrategy.REPLACE), raw=True)
        _mutate(connector, second, _plan("r", LoadStrategy.REPLACE), raw=True)
    finally:
        connector.close()
    assert [r[0] for r in _duck_rows(db, "r")] == [2, 2, 3]
    assert passed == [2, 3, 2, 3]


# ----------------------------------------------------------------- the offer itself


def test_an_interval_filter_or_a_started_stream_offers_no_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.csv", "id,name,amount,note\n1,a,1,b\n")
    source = CsvSource(path, columns=TYPES)
    identity = source.snapshot_identity()
    day = parse_interval("2026-11-01/2026-11-02")
    filtered = within_interval(
        source.batches(batch_size=10, expected_identity=identity),
        index=0,
        column="id",
        interval=day,
        tally=RowTally(),
    )
    assert raw_csv_of(counted(filtered, RowTally(), None)) is None
    stream = counted(source.batches(batch_size=10, expected_identity=identity), RowTally(), None)
    next(stream)
    assert raw_csv_of(stream) is None
    other = CsvSource(path, columns=TYPES, delimiter=":")
    assert other.raw_csv(identity) is None
