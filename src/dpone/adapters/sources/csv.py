"""CSV file source: header row names the columns, rows stream in batches as strings."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeVar

from dpone.adapters.sources import _prefetch
from dpone.adapters.sources._common import (
    CHUNK_SIZE,
    SAMPLE_ROWS,
    SmallFile,
    changed_error,
    check_identity,
    columns_of,
    declared_columns,
    decode_error,
    file_identity,
    infer_type,
    open_hashed_text,
    open_text,
    read_small,
)
from dpone.adapters.sources._passthrough import CsvFileBytes
from dpone.contracts.load import Column, ColumnType
from dpone.errors import ConfigInvalid, SourceInvalid
from dpone.ports.source import RAW_CSV_DELIMITERS, RawCsv

if TYPE_CHECKING:
    from _csv import Reader

__all__ = ["SMALL_FILE_BYTES", "CsvRows", "CsvSource"]

Batch = list[tuple[object, ...]]
_DeclaredKey = tuple[tuple[str, object], ...]
_K = TypeVar("_K")
_V = TypeVar("_V")

#: Declared column types by the declaration's items (a Runner opens one source per
#: operation, always with the workload's one declaration), and the columns of a header
#: row checked against a declaration: pure functions of their keys, kept (bounded) so
#: that operations do not validate the same declaration and header again.
_DECLARED: dict[_DeclaredKey, dict[str, ColumnType]] = {}
_HEADERS: dict[tuple[tuple[str, ...], _DeclaredKey], tuple[Column, ...]] = {}
_KEPT_MAX = 64


def _declared(
    columns: Mapping[str, ColumnType | str],
) -> tuple[_DeclaredKey | None, dict[str, ColumnType]]:
    """``declared_columns(columns)`` and the key it is kept under (None: not kept)."""
    key = tuple(columns.items())
    try:
        hash(key)
    except TypeError:  # a value that cannot be a key (a list): validated, and refused
        return None, declared_columns(columns)
    return key, _kept(_DECLARED, key, lambda: declared_columns(columns))


def _kept(kept: dict[_K, _V], key: _K, make: Callable[[], _V]) -> _V:
    """``kept[key]``, made by ``make`` the first time; the dict is emptied when full."""
    found = kept.get(key)
    if found is None:
        found = make()  # raises for a bad input: nothing is kept then
        if len(kept) >= _KEPT_MAX:
            kept.clear()
        kept[key] = found
    return found


#: A file of at most this many bytes is read once, whole: hashed for its identity, and
#: its header and rows parsed from those same bytes (one open per operation). A larger
#: file is streamed, hashed as it is read, and checked against the identity at its end.
SMALL_FILE_BYTES = CHUNK_SIZE


class CsvSource:
    """A CSV file with a header row; values are yielded as read (strings, ``""`` for empty).

    Args:
        path: the file.
        columns: declared ``name -> type``; the names must be the header's names (in
            any order). Without it, types are inferred from the first 1000 rows.
        delimiter: the one-character field separator.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        columns: Mapping[str, ColumnType | str] | None = None,
        delimiter: str = ",",
    ) -> None:
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"':
            raise ConfigInvalid(
                "the CSV delimiter must be one character (not a quote or line break)",
                field="source.delimiter",
            )
        self._path = path if isinstance(path, Path) else Path(path)
        self._delimiter = delimiter
        self._declared_key: _DeclaredKey | None = None
        self._declared: dict[str, ColumnType] | None = None
        if columns is not None:
            self._declared_key, self._declared = _declared(columns)
        self._columns: tuple[Column, ...] | None = None
        self._small: SmallFile | None = None
        self._large = False  # looked: larger than SMALL_FILE_BYTES, so streamed

    @property
    def kind(self) -> str:
        """Source kind."""
        return "csv"

    @property
    def path(self) -> Path:
        """The file."""
        return self._path

    def snapshot_identity(self) -> str:
        """Return ``sha256:<hex>`` of the file's bytes.

        A small file's bytes are read here once and kept: its rows are those bytes.
        """
        small = self._small_file()
        return small.identity if small is not None else file_identity(self._path)

    def _small_file(self) -> SmallFile | None:
        """The file read whole, once per source, if it is small (else None: streamed)."""
        if self._small is None and not self._large:
            self._small = read_small(self._path, limit=SMALL_FILE_BYTES)
            self._large = self._small is None
        return self._small

    @contextmanager
    def _text(self) -> Iterator[TextIO]:
        """The file as text for the header, a sample or a line number (no hashing)."""
        small = self._small_file()
        if small is not None:
            # newline="": line endings reach the csv module as they are, as from the file
            yield io.StringIO(small.text, newline="")
            return
        with open_text(self._path) as text:
            yield text

    def columns(self) -> tuple[Column, ...]:
        """Return the header's columns with declared or inferred types."""
        if self._columns is None:
            small = self._small_file()
            if small is not None:
                # newline="": line endings reach the csv module as they are, as from the file
                text = io.StringIO(small.text, newline="")
                self._columns = self._columns_from(csv.reader(text, delimiter=self._delimiter))
            else:
                with open_text(self._path) as stream:
                    reader = csv.reader(stream, delimiter=self._delimiter)
                    self._columns = self._columns_from(reader)
        return self._columns

    def _columns_from(self, reader: Reader) -> tuple[Column, ...]:
        if self._declared is None:
            header = self._header(reader)
            sample = self._sample(reader, len(header))
            types = {name: infer_type(row[i] for row in sample) for i, name in enumerate(header)}
            return columns_of(header, types)
        first = self._first_row(reader)
        if self._declared_key is None:
            return columns_of(self._checked_header(first), self._declared)
        # The checks and the columns follow from the header row and the declared types
        # alone: a Runner's operations read files with one header, checked once.
        declared = self._declared
        return _kept(
            _HEADERS,
            (tuple(first or ()), self._declared_key),
            lambda: columns_of(self._checked_header(first), declared),
        )

    def _header(self, reader: Iterator[list[str]]) -> list[str]:
        return self._checked_header(self._first_row(reader))

    def _first_row(self, reader: Iterator[list[str]]) -> list[str] | None:
        try:
            return next(reader, None)
        except UnicodeDecodeError as exc:
            raise decode_error(self._path, 1) from exc
        except csv.Error as exc:
            raise self._malformed(1, exc) from exc

    def _checked_header(self, first: list[str] | None) -> list[str]:
        header = [name.strip() for name in first or []]
        if not header or header == [""]:
            raise SourceInvalid(
                f"{str(self._path)!r} is empty: a CSV source needs a header row",
                hint="write the column names on the first line",
            )
        if "" in header:
            raise SourceInvalid(
                f"{str(self._path)!r}: header column #{header.index('') + 1} has no name"
            )
        lowered = [n.lower() for n in header]
        if len(set(lowered)) != len(lowered):
            twice = sorted({n for n in header if lowered.count(n.lower()) > 1})
            raise SourceInvalid(
                f"{str(self._path)!r}: header names {', '.join(map(repr, twice))} more than once"
            )
        if self._declared is not None:
            missing = [n for n in self._declared if n not in header]
            extra = [n for n in header if n not in self._declared]
            if missing or extra:
                parts = []
                if missing:
                    parts.append(f"declared but not in the header: {', '.join(map(repr, missing))}")
                if extra:
                    parts.append(f"in the header but not declared: {', '.join(map(repr, extra))}")
                raise SourceInvalid(
                    f"{str(self._path)!r}: declared columns do not match the header "
                    f"({'; '.join(parts)})",
                    hint="declare exactly the header's column names, or drop source.columns",
                )
        return header

    def _sample(self, reader: Iterator[list[str]], width: int) -> list[list[str]]:
        try:
            rows = list(islice(reader, SAMPLE_ROWS))
        except UnicodeDecodeError as exc:
            raise decode_error(self._path, getattr(reader, "line_num", 0) + 1) from exc
        except csv.Error as exc:
            raise self._malformed(getattr(reader, "line_num", 0), exc) from exc
        # Wrong-width rows are reported with their line by batches(); skip them here.
        return [row for row in rows if len(row) == width]

    def _malformed(self, line: int, exc: csv.Error) -> SourceInvalid:
        # The csv module's messages describe the syntax problem, never the field's content.
        return SourceInvalid(f"{str(self._path)!r}: line {line} is not valid CSV ({exc})")

    def batches(self, *, batch_size: int, expected_identity: str) -> CsvRows:
        """Return the rows as batches of string tuples (read lazily, see ``CsvRows``).

        The bytes read are checked against the snapshot at the end.

        Raises (while iterating):
            SourceInvalid: a row has the wrong number of fields (its line is named), the file
                is not valid CSV or UTF-8, or its content is not ``expected_identity``.
        """
        return CsvRows(self, batch_size=batch_size, expected_identity=expected_identity)

    def _rows(self, *, batch_size: int, expected_identity: str) -> Iterator[Batch]:
        if batch_size < 1:
            raise ConfigInvalid("batch_size must be at least 1", field="load.batch_size")
        names = [c.name for c in self.columns()]
        small = self._small_file()
        if small is not None:
            # the rows are parsed from the very bytes the identity was hashed from
            if small.identity != expected_identity:
                raise changed_error(self._path)
            # (columns() checked its header, in these very bytes)
            reader = csv.reader(io.StringIO(small.text, newline=""), delimiter=self._delimiter)
            next(reader)
            yield from self._parse(reader, names, batch_size)
            return
        with open_hashed_text(self._path) as (text, hashing):
            reader = csv.reader(text, delimiter=self._delimiter)
            if self._header(reader) != names:
                raise changed_error(self._path)
            yield from self._parse(reader, names, batch_size)
            check_identity(hashing, expected_identity, self._path)

    def _parse(self, reader: Reader, names: list[str], batch_size: int) -> Iterator[Batch]:
        """The rows after the header, in batches; a row of another width names its line."""
        width = len(names)
        expected = {width}
        read = 0  # rows read after the header, blank ones included
        while True:
            try:
                batch: Batch = list(map(tuple, islice(reader, batch_size)))
            except UnicodeDecodeError as exc:
                raise decode_error(self._path, reader.line_num + 1) from exc
            except csv.Error as exc:
                raise self._malformed(reader.line_num, exc) from exc
            if not batch:
                break
            first, read = read, read + len(batch)
            # One C-level pass over the lengths; Python looks at rows only on a mismatch.
            if set(map(len, batch)) != expected:
                batch = self._without_blank_rows(batch, width, first_row=first)
                if not batch:
                    continue
            yield batch

    def raw_csv_size(self) -> int | None:
        """The size of the file ``raw_csv`` would offer, or None when it offers none.

        A small file read whole knows its size from the read's own ``fstat``.
        """
        if self._delimiter not in RAW_CSV_DELIMITERS:
            return None
        small = self._small
        if small is not None:
            return small.state[2]
        try:
            return self._path.stat().st_size
        except OSError:
            return None  # the read reports it, with the source's own message

    def raw_csv(self, expected_identity: str) -> RawCsv | None:
        """Return the file as raw bytes for a target's CSV parser, when the delimiter allows."""
        if self._delimiter not in RAW_CSV_DELIMITERS:
            return None
        small = self._small
        if small is not None and small.settled and small.identity == expected_identity:
            # the identity was hashed from the file when it had this stat, settled: the
            # same fact a hash through _prefetch.hash_file records (ADR 0004)
            _prefetch.vouch(self._path, small.state, small.identity)
        return CsvFileBytes(
            self._path,
            delimiter=self._delimiter,
            columns=tuple(c.name for c in self.columns()),
            expected_identity=expected_identity,
        )

    def _without_blank_rows(self, batch: Batch, width: int, *, first_row: int) -> Batch:
        for index, row in enumerate(batch):
            if row and len(row) != width:
                line = self._line_of(first_row + index)
                raise SourceInvalid(
                    f"{str(self._path)!r}: line {line} has {len(row)} fields, "
                    f"the header has {width}",
                    hint="fix the row or quote fields that contain the delimiter",
                )
        return [row for row in batch if row]

    def _line_of(self, row_index: int) -> int:
        """Return the line on which data row ``row_index`` (0-based) ends, by reading again."""
        with self._text() as text:
            reader = csv.reader(text, delimiter=self._delimiter)
            for _ in islice(reader, row_index + 2):  # the header, then rows up to the one
                pass
            return reader.line_num


class CsvRows:
    """One read of a ``CsvSource``: an iterator of row batches that also offers the file.

    Nothing is read until the first batch is asked for, so a connector may take the
    file's raw bytes instead (``raw_csv()``, see ``dpone.ports.source.RawCsv``) and
    still fall back to iterating the rows when the bytes are refused.
    """

    def __init__(self, source: CsvSource, *, batch_size: int, expected_identity: str) -> None:
        self._source = source
        self._expected = expected_identity
        self._rows = source._rows(batch_size=batch_size, expected_identity=expected_identity)

    def __iter__(self) -> CsvRows:
        return self

    def __next__(self) -> Batch:
        return next(self._rows)

    def raw_csv(self) -> RawCsv | None:
        """Return the source file as a ``RawCsv``, or None when it cannot pass through."""
        return self._source.raw_csv(self._expected)

    def raw_csv_size(self) -> int | None:
        """The size of the file ``raw_csv`` offers (None: none), without building it."""
        return self._source.raw_csv_size()
