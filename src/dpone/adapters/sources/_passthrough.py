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

Anything else raises ``RawCsvRefused`` and the connector falls back to the rows. The
checks themselves are in ``_csvcheck``.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpone.adapters.sources._common import CHUNK_SIZE, changed_error, open_raw
from dpone.adapters.sources._csvcheck import Checker, CsvRefused
from dpone.adapters.sources._prefetch import (
    StatKey,
    checked_ahead,
    settled,
    stat_key,
    vouched_identity,
)
from dpone.ports.source import RAW_CSV_DELIMITERS, RawCsvRefused

__all__ = ["CsvFileBytes"]


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
        checker = Checker(self._delimiter.encode("ascii"), self._columns, crlf=crlf)
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
                try:
                    checker.check(chunk, final=not following)
                except CsvRefused as exc:
                    raise RawCsvRefused(str(exc)) from None
                if not following:
                    self._prove(digest, stat_again=not verified_after)
                    # The header's line feed ends no record; a last record may lack one.
                    self._records = checker.newlines - 1 + (not chunk.endswith(b"\n"))
                yield chunk
                chunk = following
            if self._records is None:  # an empty file
                self._prove(digest, stat_again=not verified_after)

    def records_checked_ahead(self, *, crlf: bool) -> int | None:
        """The record count of a check made before the target's read, while it still holds.

        ``dpone run`` checks a large CSV file in a process forked at start-up, beside the
        imports (``_prefetch.prefetch_identity``), for a target that reads the file
        itself. That check holds for this read when the identity hash vouches for the
        file's current stat (settled, unchanged since) and the check ran on the same
        stat, with this delimiter and ``crlf``: the bytes checked are the bytes the
        target reads. Then ``chunks`` need not run; ``verify_unchanged`` after the
        target's read proves nothing wrote to the file meanwhile, as after ``chunks``.

        Returns None when there is no such check (the caller reads ``chunks``).

        Raises:
            RawCsvRefused: the check refused the file, or its header is not ``columns``.
        """
        now = time.time_ns()
        state: StatKey | None
        try:
            with self._open() as handle:
                state = stat_key(os.fstat(handle.fileno()))
        except OSError:
            state = None  # no check holds; chunks() reports it
        ahead = checked_ahead(
            self._path, state, identity=self._expected, delimiter=self._delimiter, crlf=crlf
        )
        if ahead is None or state is None:
            return None
        if ahead.refused is not None:
            raise RawCsvRefused(ahead.refused)
        if ahead.header != self._columns:
            raise RawCsvRefused("header names")
        self._state, self._settled, self._records = state, settled(state, now), ahead.records
        return ahead.records

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
