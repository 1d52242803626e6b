"""The one entry point the CLI, the Airflow operator and the benchmarks all call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from dpone.config.bootstrap import (
    RunContext,
    api_provenance,
    build_route,
    configure_failpoints,
    ledger_of,
    next_interval,
    open_source,
    plan_operation,
    retry_policy,
    run_request,
)
from dpone.config.workload import RestTargetConfig, Workload, load_workload
from dpone.contracts.identity import parse_interval
from dpone.errors import ConfigInvalid
from dpone.runtime.commit_protocol import CommitProtocol
from dpone.runtime.executor import new_owner
from dpone.runtime.retry import call_with_retries
from dpone.runtime.run import NewStreak, RunService

if TYPE_CHECKING:
    # Annotations only: a load never imports the delivery contracts (``__getattr__``).
    from dpone.config.bootstrap import Route
    from dpone.config.delivery import RestRoute
    from dpone.contracts.delivery import DeliveryResult
    from dpone.contracts.identity import Interval
    from dpone.contracts.journal import JournalEntry
    from dpone.contracts.result import OperationResult
    from dpone.contracts.run import Provenance
    from dpone.ports.ledger import RunLedgerPort
    from dpone.ports.source import SourcePort
    from dpone.runtime.commit_protocol import OperationSpec
    from dpone.runtime.retry import RetryPolicy

__all__ = ["DeliveryResult", "RunContext", "Runner", "run_operation"]


def __getattr__(name: str) -> object:
    # ``DeliveryResult`` is imported on first use: only REST deliveries need it.
    if name == "DeliveryResult":
        from dpone.contracts.delivery import DeliveryResult

        return DeliveryResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Runner:
    """Runs many operations of one workload over one set of open connections.

    ``run_operation`` is a Runner used once; keep a Runner when you run many small
    operations in one process (connection setup costs more than a small load).

    In forward mode on a PostgreSQL journal, a pooled Runner sends a first attempt's
    COMPLETE (which the target's fence proves) and returns without waiting for it; the
    journal reads its answer before anything that could depend on it, and ``close``
    reads the last one (ADR 0017). Until then another journal client may read the entry
    COMMITTING. A COMPLETE whose answer is an error is logged as a warning naming the
    operation, whose next run completes the entry from the fence; one that cannot be
    sent fails ``run`` as a synchronous COMPLETE would.

    In atomic mode on PostgreSQL, after an operation born new a Runner sends the next
    one's transaction without looking the run up first; one that exists rolls back
    with nothing written and is then looked up and replayed as usual (ADR 0019).

    Args:
        workload: a workload file path or an already loaded :class:`Workload`.
        environ: environment to resolve ``*_env`` references from (default ``os.environ``).
        pooled: False when this Runner runs one operation: a PostgreSQL journal then
            keeps one session instead of connection pools (``run_operation`` does).
    """

    def __init__(
        self,
        workload: Workload | str | Path,
        *,
        environ: Mapping[str, str] | None = None,
        pooled: bool = True,
    ) -> None:
        self.workload = workload if isinstance(workload, Workload) else load_workload(workload)
        configure_failpoints(environ)
        self._environ = environ
        self._rest: RestRoute | None = None
        self._relational: Route | None = None
        # per-Runner constants of the run() hot path (``_policy_and_ledger``)
        self._hot: tuple[Workload, RetryPolicy, RunLedgerPort] | None = None
        self._default_provenance: Provenance | None = None
        self._intervals: dict[str, Interval] = {}  # parsed intervals (frozen values)
        # new operations in a row: the next is tried before a lookup (ADR 0019)
        self._streak = NewStreak()
        if isinstance(self.workload.target, RestTargetConfig):
            from dpone.config.delivery import open_rest_route

            self._rest = open_rest_route(self.workload, environ=environ)
        else:
            self._relational = build_route(self.workload, environ=environ, pooled=pooled)

    @property
    def _route(self) -> Route:
        if self._relational is None:
            raise ConfigInvalid(
                "this workload delivers to a REST receiver: use Runner.deliver() "
                "(or `dpone run`), not Runner.run()",
                field="target.kind",
            )
        return self._relational

    def _rest_route(self) -> RestRoute:
        if self._rest is None:
            raise ConfigInvalid(
                "this workload writes to a relational target: use Runner.run(); "
                "deliver() is for target.kind rest",
                field="target.kind",
            )
        return self._rest

    def deliver(
        self,
        *,
        interval: str | None = None,
        partition: str | None = None,
        context: RunContext | None = None,
        provenance: Provenance | None = None,
        poll_budget_s: float = 0.0,
    ) -> DeliveryResult:
        """Deliver one operation of a rest workload (or continue its recorded delivery).

        The source is materialized into the staged JSON-lines payload (the payload
        authority), the checkpoint the operation promotes is bound to it, and the
        delivery is submitted once by key. The run is recorded in the run ledger
        (key ``op:<operation id>``), each call that does work as an attempt.

        Args:
            interval: ``START/END``; None for an incremental workload (the checkpoint's
                next interval, reused by every retry until it completes).
            partition: the mapped partition identity, if any.
            context: logical run identity (Airflow fills it).
            provenance: who invokes; default an API caller.
            poll_budget_s: how long this call keeps observing an accepted job.

        Returns:
            ``DeliveryCompleted`` (the checkpoint is promoted), ``DeliveryPending``
            (the receipt is durable: call :meth:`resume_delivery` at ``next_check_at``)
            or ``DeliveryBlocked`` (an operator must decide).

        Raises:
            DponeError: a typed error; e.g. ``ReceiverUnavailable`` (retryable),
                ``IntentConflict``, ``LeaseHeld``, ``ConfigInvalid``.

        """
        from dpone.config.bootstrap import next_interval_for
        from dpone.config.delivery import payload_materializer, plan_delivery

        route = self._rest_route()
        if interval is None:
            window = next_interval_for(
                self.workload, route.journal, route.receiver_identity, partition=partition
            )
        else:
            window = parse_interval(interval)
        who = provenance or api_provenance()
        spec = plan_delivery(
            route,
            window=window,
            partition=partition,
            context=context,
            provenance=who,
            environ=self._environ,
        )
        return route.service.deliver(
            spec,
            payload=payload_materializer(self.workload, window=window, partition=partition),
            provenance=who.record(),
            poll_budget_s=poll_budget_s,
        )

    def resume_delivery(
        self,
        operation_id: str,
        *,
        poll_budget_s: float = 0.0,
        provenance: Provenance | None = None,
    ) -> DeliveryResult:
        """Continue a recorded delivery from the control plane (e.g. after a deferral).

        Rereads the record; observes the job if it is not terminal; on verified remote
        success (a succeeded observation of the durable receipt) promotes the bound
        checkpoint, then COMPLETE. A COMPLETE delivery returns ``DeliveryCompleted``
        again (``replayed``), without promoting twice.

        Args:
            operation_id: the delivery's operation id (``DeliveryPending.operation_id``).
            poll_budget_s: how long this call keeps observing an accepted job.
            provenance: who invokes, recorded with the run ledger's attempt when this
                call does work (an Airflow try: its try number); default an API caller.

        Raises:
            OperationNotFound: nothing is recorded under ``operation_id``.
            DponeError: as :meth:`deliver`.

        """
        route = self._rest_route()
        who = provenance or api_provenance()
        return route.service.resume(
            operation_id, provenance=who.record(), poll_budget_s=poll_budget_s
        )

    def run(
        self,
        *,
        interval: Interval | str | None = None,
        partition: str | None = None,
        context: RunContext | None = None,
        on_rows: Callable[[int], None] | None = None,
        idempotency_key: str | None = None,
        provenance: Provenance | None = None,
    ) -> OperationResult:
        """Run (or resume, or replay) one operation and return its result.

        The run is recorded in the run ledger before anything executes; a replay of the
        same idempotency key returns the existing run (docs/runs-and-retries.md).

        Args:
            interval: ``START/END`` (half-open, UTC) or an :class:`Interval`. None for an
                incremental workload: the next interval comes from its checkpoint
                (:func:`dpone.config.bootstrap.next_interval`).
            partition: the mapped partition identity, if the workload is partitioned.
            context: logical run identity (Airflow fills it); never a try number.
            on_rows: called with the size of each batch as it is written (progress).
            idempotency_key: names the run; default ``op:<operation id>``.
            provenance: who invokes (CLI, API caller, Airflow try); default an API caller.

        Returns:
            The COMPLETE operation's result; ``replayed`` is True when it was already
            complete and nothing was written; ``run_id`` and ``attempt`` name the run.

        Raises:
            DponeError: a typed error from :mod:`dpone.errors`; its ``code`` and
                ``retryability`` say what to do next.
        """
        policy, ledger = self._policy_and_ledger()
        # planning reads the journal (the next interval) and may read the source's catalog
        # (its columns): a transient failure there is retried under the same policy
        source, spec = call_with_retries(
            lambda: self._plan(interval, partition=partition, context=context), policy=policy
        )
        request = run_request(
            self.workload,
            self._route,
            spec,
            provenance=provenance or self._api_provenance(),
            idempotency_key=idempotency_key,
            environ=self._environ,
        )
        owner = new_owner()

        def protocol(on_attempt: Callable[[JournalEntry], None]) -> CommitProtocol:
            return CommitProtocol(
                journal=self._route.journal,
                connector=self._route.connector,
                source=source,
                owner=owner,
                atomic_journal=self._route.atomic,
                on_rows=on_rows,
                auto_recover=self._route.auto_recover,
                on_attempt=on_attempt,
            )

        service = RunService(ledger=ledger, retry=policy, owner=owner, streak=self._streak)
        return service.run(request, spec, protocol)

    def _policy_and_ledger(self) -> tuple[RetryPolicy, RunLedgerPort]:
        """The workload's retry policy and the route's run ledger, built once per workload."""
        hot = self._hot
        if hot is None or hot[0] is not self.workload:
            hot = self._hot = (
                self.workload,
                retry_policy(self.workload),
                ledger_of(self._route.journal),
            )
        return hot[1], hot[2]

    def _api_provenance(self) -> Provenance:
        """An API caller on this host (the default provenance), made once per Runner."""
        if self._default_provenance is None:
            self._default_provenance = api_provenance()
        return self._default_provenance

    def _plan(
        self,
        interval: Interval | str | None,
        *,
        partition: str | None,
        context: RunContext | None,
    ) -> tuple[SourcePort, OperationSpec]:
        """Choose the interval, open the source and plan the operation (no write)."""
        if interval is None:
            window = next_interval(self.workload, self._route, partition=partition)
        elif isinstance(interval, str):
            window = self._interval(interval)
        else:
            window = interval
        source = open_source(self.workload, window, partition)
        spec = plan_operation(
            self.workload,
            self._route,
            source,
            interval=window,
            partition=partition,
            context=context,
        )
        return source, spec

    def _interval(self, text: str) -> Interval:
        """``parse_interval(text)``; a Runner's operations often share their interval."""
        window = self._intervals.get(text)
        if window is None:
            window = parse_interval(text)
            if len(self._intervals) >= 64:
                self._intervals.clear()
            self._intervals[text] = window
        return window

    def close(self) -> None:
        """Close the journal and target (or control-plane) connections. Idempotent."""
        if self._relational is not None:
            self._relational.close()
        if self._rest is not None:
            self._rest.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def run_operation(
    workload: Workload | str | Path,
    *,
    interval: Interval | str | None = None,
    partition: str | None = None,
    context: RunContext | None = None,
    on_rows: Callable[[int], None] | None = None,
    environ: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    provenance: Provenance | None = None,
) -> OperationResult:
    """Run (or resume, or replay) one operation of ``workload``; see :meth:`Runner.run`."""
    with Runner(workload, environ=environ, pooled=False) as runner:
        return runner.run(
            interval=interval,
            partition=partition,
            context=context,
            on_rows=on_rows,
            idempotency_key=idempotency_key,
            provenance=provenance,
        )
