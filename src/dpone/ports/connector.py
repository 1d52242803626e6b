"""The target connector port: a writer plus its fence (ARCHITECTURE section 7)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from dpone.contracts.fence import FenceCapability, FenceObservation, SealResult
from dpone.contracts.load import LoadPlan, MutationReport

__all__ = [
    "CannotQueueAhead",
    "Collector",
    "Fused",
    "FusedCollector",
    "Gate",
    "GatedConnectorPort",
    "QueuedWithin",
    "Rows",
    "TargetConnectorPort",
    "TargetProbePort",
    "WithinTransaction",
]

Rows = Iterable[Sequence[Sequence[object]]]  # batches of rows, each row in plan column order
WithinTransaction = Callable[[object], None]  # called with the open transaction before commit
#: Called once the statements a ``QueuedWithin`` queued have their results: with the
#: error the transaction's sync raised (it raises its own translation when one of its
#: statements failed, else returns), or with None when every statement succeeded.
Collector = Callable[[BaseException | None], None]
#: Called by ``GatedConnectorPort.mutate`` before its first byte to the target; what it
#: raises stops the write with nothing sent (ADR 0021).
Gate = Callable[[], None]
#: A ``Fused`` part's collector: called with its columns of the host statement's row
#: (None with an error), or with the error that statement raised; see ``Fused``.
FusedCollector = Callable[[Sequence[object] | None, BaseException | None], object]


class Fused:
    """A ``QueuedWithin``'s statements as CTEs inside ONE statement of the connector (ADR 0022).

    For a connector whose target runs data-modifying CTEs (PostgreSQL): it writes
    ``WITH gate AS MATERIALIZED (...), <ctes>, <its own CTEs> SELECT <select>, <its
    columns> FROM <source>, ...``, one autocommit statement, so the within's writes and
    the connector's commit together or not at all, with no BEGIN or COMMIT to send. The
    host defines the one-row CTE ``gate`` first (the operation's lock); every write of
    ``ctes`` waits for it. ``ctes`` and ``select`` use positional ``%s`` placeholders,
    filled by ``params`` in order, before the host's own.

    ``collect(columns, None)`` returns the result (``columns``: the row's first
    ``width`` values). ``collect(None, error)`` raises the within's own translation when
    the error is its statements' (a conflict on its own tables) and returns otherwise:
    the error is then the connector's, or cannot be told apart: nothing then says that
    the within's writes would have succeeded.
    """

    __slots__ = ("collect", "ctes", "params", "select", "source", "width")

    def __init__(
        self,
        *,
        ctes: bytes,
        params: Sequence[object],
        select: bytes,
        source: bytes,
        width: int,
        collect: FusedCollector,
    ) -> None:
        self.ctes = ctes
        self.params = params
        self.select = select
        self.source = source
        self.width = width
        self.collect = collect


class QueuedWithin:
    """A ``within`` that a pipelining connector may send together with its own statements.

    ``queue(txn)`` adds the statements to the open transaction and returns a
    ``Collector``; it need not read their results (a pipelined ``execute`` may read
    those that arrived, and then raises its own statement's translated error). A
    connector that pipelines (the PostgreSQL small path, ADR 0016) queues them right
    after BEGIN, then its own statements, then COMMIT, and reads everything at one
    sync. Any error is first offered to the collector (its statements come first), then
    judged by the connector. Every other connector simply calls it like any
    ``within``: it queues, then collects at once.

    ``ahead``: the statements must reach the target before any of the connector's own,
    in the same transaction (ADR 0019). Only a connector that declares ``queues_ahead``
    is given one; when it cannot send them first this time (too many rows for its
    pipelined path, say), it raises ``CannotQueueAhead`` before writing anything.
    """

    __slots__ = ("ahead", "fuse", "queue")

    def __init__(
        self,
        queue: Callable[[object], Collector],
        *,
        ahead: bool = False,
        fuse: Callable[[object], Fused] | None = None,
    ) -> None:
        self.queue = queue
        self.ahead = ahead
        #: ``fuse(txn)``: the same statements as a ``Fused`` part, for a connector that
        #: writes them inside its own statement on the idle connection ``txn`` instead
        #: of queueing them (None: this within cannot be fused)
        self.fuse = fuse

    def __call__(self, txn: object) -> None:
        """Run as a plain ``within``: queue the statements, then collect at once."""
        self.queue(txn)(None)


class CannotQueueAhead(Exception):  # a signal to the runtime, never a user error
    """A connector could not send a ``QueuedWithin(ahead=True)`` first: nothing was written."""


class TargetConnectorPort(Protocol):
    """Writes one operation's rows and proves whether that write committed.

    Adapters translate driver errors in one place: lock waits past their bound raise
    ``FenceUnavailable``; rejected data raises ``TargetWriteFailed``; nothing raw escapes.
    """

    @property
    def kind(self) -> str:
        """Connector name, e.g. ``sqlite``."""
        ...

    @property
    def capability(self) -> FenceCapability:
        """The one fence capability this connector provides."""
        ...

    def target_identity(self) -> str:
        """Return kind + normalized location, never credentials."""
        ...

    def database_locator(self) -> str:
        """Return the identity of the database (no table), to detect atomic mode."""
        ...

    def check_plan(self, plan: LoadPlan) -> None:
        """Check, read-only, that the target can take the plan's rows.

        Raises:
            TargetSchemaMismatch: an existing table lacks columns or a unique key for merge.

        """
        ...

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        """Install or raise the fence to ``epoch`` (never lower it).

        Returns the observation after the write: PREPARED at ``epoch``, or COMMITTED if the
        mutation already committed (the row is left untouched).

        Raises:
            FencedOut: the fence holds a higher epoch.
            FenceUnavailable: the fence could not be locked within its bound.

        """
        ...

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
        """Apply the rows and mark the fence committed, in one target transaction.

        The fence row is locked first and must be PREPARED at ``epoch``; ``within`` runs
        last, inside the transaction (atomic mode journal write, failpoints).

        With ``prepare`` the fence is first raised to ``epoch`` inside the same
        transaction, exactly as ``prepare`` would (absent -> inserted, lower epoch ->
        raised; higher epoch or committed -> FencedOut). Doing it under the same lock as
        the write leaves no window between the two and saves a durability point.

        Raises:
            FencedOut: the fence is not PREPARED at ``epoch`` (nothing was written).

        """
        ...

    def observe(self, *, operation_id: str) -> FenceObservation:
        """Read the fence without writing."""
        ...

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        """Prove the mutation did not commit by raising the fence to ``epoch`` with a lock.

        Waits for a writer still holding the fence row, within its bound.
        """
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


class TargetProbePort(Protocol):
    """Optional extras a connector offers so ``dpone certify`` can check a live target.

    A connector without them can still be certified for its fence, but the crash and
    race checks (which count rows in the target) are reported UNVERIFIED.
    """

    def server_version(self) -> str:
        """Return the target server's product and version (no secrets)."""
        ...

    def count_rows(self, table: str, *, distinct: str) -> tuple[int, int]:
        """Return ``(rows, distinct values of column distinct)`` of ``table`` (0, 0 if absent)."""
        ...

    def drop_table(self, table: str) -> None:
        """Drop ``table`` if it exists (certification's scratch tables only)."""
        ...


class GatedConnectorPort(TargetConnectorPort, Protocol):
    """A connector whose ``mutate`` calls a gate before it touches the target (ADR 0021)."""

    @property
    def gates_writes(self) -> bool:
        """True: ``mutate(gate=...)`` calls the gate before its first byte to the target."""
        ...

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
        gate: Gate | None = None,
    ) -> MutationReport:
        """``TargetConnectorPort.mutate``; ``gate`` is called, once, before the target is touched.

        Only work that needs no target (checking the plan, reading the rows, building
        the statements) may come before it. What the gate raises propagates unchanged,
        and nothing was sent to the target then.
        """
        ...
