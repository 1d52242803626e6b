"""The source port: a snapshot identity and streamed batches of rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from dpone.contracts.load import Column

__all__ = ["SourcePort"]


class SourcePort(Protocol):
    """A readable, identifiable snapshot of input rows."""

    @property
    def kind(self) -> str:
        """Source kind, e.g. ``csv``."""
        ...

    def snapshot_identity(self) -> str:
        """Return ``sha256:<hex>`` of the content that ``batches`` will yield.

        Raises:
            SourceInvalid: the source cannot be read.

        """
        ...

    def columns(self) -> tuple[Column, ...]:
        """Return the columns, declared or inferred from a bounded sample."""
        ...

    def batches(
        self, *, batch_size: int, expected_identity: str
    ) -> Iterator[list[tuple[object, ...]]]:
        """Yield rows in column order, in batches, with memory independent of source size.

        After the last batch the content read is checked against ``expected_identity``.

        Raises:
            SourceInvalid: a row does not fit the columns, or the content changed.

        """
        ...
