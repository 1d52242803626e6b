"""``DponeDeliveryOperator``: a REST delivery that frees its worker while the job runs.

``execute`` submits (or continues) the delivery through dpone's runtime in the worker.
When the receiver accepted the job and it is still running (``DeliveryPending``), the
task defers to :class:`~dpone.airflow.triggers.DponeReceiptTrigger`, which only watches.
When the trigger fires, ``execute_complete`` asks the runtime again: it rereads the
control plane, observes once if needed, and only on verified remote success promotes the
checkpoint and writes COMPLETE. The event is a wake-up hint and is never trusted, so a
lost, repeated or duplicated event changes nothing; the operation id comes from the task
(never the try number), so every try and every wake-up continue the same delivery.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from dpone.airflow.compat import AirflowFailException, BaseOperator

if TYPE_CHECKING:
    from dpone.airflow.identity import TaskIdentity

__all__ = ["DponeDeliveryOperator", "delivery_summary"]

_log = logging.getLogger("dpone.airflow")
#: the trigger's hint for a locator it cannot resolve (dpone.airflow._observe.HINTS)
UNRESOLVED = "locator_unresolved"
#: the trigger's hint for an operation id its control plane does not know
MISSING = "missing"


def _describe(locator: dict[str, str]) -> str:
    """Which variable or connection a locator names (its values are names, not secrets)."""
    if "url_env" in locator:
        return f"environment variable {locator['url_env']}"
    if "conn_id" in locator:
        return f"Airflow connection {locator['conn_id']!r}"
    return "journal " + (locator.get("path") or locator.get("url") or "?")


def delivery_summary(result: Any) -> dict[str, object]:
    """The XCom value of a completed delivery: ids and counts, never payload or secrets."""
    return {
        "operation_id": result.operation_id,
        "state": "COMPLETE",
        "receipt": result.receipt,
        "rows": result.rows,
        "replayed": result.replayed,
    }


def _stop_instead_of_deferring(
    hint_status: object, operation_id: str, locator: dict[str, str]
) -> str | None:
    """The failure message when a still-pending delivery must not defer again, or None.

    Two hints say the next trigger would end at once just like this one: the triggerer
    cannot resolve the locator (``locator_unresolved``), or the control plane it opens
    does not know the operation (``missing``) although the worker's does, so the two
    read different journals (a relative or per-host SQLite path, another schema).
    Deferring again would be a busy loop, so the task fails for an operator.
    """
    if hint_status == UNRESOLVED:
        return (
            f"DPONE_CONFIG_INVALID: the triggerer cannot open the journal of delivery "
            f"{operation_id} (locator {_describe(locator)}); its log says what is "
            "missing. The delivery stays as it is at the receiver. Fix: make that "
            "available to the triggerer, then clear the task."
        )
    if hint_status == MISSING:
        return (
            f"DPONE_CONFIG_INVALID: the triggerer found no delivery {operation_id} in the "
            f"journal it opened ({_describe(locator)}), but the worker's journal has it "
            "pending: the two do not read the same control plane. The delivery stays as "
            "it is at the receiver. Fix: give the triggerer the workers' journal (the same "
            "SQLite file or PostgreSQL database and schema), then clear the task."
        )
    return None


class DponeDeliveryOperator(BaseOperator):  # type: ignore[misc]  # untyped without Airflow
    """Deliver one workload interval to a REST receiver; defer while the remote job runs.

    Args:
        workload: path of the workload file (``target.kind: rest``), as the worker sees it.
        interval: ``START/END``; default: the DAG run's data interval.
        partition: the mapped partition identity (default: the map index when mapped).
        journal_conn_id: an Airflow connection to use as the journal (resolved in the
            worker; a PostgreSQL journal with a password reaches the trigger as the
            connection id only, and the triggerer looks the connection up itself).
        poll_budget_s: how long ``execute`` keeps observing before deferring (0: defer at
            once once the job is accepted).
        poll_interval_s, max_polls, max_wait_s, lease_s: the trigger's bounds (seconds
            between rounds, rounds per trigger run, how long one deferral may last before
            the trigger wakes the task anyway, the observation lease).
        settle_s: the trigger never wakes the task sooner than this after the deferral
            (default 6 s): Airflow 3.3 can fail a task woken before the scheduler has
            processed the deferring process's exit (apache/airflow#67287; the supervisor
            reports it up to ``[workers] min_heartbeat_interval`` = 5 s later). 0 turns
            it off.

    Returns (XCom ``return_value``): ``operation_id``, ``state``, ``receipt``, ``rows`` and
    ``replayed``.

    The trigger's locator of the control plane is computed before anything is submitted:
    a journal URL with a password written in the workload file fails the task with
    DPONE_CONFIG_INVALID at once (use ``journal_env``, ``DPONE_JOURNAL`` or
    ``journal_conn_id``; the trigger then gets the variable's or connection's name).

    Raises:
        AirflowFailException: the delivery is blocked for an operator (the message names
            the reason and the read-only command to run), a non-retryable dpone error, or
            the triggerer cannot resolve the journal locator.
        DponeError: a retryable family (receiver or control plane unavailable now).

    """

    template_fields: Sequence[str] = ("workload", "interval", "partition")
    ui_color: ClassVar[str] = "#e4eef8"

    def __init__(
        self,
        *,
        workload: str | os.PathLike[str],
        interval: str | None = None,
        partition: str | None = None,
        journal_conn_id: str | None = None,
        poll_budget_s: float = 0.0,
        poll_interval_s: float = 10.0,
        max_polls: int = 360,
        max_wait_s: float = 3600.0,
        lease_s: float = 60.0,
        settle_s: float = 6.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workload = os.fspath(workload) if isinstance(workload, os.PathLike) else workload
        self.interval = interval
        self.partition = partition
        self.journal_conn_id = journal_conn_id
        self.poll_budget_s = float(poll_budget_s)
        self.poll_interval_s = float(poll_interval_s)
        self.max_polls = int(max_polls)
        self.max_wait_s = float(max_wait_s)
        self.lease_s = float(lease_s)
        self.settle_s = max(0.0, float(settle_s))

    # ------------------------------------------------------------------ run time only
    def execute(self, context: Any) -> dict[str, object]:
        """Submit or continue the delivery; complete, defer, or fail for an operator."""
        from dpone.airflow.operators import _interval_from, _task_identity

        task = _task_identity(context)
        try_number = getattr(context["ti"], "try_number", None)
        interval = self.interval or _interval_from(context)

        def call(runtime: Any) -> Any:
            return runtime.deliver(
                interval=interval,
                partition=task.partition(self.partition),
                context=task.run_context(),
                provenance=task.ledger_provenance(try_number=try_number),
                poll_budget_s=self.poll_budget_s,
            )

        return self._decide(call, task=task)

    def execute_complete(
        self, context: Any, event: Any = None, operation_id: str | None = None
    ) -> dict[str, object]:
        """Woken by the trigger (or a duplicate event): ask the control plane, then decide.

        ``operation_id`` comes from the deferral's own kwargs, not from the event; the event
        is logged as a hint and otherwise ignored.
        """
        hint = event if isinstance(event, dict) else {}
        if operation_id is None:
            raise AirflowFailException(
                "dpone: woken without the operation id of the deferral; clear the task"
            )
        if hint.get("operation_id") not in (None, operation_id):
            self.log.warning("dpone: ignoring an event for another operation")
        self.log.info(
            "dpone delivery %s woken (hint: %s); rereading the control plane",
            operation_id,
            hint.get("status", "-"),
        )

        from dpone.airflow.operators import _task_identity

        # the resume is an attempt of the same run: the ledger records this try's provenance
        provenance = _task_identity(context).ledger_provenance(
            try_number=getattr(context["ti"], "try_number", None)
        )

        def call(runtime: Any) -> Any:
            return runtime.resume_delivery(operation_id, poll_budget_s=0.0, provenance=provenance)

        return self._decide(call, task=None, hint_status=hint.get("status"))

    # ------------------------------------------------------------------ decisions
    def _decide(
        self, call: Any, *, task: TaskIdentity | None, hint_status: object = None
    ) -> dict[str, object]:
        from dpone.airflow.delivery_runtime import prepare_delivery
        from dpone.airflow.operators import _connection, _stop_or_retry
        from dpone.contracts.delivery import DeliveryBlocked, DeliveryCompleted
        from dpone.errors import DponeError

        runtime = None
        try:
            # the locator first: a journal the trigger cannot be told about fails here,
            # before anything is submitted
            prepared = prepare_delivery(
                str(self.workload),
                os.environ,
                journal_conn_id=self.journal_conn_id,
                lookup=_connection,
            )
            runtime, locator = prepared.runtime, prepared.locator
            result = call(runtime)
        except DponeError as error:
            _stop_or_retry(self.log, error, workload=str(self.workload))
        finally:
            if runtime is not None:
                runtime.close()
        if task is not None:
            self.log.info(
                "dpone delivery %s for %s", result.operation_id, task.provenance(try_number=None)
            )
        if isinstance(result, DeliveryCompleted):
            self.log.info(
                "dpone delivery %s is COMPLETE (receipt %s)%s",
                result.operation_id,
                result.receipt,
                " (replayed: it was already complete)" if result.replayed else "",
            )
            return delivery_summary(result)
        if isinstance(result, DeliveryBlocked):
            message = (
                f"DELIVERY_BLOCKED ({result.reason.value}): {result.message}. Operation "
                f"{result.operation_id} is in state {result.state.value}. Retrying would not "
                f"help, so the remaining retries are not used. Run `{result.recovery_ref}` "
                "to see the evidence."
            )
            self.log.error("%s", message)
            raise AirflowFailException(message)
        refusal = _stop_instead_of_deferring(hint_status, result.operation_id, locator)
        if refusal is not None:
            # deferring again would wake at once again (a busy loop of task processes and
            # ledger attempts while the job runs): stop for an operator instead
            self.log.error("%s", refusal)
            raise AirflowFailException(refusal)
        return self._defer(result.operation_id, locator)

    def _defer(self, operation_id: str, locator: dict[str, str]) -> dict[str, object]:
        from dpone.airflow.triggers import DponeReceiptTrigger

        self.log.info(
            "dpone delivery %s is running at the receiver; deferring (worker released)",
            operation_id,
        )
        self.defer(
            trigger=DponeReceiptTrigger(
                operation_id=operation_id,
                journal=locator,
                poll_interval_s=self.poll_interval_s,
                max_polls=self.max_polls,
                deadline=time.time() + self.max_wait_s,
                lease_s=self.lease_s,
                not_before=time.time() + self.settle_s,
            ),
            method_name="execute_complete",
            kwargs={"operation_id": operation_id},
        )
        raise AssertionError("unreachable: defer raises TaskDeferred")  # pragma: no cover
