"""The seam between ``DponeDeliveryOperator`` and dpone's delivery runtime (``Runner``).

Two functions, no Airflow import (the trigger tests use them in the development
environment): which object runs ``deliver`` / ``resume_delivery``, and where its control
plane is, as the trigger's non-secret locator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["open_delivery_runtime", "trigger_locator"]


def open_delivery_runtime(workload: str, environ: Mapping[str, str]) -> Any:
    """A :class:`dpone.api.Runner` on the workload file (``target.kind: rest``)."""
    from dpone.api import Runner

    return Runner(workload, environ=environ)


def trigger_locator(runtime: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The non-secret locator of the workload's control plane (its journal's database).

    Raises:
        ConfigInvalid: the journal URL carries a password (see :func:`journal_locator`).

    """
    from dpone.airflow._observe import journal_locator
    from dpone.config.workload import resolve_sqlite_url

    workload = runtime.workload
    url = workload.journal_url(dict(environ))
    if url.startswith("sqlite:"):
        path = resolve_sqlite_url(url, base_dir=workload.base_dir, field="journal")
        return journal_locator(f"sqlite:{path}")
    return journal_locator(url, schema=workload.journal_schema)
