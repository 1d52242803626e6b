"""The table format port: rows <-> the bytes of one partition file (Parquet, CSV)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dpone.contracts.load import Column

__all__ = ["PartitionStats", "TableFormatPort"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionStats:
    """What reconcile and audits need to know about one partition file."""

    rows: int
    columns: tuple[str, ...]
    null_counts: Mapping[str, int]


class TableFormatPort(Protocol):
    """Encodes rows deterministically (same rows -> same bytes) and inspects files."""

    @property
    def name(self) -> str:
        """Format name, e.g. ``parquet``."""
        ...

    def encode(
        self, columns: Sequence[Column], batches: Iterable[Sequence[Sequence[object]]]
    ) -> tuple[bytes, int]:
        """Return the file's bytes and its row count.

        Raises:
            TargetWriteFailed: a value does not fit its column's type.

        """
        ...

    def inspect(self, data: bytes) -> PartitionStats:
        """Return row count, column names and null counts of a file.

        Raises:
            PublicationRefused: the bytes are not a readable file of this format.

        """
        ...

    def decode(self, data: bytes) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
        """Return column names and every row (readers and tests)."""
        ...
