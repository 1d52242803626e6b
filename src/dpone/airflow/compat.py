"""Every Airflow import dpone makes, in one place, for Airflow 3.x and 2.10/2.11.

``apache-airflow-providers-common-compat`` resolves each name from ``airflow.sdk`` on 3.x
and from the 2.x module on 2.x; nothing else in ``dpone.airflow`` imports ``airflow``.
"""

from __future__ import annotations

from airflow.providers.common.compat.sdk import (
    DAG,
    AirflowFailException,
    AirflowNotFoundException,
    BaseHook,
    BaseOperator,
)
from airflow.providers.common.compat.version_compat import AIRFLOW_V_3_0_PLUS

# the same module in 2.x and 3.x: a schedule whose runs each cover one data interval
# (3.x turns a cron string into a zero-length-interval trigger by default)
from airflow.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable

__all__ = [
    "AIRFLOW_V_3_0_PLUS",
    "DAG",
    "AirflowFailException",
    "AirflowNotFoundException",
    "BaseHook",
    "BaseOperator",
    "CronDataIntervalTimetable",
    "DeltaDataIntervalTimetable",
]
