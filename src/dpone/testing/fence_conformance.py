"""Conformance suite for TargetConnectorPort fences: subclass FenceConformance, give a connector.

Usage, in a test module of the connector (psycopg ``dbapi20`` style)::

    from dpone.testing.fence_conformance import FenceConformance

    class TestSqliteFence(FenceConformance):
        @pytest.fixture
        def connector(self, tmp_path):
            connector = SqliteConnector(tmp_path / "t.db", table=self.table)
            yield connector
            connector.close()

        def count_rows(self, connector, table):  # 0 when the table does not exist
            ...

        def fetch_rows(self, connector, table):  # [(id, v), ...] ordered by id
            ...

        def peer_connector(self, connector, *, lock_timeout_s):  # optional: zombie tests
            return SqliteConnector(connector.path, table=self.table, lock_timeout_s=lock_timeout_s)

Tests pick themselves by the connector's capability: ``transactional_marker`` tests are
skipped, with the reason, for other capabilities, and ``none`` tests check that such a
connector never claims a proof. The class name shows the backend in test ids. Every test
uses fresh operation ids, but expects the table ``table`` to start empty.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

import pytest

from dpone.contracts.fence import FenceCapability, FenceStatus, SealOutcome
from dpone.contracts.identity import Interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy, MutationReport
from dpone.errors import DponeError, FencedOut, FenceUnavailable, TargetWriteFailed
from dpone.ports.connector import TargetConnectorPort, WithinTransaction

__all__ = ["FenceConformance", "needs"]

_F = TypeVar("_F", bound=Callable[..., Any])

_MARKER = FenceCapability.TRANSACTIONAL_MARKER
_NONE = FenceCapability.NONE
_STAGING = FenceCapability.STAGING_GENERATION

_COLUMNS = (
    Column(name="id", type=ColumnType.INTEGER),
    Column(name="v", type=ColumnType.TEXT),
    Column(name="at", type=ColumnType.TIMESTAMP),
)
_DAY1 = Interval(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 2, tzinfo=UTC))
_DAYS1_2 = Interval(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 3, tzinfo=UTC))

Row = tuple[object, ...]


def needs(capability: FenceCapability) -> Callable[[_F], _F]:
    """Mark a test as meaningful only for connectors with ``capability``."""

    def mark(test: _F) -> _F:
        test.__dpone_capability__ = capability  # type: ignore[attr-defined]
        return test

    return mark


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class FenceConformance:
    """The fence contract of ARCHITECTURE section 7, for any TargetConnectorPort."""

    #: The table every test writes; it must not exist (or be empty) when a test starts.
    table: ClassVar[str] = "dpone_conformance_items"
    #: Lock bound for the peer connector in zombie tests; short so the suite stays fast.
    short_lock_timeout_s: ClassVar[float] = 0.2
    #: The connector's capability. Declare it: tests for other capabilities are then not
    #: collected at all for the subclass (instead of being skipped at run time).
    capability: ClassVar[FenceCapability | None] = None
    #: The load strategies the connector supports; each is tested, the others are not.
    strategies: ClassVar[frozenset[LoadStrategy]] = frozenset(LoadStrategy)
    #: True when the connector's ``mutate`` reports the committed fence row
    #: (``MutationReport.committed``) on every path; the suite then requires it. Either
    #: way, a reported row must be what ``observe`` reads afterwards (every mutate here).
    reports_committed_fence: ClassVar[bool] = False

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize the strategy test with the strategies this connector declares."""
        if "case" in metafunc.fixturenames:
            cases = [
                name for name, spec in self._STRATEGY_CASES.items() if spec[0] in self.strategies
            ]
            metafunc.parametrize("case", cases)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.capability is None:
            return
        for name in dir(cls):
            wanted = getattr(getattr(cls, name, None), "__dpone_capability__", None)
            if name.startswith("test_") and wanted is not None and wanted is not cls.capability:
                setattr(cls, name, None)  # pytest collects nothing for a None attribute

    # ----------------------------------------------------------------- hooks

    @pytest.fixture
    def connector(self) -> Iterator[TargetConnectorPort]:
        """Yield a connector to an empty target; subclasses must override this fixture."""
        raise NotImplementedError("override the connector fixture in the FenceConformance subclass")

    def count_rows(self, connector: TargetConnectorPort, table: str) -> int:
        """Return the number of rows in ``table`` (0 when it does not exist)."""
        raise NotImplementedError("override count_rows in the FenceConformance subclass")

    def fetch_rows(self, connector: TargetConnectorPort, table: str) -> list[tuple[Any, Any]]:
        """Return ``(id, v)`` of every row of ``table``, ordered by ``id`` then ``v``."""
        raise NotImplementedError("override fetch_rows in the FenceConformance subclass")

    def peer_connector(
        self, connector: TargetConnectorPort, *, lock_timeout_s: float
    ) -> TargetConnectorPort:
        """Return a second connector to the same target, with its own connections and bound."""
        pytest.skip("peer_connector is not provided: zombie-writer tests need a second connector")

    # ----------------------------------------------------------------- helpers

    @pytest.fixture(autouse=True)
    def _capability_gate(self, request: pytest.FixtureRequest) -> None:
        wanted: FenceCapability | None = getattr(request.function, "__dpone_capability__", None)
        if wanted is None:
            return
        connector: TargetConnectorPort = request.getfixturevalue("connector")
        if connector.capability is not wanted:
            pytest.skip(
                f"needs capability {wanted.value}; this connector has {connector.capability.value}"
            )

    @staticmethod
    def new_operation() -> tuple[str, str]:
        """Return a fresh ``(operation_id, intent_digest)``."""
        token = secrets.token_hex(16)
        return _digest(f"operation {token}"), _digest(f"intent {token}")

    def plan(
        self, strategy: LoadStrategy = LoadStrategy.APPEND, *, interval: Interval = _DAY1
    ) -> LoadPlan:
        """Return a plan for ``(id integer, v text, at timestamp)`` with ``strategy``."""
        return LoadPlan(
            table=self.table,
            strategy=strategy,
            columns=_COLUMNS,
            key=("id",) if strategy is LoadStrategy.MERGE else (),
            interval_column="at" if strategy is LoadStrategy.REPLACE_INTERVAL else None,
            interval=interval if strategy is LoadStrategy.REPLACE_INTERVAL else None,
        )

    def mutate(
        self,
        connector: TargetConnectorPort,
        operation: tuple[str, str],
        *,
        epoch: int,
        rows: Sequence[Row],
        plan: LoadPlan | None = None,
        within: WithinTransaction | None = None,
        batch_size: int = 2,
        prepare: bool = False,
    ) -> MutationReport:
        """Call ``mutate`` with ``rows`` split into batches of ``batch_size``.

        A committed fence row the report carries is checked against ``observe``.
        """
        operation_id, intent_digest = operation
        batches = [list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]
        report = connector.mutate(
            operation_id=operation_id,
            intent_digest=intent_digest,
            epoch=epoch,
            plan=plan or self.plan(),
            batches=batches,
            content_digest=_digest(repr(rows)),
            within=within,
            prepare=prepare,
        )
        self.check_reported_commit(connector, operation_id, report)
        return report

    @staticmethod
    def check_reported_commit(
        connector: TargetConnectorPort, operation_id: str, report: MutationReport
    ) -> None:
        """A committed fence row in ``report`` is exactly what ``observe`` reads now."""
        if report.committed is None:
            return
        seen = connector.observe(operation_id=operation_id)
        assert report.committed == seen, (report.committed, seen)
        assert report.committed.status is FenceStatus.COMMITTED
        assert report.committed.row_count == report.row_count
        assert report.committed.content_digest == report.content_digest

    def load(
        self,
        connector: TargetConnectorPort,
        rows: Sequence[Row],
        *,
        plan: LoadPlan | None = None,
        epoch: int = 1,
    ) -> tuple[tuple[str, str], MutationReport]:
        """Run one new operation through prepare and mutate."""
        operation = self.new_operation()
        connector.prepare(operation_id=operation[0], intent_digest=operation[1], epoch=epoch)
        return operation, self.mutate(connector, operation, epoch=epoch, rows=rows, plan=plan)

    # ----------------------------------------------------------------- transactional marker

    @needs(_MARKER)
    def test_observe_absent_then_prepared(self, connector: TargetConnectorPort) -> None:
        """An unknown operation reads ABSENT; after prepare it reads PREPARED at the epoch."""
        op, intent = self.new_operation()
        assert connector.observe(operation_id=op).status is FenceStatus.ABSENT
        prepared = connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        assert (prepared.status, prepared.epoch) == (FenceStatus.PREPARED, 1)
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch, seen.intent_digest) == (FenceStatus.PREPARED, 1, intent)

    @needs(_MARKER)
    def test_prepare_is_idempotent_at_the_same_epoch(self, connector: TargetConnectorPort) -> None:
        """Preparing twice at one epoch (a retried call) keeps the fence at that epoch."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=4)
        again = connector.prepare(operation_id=op, intent_digest=intent, epoch=4)
        assert (again.status, again.epoch) == (FenceStatus.PREPARED, 4)

    @needs(_MARKER)
    def test_prepare_never_lowers_the_epoch(self, connector: TargetConnectorPort) -> None:
        """A lower epoch is fenced out and leaves the fence where it was; a higher one raises it."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=5)
        with pytest.raises(FencedOut):
            connector.prepare(operation_id=op, intent_digest=intent, epoch=3)
        assert connector.observe(operation_id=op).epoch == 5
        raised = connector.prepare(operation_id=op, intent_digest=intent, epoch=7)
        assert (raised.status, raised.epoch) == (FenceStatus.PREPARED, 7)
        assert connector.observe(operation_id=op).epoch == 7

    @needs(_MARKER)
    def test_prepare_reports_a_committed_fence_untouched(
        self, connector: TargetConnectorPort
    ) -> None:
        """Prepare at a higher epoch after the commit reports COMMITTED and changes nothing."""
        rows = [(1, "a", "2026-11-01 10:00:00"), (2, "b", "2026-11-01 11:00:00")]
        (op, intent), report = self.load(connector, rows, epoch=2)
        before = connector.observe(operation_id=op)
        seen = connector.prepare(operation_id=op, intent_digest=intent, epoch=9)
        assert seen.status is FenceStatus.COMMITTED
        assert (seen.epoch, seen.row_count, seen.content_digest) == (
            2,
            2,
            report.content_digest,
        )
        assert connector.observe(operation_id=op) == before
        assert self.count_rows(connector, self.table) == 2

    @needs(_MARKER)
    def test_mutate_commits_data_and_fence_together(self, connector: TargetConnectorPort) -> None:
        """Mutate at the fence's epoch writes every row and a committed fence with that count."""
        rows = [(i, f"v{i}", "2026-11-01 10:00:00") for i in range(5)]
        (op, intent), report = self.load(connector, rows, epoch=3)
        assert report.row_count == 5
        seen = connector.observe(operation_id=op)
        assert seen.status is FenceStatus.COMMITTED
        assert (seen.epoch, seen.intent_digest, seen.row_count) == (3, intent, 5)
        assert seen.content_digest == report.content_digest
        assert self.count_rows(connector, self.table) == seen.row_count

    @needs(_MARKER)
    def test_a_reported_commit_is_what_observe_reads(self, connector: TargetConnectorPort) -> None:
        """Every write path: the committed fence row ``mutate`` reports is what observe reads.

        The protocol takes a reported row as the proof of the commit instead of reading
        the fence again (ADR 0013), so it must be exactly the row left committed: the
        epoch, the intent (none for a fence installed by ``seal``), the count and digest.
        """
        many = [(i, f"v{i}", "2026-11-01 10:00:00") for i in range(1200)]
        paths: list[tuple[str, Sequence[Row], int, str]] = [
            ("prepared, a new table", [(1, "a", None), (2, "b", None)], 2, "prepare"),
            ("prepare in the write", [(3, "c", None)], 3, "in-write"),
            ("prepared again", [(4, "d", None), (5, "e", None)], 1, "prepare"),
            ("installed by seal", [(6, "f", None)], 5, "seal"),
            ("many rows, prepare in the write", many, 7, "in-write"),
            ("many rows, prepared", many, 2, "prepare"),
        ]
        for name, rows, epoch, how in paths:
            op, intent = self.new_operation()
            if how == "prepare":
                connector.prepare(operation_id=op, intent_digest=intent, epoch=epoch)
            elif how == "seal":
                connector.seal(operation_id=op, epoch=epoch)
            report = self.mutate(
                connector,
                (op, intent),
                epoch=epoch,
                rows=rows,
                prepare=how == "in-write",
                batch_size=500,
            )
            if self.reports_committed_fence:
                assert report.committed is not None, name
            if report.committed is not None:
                assert report.committed.epoch == epoch, name
                expected = None if how == "seal" else intent
                assert report.committed.intent_digest == expected, name

    @needs(_MARKER)
    def test_mutate_at_a_stale_epoch_writes_nothing(self, connector: TargetConnectorPort) -> None:
        """After the fence moved to a higher epoch, mutate at the old one is refused, 0 rows."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        connector.prepare(operation_id=op, intent_digest=intent, epoch=2)
        with pytest.raises(FencedOut):
            self.mutate(connector, (op, intent), epoch=1, rows=[(1, "a", None)])
        assert self.count_rows(connector, self.table) == 0
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.PREPARED, 2)

    @needs(_MARKER)
    def test_mutate_above_the_prepared_epoch_writes_nothing(
        self, connector: TargetConnectorPort
    ) -> None:
        """Mutate needs the fence prepared at exactly its epoch; a higher one is refused too."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        with pytest.raises(FencedOut):
            self.mutate(connector, (op, intent), epoch=2, rows=[(1, "a", None)])
        assert self.count_rows(connector, self.table) == 0
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.PREPARED, 1)

    @needs(_MARKER)
    def test_mutate_without_a_fence_writes_nothing(self, connector: TargetConnectorPort) -> None:
        """Mutate for an operation never prepared is fenced out: the fence is installed first."""
        with pytest.raises(FencedOut):
            self.mutate(connector, self.new_operation(), epoch=1, rows=[(1, "a", None)])
        assert self.count_rows(connector, self.table) == 0

    @needs(_MARKER)
    def test_a_committed_fence_is_terminal(self, connector: TargetConnectorPort) -> None:
        """A second mutate of a committed operation, even at its epoch, is refused, 0 rows."""
        operation, _ = self.load(connector, [(1, "a", None)], epoch=1)
        with pytest.raises(FencedOut):
            self.mutate(connector, operation, epoch=1, rows=[(2, "b", None)])
        assert self.count_rows(connector, self.table) == 1

    @needs(_MARKER)
    def test_mutate_with_prepare_installs_the_fence_in_the_same_transaction(
        self, connector: TargetConnectorPort
    ) -> None:
        """prepare=True: an absent fence is installed at the epoch and committed with the data."""
        op, intent = self.new_operation()
        report = self.mutate(
            connector, (op, intent), epoch=4, rows=[(1, "a", None), (2, "b", None)], prepare=True
        )
        assert report.row_count == 2
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch, seen.row_count) == (FenceStatus.COMMITTED, 4, 2)
        assert self.count_rows(connector, self.table) == 2

    @needs(_MARKER)
    def test_mutate_with_prepare_raises_a_lower_epoch(self, connector: TargetConnectorPort) -> None:
        """prepare=True over a fence prepared at a lower epoch raises it and writes."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        self.mutate(connector, (op, intent), epoch=3, rows=[(1, "a", None)], prepare=True)
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.COMMITTED, 3)

    @needs(_MARKER)
    def test_mutate_with_prepare_is_still_fenced_by_a_higher_epoch(
        self, connector: TargetConnectorPort
    ) -> None:
        """prepare=True never lowers a fence: a sealed (higher) epoch still refuses, 0 rows."""
        op, intent = self.new_operation()
        connector.seal(operation_id=op, epoch=5)
        with pytest.raises(FencedOut):
            self.mutate(connector, (op, intent), epoch=2, rows=[(1, "a", None)], prepare=True)
        assert self.count_rows(connector, self.table) == 0
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.PREPARED, 5)

    @needs(_MARKER)
    def test_mutate_with_prepare_never_writes_twice(self, connector: TargetConnectorPort) -> None:
        """prepare=True on a committed operation is refused, whatever the epoch: 1 row stays."""
        operation, _ = self.load(connector, [(1, "a", None)], epoch=1)
        for epoch in (1, 9):
            with pytest.raises(FencedOut):
                self.mutate(connector, operation, epoch=epoch, rows=[(2, "b", None)], prepare=True)
        assert self.count_rows(connector, self.table) == 1

    @needs(_MARKER)
    def test_seal_on_absent_proves_not_committed(self, connector: TargetConnectorPort) -> None:
        """Seal of an absent fence installs it at the new epoch; the old epoch can never write."""
        op, intent = self.new_operation()
        sealed = connector.seal(operation_id=op, epoch=2)
        assert sealed.outcome is SealOutcome.NOT_COMMITTED
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.PREPARED, 2)
        with pytest.raises(FencedOut):
            connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        with pytest.raises(FencedOut):
            self.mutate(connector, (op, intent), epoch=1, rows=[(1, "a", None)])
        assert self.count_rows(connector, self.table) == 0

    @needs(_MARKER)
    def test_seal_on_prepared_fences_out_the_old_writer(
        self, connector: TargetConnectorPort
    ) -> None:
        """Seal above a prepared fence proves NOT_COMMITTED; the old epoch's mutate is refused."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        sealed = connector.seal(operation_id=op, epoch=2)
        assert sealed.outcome is SealOutcome.NOT_COMMITTED
        assert sealed.observation.epoch == 2
        with pytest.raises(FencedOut):
            self.mutate(connector, (op, intent), epoch=1, rows=[(1, "a", None)])
        assert self.count_rows(connector, self.table) == 0

    @needs(_MARKER)
    def test_seal_after_commit_reports_committed(self, connector: TargetConnectorPort) -> None:
        """Seal of a committed operation reports COMMITTED with the fence's evidence."""
        (op, _), report = self.load(connector, [(1, "a", None), (2, "b", None)], epoch=1)
        sealed = connector.seal(operation_id=op, epoch=2)
        assert sealed.outcome is SealOutcome.COMMITTED
        assert sealed.observation.row_count == report.row_count == 2
        assert connector.observe(operation_id=op).status is FenceStatus.COMMITTED

    @needs(_MARKER)
    def test_seal_not_above_the_fence_is_fenced(self, connector: TargetConnectorPort) -> None:
        """Seal at or below the fence's epoch reports FENCED and leaves the fence as it was."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=3)
        assert connector.seal(operation_id=op, epoch=3).outcome is SealOutcome.FENCED
        assert connector.seal(operation_id=op, epoch=2).outcome is SealOutcome.FENCED
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.PREPARED, 3)
        self.mutate(connector, (op, intent), epoch=3, rows=[(1, "a", None)])
        assert self.count_rows(connector, self.table) == 1

    @needs(_MARKER)
    def test_within_runs_inside_the_transaction(self, connector: TargetConnectorPort) -> None:
        """``within`` is called once, before commit, with a transaction object."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        seen: list[object] = []
        self.mutate(connector, (op, intent), epoch=1, rows=[(1, "a", None)], within=seen.append)
        assert len(seen) == 1
        assert seen[0] is not None

    @needs(_MARKER)
    def test_within_failure_rolls_back_data_and_fence(self, connector: TargetConnectorPort) -> None:
        """An exception from ``within`` rolls back rows and fence, and reaches the caller."""

        class Boom(Exception):
            pass

        def fail(_txn: object) -> None:
            raise Boom

        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        rows = [(i, "x", None) for i in range(7)]
        with pytest.raises(Boom):
            self.mutate(connector, (op, intent), epoch=1, rows=rows, within=fail)
        assert self.count_rows(connector, self.table) == 0
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.PREPARED, 1)
        self.mutate(connector, (op, intent), epoch=1, rows=rows)  # the retry then commits
        assert self.count_rows(connector, self.table) == 7

    @needs(_MARKER)
    def test_failing_source_rolls_back_everything(self, connector: TargetConnectorPort) -> None:
        """An error raised by the row stream mid-way leaves no rows and the fence prepared."""

        class SourceBroke(Exception):
            pass

        def batches() -> Iterator[list[Row]]:
            yield [(1, "a", None), (2, "b", None)]
            raise SourceBroke

        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        with pytest.raises(SourceBroke):
            connector.mutate(
                operation_id=op,
                intent_digest=intent,
                epoch=1,
                plan=self.plan(),
                batches=batches(),
                content_digest=_digest("x"),
            )
        assert self.count_rows(connector, self.table) == 0
        assert connector.observe(operation_id=op).status is FenceStatus.PREPARED

    @needs(_MARKER)
    def test_a_rejected_row_is_a_dpone_error_and_writes_nothing(
        self, connector: TargetConnectorPort
    ) -> None:
        """A row with the wrong number of values raises TargetWriteFailed, not a driver error."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        with pytest.raises(TargetWriteFailed) as caught:
            self.mutate(connector, (op, intent), epoch=1, rows=[(1, "a", None), (2, "b")])
        assert isinstance(caught.value, DponeError)
        assert self.count_rows(connector, self.table) == 0
        assert connector.observe(operation_id=op).status is FenceStatus.PREPARED

    @needs(_MARKER)
    def test_seal_during_an_open_write_is_unavailable_never_a_guess(
        self, connector: TargetConnectorPort
    ) -> None:
        """A seal that cannot lock the fence within its bound raises FenceUnavailable.

        Once the writer (a zombie that kept its transaction open) commits, seal reports
        COMMITTED: the fence, not a timeout, decides.
        """
        peer = self.peer_connector(connector, lock_timeout_s=self.short_lock_timeout_s)
        try:
            op, intent = self.new_operation()
            connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
            entered, release = threading.Event(), threading.Event()
            outcome: dict[str, object] = {}

            def hold(_txn: object) -> None:
                entered.set()
                if not release.wait(30):
                    raise TimeoutError("the test never released the writer")

            def writer() -> None:
                try:
                    outcome["report"] = self.mutate(
                        connector, (op, intent), epoch=1, rows=[(1, "a", None)], within=hold
                    )
                except BaseException as exc:  # noqa: BLE001 (re-checked in the main thread)
                    outcome["error"] = exc

            thread = threading.Thread(target=writer, name="zombie-writer")
            thread.start()
            try:
                assert entered.wait(30), "the writer never reached its open transaction"
                with pytest.raises(FenceUnavailable):
                    peer.seal(operation_id=op, epoch=2)
            finally:
                release.set()
                thread.join(30)
            assert "error" not in outcome, outcome.get("error")
            sealed = peer.seal(operation_id=op, epoch=2)
            assert sealed.outcome is SealOutcome.COMMITTED
            assert self.count_rows(connector, self.table) == 1
        finally:
            peer.close()

    @needs(_MARKER)
    def test_seal_waits_for_an_open_write_within_its_bound(
        self, connector: TargetConnectorPort
    ) -> None:
        """A seal with a long enough bound waits for the writer and then reports COMMITTED."""
        peer = self.peer_connector(connector, lock_timeout_s=20.0)
        try:
            op, intent = self.new_operation()
            connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
            entered, release = threading.Event(), threading.Event()
            outcome: dict[str, object] = {}

            def hold(_txn: object) -> None:
                entered.set()
                release.wait(30)

            def writer() -> None:
                try:
                    self.mutate(
                        connector, (op, intent), epoch=1, rows=[(1, "a", None)], within=hold
                    )
                except BaseException as exc:  # noqa: BLE001 (re-checked in the main thread)
                    outcome["error"] = exc

            thread = threading.Thread(target=writer, name="slow-writer")
            thread.start()
            timer = threading.Timer(0.3, release.set)
            try:
                assert entered.wait(30)
                timer.start()
                sealed = peer.seal(operation_id=op, epoch=2)
            finally:
                release.set()
                timer.cancel()
                thread.join(30)
            assert "error" not in outcome, outcome.get("error")
            assert sealed.outcome is SealOutcome.COMMITTED
        finally:
            peer.close()

    # Two different operations per strategy: (first rows, first plan), then the second's,
    # and the table content expected after both.
    _STRATEGY_CASES: ClassVar[dict[str, Any]] = {
        "append": (
            LoadStrategy.APPEND,
            [(1, "a", "2026-11-01 10:00:00"), (2, "b", "2026-11-01 11:00:00")],
            [(2, "b", "2026-11-01 11:00:00"), (3, "c", "2026-11-01 12:00:00")],
            [(1, "a"), (2, "b"), (2, "b"), (3, "c")],
        ),
        "replace": (
            LoadStrategy.REPLACE,
            [(1, "a", "2026-11-01 10:00:00"), (2, "b", "2026-11-01 11:00:00")],
            [(3, "c", "2026-11-01 12:00:00")],
            [(3, "c")],
        ),
        "merge": (
            LoadStrategy.MERGE,
            [(1, "a", "2026-11-01 10:00:00"), (2, "b", "2026-11-01 11:00:00")],
            [(2, "B", "2026-11-01 11:30:00"), (3, "c", "2026-11-01 12:00:00")],
            [(1, "a"), (2, "B"), (3, "c")],
        ),
        "replace_interval": (
            LoadStrategy.REPLACE_INTERVAL,
            # first: two days in mixed timestamp spellings; second: day 1 only
            [
                (1, "a", "2026-11-01 00:00:00"),
                (2, "b", "2026-11-01T23:59:59Z"),
                (3, "c", "2026-11-02T00:00:00Z"),
                (4, "d", "2026-11-02 12:00:00"),
            ],
            [(5, "e", "2026-11-01T08:00:00Z")],
            [(3, "c"), (4, "d"), (5, "e")],
        ),
    }

    @needs(_MARKER)
    def test_strategy_applied_by_two_operations(
        self, connector: TargetConnectorPort, case: str
    ) -> None:
        """Each load strategy, run by two different operations, leaves the expected rows."""
        strategy, first, second, expected = self._STRATEGY_CASES[case]
        first_plan = self.plan(strategy, interval=_DAYS1_2)
        second_plan = self.plan(strategy, interval=_DAY1)
        (op1, _), r1 = self.load(connector, first, plan=first_plan)
        (op2, _), r2 = self.load(connector, second, plan=second_plan)
        assert (r1.row_count, r2.row_count) == (len(first), len(second))
        assert self.fetch_rows(connector, self.table) == expected
        for op, count in ((op1, len(first)), (op2, len(second))):
            seen = connector.observe(operation_id=op)
            assert (seen.status, seen.row_count) == (FenceStatus.COMMITTED, count)

    # ----------------------------------------------------------------- staging generation
    # One connector writes one deterministic partition object; its commit is the checksum
    # record. ``count_rows`` counts the rows of that object (0 when absent).

    @needs(_STAGING)
    def test_staging_absent_prepared_committed(self, connector: TargetConnectorPort) -> None:
        """ABSENT, then PREPARED at the epoch, then COMMITTED with the count and intent."""
        op, intent = self.new_operation()
        assert connector.observe(operation_id=op).status is FenceStatus.ABSENT
        prepared = connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        assert (prepared.status, prepared.epoch) == (FenceStatus.PREPARED, 1)
        report = self.mutate(
            connector, (op, intent), epoch=1, rows=[(1, "a", None), (2, "b", None)]
        )
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch, seen.intent_digest) == (FenceStatus.COMMITTED, 1, intent)
        assert seen.row_count == report.row_count == 2
        assert self.count_rows(connector, self.table) == 2

    @needs(_STAGING)
    def test_staging_prepare_never_lowers_the_epoch(self, connector: TargetConnectorPort) -> None:
        """A lower epoch is fenced out; the fence keeps the higher one."""
        op, intent = self.new_operation()
        connector.prepare(operation_id=op, intent_digest=intent, epoch=5)
        with pytest.raises(FencedOut):
            connector.prepare(operation_id=op, intent_digest=intent, epoch=3)
        assert connector.observe(operation_id=op).epoch == 5

    @needs(_STAGING)
    def test_staging_retry_replaces_never_appends(self, connector: TargetConnectorPort) -> None:
        """A write that died before its commit is sealed and rewritten: the rows once, not twice."""

        class Boom(Exception):
            pass

        def die(_txn: object) -> None:
            raise Boom

        op, intent = self.new_operation()
        rows = [(i, f"v{i}", None) for i in range(5)]
        with pytest.raises(Boom):
            self.mutate(connector, (op, intent), epoch=1, rows=rows, within=die, prepare=True)
        assert connector.observe(operation_id=op).status is not FenceStatus.COMMITTED
        assert connector.seal(operation_id=op, epoch=2).outcome is SealOutcome.NOT_COMMITTED
        with pytest.raises(FencedOut):
            self.mutate(connector, (op, intent), epoch=1, rows=rows)
        self.mutate(connector, (op, intent), epoch=2, rows=rows)
        assert self.count_rows(connector, self.table) == 5
        assert connector.observe(operation_id=op).status is FenceStatus.COMMITTED

    @needs(_STAGING)
    def test_staging_takeover_fences_out_a_writer_before_its_commit(
        self, connector: TargetConnectorPort
    ) -> None:
        """A seal while the old writer is between data and commit: the old writer never commits."""
        op, intent = self.new_operation()
        sealed: list[SealOutcome] = []

        def takeover(_txn: object) -> None:
            sealed.append(connector.seal(operation_id=op, epoch=2).outcome)

        rows = [(1, "a", None), (2, "b", None)]
        with pytest.raises(FencedOut):
            self.mutate(connector, (op, intent), epoch=1, rows=rows, within=takeover, prepare=True)
        assert sealed == [SealOutcome.NOT_COMMITTED]
        assert connector.observe(operation_id=op).status is FenceStatus.PREPARED
        self.mutate(connector, (op, intent), epoch=2, rows=rows, prepare=True)
        seen = connector.observe(operation_id=op)
        assert (seen.status, seen.epoch) == (FenceStatus.COMMITTED, 2)
        assert self.count_rows(connector, self.table) == 2

    @needs(_STAGING)
    def test_staging_seal_reports_committed_and_fenced(
        self, connector: TargetConnectorPort
    ) -> None:
        """Seal after the commit is COMMITTED; seal not above a prepared fence is FENCED."""
        (op, _), _report = self.load(connector, [(1, "a", None)], epoch=3)
        assert connector.seal(operation_id=op, epoch=4).outcome is SealOutcome.COMMITTED
        other, intent = self.new_operation()
        connector.prepare(operation_id=other, intent_digest=intent, epoch=9)
        assert connector.seal(operation_id=other, epoch=9).outcome is SealOutcome.FENCED

    # ----------------------------------------------------------------- capability none

    @needs(_NONE)
    def test_none_never_claims_a_proof(self, connector: TargetConnectorPort) -> None:
        """Without a fence, observe and seal answer UNKNOWN, before and after a write."""
        operation, report = self.load(connector, [(1, "a", None), (2, "b", None)])
        assert report.row_count == 2
        assert self.count_rows(connector, self.table) == 2
        assert connector.observe(operation_id=operation[0]).status is FenceStatus.UNKNOWN
        sealed = connector.seal(operation_id=operation[0], epoch=2)
        assert sealed.outcome is SealOutcome.UNKNOWN
        assert sealed.observation.status is FenceStatus.UNKNOWN

    @needs(_NONE)
    def test_none_prepare_installs_nothing(self, connector: TargetConnectorPort) -> None:
        """Prepare on a connector without a fence never reports PREPARED or COMMITTED."""
        op, intent = self.new_operation()
        seen = connector.prepare(operation_id=op, intent_digest=intent, epoch=1)
        assert seen.status in {FenceStatus.ABSENT, FenceStatus.UNKNOWN}
