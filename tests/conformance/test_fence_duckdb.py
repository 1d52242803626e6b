"""The fence conformance suite against DuckDbConnector."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from dpone.contracts.fence import FenceCapability
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance

duckdb = pytest.importorskip("duckdb")

from dpone.adapters.connectors.duckdb import DuckDbConnector  # noqa: E402


def _path(connector: TargetConnectorPort) -> Path:
    return cast(DuckDbConnector, connector).path


def _query(connector: TargetConnectorPort, sql: str) -> list[tuple[Any, ...]]:
    # A cursor of the same in-process database: DuckDB locks the file per process.
    with duckdb.connect(str(_path(connector))) as db:
        rows: list[tuple[Any, ...]] = db.execute(sql).fetchall()
        return rows


class TestDuckDbFence(FenceConformance):
    capability = FenceCapability.TRANSACTIONAL_MARKER
    reports_committed_fence = True

    @pytest.fixture
    def connector(self, tmp_path: Path) -> Iterator[TargetConnectorPort]:
        connector = DuckDbConnector(tmp_path / "target.duckdb", table=self.table)
        yield connector
        connector.close()

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        exists = _query(connector, f"SELECT 1 FROM duckdb_tables() WHERE table_name = '{table}'")
        return int(_query(connector, f'SELECT count(*) FROM "{table}"')[0][0]) if exists else 0

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        return [
            (r[0], r[1]) for r in _query(connector, f'SELECT id, v FROM "{table}" ORDER BY id, v')
        ]

    def peer_connector(
        self, connector: TargetConnectorPort, *, lock_timeout_s: float
    ) -> TargetConnectorPort:
        # Same process, same database instance, its own connection and transactions.
        return DuckDbConnector(_path(connector), table=self.table, lock_timeout_s=lock_timeout_s)
