"""Publication contracts: derived generation ids, key-safe intervals, deterministic records."""

from __future__ import annotations

import pytest

from dpone.contracts.identity import parse_interval
from dpone.contracts.publication import (
    ChecksumRecord,
    CurrentPointer,
    Manifest,
    ManifestEntry,
    PartitionLayout,
    derive_generation,
    interval_key,
)
from dpone.errors import ConfigInvalid

DAY = parse_interval("2026-11-01/2026-11-02")


def test_generation_is_derived_never_random() -> None:
    """Same dataset, interval and label: same id; any of them changed: another id."""
    base = derive_generation(dataset="r", interval=DAY, backfill=None)
    assert base == derive_generation(dataset="r", interval=DAY, backfill=None)
    assert base == derive_generation(dataset="r", interval=DAY, backfill="")
    others = {
        derive_generation(dataset="r", interval=DAY, backfill="fix"),
        derive_generation(dataset="s", interval=DAY, backfill=None),
        derive_generation(
            dataset="r", interval=parse_interval("2026-11-02/2026-11-03"), backfill=None
        ),
    }
    assert base not in others
    assert len(others) == 3
    assert len(base) == 16
    assert int(base, 16) >= 0


def test_interval_key_is_key_safe() -> None:
    """The interval becomes one path segment without ':' or '/'."""
    assert interval_key(DAY) == "20261101T000000Z_20261102T000000Z"


def test_layout_keys() -> None:
    """Every object of a generation lives under its gen= prefix; current beside them."""
    layout = PartitionLayout(dataset="r", interval="I", generation="g", fmt="csv")
    assert layout.data_key("t1") == "r/I/gen=g/t1.csv"
    assert layout.checksum_key("t1") == "r/I/gen=g/t1.checksum.json"
    assert layout.current_key == "r/I/_current.json"
    assert layout.manifest_key.startswith(layout.prefix + "/")


def test_manifest_bytes_are_deterministic_and_round_trip() -> None:
    """A manifest has no clock: equal manifests are equal bytes; bytes parse back."""
    entry = ManifestEntry(partition="t1", key="k", sha256="sha256:x", rows=3, operation_id="op")
    one = Manifest(
        dataset="r",
        interval=DAY.canonical(),
        generation="g",
        fmt="parquet",
        source_manifest="sha256:s",
        partitions=(entry,),
    )
    two = Manifest.from_bytes(one.to_bytes())
    assert two == one
    assert two.to_bytes() == one.to_bytes()
    assert one.rows == 3


def test_records_round_trip_and_damage_is_a_config_error() -> None:
    """Checksum records and pointers parse back; damaged bytes are DPONE_CONFIG_INVALID."""
    record = ChecksumRecord(
        partition="t1",
        generation="g",
        data_key="k",
        sha256="sha256:x",
        rows=1,
        source_identity="sha256:a",
        source_manifest="sha256:m",
        operation_id="op",
        intent_digest="sha256:i",
        epoch=2,
    )
    assert ChecksumRecord.from_bytes(record.to_bytes()) == record
    pointer = CurrentPointer(
        generation="g", manifest_key="k", manifest_sha256="h", published_at="t"
    )
    assert CurrentPointer.from_bytes(pointer.to_bytes()) == pointer
    for bad in (b"", b"[1]", b"\xff", b'{"partition": "t1"}'):
        with pytest.raises(ConfigInvalid):
            ChecksumRecord.from_bytes(bad)


def test_publication_failpoints_are_known_but_apart() -> None:
    """Publish's failpoints configure and fire; route crash matrices do not iterate them."""
    from dpone.errors import InjectedFault
    from dpone.runtime import failpoints

    assert not set(failpoints.PUBLICATION_FAILPOINT_NAMES) & set(failpoints.FAILPOINT_NAMES)
    failpoints.configure("before:publication.current=raise")
    try:
        with pytest.raises(InjectedFault):
            failpoints.hit("before:publication.current")
        failpoints.hit("after:publication.current")
    finally:
        failpoints.configure(None)
