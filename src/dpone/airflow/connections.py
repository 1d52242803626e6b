"""Airflow connection ids -> dpone URLs, resolved in the worker at run time only.

A DAG names a connection (``target_conn_id="warehouse"``); the URL with its credentials
is built in the task's process just before the run, handed to the runner in a private
environment mapping, and never written to the DAG, XCom, operator arguments, logs or the
journal (the journal stores only the credential-free target identity).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dpone.airflow._conn_url import ConnectionLike, connection_url
from dpone.config.workload import (
    DuckDbTargetConfig,
    MariaDbTargetConfig,
    PostgresTargetConfig,
    SqliteTargetConfig,
    Workload,
    replace,
)
from dpone.errors import ConfigInvalid

__all__ = [
    "JOURNAL_ENV",
    "TARGET_ENV",
    "ConnectionLike",
    "apply_connections",
    "connection_url",
]

#: Names under which resolved URLs reach the runner (a private mapping, not os.environ).
TARGET_ENV = "DPONE_AIRFLOW_TARGET_URL"
JOURNAL_ENV = "DPONE_AIRFLOW_JOURNAL_URL"

_URL_TARGETS = (SqliteTargetConfig, PostgresTargetConfig, MariaDbTargetConfig, DuckDbTargetConfig)


def _resolve(lookup: Callable[[str], ConnectionLike | None], conn_id: str, field: str) -> str:
    """The URL of connection ``conn_id``, or a ConfigInvalid if Airflow does not define it.

    A missing connection is a configuration error, not a transient one: retrying the task
    cannot create it, so the operator fails the task at once and says what to do.
    """
    conn = lookup(conn_id)
    if conn is None:
        env_name = "AIRFLOW_CONN_" + conn_id.upper()
        raise ConfigInvalid(
            f"the Airflow connection {conn_id!r} ({field}) is not defined",
            field=field,
            hint=(
                f"create the connection {conn_id!r} where the worker can read it (Admin > "
                f"Connections, `airflow connections add {conn_id} --conn-uri URI`, a secrets "
                f"backend or the {env_name} variable), or correct {field}; then clear the task"
            ),
        )
    return connection_url(conn)


def apply_connections(
    workload: Workload,
    *,
    target_conn_id: str | None,
    journal_conn_id: str | None,
    lookup: Callable[[str], ConnectionLike | None],
    environ: Mapping[str, str],
) -> tuple[Workload, dict[str, str]]:
    """Point the workload's target and journal at Airflow connections, if named.

    Returns the workload to run and the environment mapping to run it with: a copy of
    ``environ`` plus the resolved URLs under :data:`TARGET_ENV` / :data:`JOURNAL_ENV`. The
    workload then reads them through ``url_env`` / ``journal_env``, the same path a CLI run
    takes, so nothing else changes. ``lookup`` returns None for a connection Airflow does
    not define, which raises :class:`~dpone.errors.ConfigInvalid` naming it.
    """
    env = dict(environ)
    changes: dict[str, Any] = {}
    if target_conn_id:
        if not isinstance(workload.target, _URL_TARGETS):
            raise ConfigInvalid(
                f"target kind {workload.target.kind!r} takes no connection",
                field="target_conn_id",
                hint="leave target_conn_id out for file targets such as jsonl_append",
            )
        env[TARGET_ENV] = _resolve(lookup, target_conn_id, "target_conn_id")
        changes["target"] = replace(workload.target, url=None, url_env=TARGET_ENV)
    if journal_conn_id:
        env[JOURNAL_ENV] = _resolve(lookup, journal_conn_id, "journal_conn_id")
        changes["journal"] = None
        changes["journal_env"] = JOURNAL_ENV
    if not changes:
        return workload, env
    return replace(workload, **changes), env
