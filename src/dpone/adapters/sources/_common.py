"""Shared pieces of the file sources: hashed streaming reads, snapshot identity, type inference."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from dpone.adapters.sources._prefetch import StatKey, hash_file, settled, stat_key, take_prefetched
from dpone.contracts.load import Column, ColumnType
from dpone.errors import ConfigInvalid, SourceInvalid

__all__ = [
    "CHUNK_SIZE",
    "SAMPLE_ROWS",
    "HashingReader",
    "SmallFile",
    "changed_error",
    "check_identity",
    "columns_of",
    "declared_columns",
    "decode_error",
    "file_identity",
    "infer_type",
    "open_hashed_text",
    "open_raw",
    "open_text",
    "read_small",
]

CHUNK_SIZE = 1 << 20
SAMPLE_ROWS = 1000

# What SQLite's INTEGER / REAL affinity converts from text: no "1_000", "nan" or "inf".
_INT_RE = re.compile(r"^[+-]?\d+$")
_REAL_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")


def _missing(path: Path) -> SourceInvalid:
    return SourceInvalid(
        f"source file {str(path)!r} does not exist or cannot be opened",
        hint="check the workload's source.path (relative paths start at the workload file)",
    )


def _unreadable(path: Path, exc: OSError, *, doing: str) -> SourceInvalid:
    """The source error for ``exc``, raised while the file was being ``doing``."""
    if isinstance(exc, FileNotFoundError | IsADirectoryError | PermissionError):
        return _missing(path)
    return SourceInvalid(f"source file {str(path)!r} could not be {doing} ({type(exc).__name__})")


def file_identity(path: Path) -> str:
    """Return ``sha256:<hex>`` of the file's bytes, read in 1 MiB chunks.

    When ``_prefetch.prefetch_identity`` started hashing this very file and the file has not
    changed since (same device, inode, size, mtime and ctime), its result is used.
    """
    early = take_prefetched(path)
    if early is not None:
        return early
    return _hash_file(path)


def _hash_file(path: Path) -> str:
    try:
        digest = hash_file(path)
    except OSError as exc:
        raise _unreadable(path, exc, doing="read") from exc
    return digest


class SmallFile:
    """A whole small file read once: its text and the identity of exactly those bytes.

    ``state`` is the file's (device, inode, size, mtime, ctime) while it was read;
    ``settled`` says it had not been written for ``_prefetch.RACY_NS`` before the read
    (the stat then vouches for the bytes, ADR 0004).
    """

    __slots__ = ("identity", "settled", "state", "text")

    def __init__(self, text: str, identity: str, state: StatKey, *, settled: bool) -> None:
        self.text = text
        self.identity = identity
        self.state = state
        self.settled = settled


def read_small(path: Path, *, limit: int) -> SmallFile | None:
    """Read a file of at most ``limit`` bytes whole, with one open; None for a larger one.

    The identity is the hash of the bytes read, and the text is decoded from those same
    bytes, so what is parsed is what is hashed. A larger file (or one that grew past
    ``limit`` while read) is left to the streaming path.

    A small operation pays for this on every run, so it makes as few system calls as it
    can: ``open``, one ``fstat``, one ``read`` of one byte more than the file's size
    (which reads the whole file and finds its end; a read that returns another count,
    e.g. a file written meanwhile, reads on to the end) and ``close``. ``settled``
    needs no second ``fstat`` after the read: it vouches for the identity by the stat
    *before* the read (``raw_csv()``), and a file written at any moment after that stat,
    during the read included, never has that stat again (a settled file's next write
    is stamped later, and ctime cannot be set back: ADR 0004), so a vouch for bytes
    read while the file changed can never be matched.

    Raises:
        SourceInvalid: the file cannot be opened or read, or is not UTF-8.
    """
    now = time.time_ns()  # before the stat: a later write is stamped at least this
    fd = _open_fd(path)
    try:
        read = _read_whole(fd, limit)
    except OSError as exc:
        raise _unreadable(path, exc, doing="read") from exc
    finally:
        os.close(fd)
    if read is None:
        return None
    before, data = read
    size = before.st_size
    state = stat_key(before)
    try:
        # utf-8-sig drops a byte order mark, as the streaming path's reader does
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise decode_error(path, data.count(b"\n", 0, exc.start) + 1) from None
    return SmallFile(
        text,
        "sha256:" + hashlib.sha256(data).hexdigest(),
        state,
        settled=len(data) == size and stat.S_ISREG(before.st_mode) and settled(state, now),
    )


def _read_whole(fd: int, limit: int) -> tuple[os.stat_result, bytes] | None:
    """The descriptor's stat and all its bytes; None when it has more than ``limit``."""
    before = os.fstat(fd)
    if stat.S_ISDIR(before.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory")
    size = before.st_size
    if size > limit:
        return None
    data = os.read(fd, size + 1)
    if len(data) != size:
        # not the size the stat saw (written meanwhile), or not a regular file (a
        # pipe's size is 0): read on to the end, as far as the limit allows
        data = _read_on(fd, data, limit)
    if len(data) > limit:
        return None
    return before, data


def _read_on(fd: int, first: bytes, limit: int) -> bytes:
    """``first`` and the rest of ``fd`` to its end, stopping once past ``limit`` bytes."""
    parts = [first]
    total = len(first)
    chunk = first
    while chunk and total <= limit:
        chunk = os.read(fd, CHUNK_SIZE)
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def _open_fd(path: Path) -> int:
    """``os.open`` for reading (no ``fstat`` of its own, unlike ``io.FileIO``)."""
    try:
        return os.open(path, os.O_RDONLY)  # close-on-exec, as every Python descriptor
    except OSError as exc:
        raise _unreadable(path, exc, doing="opened") from exc


class HashingReader(io.RawIOBase):
    """A raw reader that hashes every byte it hands up, one chunk per call."""

    def __init__(self, raw: io.RawIOBase) -> None:
        super().__init__()
        self._raw = raw
        self._digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        size = self._raw.readinto(buffer) or 0
        if size:
            self._digest.update(memoryview(buffer)[:size])
        return size

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()

    def identity(self) -> str:
        """Return ``sha256:<hex>`` of the bytes read so far."""
        return "sha256:" + self._digest.hexdigest()


def open_raw(path: Path) -> io.FileIO:
    try:
        return io.FileIO(path, "r")
    except OSError as exc:
        raise _unreadable(path, exc, doing="opened") from exc


def _text(raw: io.RawIOBase) -> TextIO:
    # utf-8-sig drops a byte order mark so it cannot stick to the first column's name;
    # newline="" lets the csv module see the line endings inside quoted fields.
    return io.TextIOWrapper(
        io.BufferedReader(raw, buffer_size=CHUNK_SIZE), encoding="utf-8-sig", newline=""
    )


@contextmanager
def open_hashed_text(path: Path) -> Iterator[tuple[TextIO, HashingReader]]:
    """Open ``path`` as UTF-8 text whose bytes are hashed as they are read."""
    hashing = HashingReader(open_raw(path))
    with _text(hashing) as text:
        yield text, hashing


@contextmanager
def open_text(path: Path) -> Iterator[TextIO]:
    """Open ``path`` as UTF-8 text, for sampling (no hashing)."""
    with _text(open_raw(path)) as text:
        yield text


def changed_error(path: Path) -> SourceInvalid:
    """Return the error for a file whose content is not the recorded snapshot."""
    return SourceInvalid(
        f"source changed while it was read ({str(path)!r} no longer has the content "
        "whose identity the operation recorded); nothing was loaded",
        hint="let the file settle (write it elsewhere and rename it in place), then run again",
    )


def check_identity(hashing: HashingReader, expected: str, path: Path) -> None:
    """Raise SourceInvalid when the bytes read are not the snapshot the operation expects."""
    if hashing.identity() != expected:
        raise changed_error(path)


def decode_error(path: Path, line: int) -> SourceInvalid:
    """Return the error for bytes that are not UTF-8 near ``line``."""
    return SourceInvalid(
        f"{str(path)!r}: line {line} is not valid UTF-8", hint="re-encode the file as UTF-8"
    )


def declared_columns(columns: Mapping[str, ColumnType | str]) -> dict[str, ColumnType]:
    """Validate a declared ``name -> type`` mapping."""
    out: dict[str, ColumnType] = {}
    for name, kind in columns.items():
        try:
            out[name] = ColumnType(kind)
        except ValueError:
            raise ConfigInvalid(
                f"column {name!r} has an unknown type",
                field="source.columns",
                hint=f"use one of: {', '.join(t.value for t in ColumnType)}",
            ) from None
    if not out:
        raise ConfigInvalid("source.columns is empty", field="source.columns")
    return out


def _kind_of(value: object) -> ColumnType | None:
    """Return the narrowest type of one non-empty value (bool before int: bool is an int)."""
    if isinstance(value, bool):
        return ColumnType.BOOLEAN
    if isinstance(value, int):
        return ColumnType.INTEGER
    if isinstance(value, float):
        return ColumnType.REAL
    if isinstance(value, str):
        if _INT_RE.match(value):
            return ColumnType.INTEGER
        if _REAL_RE.match(value):
            return ColumnType.REAL
    return ColumnType.TEXT


def infer_type(values: Iterable[object]) -> ColumnType:
    """Infer a column's type: integer if every non-empty value is one, then real, else text.

    JSON booleans give ``boolean`` when every non-empty value is one.
    """
    kinds: set[ColumnType | None] = {_kind_of(v) for v in values if v is not None and v != ""}
    if not kinds:
        return ColumnType.TEXT
    if kinds == {ColumnType.BOOLEAN}:
        return ColumnType.BOOLEAN
    if kinds == {ColumnType.INTEGER}:
        return ColumnType.INTEGER
    if kinds <= {ColumnType.INTEGER, ColumnType.REAL}:
        return ColumnType.REAL
    return ColumnType.TEXT


def columns_of(names: Iterable[str], types: Mapping[str, ColumnType]) -> tuple[Column, ...]:
    """Build the column tuple in ``names`` order."""
    return tuple(Column(name=n, type=types[n]) for n in names)
