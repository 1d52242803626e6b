"""The fence conformance suite against the staging partition writer (staging_generation)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from dpone.adapters.connectors.staging import StagingPartitionConnector
from dpone.adapters.objectstores.formats import ParquetFormat
from dpone.adapters.objectstores.local import LocalObjectStore
from dpone.contracts.fence import FenceCapability
from dpone.contracts.publication import PartitionLayout
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance

LAYOUT = PartitionLayout(
    dataset="items", interval="20261101T000000Z_20261102T000000Z", generation="0" * 16
)


class TestStagingFence(FenceConformance):
    capability = FenceCapability.STAGING_GENERATION

    @pytest.fixture
    def connector(self, tmp_path: Path) -> Iterator[TargetConnectorPort]:
        self._store = LocalObjectStore(tmp_path / "lake")
        connector = StagingPartitionConnector(
            store=self._store,
            layout=LAYOUT,
            partition="p1",
            table_format=ParquetFormat(),
            source_manifest="sha256:" + "0" * 64,
        )
        yield cast(TargetConnectorPort, connector)
        connector.close()

    def _rows(self) -> list[tuple[Any, ...]]:
        got = self._store.read(LAYOUT.data_key("p1"))
        return [] if got is None else ParquetFormat().decode(got[0])[1]

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        return len(self._rows())

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        return sorted((r[0], r[1]) for r in self._rows())
