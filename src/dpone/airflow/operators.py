"""``DponeRunOperator``: one workload operation per Airflow task (or mapped partition)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from dpone.airflow.compat import (
    AirflowFailException,
    AirflowNotFoundException,
    BaseHook,
    BaseOperator,
)

if TYPE_CHECKING:
    from dpone.airflow.connections import ConnectionLike
    from dpone.airflow.identity import TaskIdentity
    from dpone.errors import DponeError

__all__ = ["DponeRunOperator"]

_log = logging.getLogger("dpone.airflow")


def _interval_from(context: Any) -> str:
    """The DAG run's data interval as ``START/END``, or a ConfigInvalid saying what to pass."""
    from dpone.errors import ConfigInvalid

    start = context.get("data_interval_start")
    end = context.get("data_interval_end")
    if not isinstance(start, datetime) or not isinstance(end, datetime) or end <= start:
        raise ConfigInvalid(
            "this DAG run has no data interval to load (a manual run of an unscheduled DAG?)",
            field="interval",
            hint="give the operator interval='START/END', or schedule the DAG",
        )
    return f"{start.isoformat()}/{end.isoformat()}"


def _connection(conn_id: str) -> ConnectionLike | None:
    """Airflow's connection ``conn_id`` (worker side), or None if Airflow does not define it.

    Any other lookup error (a secrets backend or the execution API unreachable) propagates
    unchanged: it may be transient, so Airflow's retries apply.
    """
    try:
        conn: ConnectionLike = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    return conn


def _map_index(ti: Any) -> int:
    value = getattr(ti, "map_index", None)
    return -1 if value is None else int(value)


def _task_identity(context: Any) -> TaskIdentity:
    """The running task instance's identity: DAG id, DAG run id, task id, map index."""
    from dpone.airflow.identity import TaskIdentity

    ti = context["ti"]
    return TaskIdentity(
        dag_id=ti.dag_id,
        run_id=context["dag_run"].run_id,
        task_id=ti.task_id,
        map_index=_map_index(ti),
    )


def _stop_or_retry(log: logging.Logger, error: DponeError, *, workload: str) -> NoReturn:
    """Raise for ``error``: AirflowFailException when a retry cannot fix it, else ``error``.

    A stop is logged with the recovery command (no traceback: the message says it all);
    a retryable error propagates unchanged so Airflow's retries apply.
    """
    from dpone.airflow.outcome import failure

    stop = failure(error, workload=workload)
    if stop is not None:
        log.error("%s", stop.message)
        raise AirflowFailException(stop.message) from None
    log.warning("%s (retryable: Airflow's retries apply)", error)
    raise error


class DponeRunOperator(BaseOperator):  # type: ignore[misc]  # untyped without Airflow
    """Run (or resume, or replay) one dpone operation of a workload.

    Every try of one task instance resolves the same operation: its id comes from the DAG
    id, the DAG run's ``run_id``, the task id and the partition (or map index), never the
    try number. So a retry after a lost worker finishes or proves what the lost try did
    and never writes twice; a COMPLETE operation returns its recorded result.

    Args:
        workload: path of the workload YAML file, as the worker sees it.
        interval: ``START/END`` to load; default: the DAG run's data interval.
        partition: the mapped partition identity (map the task over a list of these).
        target_conn_id: an Airflow connection to use as the target, resolved in the worker.
        journal_conn_id: an Airflow connection to use as the journal, resolved in the worker.

    Returns (XCom ``return_value``): ``operation_id``, ``state``, ``rows_written``,
    ``replayed`` and ``resumed``; never rows, SQL or credentials.

    Raises:
        AirflowFailException: COMMIT_UNKNOWN, an intent conflict or another family that a
            retry cannot fix; the message names the recovery command.
        DponeError: a retryable family (journal or fence unavailable, lease held, ...), so
            Airflow's retries apply.

    """

    template_fields: Sequence[str] = ("workload", "interval", "partition")
    ui_color: ClassVar[str] = "#e8f4ea"

    def __init__(
        self,
        *,
        workload: str | os.PathLike[str],
        interval: str | None = None,
        partition: str | None = None,
        target_conn_id: str | None = None,
        journal_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # a Path is fine too; mapped or templated values stay as given
        self.workload = os.fspath(workload) if isinstance(workload, os.PathLike) else workload
        self.interval = interval
        self.partition = partition
        self.target_conn_id = target_conn_id
        self.journal_conn_id = journal_conn_id

    # ------------------------------------------------------------------ run time only
    def execute(self, context: Any) -> dict[str, object]:
        """Run the operation in this worker; every import of dpone's runtime happens here."""
        from dpone.airflow.outcome import xcom_summary
        from dpone.errors import DponeError

        ti = context["ti"]
        task = _task_identity(context)
        provenance = task.provenance(try_number=getattr(ti, "try_number", None))
        _log.info("dpone run: workload %s, provenance %s", self.workload, provenance)
        try:
            result = self._run(task, context, try_number=getattr(ti, "try_number", None))
        except DponeError as error:
            _stop_or_retry(self.log, error, workload=str(self.workload))
        summary = xcom_summary(result)
        self.log.info(
            "dpone operation %s is %s: %s rows%s",
            result.operation_id,
            result.state.value,
            result.rows_written,
            " (replayed: it was already complete)" if result.replayed else "",
        )
        return summary

    def _run(self, task: TaskIdentity, context: Any, *, try_number: int | None) -> Any:
        from dpone.airflow.connections import apply_connections
        from dpone.api import Runner
        from dpone.config.workload import load_workload

        workload, environ = apply_connections(
            load_workload(self.workload),
            target_conn_id=self.target_conn_id,
            journal_conn_id=self.journal_conn_id,
            lookup=_connection,
            environ=os.environ,
        )
        interval = self.interval or _interval_from(context)
        # one operation per task: one journal session, and COMPLETE read before the task
        # ends (a Runner of many operations writes it behind the caller, ADR 0017)
        with Runner(workload, environ=environ, pooled=False) as runner:
            return runner.run(
                interval=interval,
                partition=task.partition(self.partition),
                context=task.run_context(),
                provenance=task.ledger_provenance(try_number=try_number),
            )
