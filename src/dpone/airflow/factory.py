"""Build DAGs from workload files: parse-time work is reading YAML, nothing else.

A DAG file in Airflow's DAGs folder::

    from dpone.airflow import dags_from_folder

    globals().update(dags_from_folder("/opt/dpone/workloads", schedule="@daily"))

Parsing validates each workload file (so a typo shows as a DAG import error with the
``DPONE_CONFIG_INVALID`` message) but opens no journal, target, source or connection,
resolves no secret and imports no database driver or HTTP client: those happen in the
worker when the task runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dpone.airflow.compat import DAG, CronDataIntervalTimetable, DeltaDataIntervalTimetable
from dpone.airflow.delivery import DponeDeliveryOperator
from dpone.airflow.operators import DponeRunOperator
from dpone.config.workload import Workload, load_workload
from dpone.errors import ConfigInvalid

__all__ = ["DEFAULT_START", "dag_from_workload", "dags_from_folder"]

#: A fixed start date; with ``catchup=False`` only the latest interval is scheduled.
DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)
_PATTERNS = ("*.yaml", "*.yml")


def dag_from_workload(
    path: str | Path, *, partitions: Sequence[str] | None = None, **options: Any
) -> Any:
    """Return the DAG ``<prefix><workload>`` with one task ``load`` for one workload file.

    The task is a :class:`DponeRunOperator`, or a :class:`DponeDeliveryOperator` for a
    ``target.kind: rest`` workload (``target_conn_id`` is then not used).

    Args:
        path: the workload YAML file.
        partitions: map the task over these partitions: one task instance, and one dpone
            operation, per partition, each filling ``{partition}`` in the source path.
        options: ``schedule`` (default ``@daily``), ``start_date``, ``retries`` (3),
            ``retry_delay`` (1 minute), ``dag_id_prefix`` (``dpone_``), ``target_conn_id``,
            ``journal_conn_id``, ``tags`` and ``dag_kwargs`` (more ``DAG`` arguments).

    """
    file = Path(path).resolve()
    return _dag(file, load_workload(file), partitions=partitions, **options)


def _dag(
    file: Path,
    spec: Workload,
    *,
    partitions: Sequence[str] | None = None,
    schedule: str | timedelta | None = "@daily",
    start_date: datetime = DEFAULT_START,
    retries: int = 3,
    retry_delay: timedelta = timedelta(minutes=1),
    dag_id_prefix: str = "dpone_",
    target_conn_id: str | None = None,
    journal_conn_id: str | None = None,
    tags: Sequence[str] = ("dpone",),
    dag_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    if partitions is not None and not partitions:
        raise ConfigInvalid(
            f"{file.name}: partitions is empty", field="partitions", hint="list at least one"
        )
    start = start_date if start_date.tzinfo else start_date.replace(tzinfo=UTC)
    dag = DAG(
        dag_id=f"{dag_id_prefix}{spec.workload}",
        schedule=_interval_schedule(schedule),
        start_date=start,
        catchup=False,
        tags=list(tags),
        default_args={"retries": retries, "retry_delay": retry_delay},
        doc_md=f"dpone workload `{spec.workload}` from `{file}`",
        **dict(dag_kwargs or {}),
    )
    operator: Any = DponeRunOperator
    common: dict[str, Any] = {
        "task_id": "load",
        "workload": str(file),
        "journal_conn_id": journal_conn_id,
    }
    if spec.target.kind == "rest":
        # a REST delivery runs as receiver jobs and defers while they run; the table
        # operator refuses it at run time (target_conn_id names a table target's
        # connection, so it does not apply here)
        operator = DponeDeliveryOperator
    else:
        common["target_conn_id"] = target_conn_id
    with dag:
        if partitions is None:
            operator(**common)
        else:
            operator.partial(**common).expand(partition=list(partitions))
    return dag


def dags_from_folder(
    folder: str | Path,
    *,
    partitions: Mapping[str, Sequence[str]] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Return ``{dag_id: DAG}`` for every ``*.yaml`` / ``*.yml`` workload file in ``folder``.

    Args:
        folder: the directory of workload files (not searched recursively).
        partitions: partition lists by workload name; those workloads get mapped tasks.
        options: passed to :func:`dag_from_workload` for every file.

    """
    directory = Path(folder)
    if not directory.is_dir():
        raise ConfigInvalid(
            f"workload folder {directory} does not exist",
            field="folder",
            hint="pass the directory that holds the workload YAML files",
        )
    files = sorted({f for pattern in _PATTERNS for f in directory.glob(pattern)})
    dags: dict[str, Any] = {}
    by_name = dict(partitions or {})
    for file in files:
        spec = load_workload(file)
        dag = _dag(file.resolve(), spec, partitions=by_name.get(spec.workload), **options)
        if dag.dag_id in dags:
            raise ConfigInvalid(
                f"two workload files in {directory} are both named {spec.workload!r}",
                field="workload",
                hint="give every workload file its own workload name",
            )
        dags[dag.dag_id] = dag
    return dags


def _interval_schedule(schedule: str | timedelta | None) -> Any:
    """A schedule whose runs each cover one data interval, the interval dpone loads.

    Airflow 3 turns a cron string into a trigger whose runs have a zero-length data
    interval; dpone loads ``[data_interval_start, data_interval_end)``, so cron strings and
    time deltas become the data-interval timetables (Airflow 2's default for cron strings).
    ``@once`` and other presets without a cron form, ``None`` and timetables pass unchanged.
    """
    if isinstance(schedule, timedelta):
        return DeltaDataIntervalTimetable(schedule)
    if isinstance(schedule, str) and schedule not in ("@once", "@continuous"):
        return CronDataIntervalTimetable(schedule, timezone="UTC")
    return schedule
