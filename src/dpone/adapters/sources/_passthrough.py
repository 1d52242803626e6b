"""A CSV file's raw bytes for targets that parse CSV themselves (COPY, read_csv).

The rows path parses with Python's ``csv`` module. A target's parser reads the same
records identically only for RFC 4180 input, so every chunk is checked before it is
handed out (all checks are C-level scans: no Python work per row or value):

- a quote that starts a quoted section must start a field (Python treats a quote inside
  an unquoted field as data; PostgreSQL and DuckDB would start quoting there). Whether
  a quote opens or closes follows from the parity of the quotes before it, so only the
  bytes in front of the opening quotes are looked at;
- no blank line (Python skips it; a target reads a NULL row or fails), no lone CR, no
  NUL byte, no ``\\.`` (PostgreSQL's end-of-data marker);
- the header line's names are the plan's columns.

Anything else raises ``RawCsvRefused`` and the connector falls back to the rows.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpone.adapters.sources._common import CHUNK_SIZE, changed_error, open_raw
from dpone.adapters.sources._prefetch import StatKey, settled, stat_key, vouched_identity
from dpone.ports.source import RAW_CSV_DELIMITERS, RawCsvRefused

__all__ = ["CsvFileBytes"]

_END_OF_DATA = re.compile(rb"\\\.")
_BLANK_LINE = re.compile(rb"\n\n")  # re's literal search beats bytes.find for this one
_BLANK_LINE_CRLF = re.compile(rb"\n\r?\n")
_LONE_CR = re.compile(rb"\r[^\n]")  # faster than a lookahead; a final CR is checked apart


class _Checker:
    """Checks consecutive chunks of one file; keeps the little state that crosses chunks."""

    def __init__(self, delimiter: bytes, columns: tuple[str, ...], *, crlf: bool) -> None:
        self._delimiter = delimiter
        self._columns = columns
        self._crlf = crlf
        # A byte other than these in front of an opening quote means it opens mid-field.
        # NUL separates the joined segments; '"' in front is an escaped quote ("").
        self._bad_open = re.compile(b"[^" + re.escape(delimiter) + b'\\n\\x00"]\\x00')
        self._odd = False  # an odd number of quotes so far: inside a quoted section
        self._last = b"\n"  # the byte before the chunk (the start of the file is a line start)
        self._tail = b""  # the last two bytes before the chunk, for two-byte patterns
        self._header_seen = False
        self.newlines = 0  # line feeds outside quoted sections: record ends (header's too)

    def check(self, chunk: bytes, *, final: bool) -> None:
        if not self._header_seen:
            self._header(chunk)
            self._header_seen = True
        # Single-byte membership tests are memchr scans; the rarer patterns are only
        # searched for when their first byte occurs at all.
        if b"\x00" in chunk:
            raise RawCsvRefused("NUL byte")
        # Every pattern is at most 3 bytes: one that crosses the border lies in ``edge``
        # (the last two bytes before the chunk and its first two), so the chunk itself
        # is searched as it is, never copied behind the tail.
        edge = self._tail + chunk[:2]
        if (b"\\" in chunk or b"\\" in edge) and (
            _END_OF_DATA.search(chunk) or _END_OF_DATA.search(edge)
        ):
            raise RawCsvRefused("end-of-data marker")
        if b"\r" in chunk or b"\r" in edge:
            # A CR ending a chunk is decided with the next chunk's first byte (the tail).
            if (
                not self._crlf
                or _LONE_CR.search(chunk)
                or _LONE_CR.search(edge)
                or (final and chunk.endswith(b"\r"))
            ):
                raise RawCsvRefused("carriage return")
            if _BLANK_LINE_CRLF.search(chunk) or _BLANK_LINE_CRLF.search(edge):
                raise RawCsvRefused("blank line")
        elif _BLANK_LINE.search(chunk) or _BLANK_LINE.search(edge):
            raise RawCsvRefused("blank line")
        newlines = chunk.count(b"\n")
        if b'"' in chunk:
            newlines -= self._quotes(chunk)
        self.newlines += newlines
        self._tail = (self._tail + chunk[-2:])[-2:]
        if chunk:
            self._last = chunk[-1:]
        if final and self._odd:
            raise RawCsvRefused("unterminated quoted field")

    def _quotes(self, chunk: bytes) -> int:
        """Check where quoted sections open; return the line feeds inside them."""
        parts = chunk.split(b'"')
        quotes = len(parts) - 1
        # parts[i] lies inside a quoted section when the quotes before it are odd.
        quoted = b"".join(parts[0 if self._odd else 1 :: 2]).count(b"\n")
        # parts[i] precedes the chunk's i-th quote; the (1-based) odd quotes of the file
        # open a quoted section, so keep the segments in front of those.
        start = 1 if self._odd else 0
        heads = parts[start:quotes:2]
        if heads and start == 0:
            heads[0] = self._last + heads[0]
        if heads and self._bad_open.search(b"\x00".join(heads) + b"\x00"):
            raise RawCsvRefused("a quote inside an unquoted field")
        if quotes % 2:
            self._odd = not self._odd
        return quoted

    def _header(self, chunk: bytes) -> None:
        end = chunk.find(b"\n")
        line = chunk[: end if end >= 0 else len(chunk)]
        if end < 0 or line.count(b'"') % 2:
            raise RawCsvRefused("header line")
        try:
            text = line.decode("utf-8-sig").rstrip("\r")
        except UnicodeDecodeError:
            raise RawCsvRefused("header encoding") from None
        names = next(csv.reader([text], delimiter=self._delimiter.decode("ascii")), [])
        if tuple(n.strip() for n in names) != self._columns:
            raise RawCsvRefused("header names")


class CsvFileBytes:
    """The ``RawCsv`` of one CSV file: hashed, checked chunks and a final re-check.

    Args:
        path: the file.
        delimiter: one of ``RAW_CSV_DELIMITERS``.
        columns: the header's names (from the source's own header parse).
        expected_identity: the operation's recorded ``sha256:<hex>`` of the file.
    """

    def __init__(
        self, path: Path, *, delimiter: str, columns: tuple[str, ...], expected_identity: str
    ) -> None:
        if delimiter not in RAW_CSV_DELIMITERS:
            raise ValueError(f"delimiter {delimiter!r} cannot pass through")
        self._path = path
        self._delimiter = delimiter
        self._columns = columns
        self._expected = expected_identity
        self._state: StatKey | None = None
        self._settled = False
        self._records: int | None = None

    @property
    def path(self) -> Path:
        """The file."""
        return self._path

    @property
    def delimiter(self) -> str:
        """The field separator."""
        return self._delimiter

    @property
    def columns(self) -> tuple[str, ...]:
        """The header's names, in file order."""
        return self._columns

    def chunks(self, *, crlf: bool, verified_after: bool = False) -> Iterator[bytes]:
        """Yield checked 1 MiB chunks; before the last is handed out, prove the snapshot.

        The proof is the hash of the bytes read, except when this process hashed the
        identity from this very file, settled, with the stat it has at this open
        (``vouched_identity``): then no byte is hashed, and the same stat once more
        after the last read proves that nothing wrote to the file from before its
        identity hash to the end of this read (ADR 0004's amendment). With
        ``verified_after`` (a target that reads the file itself and calls
        ``verify_unchanged`` after its read) that last stat is left to that call.
        """
        checker = _Checker(self._delimiter.encode("ascii"), self._columns, crlf=crlf)
        now = time.time_ns()  # before the stat: a later write is stamped at least this
        with self._open() as handle:
            self._state = stat_key(os.fstat(handle.fileno()))
            self._settled = settled(self._state, now)
            vouched = vouched_identity(self._path, self._state) == self._expected
            digest = None if vouched else hashlib.sha256()
            chunk = handle.read(CHUNK_SIZE)
            while chunk:
                following = handle.read(CHUNK_SIZE)
                if digest is not None:
                    digest.update(chunk)
                checker.check(chunk, final=not following)
                if not following:
                    self._prove(digest, stat_again=not verified_after)
                    # The header's line feed ends no record; a last record may lack one.
                    self._records = checker.newlines - 1 + (not chunk.endswith(b"\n"))
                yield chunk
                chunk = following
            if self._records is None:  # an empty file
                self._prove(digest, stat_again=not verified_after)

    def records(self) -> int:
        """Return the number of records after the header (once ``chunks`` is exhausted)."""
        if self._records is None:
            raise RuntimeError("records() before chunks() was read to the end")
        return self._records

    def verify_unchanged(self) -> None:
        """Check that the file is still the very file ``chunks`` read, and the snapshot.

        Its device, inode, size, mtime and ctime must be those ``chunks`` saw when it
        opened the file. Any write since then stamps a new mtime and ctime, unless the
        file was written less than ``_prefetch.RACY_NS`` before that open (the same
        timestamp tick could be reused): such a file is hashed again. ADR 0004 says why
        this holds.
        """
        if self._state is None:
            raise RuntimeError("verify_unchanged() before chunks()")
        self._same_stat()
        if not self._settled:
            self._hash_again()

    def _prove(self, digest: Any, *, stat_again: bool) -> None:
        """After the last read: raise "source changed" unless the bytes are the snapshot."""
        if digest is not None:
            if "sha256:" + digest.hexdigest() != self._expected:
                raise changed_error(self._path)
        elif stat_again:
            self._same_stat()  # vouched: no write since the identity hash, none since

    def _same_stat(self) -> None:
        """Raise "source changed" unless the path still has the stat ``chunks`` opened."""
        try:
            # Opened, not just stat'ed: a network file system (NFS's close-to-open
            # consistency) revalidates the attributes of a file being opened.
            with io.FileIO(self._path, "r") as handle:
                now = stat_key(os.fstat(handle.fileno()))
        except OSError:
            raise changed_error(self._path) from None
        if now != self._state:
            raise changed_error(self._path)

    def _hash_again(self) -> None:
        digest = hashlib.sha256()
        with self._open() as handle:
            before = stat_key(os.fstat(handle.fileno()))
            while chunk := handle.read(CHUNK_SIZE):
                digest.update(chunk)
            after = stat_key(os.fstat(handle.fileno()))
        if (
            "sha256:" + digest.hexdigest() != self._expected
            or not before == after == self._state
            or stat_key(os.stat(self._path)) != self._state
        ):
            raise changed_error(self._path)

    def loaded(self, rows: int) -> None:
        """Nothing to count here; the runtime wraps this object to count."""

    def _open(self) -> io.FileIO:
        return open_raw(self._path)
