"""The source port: a snapshot identity and streamed batches of rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from dpone.contracts.load import Column

__all__ = [
    "RAW_CSV_DELIMITERS",
    "RawCsv",
    "RawCsvRefused",
    "SourcePort",
    "raw_csv_of",
    "raw_csv_size_of",
]

# The field separators a raw CSV file may have: one ASCII byte every target's CSV
# reader takes as a delimiter (and safe to spell inside a SQL string literal).
RAW_CSV_DELIMITERS = frozenset(",;|\t")


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


class RawCsvRefused(Exception):
    """The file holds bytes a target's own CSV parser could read differently: use the rows.

    Raised by ``RawCsv.chunks`` before the offending chunk is handed out. Connectors roll
    back what the pass-through did and load the source's rows instead.
    """


class RawCsv(Protocol):
    """A CSV source's file offered as raw bytes to a target that parses CSV itself.

    Offered (``raw_csv()`` on the object ``batches`` returns) only when no row needs
    Python: the rows would be the file's records unchanged. Every value is text; an
    empty field, quoted or not, is NULL, exactly as in the rows path. The file has one
    header row whose names are ``columns`` (the plan's columns, in file order).
    """

    @property
    def path(self) -> Path:
        """The file."""
        ...

    @property
    def delimiter(self) -> str:
        """The field separator, one of ``RAW_CSV_DELIMITERS``."""
        ...

    @property
    def columns(self) -> tuple[str, ...]:
        """The header's column names, in file order."""
        ...

    def chunks(self, *, crlf: bool, verified_after: bool = False) -> Iterator[bytes]:
        """Yield the file's bytes (header included), checking each chunk.

        Only RFC 4180 records are handed out: a quote opens a field or doubles inside a
        quoted one, no blank line, no NUL, no backslash-dot, no lone CR (and no CR at all
        unless ``crlf``). Anything else raises ``RawCsvRefused`` before its chunk. Before
        the last chunk is handed out, the bytes are proven to be the snapshot: by their
        hash, or by the file's stat when it vouches for the identity (ADR 0004).
        ``verified_after=True`` is for a target that reads the file itself and calls
        ``verify_unchanged`` after its read.

        Raises:
            RawCsvRefused: see above (nothing about the content changed).
            SourceInvalid: after the last chunk, when the bytes read are not the
                operation's snapshot identity ("source changed").

        """
        ...

    def records_checked_ahead(self, *, crlf: bool) -> int | None:
        """The record count of checks made before this read, when they still hold; else None.

        For a target that reads the file itself: ``chunks(crlf=crlf, verified_after=True)``
        need not run when this returns a count (the same checks ran ahead on the very
        bytes the file still has; ``records`` returns it too). ``verify_unchanged`` after
        the target's read is still required.

        Raises:
            RawCsvRefused: the checks made ahead refused the file.

        """
        ...

    def records(self) -> int:
        """Return the number of records after the header, counted while ``chunks`` read.

        Line feeds outside quoted sections, less the header's; valid once ``chunks`` is
        exhausted. A connector compares it with the rows its target loaded and treats a
        difference as a refusal: the target's parser did not read the records Python would.
        """
        ...

    def verify_unchanged(self) -> None:
        """Check the file is still the snapshot ``chunks`` read (its stat, or a new hash).

        For targets that read the file themselves: call after ``chunks`` and after the
        target's read, inside the transaction, before commit. A file written just before
        ``chunks`` opened it is hashed again (ADR 0004).

        Raises:
            SourceInvalid: the content or the file's inode/size/mtime/ctime changed.

        """
        ...

    def loaded(self, rows: int) -> None:
        """Report the rows the target loaded from the file (counts and progress)."""
        ...


def raw_csv_size_of(batches: object) -> int | None:
    """The size in bytes of the raw CSV file a batch stream offers, or None (none offered).

    A stream that knows it cheaply has a ``raw_csv_size()`` method (a CSV source that
    read a small file whole); any other stream's offer is built and its file stat'ed.
    """
    known = getattr(batches, "raw_csv_size", None)
    if callable(known):
        size: int | None = known()
        return size
    raw = raw_csv_of(batches)
    if raw is None:
        return None
    try:
        return raw.path.stat().st_size
    except OSError:
        return None  # the read reports it, with the source's own message


def raw_csv_of(batches: object) -> RawCsv | None:
    """Return the raw CSV file a batch stream offers, or None (then iterate the rows).

    A stream offers one by having a ``raw_csv()`` method; interval filters and other
    Python-side row work return plain iterators, which offer none.
    """
    offer = getattr(batches, "raw_csv", None)
    if not callable(offer):
        return None
    raw: RawCsv | None = offer()
    return raw
