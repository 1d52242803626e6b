"""Reconcile, publish, read and clean up partition publications (ARCHITECTURE section 13).

Readers resolve data only through ``current``; nothing here ever changes a generation
that ``current`` names. Publishing is two steps: write the generation's manifest (bytes
are deterministic, so a repeat writes the same), then move ``current`` with one
conditional put. Of two racing publishers exactly one conditional put succeeds.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from dpone.contracts.identity import Interval, canonical_json
from dpone.contracts.objects import StoredObject
from dpone.contracts.publication import (
    ChecksumRecord,
    CurrentPointer,
    Manifest,
    ManifestEntry,
    PartitionLayout,
    load_json,
)
from dpone.contracts.states import CommitState
from dpone.errors import (
    ConfigInvalid,
    DponeError,
    IntentConflict,
    PublicationRefused,
    PublishConflict,
)
from dpone.ports.journal import CommitJournalPort
from dpone.ports.object_store import ObjectStorePort
from dpone.ports.table_format import TableFormatPort
from dpone.runtime import failpoints

__all__ = [
    "Audits",
    "CleanupReport",
    "CurrentView",
    "PublicationService",
    "PublicationSpec",
    "PublishResult",
    "unresolved_targets",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Audits:
    """Checks every partition must pass before its generation may be published."""

    min_rows: int = 0
    not_null: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicationSpec:
    """One dataset x interval: the expected partitions and how to check them."""

    dataset: str
    interval: Interval
    partitions: tuple[str, ...]
    fmt: str
    audits: Audits = field(default_factory=Audits)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishResult:
    """What publish did: the generation now current, and whether it already was."""

    generation: str
    previous_generation: str | None
    partitions: int
    rows: int
    manifest_key: str
    already_current: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CurrentView:
    """What a reader sees: the current generation's manifest (files, checksums, rows)."""

    pointer: CurrentPointer
    manifest: Manifest


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanupReport:
    """Generations deleted, and those kept with the reason."""

    deleted: tuple[str, ...]
    kept: Mapping[str, str]
    objects_deleted: int


def unresolved_targets(journal: CommitJournalPort, *, limit: int = 10_000) -> list[str] | None:
    """Target identities of operations that are not COMPLETE (still to finish or recover).

    None when the journal holds ``limit`` or more of them: the list would be cut short, so
    an interval's recovery could be missed (cleanup then keeps everything).
    """
    open_states = frozenset(s for s in CommitState if s is not CommitState.COMPLETE)
    entries = journal.list_entries(states=open_states, limit=limit)
    if len(entries) >= limit:
        return None
    return [str(e.metadata.get("target_identity", "")) for e in entries]


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class PublicationService:
    """Reconcile / publish / read / cleanup over one object store.

    Args:
        store: where generations and pointers live.
        table_format: reads partition files for row counts and audits.
        clock: seconds since the epoch (retention ages, ``published_at``).
    """

    def __init__(
        self,
        *,
        store: ObjectStorePort,
        table_format: TableFormatPort,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._format = table_format
        self._clock = clock

    # ------------------------------------------------------------------ source manifest
    def pin_source_manifest(self, layout: PartitionLayout, sources: Mapping[str, str]) -> str:
        """Record the generation's source manifest once; a later, different one is refused.

        Called before any partition of the generation is written, on every attempt.

        Returns:
            The manifest's digest.

        Raises:
            IntentConflict: the generation was started from other source content.
            PublicationRefused: cleanup deleted the generation (it is never rewritten).

        """
        retired = self.retired(layout)
        if retired is not None:
            raise PublicationRefused(
                f"generation {layout.generation} of this interval was deleted by cleanup "
                f"(retired {retired}); nothing was written",
                hint="write and publish the interval again as a backfill (--backfill LABEL), "
                "which gets a new generation",
            )
        body = canonical_json({"partitions": dict(sorted(sources.items()))})
        digest = _sha(body)
        if self._store.put_if_absent(layout.source_key, body) is not None:
            return digest
        got = self._store.read(layout.source_key)
        if got is None:  # pragma: no cover - deleted between the two calls
            raise PublicationRefused("the source manifest vanished while it was being pinned")
        if _sha(got[0]) != digest:
            pinned = load_json(got[0], what="source manifest").get("partitions", {})
            changed = sorted(
                p for p in set(pinned) | set(sources) if pinned.get(p) != sources.get(p)
            )
            raise IntentConflict(
                "the source changed since this interval's generation was started "
                f"(partitions {', '.join(changed)} differ from the pinned source manifest); "
                "nothing was read or written",
                hint="restore the original source files, or publish the new cut as a backfill "
                "(--backfill LABEL) which gets its own generation",
            )
        return digest

    def retired(self, layout: PartitionLayout) -> str | None:
        """When cleanup retired (deleted) the generation, as ISO time; None if it did not."""
        got = self._store.read(layout.retired_key)
        if got is None:
            return None
        return str(load_json(got[0], what="retirement record").get("retired_at", "?"))

    def source_manifest(self, layout: PartitionLayout) -> str | None:
        """Digest of the pinned source manifest, or None when the generation has none."""
        got = self._store.read(layout.source_key)
        return None if got is None else _sha(got[0])

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, spec: PublicationSpec, layout: PartitionLayout) -> Manifest:
        """Check the generation is complete and consistent; return its manifest.

        Raises:
            PublicationRefused: with every problem found, one per line.

        """
        problems: list[str] = []
        retired = self.retired(layout)
        if retired is not None:
            problems.append(
                f"generation {layout.generation} was deleted by cleanup (retired {retired}); "
                "it is never published again: write the interval as a backfill"
            )
        source = self.source_manifest(layout)
        if source is None:
            problems.append(f"generation {layout.generation} has no source manifest (not started)")
        objects = {o.key: o for o in self._store.list(layout.prefix)}
        entries: list[ManifestEntry] = []
        seen = self._seen_partitions(layout, objects)
        unexpected = sorted(seen - set(spec.partitions))
        if unexpected:
            problems.append(f"unexpected partitions in the generation: {', '.join(unexpected)}")
        missing = [p for p in spec.partitions if layout.checksum_key(p) not in objects]
        if missing:
            detail = [
                f"{p} (data written, not committed)" if layout.data_key(p) in objects else p
                for p in missing
            ]
            problems.append(
                f"missing partitions ({len(missing)} of {len(spec.partitions)}): "
                + ", ".join(detail)
            )
        columns: dict[tuple[str, ...], list[str]] = {}
        for partition in spec.partitions:
            if partition in missing:
                continue
            entry = self._check_partition(spec, layout, partition, source, problems, columns)
            if entry is not None:
                entries.append(entry)
        if len(columns) > 1:
            shapes = "; ".join(f"{', '.join(ps)}: {list(c)}" for c, ps in columns.items())
            problems.append(f"partitions have different columns ({shapes})")
        if problems:
            raise PublicationRefused(
                f"generation {layout.generation} of {spec.dataset} "
                f"{spec.interval.canonical()} cannot be published:\n  - " + "\n  - ".join(problems),
                hint="rerun the missing or failed partitions with the same interval (same "
                "generation), then reconcile again; readers stay on the current manifest",
            )
        assert source is not None  # noqa: S101 - a missing source is a problem above
        return Manifest(
            dataset=spec.dataset,
            interval=spec.interval.canonical(),
            generation=layout.generation,
            fmt=spec.fmt,
            source_manifest=source,
            partitions=tuple(entries),
        )

    @staticmethod
    def _seen_partitions(layout: PartitionLayout, objects: Mapping[str, StoredObject]) -> set[str]:
        seen: set[str] = set()
        for key in objects:
            name = key.removeprefix(layout.prefix + "/")
            if "/" in name or name.startswith("_"):
                continue
            seen.add(name.removesuffix(".checksum.json").rsplit(".", 1)[0])
        return seen

    def _check_partition(
        self,
        spec: PublicationSpec,
        layout: PartitionLayout,
        partition: str,
        source: str | None,
        problems: list[str],
        columns: dict[tuple[str, ...], list[str]],
    ) -> ManifestEntry | None:
        got = self._store.read(layout.checksum_key(partition))
        if got is None:
            problems.append(f"{partition}: checksum record vanished")
            return None
        try:
            record = ChecksumRecord.from_bytes(got[0])
        except ConfigInvalid:
            problems.append(f"{partition}: checksum record is damaged")
            return None
        before = len(problems)
        if record.generation != layout.generation or record.partition != partition:
            problems.append(
                f"{partition}: record belongs to generation {record.generation} partition "
                f"{record.partition} (mixed generation)"
            )
        if source is not None and record.source_manifest != source:
            problems.append(f"{partition}: written from another source cut (source hash differs)")
        data = self._store.read(layout.data_key(partition))
        if data is None:
            problems.append(f"{partition}: data object is missing")
            return None
        if _sha(data[0]) != record.sha256:
            problems.append(f"{partition}: checksum mismatch (data differs from its record)")
            return None
        try:
            stats = self._format.inspect(data[0])
        except DponeError:
            problems.append(f"{partition}: data object is not a readable {spec.fmt} file")
            return None
        if stats.rows != record.rows:
            problems.append(
                f"{partition}: row count mismatch (file {stats.rows}, record {record.rows})"
            )
        columns.setdefault(stats.columns, []).append(partition)
        if stats.rows < spec.audits.min_rows:
            problems.append(
                f"{partition}: audit min_rows failed ({stats.rows} < {spec.audits.min_rows})"
            )
        for name in spec.audits.not_null:
            if name not in stats.null_counts:
                problems.append(f"{partition}: audit not_null names unknown column {name}")
            elif stats.null_counts[name]:
                problems.append(
                    f"{partition}: audit not_null failed ({stats.null_counts[name]} nulls "
                    f"in {name})"
                )
        if len(problems) != before:
            return None
        return ManifestEntry(
            partition=partition,
            key=layout.data_key(partition),
            sha256=record.sha256,
            rows=record.rows,
            operation_id=record.operation_id,
        )

    # ------------------------------------------------------------------ publish
    def publish(self, spec: PublicationSpec, layout: PartitionLayout) -> PublishResult:
        """Reconcile, write the manifest, then move ``current`` with one conditional put.

        Raises:
            PublicationRefused: reconcile found problems; nothing was published.
            PublishConflict: another publisher moved ``current`` first.

        """
        manifest = self.reconcile(spec, layout)
        body = manifest.to_bytes()
        failpoints.hit("before:publication.manifest")
        self._store.put(layout.manifest_key, body)
        failpoints.hit("after:publication.manifest")
        found = self._store.read(layout.current_key)
        previous = None if found is None else CurrentPointer.from_bytes(found[0])
        result = PublishResult(
            generation=layout.generation,
            previous_generation=previous.generation if previous else None,
            partitions=len(manifest.partitions),
            rows=manifest.rows,
            manifest_key=layout.manifest_key,
            already_current=False,
        )
        if (
            previous is not None
            and previous.generation == layout.generation
            and previous.manifest_sha256 == _sha(body)
        ):
            return replace(
                result, previous_generation=previous.previous_generation, already_current=True
            )
        pointer = CurrentPointer(
            generation=layout.generation,
            manifest_key=layout.manifest_key,
            manifest_sha256=_sha(body),
            published_at=datetime.fromtimestamp(self._clock(), UTC).isoformat(),
            previous_generation=previous.generation if previous else None,
        )
        failpoints.hit("before:publication.current")
        if found is None:
            moved = self._store.put_if_absent(layout.current_key, pointer.to_bytes())
        else:
            moved = self._store.put_if_match(
                layout.current_key, pointer.to_bytes(), etag=found[1].etag
            )
        if moved is None:
            now = self.current(layout)
            if now is not None and now.pointer.manifest_sha256 == pointer.manifest_sha256:
                # a twin publisher of the very same manifest won: the outcome is ours
                return replace(result, already_current=True)
            winner = now.pointer.generation if now is not None else "?"
            raise PublishConflict(
                f"another publisher moved current of {spec.dataset} "
                f"{spec.interval.canonical()} first (now generation {winner}); "
                f"generation {layout.generation} was not published",
                hint="check `dpone publication status`; publish again only if this "
                "generation should replace the one now current",
            )
        failpoints.hit("after:publication.current")
        return result

    # ------------------------------------------------------------------ read
    def current(self, layout: PartitionLayout) -> CurrentView | None:
        """Resolve ``current`` to its manifest (checked against the pointer's hash).

        Raises:
            PublicationRefused: the pointer names a manifest that is missing or differs.

        """
        found = self._store.read(layout.current_key)
        if found is None:
            return None
        pointer = CurrentPointer.from_bytes(found[0])
        got = self._store.read(pointer.manifest_key)
        if got is None or _sha(got[0]) != pointer.manifest_sha256:
            raise PublicationRefused(
                "current names a manifest that is missing or does not match its hash",
                hint="republish the generation (`dpone publication publish`)",
            )
        return CurrentView(pointer=pointer, manifest=Manifest.from_bytes(got[0]))

    def read_rows(
        self, layout: PartitionLayout
    ) -> tuple[CurrentView, tuple[str, ...], list[tuple[object, ...]]] | None:
        """Every row of the current generation, each file checked against the manifest."""
        view = self.current(layout)
        if view is None:
            return None
        names: tuple[str, ...] = ()
        rows: list[tuple[object, ...]] = []
        for entry in view.manifest.partitions:
            got = self._store.read(entry.key)
            if got is None or _sha(got[0]) != entry.sha256:
                raise PublicationRefused(
                    f"partition {entry.partition} of the current manifest is missing or changed"
                )
            names, part = self._format.decode(got[0])
            rows.extend(part)
        return view, names, rows

    # ------------------------------------------------------------------ status
    def status(self, spec: PublicationSpec, layout: PartitionLayout) -> dict[str, object]:
        """Committed / written / missing partitions of the generation, and what is current.

        ``partial_age_seconds`` is how long a started, incomplete generation has been
        waiting (since its first object): the figure to alert on when a publication is
        blocked; None when the generation is complete or not started.
        """
        listed = self._store.list(layout.prefix)
        objects = {o.key for o in listed}
        committed = [p for p in spec.partitions if layout.checksum_key(p) in objects]
        written = [
            p
            for p in spec.partitions
            if layout.data_key(p) in objects and layout.checksum_key(p) not in objects
        ]
        missing = [p for p in spec.partitions if p not in committed and p not in written]
        found = self._store.read(layout.current_key)
        pointer = None if found is None else CurrentPointer.from_bytes(found[0])
        partial = bool(listed) and bool(written or missing)
        started = min((o.modified_at for o in listed), default=None)
        return {
            "dataset": spec.dataset,
            "interval": spec.interval.canonical(),
            "generation": layout.generation,
            "expected": list(spec.partitions),
            "committed": committed,
            "written_not_committed": written,
            "missing": missing,
            "partial_age_seconds": (
                round(self._clock() - started, 1) if partial and started is not None else None
            ),
            "source_manifest": self.source_manifest(layout),
            "retired": self.retired(layout),
            "manifest_written": layout.manifest_key in objects,
            "current_generation": pointer.generation if pointer else None,
            "published": pointer is not None and pointer.generation == layout.generation,
        }

    # ------------------------------------------------------------------ cleanup
    def cleanup(
        self,
        layout: PartitionLayout,
        *,
        older_than_seconds: float,
        unresolved: Sequence[str] | None,
        target_prefix: str,
        dry_run: bool = False,
    ) -> CleanupReport:
        """Delete staging generations of the interval that no reader or recovery needs.

        A generation is deleted only when it is not current, its newest object is older
        than the cutoff, and no unresolved operation targets the interval (a recovery of
        the interval may still need any of its generations).

        Args:
            layout: any layout of the dataset x interval (its generation is ignored).
            older_than_seconds: the retention cutoff.
            unresolved: target identities of operations not COMPLETE; None when they
                could not all be listed (nothing is deleted then).
            target_prefix: ``staging:<store>/<dataset>/<interval>/`` for matching those.
            dry_run: report without deleting.

        """
        objects = self._store.list(layout.interval_prefix)
        generations: dict[str, list[StoredObject]] = {}
        for obj in objects:
            rest = obj.key.removeprefix(layout.interval_prefix + "/")
            head = rest.split("/", 1)[0]
            if head.startswith("gen="):
                generations.setdefault(head.removeprefix("gen="), []).append(obj)
        found = self._store.read(layout.current_key)
        pointer = None if found is None else CurrentPointer.from_bytes(found[0])
        current = pointer.generation if pointer else None
        blocked = _recovery_block(unresolved, target_prefix)
        cutoff = self._clock() - older_than_seconds
        # readers that resolved current just before the last publish may still read the
        # generation it replaced: keep that one until the cutoff has passed since then
        superseded = pointer.previous_generation if pointer else None
        superseded_recently = pointer is not None and _timestamp(pointer.published_at) > cutoff
        kept: dict[str, str] = {}
        deleted: list[str] = []
        count = 0
        for generation, members in sorted(generations.items()):
            if generation == current:
                kept[generation] = "current"
            elif blocked is not None:
                kept[generation] = blocked
            elif generation == superseded and superseded_recently:
                kept[generation] = "replaced by current less than the retention cutoff ago"
            elif max(o.modified_at for o in members) > cutoff:
                kept[generation] = "younger than the retention cutoff"
            else:
                deleted.append(generation)
                if not dry_run:
                    count += self._retire(replace(layout, generation=generation), members)
        return CleanupReport(deleted=tuple(deleted), kept=kept, objects_deleted=count)

    def _retire(self, layout: PartitionLayout, members: Sequence[StoredObject]) -> int:
        """Record the generation as retired, then delete its objects; return how many.

        The record comes first: from then on no writer pins the generation and reconcile
        refuses it, so a writer that raced this cleanup can never get it published with
        objects missing, and a rerun of the interval is told to use a backfill instead of
        replaying partitions the journal remembers as COMPLETE.
        """
        stamp = datetime.fromtimestamp(self._clock(), UTC).isoformat()
        record = canonical_json({"generation": layout.generation, "retired_at": stamp})
        self._store.put_if_absent(layout.retired_key, record)  # an earlier retirement stays
        # the manifest and records last, so a half-done delete still reads as junk
        for obj in sorted(members, key=lambda o: o.key.endswith(".json")):
            self._store.delete(obj.key)
        return len(members)


def _recovery_block(unresolved: Sequence[str] | None, target_prefix: str) -> str | None:
    """Why nothing of the interval may be deleted now, or None when nothing blocks."""
    if unresolved is None:
        return (
            "the journal holds too many unresolved operations to tell whether this interval "
            "is being recovered: never clean up during a recovery"
        )
    recovering = [t for t in unresolved if t.startswith(target_prefix)]
    if not recovering:
        return None
    return (
        f"{len(recovering)} unresolved operation(s) on this interval: "
        "never clean up during a recovery"
    )


def _timestamp(iso: str) -> float:
    """Seconds since the epoch of an ISO time written by publish (unparsable: now, i.e. keep)."""
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return time.time()
