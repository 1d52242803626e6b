"""Partition publication: layout, derived generation ids, checksum records, manifests (section 13).

Layout of one dataset in an object store::

    <dataset>/<interval>/_current.json                     the pointer readers resolve
    <dataset>/<interval>/gen=<g>/_source.json               the immutable source manifest
    <dataset>/<interval>/gen=<g>/_fence/<partition>.json    the writer's epoch fence
    <dataset>/<interval>/gen=<g>/<partition>.<fmt>          the partition's data
    <dataset>/<interval>/gen=<g>/<partition>.checksum.json  its checksum record (the commit)
    <dataset>/<interval>/gen=<g>/_manifest.json             the validated manifest

The generation id is derived from dataset, interval and backfill label, never random: a
retry of the same interval lands in the same generation; a backfill gets its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from dpone.contracts.identity import Interval, canonical_json, digest_of
from dpone.errors import ConfigInvalid

__all__ = [
    "FORMATS",
    "ChecksumRecord",
    "CurrentPointer",
    "Manifest",
    "ManifestEntry",
    "PartitionLayout",
    "derive_generation",
    "interval_key",
    "load_json",
]

#: Output formats and their file extensions.
FORMATS: Mapping[str, str] = {"parquet": "parquet", "csv": "csv"}


def interval_key(interval: Interval) -> str:
    """Return a key-safe form of the interval: ``20261101T000000Z_20261102T000000Z``."""
    start, end = interval.canonical().split("/")
    return "_".join(s.replace("-", "").replace(":", "").replace(".", "") for s in (start, end))


def derive_generation(*, dataset: str, interval: Interval, backfill: str | None) -> str:
    """Return the generation id (16 hex digits) of dataset x interval x backfill label."""
    fields = {"dataset": dataset, "interval": interval.canonical(), "backfill": backfill or ""}
    return digest_of(fields).removeprefix("sha256:")[:16]


def load_json(data: bytes, *, what: str) -> dict[str, Any]:
    """Parse a JSON object written by dpone; a damaged one is a ConfigInvalid naming ``what``."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise ConfigInvalid(f"{what} is not a JSON object written by dpone", field=what)
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionLayout:
    """Where every object of one generation of one dataset x interval lives."""

    dataset: str
    interval: str  # interval_key(...)
    generation: str
    fmt: str = "parquet"

    @property
    def interval_prefix(self) -> str:
        """``<dataset>/<interval>``."""
        return f"{self.dataset}/{self.interval}"

    @property
    def prefix(self) -> str:
        """``<dataset>/<interval>/gen=<g>``."""
        return f"{self.interval_prefix}/gen={self.generation}"

    @property
    def current_key(self) -> str:
        """The dataset x interval's ``current`` pointer."""
        return f"{self.interval_prefix}/_current.json"

    @property
    def source_key(self) -> str:
        """The generation's immutable source manifest."""
        return f"{self.prefix}/_source.json"

    @property
    def manifest_key(self) -> str:
        """The generation's validated manifest."""
        return f"{self.prefix}/_manifest.json"

    @property
    def retired_key(self) -> str:
        """Written by cleanup before it deletes the generation; the generation never returns.

        It lies outside ``gen=<g>/`` so that deleting the generation leaves it in place.
        """
        return f"{self.interval_prefix}/_retired/{self.generation}.json"

    def data_key(self, partition: str) -> str:
        """The partition's data object."""
        return f"{self.prefix}/{partition}.{FORMATS[self.fmt]}"

    def checksum_key(self, partition: str) -> str:
        """The partition's checksum record; its presence means the partition committed."""
        return f"{self.prefix}/{partition}.checksum.json"

    def fence_key(self, partition: str) -> str:
        """The partition writer's epoch fence."""
        return f"{self.prefix}/_fence/{partition}.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChecksumRecord:
    """What one committed partition holds, written after its data object."""

    partition: str
    generation: str
    data_key: str
    sha256: str  # of the data object's bytes
    rows: int
    source_identity: str  # the partition's source content hash
    source_manifest: str  # digest of the whole generation's source manifest
    operation_id: str
    intent_digest: str
    epoch: int

    def to_bytes(self) -> bytes:
        """Canonical JSON."""
        return canonical_json(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> ChecksumRecord:
        """Parse a record; a damaged one is a ConfigInvalid."""
        raw = load_json(data, what="checksum record")
        try:
            return cls(**{k: raw[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError):
            raise ConfigInvalid("checksum record lacks fields", field="checksum record") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestEntry:
    """One partition of a manifest."""

    partition: str
    key: str
    sha256: str
    rows: int
    operation_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """The validated list of a generation's partitions; deterministic bytes (no clock)."""

    dataset: str
    interval: str  # canonical START/END
    generation: str
    fmt: str
    source_manifest: str
    partitions: tuple[ManifestEntry, ...] = field(default_factory=tuple)

    @property
    def rows(self) -> int:
        """Total rows."""
        return sum(p.rows for p in self.partitions)

    def to_bytes(self) -> bytes:
        """Canonical JSON."""
        return canonical_json({**asdict(self), "partitions": [asdict(p) for p in self.partitions]})

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse a manifest; a damaged one is a ConfigInvalid."""
        raw = load_json(data, what="manifest")
        try:
            entries = tuple(ManifestEntry(**p) for p in raw.pop("partitions"))
            raw.pop("v", None)
            return cls(**raw, partitions=entries)
        except (KeyError, TypeError):
            raise ConfigInvalid("manifest lacks fields", field="manifest") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class CurrentPointer:
    """The ``current`` pointer: which generation's manifest readers resolve to."""

    generation: str
    manifest_key: str
    manifest_sha256: str
    published_at: str
    previous_generation: str | None = None

    def to_bytes(self) -> bytes:
        """Canonical JSON."""
        return canonical_json(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> CurrentPointer:
        """Parse a pointer; a damaged one is a ConfigInvalid."""
        raw = load_json(data, what="current pointer")
        raw.pop("v", None)
        try:
            return cls(**raw)
        except TypeError:
            raise ConfigInvalid("current pointer lacks fields", field="current pointer") from None
