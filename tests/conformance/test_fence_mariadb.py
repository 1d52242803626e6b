"""The fence conformance suite against MariaDbConnector, one database per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import urlsplit

import pytest

from dpone.adapters.connectors.mariadb import MariaDbConnector
from dpone.contracts.fence import FenceCapability
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance


def query(dsn: str, statement: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh autocommit connection; return its rows."""
    import pymysql

    parts = urlsplit(dsn)
    conn = pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.path.lstrip("/"),
        autocommit=True,
        charset="utf8mb4",
    )
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args or None)
            return list(cur.fetchall())
    finally:
        conn.close()


class TestMariadbFence(FenceConformance):
    capability = FenceCapability.TRANSACTIONAL_MARKER
    reports_committed_fence = True

    @pytest.fixture
    def connector(self, mariadb_database: str) -> Iterator[TargetConnectorPort]:
        # Table and fence both live in the test's own database (dropped afterwards).
        self.dsn = mariadb_database
        self.database = urlsplit(mariadb_database).path.lstrip("/")
        self.table = "items"
        connector = MariaDbConnector(mariadb_database, table=self.table)
        yield connector
        connector.close()

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        exists = query(
            self.dsn,
            "SELECT COUNT(*) FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (self.database, table),
        )
        if not exists[0][0]:
            return 0
        return int(query(self.dsn, f"SELECT COUNT(*) FROM `{table}`")[0][0])

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        rows = query(self.dsn, f"SELECT id, v FROM `{table}` ORDER BY id, v")
        return [(r[0], r[1]) for r in rows]

    def peer_connector(
        self, connector: TargetConnectorPort, *, lock_timeout_s: float
    ) -> TargetConnectorPort:
        return MariaDbConnector(
            self.dsn,
            table=self.table,
            fence_schema=cast(MariaDbConnector, connector).fence_schema,
            lock_timeout_s=lock_timeout_s,
        )
