"""Row streams: counting for progress and results, filtering to the operation's interval."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime

from dpone.contracts.identity import Interval
from dpone.errors import SourceInvalid

__all__ = ["RowTally", "counted", "within_interval"]

Batch = list[tuple[object, ...]]


class RowTally:
    """Counts rows seen and rows skipped; read after the stream is consumed."""

    __slots__ = ("rows", "skipped")

    def __init__(self) -> None:
        self.rows = 0
        self.skipped = 0


def counted(
    batches: Iterable[Batch], tally: RowTally, on_rows: Callable[[int], None] | None
) -> Iterator[Batch]:
    """Yield ``batches`` unchanged, counting rows per batch (no per-row work)."""
    for batch in batches:
        tally.rows += len(batch)
        if on_rows is not None:
            on_rows(len(batch))
        yield batch


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
