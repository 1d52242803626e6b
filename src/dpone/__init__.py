"""dpone: batch data delivery that is safe to retry.

The public API is :func:`run_operation`; everything else is reached through the
``dpone`` command or the sub-packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpone._version import __version__

if TYPE_CHECKING:
    from dpone.api import RunContext, Runner, run_operation

__all__ = ["RunContext", "Runner", "__version__", "run_operation"]


def __getattr__(name: str) -> Any:
    # the API pulls in config and adapters; keep `import dpone` light (Airflow DAG parsing)
    if name in ("run_operation", "RunContext", "Runner"):
        from dpone import api

        return getattr(api, name)
    raise AttributeError(name)
