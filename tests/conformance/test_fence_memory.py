"""The fence conformance suite against the in-memory connector used by unit tests."""

from __future__ import annotations

from typing import Any, cast

import pytest

from dpone.contracts.fence import FenceCapability
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance
from dpone.testing.memory import InMemoryConnector


class TestMemoryFence(FenceConformance):
    capability = FenceCapability.TRANSACTIONAL_MARKER

    @pytest.fixture
    def connector(self) -> TargetConnectorPort:
        return cast(TargetConnectorPort, InMemoryConnector(table=self.table))

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        return len(cast(InMemoryConnector, connector).rows(table))

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        rows = cast(InMemoryConnector, connector).rows(table)
        return sorted((r["id"], r["v"]) for r in rows)

    def peer_connector(
        self, connector: TargetConnectorPort, *, lock_timeout_s: float
    ) -> TargetConnectorPort:
        return cast(InMemoryConnector, connector).sibling(lock_timeout_s=lock_timeout_s)
