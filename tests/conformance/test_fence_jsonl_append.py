"""The fence conformance suite against JsonlAppendConnector (capability none)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from dpone.adapters.connectors.jsonl_append import JsonlAppendConnector
from dpone.contracts.fence import FenceCapability
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance


def _lines(connector: TargetConnectorPort) -> list[dict[str, Any]]:
    path = cast(JsonlAppendConnector, connector).path
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class TestJsonlAppendFence(FenceConformance):
    capability = FenceCapability.NONE

    @pytest.fixture
    def connector(self, tmp_path: Path) -> Iterator[TargetConnectorPort]:
        connector = JsonlAppendConnector(tmp_path / "out" / "rows.jsonl")
        yield connector
        connector.close()

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        return len(_lines(connector))

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        return sorted((row["id"], row["v"]) for row in _lines(connector))
