"""The fence conformance suite against PostgresConnector, one schema per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql

from dpone.adapters.connectors.postgres import PostgresConnector
from dpone.contracts.fence import FenceCapability, FenceStatus
from dpone.contracts.load import LoadStrategy
from dpone.errors import TargetWriteFailed
from dpone.ports.connector import TargetConnectorPort
from dpone.testing.fence_conformance import FenceConformance


def _pg(connector: TargetConnectorPort) -> PostgresConnector:
    return cast(PostgresConnector, connector)


class TestPostgresFence(FenceConformance):
    capability = FenceCapability.TRANSACTIONAL_MARKER
    reports_committed_fence = True

    @pytest.fixture
    def connector(self, pg_available: str, pg_schema: str) -> Iterator[TargetConnectorPort]:
        # Table and fence both live in the test's own schema (dropped afterwards).
        self.table = f"{pg_schema}.items"
        self.dsn = pg_available
        connector = PostgresConnector(pg_available, table=self.table, fence_schema=pg_schema)
        yield connector
        connector.close()

    def _query(self, statement: sql.Composable) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(statement).fetchall()

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        schema, name = table.split(".")
        exists = self._query(
            sql.SQL("SELECT to_regclass({})").format(
                sql.Literal(sql.Identifier(schema, name).as_string(None))
            )
        )
        if exists[0][0] is None:
            return 0
        counted = self._query(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name))
        )
        return int(counted[0][0])

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        schema, name = table.split(".")
        rows = self._query(
            sql.SQL("SELECT id, v FROM {} ORDER BY id, v").format(sql.Identifier(schema, name))
        )
        return [(r[0], r[1]) for r in rows]

    def peer_connector(
        self, connector: TargetConnectorPort, *, lock_timeout_s: float
    ) -> TargetConnectorPort:
        return PostgresConnector(
            self.dsn,
            table=self.table,
            fence_schema=_pg(connector).fence_schema,
            lock_timeout_s=lock_timeout_s,
        )


class TestPostgresFenceSmallPath(TestPostgresFence):
    """The same contract through the small-operation path.

    The table exists and the connector has checked it, so every append, replace and
    replace_interval write of a few rows is one pipelined transaction with a multi-row
    INSERT (merge keeps its staging table).
    """

    @pytest.fixture
    def connector(
        self, pg_available: str, pg_schema: str, request: pytest.FixtureRequest
    ) -> Iterator[TargetConnectorPort]:
        self.table = f"{pg_schema}.items"
        self.dsn = pg_available
        callspec = getattr(request.node, "callspec", None)
        merge = callspec is not None and callspec.params.get("case") == "merge"
        key = sql.SQL(", UNIQUE (id)" if merge else "")
        with psycopg.connect(pg_available, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint, v text, at timestamptz{})").format(
                    sql.Identifier(pg_schema, "items"), key
                )
            )
        connector = PostgresConnector(pg_available, table=self.table, fence_schema=pg_schema)
        strategies = [LoadStrategy.APPEND, LoadStrategy.REPLACE, LoadStrategy.REPLACE_INTERVAL]
        for strategy in strategies + ([LoadStrategy.MERGE] if merge else []):
            connector.check_plan(self.plan(strategy))
        yield connector
        connector.close()

    def test_small_writes_take_the_pipelined_path(self, connector: TargetConnectorPort) -> None:
        """Guard against a vacuous class: a checked table's small write is an INSERT."""
        self.load(connector, [(1, "a", None), (2, "", "2026-11-01T00:00:00Z")])
        assert _pg(connector)._inserts, "the small path was not taken"
        assert self._query(
            sql.SQL("SELECT id, v, at IS NULL FROM {} ORDER BY id").format(
                sql.Identifier(*self.table.split("."))
            )
        ) == [(1, "a", True), (2, None, False)]  # '' is NULL, as with COPY (NULL '')

    def test_a_value_the_server_rejects_rolls_the_pipeline_back(
        self, connector: TargetConnectorPort
    ) -> None:
        """A failed statement inside the pipeline: nothing written, fence still prepared,
        and the connection is rolled back and kept (not left in a failed transaction)."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        before = _pg(connector)._conn
        with pytest.raises(TargetWriteFailed):
            self.mutate(connector, (op, intent), epoch=1, rows=[(1, "a", None), ("x", "b", None)])
        assert self.count_rows(connector, self.table) == 0
        assert connector.observe(operation_id=op).status is FenceStatus.PREPARED
        assert _pg(connector)._conn is before
        self.mutate(connector, (op, intent), epoch=1, rows=[(1, "a", None)])
        assert self.count_rows(connector, self.table) == 1
