"""The checks a CSV file's raw chunks pass before a target's own parser may read them.

The rows path parses with Python's ``csv`` module. A target's parser reads the same
records identically only for RFC 4180 input (``dpone.adapters.sources._passthrough``
says which checks and why). Every check is a C-level scan: no Python work per row or
value. This module imports nothing of dpone, so a process forked at start-up can run
it cheaply (``dpone.adapters.sources._prefetch``).
"""

from __future__ import annotations

import csv
import re

__all__ = ["Checker", "CsvRefused"]


class CsvRefused(Exception):
    """The chunk could be read differently by a target's parser; the reason is the text."""


_END_OF_DATA = re.compile(rb"\\\.")
_BLANK_LINE = re.compile(rb"\n\n")  # re's literal search beats bytes.find for this one
_BLANK_LINE_CRLF = re.compile(rb"\n\r?\n")
_LONE_CR = re.compile(rb"\r[^\n]")  # faster than a lookahead; a final CR is checked apart


class Checker:
    """Checks consecutive chunks of one file; keeps the little state that crosses chunks."""

    def __init__(self, delimiter: bytes, columns: tuple[str, ...] | None, *, crlf: bool) -> None:
        self._delimiter = delimiter
        self._columns = columns  # None: record the header's names (``header``), not compare
        self._crlf = crlf
        # A byte other than these in front of an opening quote means it opens mid-field.
        # NUL separates the joined segments; '"' in front is an escaped quote ("").
        self._bad_open = re.compile(b"[^" + re.escape(delimiter) + b'\\n\\x00"]\\x00')
        self._odd = False  # an odd number of quotes so far: inside a quoted section
        self._last = b"\n"  # the byte before the chunk (the start of the file is a line start)
        self._tail = b""  # the last two bytes before the chunk, for two-byte patterns
        self._header_seen = False
        self.newlines = 0  # line feeds outside quoted sections: record ends (header's too)
        self.header: tuple[str, ...] | None = None  # the header's names, once read

    def check(self, chunk: bytes, *, final: bool) -> None:
        if not self._header_seen:
            self._header(chunk)
            self._header_seen = True
        # Single-byte membership tests are memchr scans; the rarer patterns are only
        # searched for when their first byte occurs at all.
        if b"\x00" in chunk:
            raise CsvRefused("NUL byte")
        # Every pattern is at most 3 bytes: one that crosses the border lies in ``edge``
        # (the last two bytes before the chunk and its first two), so the chunk itself
        # is searched as it is, never copied behind the tail.
        edge = self._tail + chunk[:2]
        if (b"\\" in chunk or b"\\" in edge) and (
            _END_OF_DATA.search(chunk) or _END_OF_DATA.search(edge)
        ):
            raise CsvRefused("end-of-data marker")
        if b"\r" in chunk or b"\r" in edge:
            # A CR ending a chunk is decided with the next chunk's first byte (the tail).
            if (
                not self._crlf
                or _LONE_CR.search(chunk)
                or _LONE_CR.search(edge)
                or (final and chunk.endswith(b"\r"))
            ):
                raise CsvRefused("carriage return")
            if _BLANK_LINE_CRLF.search(chunk) or _BLANK_LINE_CRLF.search(edge):
                raise CsvRefused("blank line")
        elif _BLANK_LINE.search(chunk) or _BLANK_LINE.search(edge):
            raise CsvRefused("blank line")
        newlines = chunk.count(b"\n")
        if b'"' in chunk:
            newlines -= self._quotes(chunk)
        self.newlines += newlines
        self._tail = (self._tail + chunk[-2:])[-2:]
        if chunk:
            self._last = chunk[-1:]
        if final and self._odd:
            raise CsvRefused("unterminated quoted field")

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
            raise CsvRefused("a quote inside an unquoted field")
        if quotes % 2:
            self._odd = not self._odd
        return quoted

    def _header(self, chunk: bytes) -> None:
        end = chunk.find(b"\n")
        line = chunk[: end if end >= 0 else len(chunk)]
        if end < 0 or line.count(b'"') % 2:
            raise CsvRefused("header line")
        try:
            text = line.decode("utf-8-sig").rstrip("\r")
        except UnicodeDecodeError:
            raise CsvRefused("header encoding") from None
        names = next(csv.reader([text], delimiter=self._delimiter.decode("ascii")), [])
        self.header = tuple(n.strip() for n in names)
        if self._columns is not None and self.header != self._columns:
            raise CsvRefused("header names")
