"""Composition of resumable delivery: the control-plane store and the REST sink factory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dpone.contracts.delivery import PayloadRef
from dpone.contracts.identity import CLI_DAG_ID, derive_operation_id, parse_interval
from dpone.errors import ConfigInvalid, SourceInvalid
from dpone.ports.delivery import DeliverySinkPort, DeliveryStorePort
from dpone.runtime.delivery import (
    DeliveryPolicy,
    ResumableDeliveryProcessor,
    SinkFactory,
    stage_payload,
)

__all__ = [
    "delivery_operation_id",
    "open_delivery_processor",
    "open_delivery_store",
    "rest_sink_factory",
    "stage_payload_copy",
]


def open_delivery_store(
    journal: str, *, base_dir: Path, schema: str = "dpone"
) -> DeliveryStorePort:
    """Open the delivery control plane in the journal's database.

    ``sqlite:///path`` (embedded default) or ``postgresql://...`` (production; the
    tables go into the journal's ``schema``). Its tables and schema version are its
    own, so it shares the journal's database safely.

    Raises:
        ConfigInvalid: another URL scheme, or the postgres extra is missing.

    """
    if journal.startswith("sqlite:"):
        from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore
        from dpone.config.workload import resolve_sqlite_url

        return SqliteDeliveryStore(resolve_sqlite_url(journal, base_dir=base_dir, field="journal"))
    if journal.startswith(("postgresql://", "postgres://")):
        try:
            from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore
        except ImportError as exc:  # pragma: no cover - the postgres extra is missing
            raise ConfigInvalid(
                "a PostgreSQL control plane needs psycopg: install dpone[postgres]",
                field="journal",
            ) from exc
        return PostgresDeliveryStore(journal, schema=schema)
    raise ConfigInvalid(
        "the delivery control plane needs a sqlite:/// or postgresql:// journal URL",
        field="journal",
        hint="use --journal sqlite:///path/to/journal.db or postgresql://user@host/db",
    )


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
    journal: str,
    *,
    base_dir: Path,
    policy: DeliveryPolicy | None = None,
    timeout_s: float = 10.0,
) -> ResumableDeliveryProcessor:
    """Wire a processor on the control plane named by ``journal`` with REST sinks."""
    factory = rest_sink_factory(timeout_s=timeout_s)
    return ResumableDeliveryProcessor(
        store=open_delivery_store(journal, base_dir=base_dir),
        sink_factory=factory,
        policy=policy,
    )


def stage_payload_copy(source: Path, *, staging_dir: Path, chunk_bytes: int) -> PayloadRef:
    """Copy ``source`` into a content-addressed staging file and describe it.

    The copy is the payload authority: editing or removing ``source`` afterwards
    changes nothing that was recorded. The same content is staged once.

    Raises:
        SourceInvalid: ``source`` cannot be read.

    """
    described = stage_payload(source, chunk_bytes=chunk_bytes)
    staging_dir.mkdir(parents=True, exist_ok=True)
    staged = staging_dir / f"{described.digest[7:]}.jsonl"
    if not staged.is_file():
        tmp = staging_dir / f".{staged.name}.tmp-{os.getpid()}"
        shutil.copyfile(source, tmp)
        os.replace(tmp, staged)
    copy = stage_payload(staged, chunk_bytes=chunk_bytes)
    if copy.digest != described.digest:
        raise SourceInvalid("the payload changed while it was being staged", field="payload")
    return copy


def delivery_operation_id(
    *,
    workload_id: str,
    interval: str,
    partition: str,
    release: str,
    deployment: str,
    receiver: str,
) -> str:
    """The operation id of a delivery started outside Airflow (DAG fields are ``-``)."""
    return derive_operation_id(
        release_id=release,
        deployment_id=deployment,
        dag_id=CLI_DAG_ID,
        dag_run_logical_identity=CLI_DAG_ID,
        workload_id=workload_id,
        mapped_partition_identity=partition,
        canonical_interval=parse_interval(interval),
        canonical_target_identity=receiver,
    )
