"""Composition of a publication workload: store, format, journal, writers and the service.

Each partition is its own operation through the commit protocol (capability
``staging_generation``); reconcile / publish / read / cleanup are the publication service.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import cast

import msgspec

from dpone.contracts.identity import Interval, digest_of, parse_interval
from dpone.contracts.load import Column
from dpone.contracts.publication import (
    Manifest,
    PartitionLayout,
    derive_generation,
    interval_key,
)
from dpone.contracts.result import OperationResult
from dpone.errors import ConfigInvalid, IntentConflict
from dpone.ports.journal import CommitJournalPort
from dpone.ports.object_store import ObjectStorePort
from dpone.ports.source import SourcePort
from dpone.publication.service import (
    Audits,
    CleanupReport,
    CurrentView,
    PublicationService,
    PublicationSpec,
    PublishResult,
    unresolved_targets,
)
from dpone.runtime.commit_protocol import CommitProtocol
from dpone.runtime.executor import new_owner

from .bootstrap import (
    Route,
    RunContext,
    configure_failpoints,
    open_journal,
    open_source,
    plan_operation,
)
from .workload import (
    LocalStoreConfig,
    PublicationConfig,
    S3StoreConfig,
    Workload,
    load_workload,
    shown_variable,
    to_json_dict,
)

__all__ = ["Publication", "open_store"]

_BACKFILL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PARTITION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_=-]{0,127}")


def open_store(
    config: LocalStoreConfig | S3StoreConfig, *, base_dir: Path, environ: Mapping[str, str]
) -> ObjectStorePort:
    """Open the object store a publication names; S3 credentials come from the environment."""
    if isinstance(config, LocalStoreConfig):
        from dpone.adapters.objectstores.local import LocalObjectStore

        path = Path(config.path).expanduser()
        return LocalObjectStore(path if path.is_absolute() else base_dir / path)
    try:
        from dpone.adapters.objectstores.s3 import S3ObjectStore
    except ImportError:
        raise ConfigInvalid(
            "an s3 store needs the s3 extra",
            field="publication.store",
            hint="pip install 'dpone[s3]'",
        ) from None

    def env(name: str | None, what: str) -> str | None:
        if name is None:
            return None
        value = environ.get(name)
        if not value:
            raise ConfigInvalid(
                f"publication.store.{what} names {shown_variable(name)}, which is not set",
                field=f"publication.store.{what}",
                hint=f"export {shown_variable(name, 'NAME')}=...",
            )
        return value

    endpoint = config.endpoint or env(config.endpoint_env, "endpoint_env")
    return cast(
        ObjectStorePort,
        S3ObjectStore(
            bucket=config.bucket,
            prefix=config.prefix,
            endpoint=endpoint,
            region=config.region,
            access_key_id=env(config.access_key_id_env, "access_key_id_env"),
            secret_access_key=env(config.secret_access_key_env, "secret_access_key_env"),
        ),
    )


def _interval(config: PublicationConfig, given: str | Interval | None) -> Interval:
    window = parse_interval(given) if isinstance(given, str) else given
    pinned = parse_interval(config.interval) if config.interval else None
    if window is None and pinned is None:
        raise ConfigInvalid(
            "this publication has no fixed interval",
            field="publication.interval",
            hint="pass --interval START/END or set publication.interval",
        )
    if window is not None and pinned is not None and window != pinned:
        raise ConfigInvalid(
            f"--interval {window.canonical()} differs from the workload's fixed "
            f"publication.interval {pinned.canonical()}",
            field="publication.interval",
            hint="omit --interval, or use the workload's interval",
        )
    return cast(Interval, window or pinned)


def _partitions(workload: Workload, config: PublicationConfig, window: Interval) -> tuple[str, ...]:
    if config.partitions is not None:
        return tuple(config.partitions)
    raw = getattr(workload.source, "path", None)
    if not isinstance(raw, str):
        raise ConfigInvalid(
            "a publication derives its partitions from source files",
            field="source.path",
            hint="use a file source (csv, jsonl) with {partition} in its path, "
            "or list publication.partitions",
        )
    pattern = str(
        workload.resolve_path(raw.format(partition="*", start=window.start, end=window.end))
    )
    shape = re.compile(re.escape(pattern).replace(r"\*", "([^/]+)"))
    found = []
    for match in sorted(glob.glob(pattern)):
        matched = shape.fullmatch(match)
        if matched is not None:
            if not _PARTITION_NAME.fullmatch(matched.group(1)):
                raise ConfigInvalid(
                    f"source file {match} gives partition name {matched.group(1)!r}, which is "
                    "not letters, digits, '_', '=' or '-'",
                    field="publication.partitions_from_source",
                    hint="rename the file or list publication.partitions explicitly",
                )
            found.append(matched.group(1))
    if not found:
        raise ConfigInvalid(
            "partitions_from_source found no source files",
            field="publication.partitions_from_source",
            hint=f"check source.path; it matched nothing as {pattern}",
        )
    return tuple(found)


def _publication_fields(config: PublicationConfig) -> dict[str, object]:
    """The publication section in an operation's intent (pinned by test_identity_pins.py)."""
    return to_json_dict(config, exclude={"audits", "retention_hours", "interval"})


def _check_backfill(backfill: str | None) -> str | None:
    if backfill is not None and not _BACKFILL_RE.fullmatch(backfill):
        raise ConfigInvalid(
            f"backfill label {backfill!r} must be letters, digits, '.', '_' or '-'",
            field="backfill",
            hint="e.g. --backfill 2026-11-30-fix",
        )
    return backfill


class _HashedSource:
    """A source whose snapshot identity is computed once (the manifest and the plan share it).

    ``batches`` still checks the content it reads against that identity.
    """

    def __init__(self, source: SourcePort) -> None:
        self._source = source
        self._identity: str | None = None

    @property
    def kind(self) -> str:
        return self._source.kind

    def snapshot_identity(self) -> str:
        if self._identity is None:
            self._identity = self._source.snapshot_identity()
        return self._identity

    def columns(self) -> tuple[Column, ...]:
        return self._source.columns()

    def batches(
        self, *, batch_size: int, expected_identity: str
    ) -> Iterator[list[tuple[object, ...]]]:
        return self._source.batches(batch_size=batch_size, expected_identity=expected_identity)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Opened:
    store: ObjectStorePort
    journal: CommitJournalPort


class Publication:
    """One publication workload for one interval, with its store and journal open.

    Args:
        workload: the workload file (or loaded workload); it must have ``publication``.
        interval: ``START/END``; optional when the workload fixes ``publication.interval``.
        environ: environment for ``*_env`` references (default ``os.environ``).
    """

    def __init__(
        self,
        workload: Workload | str | Path,
        *,
        interval: str | Interval | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        from dpone.adapters.objectstores.formats import open_format

        env = os.environ if environ is None else environ
        self.workload = workload if isinstance(workload, Workload) else load_workload(workload)
        config = self.workload.publication
        if config is None:
            raise ConfigInvalid(
                "this workload has no publication: section",
                field="publication",
                hint="see docs/publication.md for a publication workload",
            )
        configure_failpoints(env)
        self.config = config
        self.interval = _interval(config, interval)
        self.spec = PublicationSpec(
            dataset=config.dataset,
            interval=self.interval,
            partitions=_partitions(self.workload, config, self.interval),
            fmt=config.format,
            audits=Audits(min_rows=config.audits.min_rows, not_null=tuple(config.audits.not_null)),
        )
        self.format = open_format(config.format)
        store = open_store(config.store, base_dir=self.workload.base_dir, environ=env)
        try:
            journal = open_journal(
                self.workload.journal_url(dict(env)),
                base_dir=self.workload.base_dir,
                schema=self.workload.journal_schema,
            )
        except BaseException:
            store.close()
            raise
        self._opened = _Opened(store=store, journal=journal)
        self.service = PublicationService(store=store, table_format=self.format)

    @property
    def store(self) -> ObjectStorePort:
        """The object store."""
        return self._opened.store

    @property
    def journal(self) -> CommitJournalPort:
        """The operation journal."""
        return self._opened.journal

    def layout(self, backfill: str | None = None) -> PartitionLayout:
        """The generation of this interval (a backfill label gives another one)."""
        generation = derive_generation(
            dataset=self.spec.dataset, interval=self.interval, backfill=_check_backfill(backfill)
        )
        return PartitionLayout(
            dataset=self.spec.dataset,
            interval=interval_key(self.interval),
            generation=generation,
            fmt=self.spec.fmt,
        )

    # ------------------------------------------------------------------ write
    def write(
        self,
        *,
        backfill: str | None = None,
        partitions: Sequence[str] | None = None,
        context: RunContext | None = None,
    ) -> list[OperationResult]:
        """Write partitions (default: all expected), each as its own operation.

        The source manifest of the whole generation is pinned (or checked) first: a
        source that changed since the generation started is refused before any write.
        """
        wanted = tuple(partitions) if partitions else self.spec.partitions
        unknown = sorted(set(wanted) - set(self.spec.partitions))
        if unknown:
            raise ConfigInvalid(
                f"partition(s) {', '.join(unknown)} are not in the expected set",
                field="partition",
                hint=f"expected: {', '.join(self.spec.partitions)}",
            )
        layout = self.layout(backfill)
        sources = {
            p: _HashedSource(open_source(self.workload, self.interval, p))
            for p in self.spec.partitions
        }
        identities = {p: s.snapshot_identity() for p, s in sources.items()}
        self._check_pinned(identities)
        manifest = self.service.pin_source_manifest(layout, identities)
        return [self._write_one(layout, p, sources[p], manifest, context) for p in wanted]

    def _check_pinned(self, identities: Mapping[str, str]) -> None:
        """Compare the sources with the workload's ``source_hashes``, if it pins them."""
        pinned = self.config.source_hashes
        if pinned is None:
            return
        unknown = sorted(set(identities) - set(pinned))
        if unknown:
            raise ConfigInvalid(
                f"publication.source_hashes lacks partition(s) {', '.join(unknown)}",
                field="publication.source_hashes",
                hint="pin every expected partition's source hash, or remove source_hashes",
            )
        changed = sorted(p for p, identity in identities.items() if pinned[p] != identity)
        if changed:
            raise IntentConflict(
                f"source file(s) of partition(s) {', '.join(changed)} differ from the hashes "
                "pinned in publication.source_hashes; nothing was written",
                hint="restore the pinned files, or pin the new hashes (a new source cut: "
                "publish it as a backfill)",
            )

    def _write_one(
        self,
        layout: PartitionLayout,
        partition: str,
        source: SourcePort,
        source_manifest: str,
        context: RunContext | None,
    ) -> OperationResult:
        from dpone.adapters.connectors.staging import StagingPartitionConnector

        connector = StagingPartitionConnector(
            store=self.store,
            layout=layout,
            partition=partition,
            table_format=self.format,
            source_manifest=source_manifest,
        )
        src = source
        route = Route(journal=self.journal, connector=connector)
        spec = plan_operation(
            self.workload, route, src, interval=self.interval, partition=partition, context=context
        )
        spec = msgspec.structs.replace(
            spec,
            intent_digest=digest_of(
                {
                    "base": spec.intent_digest,
                    "publication": _publication_fields(self.config),
                    "manifest": source_manifest,
                }
            ),
        )
        protocol = CommitProtocol(
            journal=self.journal, connector=connector, source=src, owner=new_owner()
        )
        return protocol.run(spec)

    # ------------------------------------------------------------------ the rest
    def reconcile(self, *, backfill: str | None = None) -> Manifest:
        """Check the generation; see :meth:`PublicationService.reconcile`."""
        return self.service.reconcile(self.spec, self.layout(backfill))

    def publish(self, *, backfill: str | None = None) -> PublishResult:
        """Reconcile and publish; see :meth:`PublicationService.publish`."""
        return self.service.publish(self.spec, self.layout(backfill))

    def read(self) -> CurrentView | None:
        """The current generation's manifest, or None before the first publish."""
        return self.service.current(self.layout())

    def status(self, *, backfill: str | None = None) -> dict[str, object]:
        """Where the generation stands."""
        return self.service.status(self.spec, self.layout(backfill))

    def cleanup(
        self, *, older_than_hours: float | None = None, dry_run: bool = False
    ) -> CleanupReport:
        """Delete old staging generations of this interval that are safe to delete."""
        layout = self.layout()
        hours = self.config.retention_hours if older_than_hours is None else older_than_hours
        return self.service.cleanup(
            layout,
            older_than_seconds=hours * 3600.0,
            unresolved=unresolved_targets(self.journal),
            target_prefix=f"staging:{self.store.location()}/{layout.interval_prefix}/",
            dry_run=dry_run,
        )

    def run(
        self, *, backfill: str | None = None, context: RunContext | None = None
    ) -> tuple[list[OperationResult], PublishResult]:
        """The whole publication: every partition, then reconcile and publish."""
        results = self.write(backfill=backfill, context=context)
        return results, self.publish(backfill=backfill)

    def close(self) -> None:
        """Close the journal and the store. Idempotent."""
        self.journal.close()
        self.store.close()

    def __enter__(self) -> Publication:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
