"""Composition of resumable delivery: the control-plane store and the REST sink factory."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from dpone.config.workload import RestTargetConfig, Workload
from dpone.contracts.delivery import PayloadRef
from dpone.contracts.identity import (
    CLI_DAG_ID,
    Interval,
    derive_operation_id,
    digest_of,
    parse_interval,
)
from dpone.contracts.run import (
    AccessContext,
    Provenance,
    RunStart,
    default_idempotency_key,
    run_id_for,
)
from dpone.errors import ConfigInvalid, SourceInvalid
from dpone.ports.checkpoint import DeliveryCheckpointPort
from dpone.ports.delivery import DeliverySinkPort, DeliveryStorePort
from dpone.ports.journal import CommitJournalPort
from dpone.runtime.delivery import (
    DeliveryPolicy,
    ResumableDeliveryProcessor,
    SinkFactory,
    stage_payload,
)
from dpone.runtime.workload_delivery import (
    WorkloadDelivery,
    WorkloadDeliveryService,
    materialize_jsonl,
)

if TYPE_CHECKING:
    from dpone.config.bootstrap import RunContext

__all__ = [
    "RestRoute",
    "delivery_operation_id",
    "open_delivery_processor",
    "open_delivery_service",
    "open_delivery_store",
    "open_rest_route",
    "payload_materializer",
    "plan_delivery",
    "rest_sink_factory",
    "stage_payload_copy",
    "workload_policy",
]


def open_delivery_store(
    journal: str, *, base_dir: Path, schema: str = "dpone", read_only: bool = False
) -> DeliveryStorePort:
    """Open the delivery control plane in the journal's database.

    ``sqlite:///path`` (embedded default) or ``postgresql://...`` (production; the
    tables go into the journal's ``schema``). Its tables and schema version are its
    own, so it shares the journal's database safely. ``read_only`` (commands that only
    look) creates, migrates and writes nothing.

    Raises:
        ConfigInvalid: another URL scheme, the postgres extra is missing, or (read-only)
            no control plane exists there.

    """
    if journal.startswith("sqlite:"):
        from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore
        from dpone.config.workload import resolve_sqlite_url

        return SqliteDeliveryStore(
            resolve_sqlite_url(journal, base_dir=base_dir, field="journal"), read_only=read_only
        )
    if journal.startswith(("postgresql://", "postgres://")):
        try:
            from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore
        except ImportError as exc:  # pragma: no cover - the postgres extra is missing
            raise ConfigInvalid(
                "a PostgreSQL control plane needs psycopg: install dpone[postgres]",
                field="journal",
            ) from exc
        return PostgresDeliveryStore(journal, schema=schema, read_only=read_only)
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
    schema: str = "dpone",
) -> ResumableDeliveryProcessor:
    """Wire a processor on the control plane named by ``journal`` with REST sinks."""
    factory = rest_sink_factory(timeout_s=timeout_s)
    return ResumableDeliveryProcessor(
        store=open_delivery_store(journal, base_dir=base_dir, schema=schema),
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


# ---------------------------------------------------------------------- workloads
@dataclass(slots=True)
class RestRoute:
    """The wired pieces of a ``target.kind: rest`` workload; close it when done."""

    workload: Workload
    journal: CommitJournalPort  # the run ledger and the checkpoints
    service: WorkloadDeliveryService
    receiver_url: str
    receiver_identity: str
    closed: bool = False

    def close(self) -> None:
        """Close the control plane and the journal (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.service.store.close()
        self.journal.close()


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def open_delivery_service(
    journal_url: str,
    *,
    base_dir: Path,
    policy: DeliveryPolicy,
    schema: str = "dpone",
    timeout_s: float = 10.0,
) -> tuple[WorkloadDeliveryService, CommitJournalPort]:
    """The delivery service on ``journal_url``: control plane, ledger and checkpoints.

    What `dpone delivery resume` uses: a workload's delivery promotes the checkpoint
    bound to its operation id, so the workload file is not needed to continue it.
    """
    from dpone.config.bootstrap import ledger_of, open_journal

    journal = open_journal(journal_url, base_dir=base_dir, schema=schema)
    try:
        store = open_delivery_store(journal_url, base_dir=base_dir, schema=schema)
    except BaseException:
        journal.close()
        raise
    service = WorkloadDeliveryService(
        store=store,
        sink_factory=rest_sink_factory(timeout_s=timeout_s),
        policy=policy,
        checkpoints=_checkpoints_of(journal),
        ledger=ledger_of(journal),
        owner=_owner(),
    )
    return service, journal


def _checkpoints_of(journal: object) -> DeliveryCheckpointPort:
    from dpone.config.bootstrap import require_methods

    require_methods(
        journal,
        ("promote_delivered",),
        "this journal cannot store checkpoints, which deliveries promote",
        hint="use the SQLite or PostgreSQL journal",
    )
    return cast(DeliveryCheckpointPort, journal)


def workload_policy(target: RestTargetConfig) -> DeliveryPolicy:
    """The processor bounds a rest target names (the poll budget is given per call)."""
    return DeliveryPolicy(
        poll_interval_s=target.poll_interval_seconds,
        wait_budget_s=target.wait_budget_seconds,
        submit_lease_s=target.submit_lease_seconds,
        retry_max_s=max(target.poll_interval_seconds, 1.0) * 12,
    )


def open_rest_route(workload: Workload, *, environ: Mapping[str, str] | None = None) -> RestRoute:
    """Open the journal and control plane of a rest workload (one database, one schema).

    Raises:
        ConfigInvalid: the target is not rest, its URL variable is unset or not a receiver
            URL, or the journal is not SQLite/PostgreSQL.

    """
    target = workload.target
    if not isinstance(target, RestTargetConfig):
        raise ConfigInvalid("this workload's target is not a REST receiver", field="target.kind")
    env = os.environ if environ is None else environ
    url = workload.target_url(dict(env))
    from dpone.adapters.delivery.rest import KIND, check_credential_ref

    check_credential_ref(target.credential)
    journal_url = workload.journal_url(dict(env))
    if not journal_url.startswith(("sqlite:", "postgresql://", "postgres://")):
        raise ConfigInvalid(
            "a REST delivery keeps its control plane in the journal's database: use a "
            "sqlite:/// or postgresql:// journal",
            field="journal",
        )
    service, journal = open_delivery_service(
        journal_url,
        base_dir=workload.base_dir,
        policy=workload_policy(target),
        schema=workload.journal_schema,
        timeout_s=target.request_timeout_seconds,
    )
    return RestRoute(
        workload=workload,
        journal=journal,
        service=service,
        receiver_url=url,
        receiver_identity=f"{KIND}:{url}",
    )


def plan_delivery(
    route: RestRoute,
    *,
    window: Interval,
    partition: str | None,
    context: RunContext | None,
    provenance: Provenance,
    environ: Mapping[str, str] | None = None,
) -> WorkloadDelivery:
    """Identity, intent, checkpoint and run record of one delivery (no write, no I/O).

    The operation id comes from the same identity builder as relational runs, with the
    receiver URL (no credentials) as the target identity.
    """
    from dpone.config.bootstrap import (
        _principal,
        checkpoint_advance,
        connection_names,
        pack_fingerprint,
        request_digest,
        workload_operation_id,
    )

    workload = route.workload
    target = cast(RestTargetConfig, workload.target)
    from dpone.config.bootstrap import RunContext

    ctx = context or RunContext()
    op = workload_operation_id(
        workload, ctx, partition=partition, window=window, target_identity=route.receiver_identity
    )
    # what is sent depends on the split and the chunking too: they pin the definition
    pack = digest_of(
        {
            "pack": pack_fingerprint(workload, route.receiver_identity),
            "rows_per_child": target.rows_per_child,
            "chunk_bytes": target.chunk_bytes,
        }
    )
    env = os.environ if environ is None else environ
    request_hash = request_digest(
        operation_id=op,
        workload_id=workload.workload,
        interval=window.canonical(),
        partition=partition or "-",
        dag_id=ctx.dag_id,
        dag_run=ctx.dag_run_logical_identity,
    )
    access = AccessContext(
        principal=_principal(provenance, env),
        # the control plane's journal is SQLite or PostgreSQL: it always has a locator
        connections=connection_names(workload, route.journal, route.receiver_identity, env),
    )
    key = default_idempotency_key(op)
    run = RunStart(
        run_id=run_id_for(key),
        idempotency_key=key,
        operation_id=op,
        request_hash=request_hash,
        definition_hash=pack,
        access_digest=access.digest(),
        access=access.record(),
        provenance=provenance.record(),
    )
    return WorkloadDelivery(
        operation_id=op,
        pack_fingerprint=pack,
        receiver_url=route.receiver_url,
        receiver_identity=route.receiver_identity,
        credential_ref=target.credential,
        capacity_limit=target.capacity,
        rows_per_child=target.rows_per_child,
        chunk_bytes=target.chunk_bytes,
        checkpoint=checkpoint_advance(workload, route.receiver_identity, partition, window),
        run=run,
    )


def payload_materializer(
    workload: Workload, *, window: Interval, partition: str | None
) -> Callable[[], PayloadRef]:
    """Return a call that reads the source for ``window`` into the staged JSON-lines payload."""
    from dpone.config.bootstrap import open_source

    target = cast(RestTargetConfig, workload.target)

    def materialize() -> PayloadRef:
        source = open_source(workload, window, partition)
        return materialize_jsonl(
            source,
            staging_dir=workload.resolve_path(target.staging_dir),
            batch_size=workload.load.batch_size,
            chunk_bytes=target.chunk_bytes,
        )

    return materialize
