"""The fence conformance suite against the staging partition writer, on both object stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from dpone.adapters.connectors.staging import StagingPartitionConnector
from dpone.adapters.objectstores.formats import ParquetFormat
from dpone.adapters.objectstores.local import LocalObjectStore
from dpone.adapters.objectstores.s3 import S3ObjectStore
from dpone.contracts.fence import FenceCapability
from dpone.contracts.publication import PartitionLayout
from dpone.ports.connector import TargetConnectorPort
from dpone.ports.object_store import ObjectStorePort
from dpone.testing.fence_conformance import FenceConformance
from dpone.testing.s3_server import S3Server

LAYOUT = PartitionLayout(
    dataset="items", interval="20261101T000000Z_20261102T000000Z", generation="0" * 16
)


class TestStagingFence(FenceConformance):
    """On the local directory store."""

    capability = FenceCapability.STAGING_GENERATION

    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStorePort:
        return LocalObjectStore(tmp_path / "lake")

    @pytest.fixture
    def connector(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> Iterator[TargetConnectorPort]:
        self._store = self.store(request, tmp_path)
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


class TestStagingFenceS3(TestStagingFence):
    """On S3 (obstore) against the loopback S3-API server."""

    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStorePort:
        server: S3Server = request.getfixturevalue("s3_server")
        return S3ObjectStore(
            bucket=request.getfixturevalue("s3_bucket"),
            endpoint=server.endpoint,
            access_key_id="testing",
            secret_access_key="testing",  # noqa: S106 - moto's dummy credentials
        )
