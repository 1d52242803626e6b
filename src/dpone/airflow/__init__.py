"""Apache Airflow provider for dpone: retry-safe loads as Airflow tasks (optional extra).

Install with ``pip install 'dpone[airflow]'``. Importing this package imports neither
Airflow nor any adapter: DAG files reach :class:`DponeRunOperator` and the DAG factory
through the lazy attributes below, and the operator reaches journals and targets only when
a worker runs it.

Public names:
    DponeRunOperator    run one workload operation per task (or per mapped partition)
    DponeDeliveryOperator  deliver to a REST receiver, deferring while the remote job runs
    DponeReceiptTrigger    the read-only trigger that wakes a deferred delivery
    dags_from_folder    build one DAG per workload file in a folder
    dag_from_workload   build the DAG of one workload file
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpone.airflow.delivery import DponeDeliveryOperator
    from dpone.airflow.factory import dag_from_workload, dags_from_folder
    from dpone.airflow.operators import DponeRunOperator
    from dpone.airflow.triggers import DponeReceiptTrigger

__all__ = [
    "DponeDeliveryOperator",
    "DponeReceiptTrigger",
    "DponeRunOperator",
    "dag_from_workload",
    "dags_from_folder",
]

_LAZY = {
    "DponeRunOperator": "dpone.airflow.operators",
    "DponeDeliveryOperator": "dpone.airflow.delivery",
    "DponeReceiptTrigger": "dpone.airflow.triggers",
    "dags_from_folder": "dpone.airflow.factory",
    "dag_from_workload": "dpone.airflow.factory",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(module), name)
