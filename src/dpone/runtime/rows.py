"""Row streams: counting for progress and results, filtering to the operation's interval."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from dpone.contracts.identity import Interval
from dpone.errors import SourceInvalid
from dpone.ports.source import RawCsv, raw_csv_of, raw_csv_size_of

__all__ = ["RowTally", "counted", "within_interval"]

Batch = list[tuple[object, ...]]


class RowTally:
    """Counts rows seen and rows skipped; read after the stream is consumed."""

    __slots__ = ("rows", "skipped")

    def __init__(self) -> None:
        self.rows = 0
        self.skipped = 0


class Counted:
    """Batches passed through unchanged, counted per batch (no per-row work).

    When the stream offers the source file's raw bytes (``raw_csv()``, see
    ``dpone.ports.source.RawCsv``), so does this one, and the rows a connector reports
    loaded from the file are counted the same way.
    """

    def __init__(
        self, batches: Iterable[Batch], tally: RowTally, on_rows: Callable[[int], None] | None
    ) -> None:
        self._batches = batches
        self._iterator: Iterator[Batch] | None = None
        self._tally = tally
        self._on_rows = on_rows

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> Batch:
        if self._iterator is None:
            self._iterator = iter(self._batches)
        batch = next(self._iterator)
        self.count(len(batch))
        return batch

    def count(self, rows: int) -> None:
        """Add ``rows`` to the tally and report them as progress."""
        self._tally.rows += rows
        if self._on_rows is not None:
            self._on_rows(rows)

    def raw_csv_size(self) -> int | None:
        """The size of the file ``raw_csv`` would offer (None: it offers none)."""
        if self._iterator is not None:
            return None
        return raw_csv_size_of(self._batches)

    def raw_csv(self) -> RawCsv | None:
        """Return the source's raw CSV file, counting what is loaded from it, or None."""
        if self._iterator is not None:
            return None  # rows were already taken: the file cannot be offered any more
        raw = raw_csv_of(self._batches)
        return None if raw is None else _CountedRawCsv(raw, self)


class _CountedRawCsv:
    """A ``RawCsv`` whose ``loaded`` counts into the stream's tally."""

    def __init__(self, raw: RawCsv, counted: Counted) -> None:
        self._raw = raw
        self._counted = counted
        self.chunks = raw.chunks
        self.verify_unchanged = raw.verify_unchanged
        self.records = raw.records
        self.records_checked_ahead = raw.records_checked_ahead

    @property
    def path(self) -> Path:
        return self._raw.path

    @property
    def delimiter(self) -> str:
        return self._raw.delimiter

    @property
    def columns(self) -> tuple[str, ...]:
        return self._raw.columns

    def loaded(self, rows: int) -> None:
        self._raw.loaded(rows)
        self._counted.count(rows)


def counted(
    batches: Iterable[Batch], tally: RowTally, on_rows: Callable[[int], None] | None
) -> Counted:
    """Yield ``batches`` unchanged, counting rows per batch (no per-row work)."""
    return Counted(batches, tally, on_rows)


def _moment(value: object, column: str) -> datetime:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise SourceInvalid(
                f"column {column!r} holds a value that is not an ISO-8601 time",
                field=column,
                hint="interval columns must hold ISO-8601 dates or times",
            ) from None
    else:
        raise SourceInvalid(
            f"column {column!r} is empty in a row, so the row belongs to no interval",
            field=column,
            hint="fill the interval column in every row, or drop load.interval_column",
        )
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def within_interval(
    batches: Iterable[Batch], *, index: int, column: str, interval: Interval, tally: RowTally
) -> Iterator[Batch]:
    """Yield only rows whose ``column`` lies in ``interval``; count the others as skipped."""
    start, end = interval.start, interval.end
    for batch in batches:
        kept = [row for row in batch if start <= _moment(row[index], column) < end]
        tally.skipped += len(batch) - len(kept)
        if kept:
            yield kept
