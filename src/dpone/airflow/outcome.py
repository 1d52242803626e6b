"""dpone results and errors -> what an Airflow task returns, retries or fails with.

Pure functions, tested without Airflow: the operator maps :func:`failure` onto
``AirflowFailException`` and lets retryable errors propagate unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpone.contracts.result import OperationResult
from dpone.errors import DponeError, recovery_ref

__all__ = ["Failure", "failure", "xcom_summary"]


def xcom_summary(result: OperationResult) -> dict[str, object]:
    """The task's XCom value: operation id, state and row count; never rows, SQL or secrets.

    The journal is the truth: losing this value changes nothing, a retry rereads the
    journal and returns the recorded result.
    """
    return {
        "operation_id": result.operation_id,
        "state": result.state.value,
        "rows_written": result.rows_written,
        "replayed": result.replayed,
        "resumed": result.resumed,
    }


@dataclass(frozen=True, slots=True)
class Failure:
    """A failure Airflow must not retry, with the message the task log shows."""

    message: str


def _next_step(error: DponeError, workload: str) -> str:
    if error.operation_id:
        command = error.recovery_ref or recovery_ref(error.operation_id)
        if command.startswith("dpone recovery") and " -w " not in command:
            command += f" -w {workload}"
        return f"Run `{command}` to see the evidence and the recommended action."
    if error.hint:
        return f"Fix: {error.hint}."
    return "Fix the cause above, then clear the task."


def failure(error: DponeError, *, workload: str) -> Failure | None:
    """Return the :class:`Failure` for a non-retryable error, None for a retryable one.

    Retryable (transient) families propagate unchanged so Airflow's retries apply; every
    try resolves the same operation, so a retry finishes or replays, never writes twice.
    COMMIT_UNKNOWN, an intent conflict and every other stop or terminal family fail the
    task without using its remaining retries, naming the recovery command.
    """
    if error.retryable:
        return None
    where = ""
    if error.operation_id:
        where = f" Operation {error.operation_id}"
        if error.state:
            where += f" is in state {error.state}"
        if error.journal_version is not None:
            where += f" (journal version {error.journal_version})"
        where += "."
    message = (
        f"{error.code.value}: {error.message}.{where} Retrying would not help, so the "
        f"remaining retries are not used. {_next_step(error, workload)}"
    )
    return Failure(message=message.replace("..", "."))
