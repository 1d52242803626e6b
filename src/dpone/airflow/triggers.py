"""``DponeReceiptTrigger``: wake a deferred delivery task when its remote job may be done.

The trigger is read-only and untrusted by design (ADR 0054 / ARCHITECTURE section 14):
it gets an operation id and a non-secret locator of the control plane, observes the
receiver with GET under an observation lease, and emits a hint. The operator's
``execute_complete`` rereads the control plane and decides; a lost, repeated or wrong
event changes nothing. Only plain JSON values go into its arguments (Airflow 3 refuses
anything else, and they are stored with the task instance): never a token, URL password,
payload or response body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from dpone.airflow._observe import ObservationBounds, observe_once_woken, settle

__all__ = ["DponeReceiptTrigger"]


async def _airflow_connection_url(conn_id: str) -> str | None:
    """The dpone URL of Airflow connection ``conn_id`` as the triggerer sees it, or None.

    Airflow's lookup is synchronous (a secrets backend, the metadata database or, in 3.x,
    the triggerer's supervisor), so it runs in a thread, off the event loop every trigger
    of this triggerer shares. The URL is built as the worker builds it
    (:func:`dpone.airflow._conn_url.connection_url`) and stays in this process's memory.
    """
    from dpone.airflow._conn_url import connection_url
    from dpone.airflow.compat import AirflowNotFoundException, BaseHook

    try:
        conn = await asyncio.to_thread(BaseHook.get_connection, conn_id)
    except AirflowNotFoundException:
        return None
    return connection_url(conn)


class DponeReceiptTrigger(BaseTrigger):  # type: ignore[misc]  # untyped without Airflow
    """Watch one delivery's remote job; emit ``{"operation_id", "status", "polls"}`` once.

    Args:
        operation_id: the delivery's operation id.
        journal: the control plane's locator, never a secret: ``{"kind": "sqlite",
            "path": ...}``, or ``{"kind": "postgresql", "schema": ...}`` with one of
            ``"url"`` (no password), ``"url_env"`` (a variable of the triggerer holding
            the URL) or ``"conn_id"`` (an Airflow connection the triggerer looks up).
        poll_interval_s: seconds between rounds.
        max_polls: rounds of this run at most (GETs by the lease holder, control-plane
            looks by a watcher); a triggerer restart starts the count again.
        deadline: seconds since the epoch after which the run ends (kept across restarts).
        lease_s: how long the observation lease lasts without renewal; another trigger
            for the same operation takes over after it.
        request_timeout_s: timeout of one GET.
        not_before: seconds since the epoch before which no event is emitted (the
            operator's ``settle_s`` after the deferral; see :func:`settle`).

    When the bounds are reached the trigger emits ``exhausted``: the operator looks at
    the control plane itself and defers again while the job runs. A locator this
    triggerer cannot resolve (its ``url_env`` variable unset, its ``conn_id`` unknown
    here) ends the run at once with ``locator_unresolved`` and one error line naming what
    is missing; the operator then fails the task for an operator instead of deferring
    into the same failure again.
    """

    def __init__(
        self,
        operation_id: str,
        journal: dict[str, Any],
        poll_interval_s: float = 10.0,
        max_polls: int = 360,
        deadline: float | None = None,
        lease_s: float = 60.0,
        request_timeout_s: float = 10.0,
        not_before: float | None = None,
    ) -> None:
        super().__init__()
        self.operation_id = str(operation_id)
        self.journal = {str(k): str(v) for k, v in dict(journal).items()}
        self.poll_interval_s = float(poll_interval_s)
        self.max_polls = int(max_polls)
        self.deadline = None if deadline is None else float(deadline)
        self.lease_s = float(lease_s)
        self.request_timeout_s = float(request_timeout_s)
        self.not_before = None if not_before is None else float(not_before)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and plain keyword arguments that rebuild this trigger."""
        return (
            "dpone.airflow.triggers.DponeReceiptTrigger",
            {
                "operation_id": self.operation_id,
                "journal": dict(self.journal),
                "poll_interval_s": self.poll_interval_s,
                "max_polls": self.max_polls,
                "deadline": self.deadline,
                "lease_s": self.lease_s,
                "request_timeout_s": self.request_timeout_s,
                "not_before": self.not_before,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Observe until a hint is due, then yield it (once per run)."""
        hint = await observe_once_woken(
            self.operation_id,
            self.journal,
            ObservationBounds(
                poll_interval_s=self.poll_interval_s,
                max_polls=self.max_polls,
                deadline=self.deadline,
                lease_s=self.lease_s,
                request_timeout_s=self.request_timeout_s,
            ),
            connection_url=_airflow_connection_url,
        )
        self.log.info(
            "dpone delivery %s: %s after %s poll(s)",
            self.operation_id,
            hint["status"],
            hint["polls"],
        )
        await settle(self.not_before)
        yield TriggerEvent(hint)
