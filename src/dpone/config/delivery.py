"""Composition of resumable delivery: the control-plane store and the REST sink factory."""

from __future__ import annotations

from pathlib import Path

from dpone.errors import ConfigInvalid
from dpone.ports.delivery import DeliverySinkPort, DeliveryStorePort
from dpone.runtime.delivery import DeliveryPolicy, ResumableDeliveryProcessor, SinkFactory

__all__ = ["open_delivery_processor", "open_delivery_store", "rest_sink_factory"]


def open_delivery_store(journal: str | Path) -> DeliveryStorePort:
    """Open the delivery control plane beside the journal: a SQLite file path for now.

    Raises:
        ConfigInvalid: the locator is not a SQLite file (PostgreSQL is not built yet).

    """
    text = str(journal)
    if "://" in text and not text.startswith("sqlite:"):
        raise ConfigInvalid(
            "the delivery control plane runs on a SQLite file for now; PostgreSQL is not built yet",
            field="journal",
        )
    from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore

    path = text.removeprefix("sqlite:///").removeprefix("sqlite:")
    return SqliteDeliveryStore(Path(path))


def rest_sink_factory(*, timeout_s: float = 10.0) -> SinkFactory:
    """Return a factory building a REST sink (httpx, imported here lazily) per receiver."""
    try:
        from dpone.adapters.delivery.rest import RestDeliverySink
    except ImportError as exc:  # pragma: no cover - the rest extra is missing
        raise ConfigInvalid(
            "REST delivery needs httpx: install dpone[rest]", field="receiver"
        ) from exc

    def build(url: str, credential_ref: str | None) -> DeliverySinkPort:
        return RestDeliverySink(url, credential_ref=credential_ref, timeout_s=timeout_s)

    return build


def open_delivery_processor(
    journal: str | Path, *, policy: DeliveryPolicy | None = None, timeout_s: float = 10.0
) -> ResumableDeliveryProcessor:
    """Wire a processor on the SQLite control plane with REST sinks."""
    factory = rest_sink_factory(timeout_s=timeout_s)
    return ResumableDeliveryProcessor(
        store=open_delivery_store(journal),
        sink_factory=factory,
        policy=policy,
    )
