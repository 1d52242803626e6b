"""Staging partition writer: one partition of one generation, capability ``staging_generation``.

Each partition is its own operation. Its output is a deterministic object
``<dataset>/<interval>/gen=<g>/<partition>.<fmt>`` followed by a checksum record, whose
presence is the commit. The fence is a small object holding the writer's epoch, raised
with conditional puts. An object store has no transaction, so the safety of this route
rests on determinism: every attempt of the operation writes the same bytes to the same
key (a retry *replaces*, never appends), and nothing becomes visible to readers before
reconcile checks the checksums and publish moves ``current``.
"""

from __future__ import annotations

import hashlib
import json

from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
)
from dpone.contracts.load import LoadPlan, MutationReport
from dpone.contracts.objects import StoredObject
from dpone.contracts.publication import ChecksumRecord, PartitionLayout, load_json
from dpone.errors import ConfigInvalid, FencedOut, FenceUnavailable
from dpone.ports.connector import Rows, WithinTransaction
from dpone.ports.object_store import ObjectStorePort
from dpone.ports.table_format import TableFormatPort

__all__ = ["StagingPartitionConnector"]

_CAS_TRIES = 8


class StagingPartitionConnector:
    """Writes one partition of one staging generation into an object store.

    Args:
        store: the object store.
        layout: dataset, interval, generation and format (where the objects go).
        partition: the partition this operation writes.
        table_format: encodes rows into the partition file.
        source_manifest: digest of the generation's source manifest (recorded per partition).
    """

    def __init__(
        self,
        *,
        store: ObjectStorePort,
        layout: PartitionLayout,
        partition: str,
        table_format: TableFormatPort,
        source_manifest: str,
    ) -> None:
        self._store = store
        self._layout = layout
        self._partition = partition
        self._format = table_format
        self._source_manifest = source_manifest

    @property
    def kind(self) -> str:
        """Connector name."""
        return "staging"

    @property
    def capability(self) -> FenceCapability:
        """Deterministic staging + an atomically published manifest."""
        return FenceCapability.STAGING_GENERATION

    @property
    def layout(self) -> PartitionLayout:
        """Where this partition's objects live."""
        return self._layout

    def target_identity(self) -> str:
        """Return ``staging:<store>/<dataset>/<interval>/gen=<g>`` (partition is in identity)."""
        return f"staging:{self._store.location()}/{self._layout.prefix}"

    def database_locator(self) -> str:
        """The store location; no journal lives there, so atomic mode never applies."""
        return f"staging:{self._store.location()}"

    def check_plan(self, plan: LoadPlan) -> None:
        """A partition file needs at least one column."""
        if not plan.columns:
            raise ConfigInvalid("the source has no columns to publish", field="source")

    # ------------------------------------------------------------------ fence
    def _record(self) -> ChecksumRecord | None:
        got = self._store.read(self._layout.checksum_key(self._partition))
        return None if got is None else ChecksumRecord.from_bytes(got[0])

    def _fence(self) -> tuple[int, StoredObject | None]:
        got = self._store.read(self._layout.fence_key(self._partition))
        if got is None:
            return 0, None
        raw = load_json(got[0], what="partition fence")
        return int(raw.get("epoch", 0)), got[1]

    def _raise_to(self, operation_id: str, epoch: int) -> int:
        """Raise the fence to ``epoch`` with a conditional put; return the epoch found before."""
        key = self._layout.fence_key(self._partition)
        body = json.dumps({"epoch": epoch, "operation_id": operation_id}).encode()
        for _ in range(_CAS_TRIES):
            found, meta = self._fence()
            if found >= epoch:
                return found
            if meta is None:
                written = self._store.put_if_absent(key, body)
            else:
                written = self._store.put_if_match(key, body, etag=meta.etag)
            if written is not None:
                return found
        raise FenceUnavailable(
            "the partition fence kept changing under concurrent writers",
            operation_id=operation_id,
        )

    def _committed(self, record: ChecksumRecord) -> FenceObservation:
        return FenceObservation(
            status=FenceStatus.COMMITTED,
            epoch=record.epoch,
            intent_digest=record.intent_digest,
            row_count=record.rows,
            content_digest=record.source_identity,
        )

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        """Raise the fence to ``epoch``; a committed partition is reported untouched."""
        record = self._record()
        if record is not None and record.operation_id == operation_id:
            return self._committed(record)
        found = self._raise_to(operation_id, epoch)
        if found > epoch:
            raise FencedOut(
                f"the partition fence holds epoch {found}, above {epoch}",
                operation_id=operation_id,
            )
        return FenceObservation(status=FenceStatus.PREPARED, epoch=epoch)

    def observe(self, *, operation_id: str) -> FenceObservation:
        """COMMITTED when this operation's checksum record exists, else the fence's epoch."""
        record = self._record()
        if record is not None and record.operation_id == operation_id:
            return self._committed(record)
        epoch, meta = self._fence()
        if meta is None:
            return FenceObservation(status=FenceStatus.ABSENT)
        return FenceObservation(status=FenceStatus.PREPARED, epoch=epoch)

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        """Raise the fence to ``epoch``; an older writer finds it raised before it commits."""
        observed = self.observe(operation_id=operation_id)
        if observed.status is FenceStatus.COMMITTED:
            return SealResult(outcome=SealOutcome.COMMITTED, observation=observed)
        found = self._raise_to(operation_id, epoch)
        if found >= epoch:
            return SealResult(outcome=SealOutcome.FENCED, observation=observed)
        after = self.observe(operation_id=operation_id)
        if after.status is FenceStatus.COMMITTED:
            return SealResult(outcome=SealOutcome.COMMITTED, observation=after)
        return SealResult(outcome=SealOutcome.NOT_COMMITTED, observation=after)

    # ------------------------------------------------------------------ write
    def mutate(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        plan: LoadPlan,
        batches: Rows,
        content_digest: str,
        within: WithinTransaction | None = None,
        prepare: bool = False,
    ) -> MutationReport:
        """Write the partition file, then (fence still ours) its checksum record.

        ``within(None)`` runs between the two: the data object exists, the commit does not.

        With ``prepare`` an *absent* fence is not written: it counts as epoch 0, below every
        lease epoch, and a takeover installs it with ``seal`` (a higher epoch), which this
        writer's check before the commit record then sees. That saves a durable write per
        partition on the common first attempt; a fence that exists is raised as ``prepare``
        would.

        Raises:
            FencedOut: the fence is not ours (before the data, or before the commit).
        """
        record = self._record()
        if record is not None and record.operation_id == operation_id:
            raise FencedOut("the partition already committed", operation_id=operation_id)
        lazy = False
        if prepare:
            found, meta = self._fence()
            if meta is None:
                lazy = True
            elif found > epoch:
                raise FencedOut(
                    f"the partition fence holds epoch {found}, above {epoch}",
                    operation_id=operation_id,
                )
            elif found < epoch:
                self.prepare(operation_id=operation_id, intent_digest=intent_digest, epoch=epoch)
        else:
            self._check_epoch(operation_id, epoch)
        data, rows = self._format.encode(plan.columns, batches)
        key = self._layout.data_key(self._partition)
        self._store.put(key, data)
        if within is not None:
            within(None)
        self._check_epoch(operation_id, epoch, absent_ok=lazy)
        record = ChecksumRecord(
            partition=self._partition,
            generation=self._layout.generation,
            data_key=key,
            sha256="sha256:" + hashlib.sha256(data).hexdigest(),
            rows=rows,
            source_identity=content_digest,
            source_manifest=self._source_manifest,
            operation_id=operation_id,
            intent_digest=intent_digest,
            epoch=epoch,
        )
        self._store.put(self._layout.checksum_key(self._partition), record.to_bytes())
        return MutationReport(row_count=rows, content_digest=content_digest)

    def _check_epoch(self, operation_id: str, epoch: int, *, absent_ok: bool = False) -> None:
        found, meta = self._fence()
        if found != epoch and not (absent_ok and meta is None):
            raise FencedOut(
                f"the partition fence is at epoch {found}, not {epoch}; nothing more is written",
                operation_id=operation_id,
            )

    def close(self) -> None:
        """The store is owned by the caller. Idempotent."""
