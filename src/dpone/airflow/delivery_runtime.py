"""The seam between ``DponeDeliveryOperator`` and dpone's delivery runtime (``Runner``).

No Airflow import (the trigger tests use it in the development environment): which
object runs ``deliver`` / ``resume_delivery``, and where its control plane is, as the
trigger's non-secret locator. :func:`prepare_delivery` computes the locator *before* it
opens anything, so a journal the trigger could not be told about safely fails the task
before a remote job is submitted, not after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from dpone.airflow._conn_url import ConnectionLike
    from dpone.config.workload import Workload

__all__ = ["PreparedDelivery", "open_delivery_runtime", "prepare_delivery", "trigger_locator"]


def open_delivery_runtime(workload: Workload | str, environ: Mapping[str, str]) -> Any:
    """A :class:`dpone.api.Runner` on the workload (``target.kind: rest``)."""
    from dpone.api import Runner

    return Runner(workload, environ=environ)


@dataclass(frozen=True, slots=True)
class PreparedDelivery:
    """An open runtime and the trigger's locator of its control plane (no secret)."""

    runtime: Any
    locator: dict[str, str]


def prepare_delivery(
    workload: str,
    environ: Mapping[str, str],
    *,
    journal_conn_id: str | None = None,
    lookup: Callable[[str], ConnectionLike | None] | None = None,
) -> PreparedDelivery:
    """Load the workload, apply ``journal_conn_id``, compute the locator, open the runtime.

    The locator comes first: it needs no I/O, and an error here (a password written in
    the workload file) must stop the task before anything is submitted.

    Raises:
        ConfigInvalid: the workload, the connection or the journal URL is not usable by a
            deferred delivery (the message says what to change).

    """
    from dpone.airflow.connections import apply_connections
    from dpone.config.workload import load_workload

    loaded = load_workload(workload)
    env: Mapping[str, str] = environ
    if journal_conn_id:
        if lookup is None:
            raise TypeError("journal_conn_id needs a connection lookup")
        loaded, env = apply_connections(
            loaded,
            target_conn_id=None,
            journal_conn_id=journal_conn_id,
            lookup=lookup,
            environ=environ,
        )
    locator = workload_locator(loaded, env, journal_conn_id=journal_conn_id)
    return PreparedDelivery(runtime=open_delivery_runtime(loaded, env), locator=locator)


def trigger_locator(
    runtime: Any, environ: Mapping[str, str], *, journal_conn_id: str | None = None
) -> dict[str, str]:
    """The non-secret locator of an open runtime's control plane (see :func:`workload_locator`)."""
    return workload_locator(runtime.workload, environ, journal_conn_id=journal_conn_id)


def workload_locator(
    workload: Workload, environ: Mapping[str, str], *, journal_conn_id: str | None = None
) -> dict[str, str]:
    """The trigger's locator of the workload's journal database: names, never secrets.

    - SQLite: the absolute path.
    - PostgreSQL without a password or query: the URL itself.
    - PostgreSQL with one, from ``journal_conn_id``: ``{"conn_id": ...}`` (the triggerer
      looks the Airflow connection up); from ``journal_env`` or ``DPONE_JOURNAL``:
      ``{"url_env": NAME}`` (the triggerer reads its own variable of that name).

    Raises:
        ConfigInvalid: a password written in the workload file itself (``journal:``), or a
            journal the trigger cannot read (another scheme, a relative SQLite path).

    """
    from dpone.airflow._observe import (
        carries_secret,
        conn_locator,
        env_locator,
        journal_locator,
    )
    from dpone.config.workload import resolve_sqlite_url
    from dpone.errors import ConfigInvalid

    url = workload.journal_url(dict(environ))
    if url.startswith("sqlite:"):
        path = resolve_sqlite_url(url, base_dir=workload.base_dir, field="journal")
        return journal_locator(f"sqlite:{path}")
    schema = workload.journal_schema
    if urlsplit(url).scheme not in ("postgresql", "postgres") or not carries_secret(url):
        return journal_locator(url, schema=schema)
    if journal_conn_id:
        return conn_locator(journal_conn_id, schema=schema)
    if workload.journal is not None:
        raise ConfigInvalid(
            "the workload file's journal URL carries a password (or query), which a "
            "deferred delivery would have to hand to the triggerer",
            field="journal",
            hint="take the URL out of the workload file: set journal_env to a variable that "
            "the workers and the triggerer both have (or set DPONE_JOURNAL there), or give "
            "the operator journal_conn_id=<an Airflow connection>; the trigger then gets "
            "only the variable's or the connection's name",
        )
    return env_locator(workload.journal_env or "DPONE_JOURNAL", schema=schema)
