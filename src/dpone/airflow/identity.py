"""Airflow task -> dpone identity: DAG, logical run, task and map index; never a try number.

Pure functions over plain values, so they are tested without Airflow installed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from dpone.config.bootstrap import RunContext
from dpone.contracts.identity import derive_operation_id
from dpone.contracts.run import AirflowProvenance
from dpone.errors import ConfigInvalid, UnsafeValue

__all__ = ["TaskIdentity", "logical_run_identity"]

_PROBE_INTERVAL_START = datetime(2000, 1, 1, tzinfo=UTC)


def _accepted(value: str) -> bool:
    """True when the identity guard takes ``value`` as a logical run identity as it is."""
    from dpone.contracts.identity import Interval

    try:
        derive_operation_id(
            release_id="r",
            deployment_id="d",
            dag_id="d",
            dag_run_logical_identity=value,
            workload_id="w",
            mapped_partition_identity="-",
            canonical_interval=Interval(
                start=_PROBE_INTERVAL_START, end=_PROBE_INTERVAL_START.replace(year=2001)
            ),
            canonical_target_identity="t",
        )
    except UnsafeValue:
        return False
    return True


def logical_run_identity(run_id: str) -> str:
    """Return the DAG run's logical identity: its ``run_id``, the same on every try.

    ``run_id`` is Airflow's key of a DAG run beside the DAG id in both 2.x and 3.x, and a
    run has one even without a logical date. A manual run's id carries its trigger time to
    the microsecond (``manual__2026-11-30T10:11:12.345678+00:00``), which the identity guard
    rejects because such values usually mean "now"; for Airflow the value is stored with the
    run and never changes, so it enters the identity as ``run_id_sha256:<digest>`` instead.
    """
    if not run_id:
        raise ConfigInvalid("the DAG run has no run_id", field="dag_run.run_id")
    if _accepted(run_id):
        return run_id
    return "run_id_sha256:" + hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskIdentity:
    """The logical identity of one Airflow task instance (every try has the same one).

    ``map_index`` is -1 for an unmapped task, as in Airflow.
    """

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    def run_context(self) -> RunContext:
        """The :class:`RunContext` handed to :meth:`dpone.api.Runner.run`.

        The operation identity has one field for the orchestrator's job, ``dag_id``; the
        task id goes into it as ``DAG/TASK`` (Airflow ids cannot contain ``/``), so two tasks
        of one DAG loading the same workload are two operations.
        """
        return RunContext(
            dag_id=f"{self.dag_id}/{self.task_id}",
            dag_run_logical_identity=logical_run_identity(self.run_id),
        )

    def partition(self, given: str | None) -> str | None:
        """The mapped partition identity: the partition given, else the map index.

        A task mapped over ``partition`` gets that value (which also fills ``{partition}``
        in the source path); a task mapped over something else gets ``map_index=N``, which
        is stable within its DAG run, so every mapped instance is its own operation.
        """
        if given is not None:
            if not isinstance(given, str) or not given:
                raise ConfigInvalid(
                    "partition must be a non-empty string",
                    field="partition",
                    hint="map the task over a list of partition names",
                )
            return given
        return f"map_index={self.map_index}" if self.map_index >= 0 else None

    def ledger_provenance(self, *, try_number: int | None) -> AirflowProvenance:
        """Return this try as the run ledger records it (the try number is provenance only)."""
        import socket

        return AirflowProvenance(
            dag_id=self.dag_id,
            run_id=self.run_id,
            task_id=self.task_id,
            try_number=try_number if try_number is not None else 0,
            map_index=self.map_index,
            host=socket.gethostname(),
        )

    def provenance(self, *, try_number: int | None) -> dict[str, str]:
        """Who ran the operation, for the run ledger and logs (never part of the identity)."""
        out = {
            "orchestrator": "airflow",
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": str(self.map_index),
        }
        if try_number is not None:
            out["try_number"] = str(try_number)
        return out
