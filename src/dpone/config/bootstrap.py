"""Composition root: workload + environment -> journal, connector, source, identity.

The only module that reads the environment and picks adapters; adapters are imported
lazily so that ``import dpone`` stays light.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import msgspec

import dpone
from dpone.contracts.audit import Audits, CustomAudit
from dpone.contracts.checkpoint import CheckpointAdvance, from_micros, stream_id, to_micros
from dpone.contracts.evidence import SafeMapping
from dpone.contracts.fence import FenceCapability
from dpone.contracts.identity import (
    CLI_DAG_ID,
    Interval,
    derive_intent_digest,
    derive_operation_id,
    digest_of,
)
from dpone.contracts.load import Column, LoadPlan
from dpone.contracts.run import (
    AccessContext,
    AirflowProvenance,
    ApiProvenance,
    CliProvenance,
    Provenance,
)
from dpone.errors import ConfigInvalid
from dpone.ports.checkpoint import CheckpointStorePort
from dpone.ports.connector import TargetConnectorPort
from dpone.ports.journal import CommitJournalPort, TransactionalJournalPort
from dpone.ports.ledger import RunLedgerPort
from dpone.ports.source import SourcePort
from dpone.runtime import failpoints
from dpone.runtime.commit_protocol import OperationSpec
from dpone.runtime.retry import RetryPolicy
from dpone.runtime.run import RunRequest

from .evidence import EVIDENCE_DIR, load_valid_evidence
from .workload import (
    CONNECTOR_GROUP,
    CsvSourceConfig,
    DuckDbTargetConfig,
    JsonlAppendTargetConfig,
    JsonlSourceConfig,
    MariaDbTableSourceConfig,
    MariaDbTargetConfig,
    ParquetSourceConfig,
    PluginTargetConfig,
    PostgresTableSourceConfig,
    PostgresTargetConfig,
    PublicationTargetConfig,
    RestTargetConfig,
    SqliteTableSourceConfig,
    SqliteTargetConfig,
    SqlSourceConfig,
    Workload,
    resolve_file_url,
    resolve_sqlite_url,
    to_json_dict,
)

__all__ = [
    "Route",
    "RunContext",
    "api_provenance",
    "build_route",
    "checkpoint_advance",
    "configure_failpoints",
    "ledger_of",
    "next_interval",
    "next_interval_for",
    "open_journal",
    "open_source",
    "plan_operation",
    "retry_policy",
    "run_request",
]


class RunContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who asks for the run, by logical identity only (never a try number or host).

    Outside Airflow both DAG fields are ``"-"``; the Airflow operator fills them from the
    DAG id and the DAG run's logical date / run id.
    """

    dag_id: str = CLI_DAG_ID
    dag_run_logical_identity: str = CLI_DAG_ID


class Route(msgspec.Struct):
    """The wired adapters of one workload; close it when done."""

    journal: CommitJournalPort
    connector: TargetConnectorPort
    atomic: TransactionalJournalPort | None = None
    #: False when policy requires certification and this route has no valid evidence
    auto_recover: bool = True
    closed: bool = False

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
    pooled: bool = True,
) -> CommitJournalPort:
    """Open the journal a URL names: ``sqlite:///path``, ``postgresql://…`` or ``memory://``.

    ``read_only`` is for commands that only look (list, history, inspect, plan): they
    never create, convert or migrate a journal. ``pooled=False`` is for a process that
    runs one operation: a PostgreSQL journal then keeps one session, no pool.
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
            postgres.PostgresCommitJournal(url, schema=schema, read_only=read_only, pooled=pooled),
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
    if isinstance(target, RestTargetConfig):
        raise ConfigInvalid(
            "a REST delivery workload has a receiver, not a target connector",
            field="target.kind",
            hint="use `dpone run WORKLOAD` or Runner.deliver()",
        )
    if isinstance(target, PublicationTargetConfig):
        raise ConfigInvalid(
            "a publication workload has one writer per partition, not one target connector",
            field="target.kind",
            hint="use `dpone run WORKLOAD --interval ...` or `dpone publication write|publish`",
        )
    raise ConfigInvalid("unknown target kind", field="target.kind")  # pragma: no cover


def source_path(workload: Workload, window: Interval, partition: str | None) -> Path:
    """Resolve the source path, filling ``{partition}``, ``{start:FMT}`` and ``{end:FMT}``."""
    if not isinstance(workload.source, CsvSourceConfig | JsonlSourceConfig | ParquetSourceConfig):
        raise ConfigInvalid("this source has no path", field="source")
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
    if not filled.startswith(("~", "/")) and ".." not in filled:
        # the common case, a file under the workload's directory: the directory is
        # resolved once per workload, not once per operation (resolving walks every path
        # component), and the path is parsed once
        anchor = _anchor(workload)
        if anchor is not None:
            return Path(f"{anchor}/{filled}")
    path = Path(filled).expanduser()
    if path.is_absolute() or ".." in path.parts or not workload.base_dir.is_absolute():
        return workload.resolve_path(filled)
    return workload.base_dir.resolve() / path


#: (id of a workload) -> (that workload, its resolved base directory, None when the
#: base directory is relative); see source_path
_ANCHORS: dict[int, tuple[Workload, str | None]] = {}


def _anchor(workload: Workload) -> str | None:
    hit = _ANCHORS.get(id(workload))
    if hit is not None and hit[0] is workload:
        return hit[1]
    # without a trailing slash, so that the root directory does not give "//file"
    anchor = (
        str(workload.base_dir.resolve()).rstrip("/") if workload.base_dir.is_absolute() else None
    )
    if len(_ANCHORS) >= 64:
        _ANCHORS.clear()
    _ANCHORS[id(workload)] = (workload, anchor)
    return anchor


def open_source(workload: Workload, window: Interval, partition: str | None) -> SourcePort:
    """Open the workload's source for one operation."""
    source = workload.source
    if isinstance(
        source, PostgresTableSourceConfig | MariaDbTableSourceConfig | SqliteTableSourceConfig
    ):
        return _sql_source(workload, source, window)
    path = source_path(workload, window, partition)
    if isinstance(source, ParquetSourceConfig):
        from dpone.adapters.sources.parquet import ParquetSource

        return cast(SourcePort, ParquetSource(path, columns=source.columns))
    if isinstance(source, CsvSourceConfig):
        from dpone.adapters.sources.csv import CsvSource

        return cast(SourcePort, CsvSource(path, columns=source.columns, delimiter=source.delimiter))
    from dpone.adapters.sources.jsonl import JsonlSource

    return cast(SourcePort, JsonlSource(path, columns=source.columns))


def _sql_source(workload: Workload, source: SqlSourceConfig, window: Interval) -> SourcePort:
    """An incremental SQL table source reading ``[window.start, window.end)`` (the cut)."""
    url: str | Path = workload.source_url()
    if isinstance(source, SqliteTableSourceConfig):
        field_name = "source.url" if source.url is not None else "source.url_env"
        url = resolve_sqlite_url(str(url), base_dir=workload.base_dir, field=field_name)
    else:
        extra = "postgres" if isinstance(source, PostgresTableSourceConfig) else "mysql"
        driver = "psycopg" if extra == "postgres" else "pymysql"
        _require_driver(driver, extra=extra)
    from dpone.adapters.sources.sql import SqlTableSource

    return cast(
        SourcePort,
        SqlTableSource(
            source.kind,
            url=url,
            table=source.table,
            cursor_column=source.cursor_column,
            interval=window,
            columns=source.columns,
        ),
    )


def _require_driver(module: str, *, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigInvalid(
            f"this source needs the {extra} extra",
            field="source",
            hint=f"pip install 'dpone[{extra}]'",
        )


def _stream(workload: Workload, route: Route, partition: str | None) -> tuple[str, str, str]:
    """Return (stream id, partition label, target identity) of the workload's stream."""
    return _stream_of(workload, route.connector.target_identity(), partition)


def _stream_of(
    workload: Workload, target_identity: str, partition: str | None
) -> tuple[str, str, str]:
    label = partition or "-"
    return (
        stream_id(
            workload_id=workload.workload,
            deployment_id=workload.deployment,
            partition=label,
            target_identity=target_identity,
        ),
        label,
        target_identity,
    )


def next_interval(workload: Workload, route: Route, *, partition: str | None = None) -> Interval:
    """Return the next interval of an incremental workload, from its checkpoint.

    ``[watermark, journal now - lag)``, at most ``max_interval_seconds`` long. The choice
    is recorded in the journal (the stream's claim) and returned unchanged to every
    later call until that interval is COMPLETE, so a retry after a crash loads exactly
    the same interval, never a longer one.

    Raises:
        ConfigInvalid: the workload has no ``incremental`` block, or nothing is due yet.
    """
    return next_interval_for(
        workload, route.journal, route.connector.target_identity(), partition=partition
    )


def next_interval_for(
    workload: Workload, journal: CommitJournalPort, target_identity: str, *, partition: str | None
) -> Interval:
    """:func:`next_interval` for a target named by its identity (a REST receiver, too)."""
    incremental = workload.incremental
    if incremental is None:
        raise ConfigInvalid(
            "no interval given and the workload is not incremental",
            field="interval",
            hint="pass --interval START/END, or add an incremental: block with a start",
        )
    store = _checkpoint_store(journal)
    stream, label, target_identity = _stream_of(workload, target_identity, partition)
    origin = to_micros(incremental.start)
    now = int(journal.now()) - math.ceil(incremental.lag_seconds)  # whole seconds
    proposed = now * 1_000_000
    current = store.get_checkpoint(stream)
    watermark = current.watermark if current is not None else origin
    if incremental.max_interval_seconds is not None:
        proposed = min(proposed, watermark + int(incremental.max_interval_seconds * 1_000_000))
    chosen = store.claim_interval(
        stream_id=stream,
        workload_id=workload.workload,
        partition=label,
        target_identity=target_identity,
        origin=origin,
        proposed_end=proposed,
    )
    if chosen is None:
        raise ConfigInvalid(
            f"nothing to load yet: the checkpoint is at {_moment(watermark)}, and the "
            f"next interval may end no later than now - lag ({_moment(proposed)})",
            field="interval",
            hint="run again later, or pass an explicit --interval",
        )
    return Interval(start=from_micros(chosen[0]), end=from_micros(chosen[1]))


def _moment(micros: int) -> str:
    return from_micros(micros).isoformat()


def _checkpoint_store(journal: object) -> CheckpointStorePort:
    require_methods(
        journal,
        ("claim_interval",),
        "this journal cannot store checkpoints, which incremental workloads need",
        hint="use the SQLite or PostgreSQL journal",
    )
    return cast(CheckpointStorePort, journal)


def require_methods(journal: object, methods: tuple[str, ...], message: str, *, hint: str) -> None:
    """Refuse a journal that lacks one of ``methods`` (a capability its caller needs).

    Raises:
        ConfigInvalid: a method is missing, with ``message`` and ``hint`` (field journal).
    """
    if not all(callable(getattr(journal, name, None)) for name in methods):
        raise ConfigInvalid(message, field="journal", hint=hint)


def build_route(
    workload: Workload,
    *,
    environ: Mapping[str, str] | None = None,
    read_only: bool = False,
    pooled: bool = True,
) -> Route:
    """Open the workload's journal and connector; detect atomic mode.

    ``pooled=False``: the route serves one operation (see :func:`open_journal`).
    """
    env = os.environ if environ is None else environ
    journal = open_journal(
        workload.journal_url(dict(env)),
        base_dir=workload.base_dir,
        schema=workload.journal_schema,
        read_only=read_only,
        pooled=pooled,
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


def pack_fingerprint(workload: Workload, target_identity: str) -> str:
    """The workload definition's fingerprint (no paths, URLs or secrets): intent and run pin."""
    return _pack_fingerprint(workload, target_identity)


#: (id of a workload, target identity) -> (that workload, its pack fingerprint): a Runner
#: derives every operation from one frozen workload, so its definition is digested once.
_PACKS: dict[tuple[int, str], tuple[Workload, str]] = {}


def _pack_fingerprint(workload: Workload, target_identity: str) -> str:
    key = (id(workload), target_identity)
    hit = _PACKS.get(key)
    if hit is not None and hit[0] is workload:
        return hit[1]
    pack = _pack_digest(workload, target_identity)
    if len(_PACKS) >= 64:
        _PACKS.clear()
    _PACKS[key] = (workload, pack)
    return pack


def _pack_digest(workload: Workload, target_identity: str) -> str:
    return digest_of(_pack_fields(workload, target_identity))


def _pack_fields(workload: Workload, target_identity: str) -> dict[str, object]:
    """What the pack fingerprint digests (pinned by tests/unit/test_identity_pins.py)."""
    # paths and URLs are not the definition (a moved file or a rotated password is not
    # another load); the source snapshot identity names what is read
    source = to_json_dict(workload.source, exclude={"path", "url", "url_env"})
    target = {"kind": workload.target.kind, "identity": target_identity}
    return {
        "workload": workload.workload,
        "release": workload.release,
        "deployment": workload.deployment,
        "source": source,
        "target": target,
        "load": to_json_dict(workload.load, exclude={"batch_size"}),
    }


def workload_operation_id(
    workload: Workload,
    ctx: RunContext,
    *,
    partition: str | None,
    window: Interval,
    target_identity: str,
) -> str:
    """The operation id of ``workload`` over ``window`` into ``target_identity``.

    One identity builder for relational runs and REST deliveries (docs/identity.md).
    """
    return derive_operation_id(
        release_id=workload.release,
        deployment_id=workload.deployment,
        dag_id=ctx.dag_id,
        dag_run_logical_identity=ctx.dag_run_logical_identity,
        workload_id=workload.workload,
        mapped_partition_identity=partition or "-",
        canonical_interval=window,
        canonical_target_identity=target_identity,
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
    fixed = _fixed(workload, route)
    target_identity = fixed.target_identity
    operation_id = workload_operation_id(
        workload, ctx, partition=partition, window=window, target_identity=target_identity
    )
    columns: tuple[Column, ...] = source.columns()
    schema_fingerprint = fixed.schema_fingerprint(columns)
    load = workload.load
    plan = LoadPlan(
        table=fixed.table,
        strategy=load.strategy,
        columns=columns,
        key=fixed.key,
        interval_column=load.interval_column,
        interval=window,
        audits=fixed.audits,
    )
    source_identity = source.snapshot_identity()
    intent_digest = derive_intent_digest(
        pack_fingerprint=fixed.pack,
        normalized_load_strategy=fixed.strategy,
        source_snapshot_identity=source_identity,
        target_contract=fixed.target_contract,
        schema_fingerprint=schema_fingerprint,
    )
    metadata = {
        **fixed.metadata,
        "dag_id": ctx.dag_id,
        "dag_run": ctx.dag_run_logical_identity,
        "partition": partition or "-",
        "interval": window.canonical(),
        "source_kind": source.kind,
        "source_identity": source_identity,
    }
    return OperationSpec(
        operation_id=operation_id,
        intent_digest=intent_digest,
        metadata=metadata,
        plan=plan,
        source_identity=source_identity,
        batch_size=load.batch_size,
        lease_ttl_seconds=workload.lease_ttl_seconds,
        checkpoint=checkpoint_advance(workload, target_identity, partition, window),
    )


class _Fixed:
    """What ``plan_operation`` derives from the workload and the route alone.

    A Runner plans every operation from one frozen workload over one connector, so these
    are computed once (``_fixed``), not once per operation; the schema fingerprint is
    kept for the last column set seen (a source's columns rarely change between runs).
    """

    __slots__ = (
        "_last",
        "audits",
        "connector",
        "key",
        "metadata",
        "pack",
        "strategy",
        "table",
        "target_contract",
        "target_identity",
        "workload",
    )

    def __init__(self, workload: Workload, route: Route) -> None:
        connector = route.connector
        load = workload.load
        self.workload = workload
        self.connector = connector
        self.target_identity = connector.target_identity()
        self.table: str = getattr(workload.target, "table", "-")
        self.key = tuple(load.key)
        self.audits = _audits(workload)
        self.pack = _pack_fingerprint(workload, self.target_identity)
        keys = ",".join(load.key)
        self.strategy = (
            f"{load.strategy.value}|key={keys}|interval_column={load.interval_column or ''}"
        )
        capability = connector.capability.value
        self.target_contract = f"{connector.kind}|{self.table}|{capability}"
        # metadata keys in the order the record always had (the rest is per operation)
        self.metadata: dict[str, object] = {
            "workload_id": workload.workload,
            "release_id": workload.release,
            "deployment_id": workload.deployment,
            "dag_id": None,
            "dag_run": None,
            "partition": None,
            "interval": None,
            "target_identity": self.target_identity,
            "target_kind": connector.kind,
            "capability": capability,
            "table": self.table,
            "strategy": load.strategy.value,
            "source_kind": None,
            "source_identity": None,
            "pack_fingerprint": self.pack,
            "dpone_version": dpone.__version__,
        }
        self._last: tuple[tuple[Column, ...], str] | None = None  # columns, fingerprint

    def schema_fingerprint(self, columns: tuple[Column, ...]) -> str:
        """The columns' fingerprint, after checking the load's key columns are there."""
        last = self._last  # one reference: threads of one Runner may plan at once
        if last is not None and (columns is last[0] or columns == last[0]):
            return last[1]
        load = self.workload.load
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
        schema = digest_of({"columns": [[c.name, c.type.value] for c in columns]})
        self._last = (columns, schema)
        return schema


#: (id of a workload, id of a connector) -> their ``_Fixed``; see ``_Fixed``
_FIXED: dict[tuple[int, int], _Fixed] = {}


def _fixed(workload: Workload, route: Route) -> _Fixed:
    key = (id(workload), id(route.connector))
    hit = _FIXED.get(key)
    if hit is not None and hit.workload is workload and hit.connector is route.connector:
        return hit
    fixed = _Fixed(workload, route)
    if len(_FIXED) >= 64:
        _FIXED.clear()
    _FIXED[key] = fixed
    return fixed


def checkpoint_advance(
    workload: Workload, target_identity: str, partition: str | None, window: Interval
) -> CheckpointAdvance | None:
    """What completing ``window`` promotes in the stream of ``target_identity`` (or None)."""
    if workload.incremental is None:
        return None
    stream, label, target_identity = _stream_of(workload, target_identity, partition)
    return CheckpointAdvance.of(
        stream=stream,
        workload_id=workload.workload,
        partition=label,
        target_identity=target_identity,
        origin=workload.incremental.start,
        interval=window,
    )


def _audits(workload: Workload) -> Audits | None:
    """The workload's audits as a contract (not part of the intent: they publish or not)."""
    config = workload.audits
    if config is None:
        return None
    return Audits(
        min_rows=config.min_rows,
        max_rows=config.max_rows,
        not_null=tuple(config.not_null),
        unique_key=tuple(config.unique_key),
        custom=tuple(CustomAudit(name=a.name, query=a.query) for a in config.sql),
    )


# ---------------------------------------------------------------------- runs
_LEDGER_METHODS = ("begin_run", "get_run", "list_runs", "attempts", "begin_attempt", "end_attempt")


def ledger_of(journal: CommitJournalPort) -> RunLedgerPort:
    """Return the run ledger kept in ``journal``'s store (every dpone journal keeps one)."""
    require_methods(
        journal,
        _LEDGER_METHODS,
        "this journal keeps no run ledger",
        hint="use a sqlite://, postgresql:// or memory:// journal",
    )
    return cast(RunLedgerPort, journal)


def retry_policy(workload: Workload) -> RetryPolicy:
    """The workload's ``retry:`` block as the runtime's policy (one try when absent)."""
    r = workload.retry
    return RetryPolicy(
        attempts=r.attempts,
        budget_seconds=r.budget_seconds,
        wait_initial_seconds=r.wait_initial_seconds,
        wait_max_seconds=r.wait_max_seconds,
        wait_jitter_seconds=r.wait_jitter_seconds,
        wait_exp_base=r.wait_exp_base,
    )


def _principal(provenance: Provenance, env: Mapping[str, str]) -> str:
    if env.get("DPONE_PRINCIPAL"):
        return env["DPONE_PRINCIPAL"]
    if isinstance(provenance, CliProvenance):
        return provenance.user
    if isinstance(provenance, AirflowProvenance):
        return f"airflow:{provenance.dag_id}"
    return provenance.caller


def _connection_names(workload: Workload, route: Route, env: Mapping[str, str]) -> tuple[str, ...]:
    """Name each connection by the variable it came from, else by its credential-free locator."""
    return connection_names(workload, route.journal, route.connector.target_identity(), env)


def connection_names(
    workload: Workload, journal: object, target_identity: str, env: Mapping[str, str]
) -> tuple[str, str]:
    """``(journal, target)`` named by the variable each came from, else by its locator.

    The access record's connections (no credentials): a journal without a ``locator``
    is named by its type.
    """
    if workload.journal_env is not None:
        journal_name = f"journal=env:{workload.journal_env}"
    elif workload.journal is None and env.get("DPONE_JOURNAL"):
        journal_name = "journal=env:DPONE_JOURNAL"
    else:
        journal_name = f"journal={getattr(journal, 'locator', type(journal).__name__)}"
    url_env = getattr(workload.target, "url_env", None)
    target_name = f"target=env:{url_env}" if url_env else f"target={target_identity}"
    return (journal_name, target_name)


def request_digest(
    *,
    operation_id: str,
    workload_id: str,
    interval: str,
    partition: str,
    dag_id: str,
    dag_run: str,
) -> str:
    """The run's request hash: what was asked for (operation, workload, window, DAG run)."""
    return digest_of(
        {
            "operation_id": operation_id,
            "workload_id": workload_id,
            "interval": interval,
            "partition": partition,
            "dag_id": dag_id,
            "dag_run": dag_run,
        }
    )


def run_request(
    workload: Workload,
    route: Route,
    spec: OperationSpec,
    *,
    provenance: Provenance,
    idempotency_key: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RunRequest:
    """Describe the run of ``spec``: request and definition hashes, provenance, access."""
    env = os.environ if environ is None else environ
    meta = spec.metadata
    request_hash = request_digest(
        operation_id=spec.operation_id,
        workload_id=str(meta.get("workload_id", "")),
        interval=str(meta.get("interval", "")),
        partition=str(meta.get("partition", "")),
        dag_id=str(meta.get("dag_id", "")),
        dag_run=str(meta.get("dag_run", "")),
    )
    return RunRequest(
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        definition_hash=str(meta["pack_fingerprint"]),
        provenance=_provenance_record(provenance),
        access=_access_context(
            _principal(provenance, env), _connection_names(workload, route, env)
        ),
    )


@functools.lru_cache(maxsize=64)
def _provenance_record(provenance: Provenance) -> SafeMapping:
    # a Runner's operations share one provenance (frozen); its record (read-only, and
    # checked for secrets once) is the same for each of them
    return provenance.record()


@functools.lru_cache(maxsize=64)
def _access_context(principal: str, connections: tuple[str, ...]) -> AccessContext:
    # frozen, and checked for secrets as it is made: one per principal and connections
    return AccessContext(principal=principal, connections=connections)


def api_provenance(caller: str = "python-api") -> ApiProvenance:
    """The provenance of a library call that gave none: the caller label and the host."""
    import socket

    return ApiProvenance(caller=caller, host=socket.gethostname())
