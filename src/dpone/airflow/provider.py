"""What Airflow reads from the ``apache_airflow_provider`` entry point (imports no Airflow)."""

from __future__ import annotations

from typing import Any

from dpone._version import __version__

__all__ = ["get_provider_info"]


def get_provider_info() -> dict[str, Any]:
    """Return the provider description ``airflow providers list`` shows.

    The schema requires only ``name`` and ``description``; operators are listed so that
    ``airflow providers operators`` (and the docs) can find them, and the read-only
    trigger of deferred REST deliveries so ``airflow providers triggers`` does.
    """
    return {
        "package-name": "dpone",
        "name": "dpone",
        "description": "Retry-safe batch loads: every load is a journaled operation with a "
        "target-side fence, so Airflow retries never write twice.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "dpone",
                "external-doc-url": "https://github.com/dpone/dpone/blob/main/docs/airflow.md",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "dpone",
                "python-modules": ["dpone.airflow.operators", "dpone.airflow.delivery"],
            },
        ],
        "triggers": [
            {"integration-name": "dpone", "python-modules": ["dpone.airflow.triggers"]},
        ],
    }
