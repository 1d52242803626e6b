"""THE MERGE SEAM between ``DponeDeliveryOperator`` and dpone's delivery runtime.

Two functions, no Airflow import (the trigger tests use them in the development
environment): which object runs ``deliver`` / ``resume_delivery``, and where its control
plane is, as the trigger's non-secret locator. Everything else in the operator stays
as it is when the interim runtime gives way to ``Runner``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["open_delivery_runtime", "trigger_locator"]


def open_delivery_runtime(workload: str, environ: Mapping[str, str]) -> Any:
    """THE MERGE SEAM: the object whose ``deliver`` / ``resume_delivery`` the operator calls.

    Interim: :class:`dpone.airflow._interim_delivery.InterimDeliveryRuntime` on the existing
    delivery composition. At merge this becomes ``Runner(workload, environ=environ)``
    (same two methods plus ``close``), and :func:`trigger_locator` reads the workload's
    journal URL.
    """
    from dpone.airflow._interim_delivery import InterimDeliveryRuntime

    return InterimDeliveryRuntime(workload, environ=environ)


def trigger_locator(runtime: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The non-secret locator of the runtime's control plane, for the trigger (merge seam)."""
    from dpone.airflow._observe import journal_locator

    del environ  # the interim runtime resolved its journal already
    return journal_locator(runtime.store_locator)
