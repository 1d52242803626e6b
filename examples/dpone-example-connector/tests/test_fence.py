"""The example connector proves its fence with dpone's own conformance suite."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import pytest
from dpone_example.connector import ExampleConnector

from dpone.contracts.fence import FenceCapability
from dpone.contracts.load import LoadStrategy
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance


class TestExampleFence(FenceConformance):
    capability = FenceCapability.TRANSACTIONAL_MARKER
    strategies = frozenset({LoadStrategy.APPEND})

    @pytest.fixture
    def connector(self, tmp_path: Path) -> Iterator[TargetConnectorPort]:
        connector = ExampleConnector(tmp_path / "target.db", table=self.table)
        yield cast(TargetConnectorPort, connector)
        connector.close()

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        return len(self.fetch_rows(connector, table))

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        path = cast(ExampleConnector, connector)._path
        with closing(sqlite3.connect(path)) as db:
            exists = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
            if not exists:
                return []
            return db.execute(f'SELECT id, v FROM "{table}" ORDER BY id, v').fetchall()

    def peer_connector(
        self, connector: TargetConnectorPort, *, lock_timeout_s: float
    ) -> TargetConnectorPort:
        path = cast(ExampleConnector, connector)._path
        return cast(
            TargetConnectorPort,
            ExampleConnector(path, table=self.table, lock_timeout_s=lock_timeout_s),
        )
