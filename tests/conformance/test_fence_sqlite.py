"""The fence conformance suite against SqliteConnector."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import pytest

from dpone.adapters.connectors.sqlite import SqliteConnector
from dpone.contracts.fence import FenceCapability
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance


def _path(connector: TargetConnectorPort) -> Path:
    return cast(SqliteConnector, connector).path


class TestSqliteFence(FenceConformance):
    capability = FenceCapability.TRANSACTIONAL_MARKER
    reports_committed_fence = True

    @pytest.fixture
    def connector(self, tmp_path: Path) -> Iterator[TargetConnectorPort]:
        connector = SqliteConnector(tmp_path / "target.db", table=self.table)
        yield connector
        connector.close()

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        with closing(sqlite3.connect(_path(connector))) as db:
            exists = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
            return db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] if exists else 0

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        with closing(sqlite3.connect(_path(connector))) as db:
            return db.execute(f'SELECT id, v FROM "{table}" ORDER BY id, v').fetchall()

    def peer_connector(
        self, connector: TargetConnectorPort, *, lock_timeout_s: float
    ) -> TargetConnectorPort:
        return SqliteConnector(_path(connector), table=self.table, lock_timeout_s=lock_timeout_s)
