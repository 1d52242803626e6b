"""Write-audit-publish on every SQL target: a failed audit publishes nothing.

Each target first takes a clean load (audits pass), then a load whose rows break the
audits: the target table must be byte-for-byte what it was (a full, ordered dump), the
journal must say FAILED_PRE_COMMIT with the findings (counts, no rows), and the same
operation must complete once the audit is relaxed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dpone.adapters.journal.sqlite import SqliteCommitJournal
from dpone.api import Runner
from dpone.config.workload import parse_workload
from dpone.contracts.states import CommitState
from dpone.errors import AuditFailed, ConfigInvalid
from dpone.runtime import failpoints

CLEAN = [{"id": 1, "email": "a@example.org"}, {"id": 2, "email": "b@example.org"}]
DIRTY = [
    {"id": 7, "email": "c@example.org"},
    {"id": 7, "email": None},  # a duplicate key and a null
    {"id": 8, "email": "-1"},
]
AUDITS = {
    "min_rows": 1,
    "max_rows": 100,
    "not_null": ["email"],
    "unique_key": ["id"],
    "sql": [{"name": "no_negative_marker", "query": "SELECT id FROM {table} WHERE email = '-1'"}],
}

Dump = Callable[[], list[tuple[Any, ...]]]


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    failpoints.configure(None)


def _sqlite_dump(path: Path) -> Dump:
    def dump() -> list[tuple[Any, ...]]:
        with sqlite3.connect(path) as conn:
            return conn.execute("SELECT * FROM people ORDER BY id, email").fetchall()

    return dump


def _target(request: pytest.FixtureRequest, root: Path) -> tuple[dict[str, Any], Dump, str]:
    """(target config, dump of the target table, journal URL) for one target kind."""
    kind = request.param
    if kind in ("sqlite", "sqlite-atomic"):
        journal = "sqlite:///wh.db" if kind == "sqlite-atomic" else "sqlite:///journal.db"
        target = {"kind": "sqlite", "url": "sqlite:///wh.db", "table": "people"}
        return target, _sqlite_dump(root / "wh.db"), journal
    if kind == "duckdb":
        import duckdb

        def dump_duck() -> list[tuple[Any, ...]]:
            with duckdb.connect(str(root / "wh.duckdb"), read_only=True) as conn:
                return conn.execute("SELECT * FROM people ORDER BY id, email").fetchall()

        target = {"kind": "duckdb", "url": "duckdb:///wh.duckdb", "table": "people"}
        return target, dump_duck, "sqlite:///journal.db"
    if kind == "postgres":
        import psycopg

        dsn = request.getfixturevalue("pg_available")
        schema = request.getfixturevalue("pg_schema")

        def dump_pg() -> list[tuple[Any, ...]]:
            with psycopg.connect(dsn) as conn:
                return conn.execute(
                    f'SELECT * FROM "{schema}".people ORDER BY id, email'
                ).fetchall()

        return (
            {"kind": "postgres", "url": dsn, "table": f"{schema}.people"},
            dump_pg,
            "sqlite:///journal.db",
        )
    import pymysql

    dsn = request.getfixturevalue("mariadb_database")
    parts = urlsplit(dsn)

    def dump_maria() -> list[tuple[Any, ...]]:
        conn = pymysql.connect(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            database=parts.path.lstrip("/"),
        )
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT * FROM people ORDER BY id, email")
                return list(cur.fetchall())
        finally:
            conn.close()

    return {"kind": "mariadb", "url": dsn, "table": "people"}, dump_maria, "sqlite:///journal.db"


@pytest.fixture(params=["sqlite", "sqlite-atomic", "duckdb", "postgres", "mariadb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict[str, Any], Dump, str]:
    return _target(request, tmp_path)


def _workload(root: Path, target: dict[str, Any], journal: str, audits: dict[str, Any] | None):  # type: ignore[no-untyped-def]
    data: dict[str, Any] = {
        "workload": "people",
        "release": "r1",
        "deployment": "test",
        "journal": journal,
        "source": {"kind": "jsonl", "path": "{start:%Y-%m-%d}.jsonl"},
        "target": target,
        "load": {"strategy": "append"},
    }
    if audits is not None:
        data["audits"] = audits
    return parse_workload(data, base_dir=root)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_a_failed_audit_leaves_the_target_untouched_and_the_operation_retryable(
    tmp_path: Path, target: tuple[dict[str, Any], Dump, str]
) -> None:
    """Audits pass -> published; audits fail -> nothing published, FAILED_PRE_COMMIT, retry OK."""
    config, dump, journal_url = target
    _jsonl(tmp_path / "2026-11-01.jsonl", CLEAN)
    _jsonl(tmp_path / "2026-11-02.jsonl", DIRTY)
    audited = _workload(tmp_path, config, journal_url, AUDITS)
    with Runner(audited) as runner:
        assert runner.run(interval="2026-11-01/2026-11-02").rows_written == 2
    before = dump()
    assert len(before) == 2

    with Runner(audited) as runner, pytest.raises(AuditFailed) as caught:
        runner.run(interval="2026-11-02/2026-11-03")
    assert caught.value.findings == {
        "audit_failed": "not_null:email",
        "audit_violations": 1,
        "audits_failed": 3,
        "audits_run": 5,
    }
    assert dump() == before  # the whole table, every column, in order: unchanged

    journal = SqliteCommitJournal(tmp_path / urlsplit(journal_url).path.lstrip("/"))
    try:
        failed = [e for e in journal.list_entries() if e.state is CommitState.FAILED_PRE_COMMIT]
        [entry] = failed
        [evidence] = [
            t.evidence
            for t in journal.history(entry.operation_id)
            if t.to_state is CommitState.FAILED_PRE_COMMIT
        ]
    finally:
        journal.close()
    assert evidence["error_code"] == "DPONE_AUDIT_FAILED"
    assert evidence["audit_failed"] == "not_null:email"
    assert evidence["audits_failed"] == 3
    assert "c@example.org" not in json.dumps(dict(evidence))  # counts, never rows

    # audits decide publication, not content: relaxing them retries the same operation
    relaxed = _workload(tmp_path, config, journal_url, {"min_rows": 1})
    with Runner(relaxed) as runner:
        result = runner.run(interval="2026-11-02/2026-11-03")
    assert result.operation_id == entry.operation_id
    assert result.state is CommitState.COMPLETE
    assert len(dump()) == 5


def test_audits_need_a_sql_target(tmp_path: Path) -> None:
    """An audits block on a file target is a config error, not a silent no-op."""
    with pytest.raises(ConfigInvalid, match="audits"):
        _workload(tmp_path, {"kind": "jsonl_append", "path": "out.jsonl"}, "memory://", AUDITS)


def test_an_audit_query_must_be_one_select(tmp_path: Path) -> None:
    """A custom audit that is not a single SELECT is refused at load time."""
    bad = {"sql": [{"name": "x", "query": "DELETE FROM {table}; SELECT 1"}]}
    with pytest.raises(ConfigInvalid, match="SELECT"):
        _workload(
            tmp_path, {"kind": "sqlite", "url": "sqlite:///wh.db", "table": "t"}, "memory://", bad
        )
