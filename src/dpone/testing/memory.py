"""In-memory connector and source for unit tests; the connector passes the fence suite."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
)
from dpone.contracts.load import Column, LoadPlan, LoadStrategy, MutationReport
from dpone.errors import (
    FencedOut,
    FenceUnavailable,
    SourceInvalid,
    TargetSchemaMismatch,
    TargetWriteFailed,
)
from dpone.ports.connector import Rows, WithinTransaction

__all__ = ["InMemoryConnector", "ListSource"]


@dataclass(slots=True)
class _Fence:
    intent_digest: str
    epoch: int
    state: str  # "prepared" | "committed"
    row_count: int | None = None
    content_digest: str | None = None


@dataclass(slots=True)
class _Store:
    tables: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    fences: dict[str, _Fence] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class InMemoryConnector:
    """A transactional-marker target held in memory; one lock stands for the row lock."""

    kind = "memory"

    def __init__(
        self, *, table: str = "t", lock_timeout_s: float = 5.0, store: _Store | None = None
    ) -> None:
        self._table = table
        self._timeout = lock_timeout_s
        self._store = store or _Store()

    @property
    def capability(self) -> FenceCapability:
        return FenceCapability.TRANSACTIONAL_MARKER

    def sibling(self, *, lock_timeout_s: float | None = None) -> InMemoryConnector:
        """Return another connection to the same store (another executor)."""
        return InMemoryConnector(
            table=self._table,
            lock_timeout_s=self._timeout if lock_timeout_s is None else lock_timeout_s,
            store=self._store,
        )

    def rows(self, table: str | None = None) -> list[dict[str, object]]:
        """Return a copy of the committed rows of ``table``."""
        with self._locked():
            return [dict(r) for r in self._store.tables.get(table or self._table, [])]

    def target_identity(self) -> str:
        return f"memory:{id(self._store)}#{self._table}"

    def database_locator(self) -> str:
        return f"memory:{id(self._store)}"

    def check_plan(self, plan: LoadPlan) -> None:
        rows = self._store.tables.get(plan.table)
        if rows:
            missing = [c.name for c in plan.columns if c.name not in rows[0]]
            if missing:
                raise TargetSchemaMismatch(f"table {plan.table} lacks columns {missing}")

    def _locked(self) -> _Held:
        return _Held(self._store.lock, self._timeout)

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        with self._locked():
            return self._prepare_locked(operation_id, intent_digest, epoch)

    def _prepare_locked(
        self, operation_id: str, intent_digest: str, epoch: int
    ) -> FenceObservation:
        fence = self._store.fences.get(operation_id)
        if fence is None:
            fence = _Fence(intent_digest, epoch, "prepared")
            self._store.fences[operation_id] = fence
        elif fence.state == "committed":
            return _view(fence)
        elif fence.epoch > epoch:
            raise FencedOut("the fence holds a higher epoch", operation_id=operation_id)
        else:
            fence.epoch = epoch
        return _view(fence)

    def mutate(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        plan: LoadPlan,
        batches: Rows,
        content_digest: str,
        within: WithinTransaction | None = None,
        prepare: bool = False,
    ) -> MutationReport:
        with self._locked():
            # like a database transaction: a failed write leaves the fence as it was
            saved = self._store.fences.get(operation_id)
            saved = None if saved is None else dataclasses.replace(saved)
            try:
                return self._mutate_locked(
                    operation_id,
                    intent_digest,
                    epoch,
                    plan,
                    batches,
                    content_digest,
                    within,
                    prepare=prepare,
                )
            except BaseException:
                if saved is None:
                    self._store.fences.pop(operation_id, None)
                else:
                    self._store.fences[operation_id] = saved
                raise

    def _mutate_locked(
        self,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        plan: LoadPlan,
        batches: Rows,
        content_digest: str,
        within: WithinTransaction | None,
        *,
        prepare: bool,
    ) -> MutationReport:
        if prepare:
            self._prepare_locked(operation_id, intent_digest, epoch)
        fence = self._store.fences.get(operation_id)
        if fence is None or fence.state != "prepared" or fence.epoch != epoch:
            raise FencedOut("the fence is not prepared at this epoch", operation_id=operation_id)
        names = [c.name for c in plan.columns]
        current = list(self._store.tables.get(plan.table, []))
        incoming = []
        for batch in batches:
            for row in batch:
                if len(row) != len(names):
                    raise TargetWriteFailed(
                        f"a row does not have the plan's {len(names)} values; nothing was written",
                        operation_id=operation_id,
                    )
                incoming.append(
                    {n: (None if v == "" else v) for n, v in zip(names, row, strict=True)}
                )
        table = _apply(plan, current, incoming)
        if within is not None:
            within(self)
        # "commit": data and fence become visible together
        self._store.tables[plan.table] = table
        fence.state = "committed"
        fence.row_count = len(incoming)
        fence.content_digest = content_digest
        fence.intent_digest = intent_digest
        return MutationReport(row_count=len(incoming), content_digest=content_digest)

    def observe(self, *, operation_id: str) -> FenceObservation:
        with self._locked():
            fence = self._store.fences.get(operation_id)
            return FenceObservation(status=FenceStatus.ABSENT) if fence is None else _view(fence)

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        with self._locked():
            fence = self._store.fences.get(operation_id)
            if fence is None:
                fence = _Fence("", epoch, "prepared")
                self._store.fences[operation_id] = fence
                return SealResult(outcome=SealOutcome.NOT_COMMITTED, observation=_view(fence))
            if fence.state == "committed":
                return SealResult(outcome=SealOutcome.COMMITTED, observation=_view(fence))
            if fence.epoch >= epoch:
                return SealResult(outcome=SealOutcome.FENCED, observation=_view(fence))
            fence.epoch = epoch
            return SealResult(outcome=SealOutcome.NOT_COMMITTED, observation=_view(fence))

    def close(self) -> None:
        return None


class _Held:
    def __init__(self, lock: threading.Lock, timeout: float) -> None:
        self._lock = lock
        self._timeout = timeout

    def __enter__(self) -> None:
        if not self._lock.acquire(timeout=self._timeout):
            raise FenceUnavailable("the fence stayed locked past its bound")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _view(fence: _Fence) -> FenceObservation:
    return FenceObservation(
        status=FenceStatus.COMMITTED if fence.state == "committed" else FenceStatus.PREPARED,
        epoch=fence.epoch,
        intent_digest=fence.intent_digest or None,
        row_count=fence.row_count,
        content_digest=fence.content_digest,
    )


def _apply(
    plan: LoadPlan, current: list[dict[str, object]], incoming: list[dict[str, object]]
) -> list[dict[str, object]]:
    if plan.strategy is LoadStrategy.APPEND:
        return current + incoming
    if plan.strategy is LoadStrategy.REPLACE:
        return incoming
    if plan.strategy is LoadStrategy.MERGE:
        merged = {tuple(r[k] for k in plan.key): r for r in current}
        for row in incoming:
            merged[tuple(row[k] for k in plan.key)] = row
        return list(merged.values())
    assert plan.interval is not None
    assert plan.interval_column is not None
    from datetime import UTC, datetime

    def inside(row: dict[str, object]) -> bool:
        moment = datetime.fromisoformat(str(row[plan.interval_column or ""]))
        moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        return plan.interval is not None and plan.interval.contains(moment)

    return [r for r in current if not inside(r)] + incoming


class ListSource:
    """A source over rows held in memory; its identity is the digest of the rows."""

    kind = "memory"

    def __init__(self, columns: Sequence[Column], rows: Sequence[tuple[object, ...]]) -> None:
        self._columns = tuple(columns)
        self.rows = list(rows)

    def snapshot_identity(self) -> str:
        digest = hashlib.sha256(repr(self.rows).encode()).hexdigest()
        return f"sha256:{digest}"

    def columns(self) -> tuple[Column, ...]:
        return self._columns

    def batches(
        self, *, batch_size: int, expected_identity: str
    ) -> Iterator[list[tuple[object, ...]]]:
        for start in range(0, len(self.rows), batch_size):
            yield self.rows[start : start + batch_size]
        if self.snapshot_identity() != expected_identity:
            raise SourceInvalid("source changed while it was read")
