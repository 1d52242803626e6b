"""Composition root: workload + environment -> journal, connector, source, identity.

The only module that reads the environment and picks adapters; adapters are imported
lazily so that ``import dpone`` stays light.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import dpone
from dpone.contracts.fence import FenceCapability
from dpone.contracts.identity import (
    CLI_DAG_ID,
    Interval,
    derive_intent_digest,
    derive_operation_id,
    digest_of,
)
from dpone.contracts.load import Column, LoadPlan
from dpone.errors import ConfigInvalid
from dpone.ports.connector import TargetConnectorPort
from dpone.ports.journal import CommitJournalPort, TransactionalJournalPort
from dpone.ports.source import SourcePort
from dpone.runtime import failpoints
from dpone.runtime.commit_protocol import OperationSpec

from .evidence import EVIDENCE_DIR, load_valid_evidence
from .workload import (
    CONNECTOR_GROUP,
    CsvSourceConfig,
    DuckDbTargetConfig,
    JsonlAppendTargetConfig,
    MariaDbTargetConfig,
    PluginTargetConfig,
    PostgresTargetConfig,
    PublicationTargetConfig,
    SqliteTargetConfig,
    Workload,
    resolve_file_url,
    resolve_sqlite_url,
)

__all__ = [
    "Route",
    "RunContext",
    "build_route",
    "configure_failpoints",
    "open_journal",
    "open_source",
    "plan_operation",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """Who asks for the run, by logical identity only (never a try number or host).

    Outside Airflow both DAG fields are ``"-"``; the Airflow operator fills them from the
    DAG id and the DAG run's logical date / run id.
    """

    dag_id: str = CLI_DAG_ID
    dag_run_logical_identity: str = CLI_DAG_ID


@dataclass(slots=True)
class Route:
    """The wired adapters of one workload; close it when done."""

    journal: CommitJournalPort
    connector: TargetConnectorPort
    atomic: TransactionalJournalPort | None = None
    #: False when policy requires certification and this route has no valid evidence
    auto_recover: bool = True
    closed: bool = field(default=False)

    def close(self) -> None:
        """Close every adapter (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.connector.close()
        self.journal.close()


def configure_failpoints(environ: Mapping[str, str] | None = None) -> None:
    """Activate failpoints from ``DPONE_FAILPOINTS`` (crash tests, certification)."""
    env = os.environ if environ is None else environ
    failpoints.configure(env.get("DPONE_FAILPOINTS"))


def open_journal(
    url: str,
    *,
    base_dir: Path,
    field_name: str = "journal",
    schema: str = "dpone",
    read_only: bool = False,
) -> CommitJournalPort:
    """Open the journal a URL names: ``sqlite:///path``, ``postgresql://…`` or ``memory://``.

    ``read_only`` is for commands that only look (list, history, inspect, plan): they
    never create, convert or migrate a journal.
    """
    if url == "memory://":
        from dpone.adapters.journal.memory import InMemoryCommitJournal

        return InMemoryCommitJournal()
    if url.startswith("sqlite:"):
        from dpone.adapters.journal.sqlite import SqliteCommitJournal

        return SqliteCommitJournal(
            resolve_sqlite_url(url, base_dir=base_dir, field=field_name), read_only=read_only
        )
    if url.startswith(("postgresql://", "postgres://")):
        postgres = _adapter_module("journal.postgres", extra="postgres", role="journal")
        return cast(
            CommitJournalPort,
            postgres.PostgresCommitJournal(url, schema=schema, read_only=read_only),
        )
    raise ConfigInvalid(
        f"{field_name} URL scheme is not supported",
        field=field_name,
        hint="use sqlite:///path/to/journal.db or postgresql://user@host:5432/db",
    )


def _plugin_connector(
    target: PluginTargetConfig, workload: Workload, environ: Mapping[str, str]
) -> TargetConnectorPort:
    """Build a third-party connector from its ``dpone.connectors`` entry point.

    The entry point is a factory ``(options, *, base_dir, environ) -> connector``; the
    connector declares its capability as data (``connector.capability``).
    """
    from importlib.metadata import entry_points

    [point] = entry_points(group=CONNECTOR_GROUP, name=target.kind)
    try:
        factory = point.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not crash with a traceback
        raise ConfigInvalid(
            f"the connector package for target kind {target.kind!r} failed to load "
            f"({type(exc).__name__})",
            field="target.kind",
            hint="reinstall the connector package or check its entry point",
        ) from None
    connector = factory(target.options(), base_dir=workload.base_dir, environ=environ)
    if not isinstance(getattr(connector, "capability", None), FenceCapability):
        raise ConfigInvalid(
            f"the connector for target kind {target.kind!r} declares no fence capability",
            field="target.kind",
            hint="a connector must expose capability: dpone.contracts.fence.FenceCapability",
        )
    return cast(TargetConnectorPort, connector)


def _adapter_module(name: str, *, extra: str, role: str) -> Any:
    """Import an adapter that needs an optional dependency, or say which extra to install."""
    import importlib

    try:
        return importlib.import_module(f"dpone.adapters.{name}")
    except ImportError:
        raise ConfigInvalid(
            f"this {role} needs the {extra} extra",
            field=role,
            hint=f"pip install 'dpone[{extra}]'",
        ) from None


def _open_connector(workload: Workload, environ: Mapping[str, str]) -> TargetConnectorPort:
    target = workload.target
    if isinstance(target, SqliteTargetConfig):
        from dpone.adapters.connectors.sqlite import SqliteConnector

        url = workload.target_url(dict(environ))
        field_name = "target.url" if target.url is not None else "target.url_env"
        path = resolve_sqlite_url(url, base_dir=workload.base_dir, field=field_name)
        return cast(TargetConnectorPort, SqliteConnector(path, table=target.table))
    if isinstance(target, PostgresTargetConfig):
        postgres = _adapter_module("connectors.postgres", extra="postgres", role="target")
        return cast(
            TargetConnectorPort,
            postgres.PostgresConnector(
                workload.target_url(dict(environ)),
                table=target.table,
                fence_schema=target.fence_schema,
                lock_timeout_s=target.lock_timeout_seconds,
            ),
        )
    if isinstance(target, MariaDbTargetConfig):
        module = _adapter_module("connectors.mariadb", extra="mysql", role="target")
        return cast(
            TargetConnectorPort,
            module.MariaDbConnector(
                workload.target_url(dict(environ)),
                table=target.table,
                fence_schema=target.fence_schema,
                lock_timeout_s=target.lock_timeout_seconds,
            ),
        )
    if isinstance(target, DuckDbTargetConfig):
        module = _adapter_module("connectors.duckdb", extra="duckdb", role="target")
        field_name = "target.url" if target.url is not None else "target.url_env"
        path = resolve_file_url(
            workload.target_url(dict(environ)),
            scheme="duckdb",
            base_dir=workload.base_dir,
            field=field_name,
        )
        return cast(
            TargetConnectorPort,
            module.DuckDbConnector(
                path, table=target.table, lock_timeout_s=target.lock_timeout_seconds
            ),
        )
    if isinstance(target, PluginTargetConfig):
        return _plugin_connector(target, workload, environ)
    if isinstance(target, JsonlAppendTargetConfig):
        from dpone.adapters.connectors.jsonl_append import JsonlAppendConnector

        return cast(TargetConnectorPort, JsonlAppendConnector(workload.resolve_path(target.path)))
    if isinstance(target, PublicationTargetConfig):
        raise ConfigInvalid(
            "a publication workload has one writer per partition, not one target connector",
            field="target.kind",
            hint="use `dpone run WORKLOAD --interval ...` or `dpone publication write|publish`",
        )
    raise ConfigInvalid("unknown target kind", field="target.kind")  # pragma: no cover


def source_path(workload: Workload, window: Interval, partition: str | None) -> Path:
    """Resolve the source path, filling ``{partition}``, ``{start:FMT}`` and ``{end:FMT}``."""
    raw = workload.source.path
    if "{partition" in raw and partition is None:
        raise ConfigInvalid(
            "source.path uses {partition}, but no partition was given",
            field="source.path",
            hint="pass --partition P (or partition= in the Python API)",
        )
    try:
        filled = raw.format(partition=partition or "", start=window.start, end=window.end)
    except (ValueError, KeyError, IndexError) as exc:
        raise ConfigInvalid(
            f"source.path cannot be filled in ({type(exc).__name__})",
            field="source.path",
            hint="use {partition}, {start:%Y-%m-%d} or {end:%Y-%m-%d}",
        ) from None
    return workload.resolve_path(filled)


def open_source(workload: Workload, window: Interval, partition: str | None) -> SourcePort:
    """Open the workload's source for one operation."""
    source = workload.source
    path = source_path(workload, window, partition)
    if isinstance(source, CsvSourceConfig):
        from dpone.adapters.sources.csv import CsvSource

        return cast(SourcePort, CsvSource(path, columns=source.columns, delimiter=source.delimiter))
    from dpone.adapters.sources.jsonl import JsonlSource

    return cast(SourcePort, JsonlSource(path, columns=source.columns))


def build_route(
    workload: Workload, *, environ: Mapping[str, str] | None = None, read_only: bool = False
) -> Route:
    """Open the workload's journal and connector; detect atomic mode."""
    env = os.environ if environ is None else environ
    journal = open_journal(
        workload.journal_url(dict(env)),
        base_dir=workload.base_dir,
        schema=workload.journal_schema,
        read_only=read_only,
    )
    try:
        connector = _open_connector(workload, env)
    except BaseException:
        journal.close()
        raise
    atomic: TransactionalJournalPort | None = None
    shares = getattr(journal, "shares_database_with", None)
    if shares is not None and shares(connector.database_locator()):
        atomic = cast(TransactionalJournalPort, journal)
    return Route(
        journal=journal,
        connector=connector,
        atomic=atomic,
        auto_recover=_certified(workload, connector) if workload.require_certified else True,
    )


def _certified(workload: Workload, connector: TargetConnectorPort) -> bool:
    """True when valid evidence certifies this connector on this target database."""
    directory = (
        workload.resolve_path(workload.certification_dir)
        if workload.certification_dir
        else workload.base_dir / EVIDENCE_DIR
    )
    evidence = load_valid_evidence(
        directory,
        connector=connector.kind,
        capability=connector.capability.value,
        database=connector.database_locator(),
    )
    return evidence is not None


def _pack_fingerprint(workload: Workload, target_identity: str) -> str:
    source = workload.source.model_dump(mode="json", exclude={"path"})
    target = {"kind": workload.target.kind, "identity": target_identity}
    return digest_of(
        {
            "workload": workload.workload,
            "release": workload.release,
            "deployment": workload.deployment,
            "source": source,
            "target": target,
            "load": workload.load.model_dump(mode="json", exclude={"batch_size"}),
        }
    )


def plan_operation(
    workload: Workload,
    route: Route,
    source: SourcePort,
    *,
    interval: Interval,
    partition: str | None = None,
    context: RunContext | None = None,
) -> OperationSpec:
    """Derive identity and intent, and build the load plan, for one operation."""
    ctx = context or RunContext()
    window = interval
    target_identity = route.connector.target_identity()
    operation_id = derive_operation_id(
        release_id=workload.release,
        deployment_id=workload.deployment,
        dag_id=ctx.dag_id,
        dag_run_logical_identity=ctx.dag_run_logical_identity,
        workload_id=workload.workload,
        mapped_partition_identity=partition or "-",
        canonical_interval=window,
        canonical_target_identity=target_identity,
    )
    columns: tuple[Column, ...] = source.columns()
    load = workload.load
    names = {c.name for c in columns}
    for needed, what in [(k, "load.key") for k in load.key] + (
        [(load.interval_column, "load.interval_column")] if load.interval_column else []
    ):
        if needed not in names:
            raise ConfigInvalid(
                f"{what} names column {needed!r}, which the source does not have",
                field=what,
                hint=f"source columns are: {', '.join(c.name for c in columns)}",
            )
    table = getattr(workload.target, "table", "-")
    plan = LoadPlan(
        table=table,
        strategy=load.strategy,
        columns=columns,
        key=tuple(load.key),
        interval_column=load.interval_column,
        interval=window,
    )
    source_identity = source.snapshot_identity()
    pack = _pack_fingerprint(workload, target_identity)
    keys = ",".join(load.key)
    strategy = f"{load.strategy.value}|key={keys}|interval_column={load.interval_column or ''}"
    intent_digest = derive_intent_digest(
        pack_fingerprint=pack,
        normalized_load_strategy=strategy,
        source_snapshot_identity=source_identity,
        target_contract=f"{route.connector.kind}|{table}|{route.connector.capability.value}",
        schema_fingerprint=digest_of({"columns": [[c.name, c.type.value] for c in columns]}),
    )
    metadata = {
        "workload_id": workload.workload,
        "release_id": workload.release,
        "deployment_id": workload.deployment,
        "dag_id": ctx.dag_id,
        "dag_run": ctx.dag_run_logical_identity,
        "partition": partition or "-",
        "interval": window.canonical(),
        "target_identity": target_identity,
        "target_kind": route.connector.kind,
        "capability": route.connector.capability.value,
        "table": table,
        "strategy": load.strategy.value,
        "source_kind": source.kind,
        "source_identity": source_identity,
        "pack_fingerprint": pack,
        "dpone_version": dpone.__version__,
    }
    return OperationSpec(
        operation_id=operation_id,
        intent_digest=intent_digest,
        metadata=metadata,
        plan=plan,
        source_identity=source_identity,
        batch_size=load.batch_size,
        lease_ttl_seconds=workload.lease_ttl_seconds,
    )
