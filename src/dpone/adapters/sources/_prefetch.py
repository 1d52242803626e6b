"""A file's content hash computed ahead, in a background thread (no other dpone import).

``dpone run`` starts it before importing the rest of dpone (``dpone.cli._early``), so
the identity hash overlaps with start-up that holds the interpreter: ``hashlib`` and
file reads release the GIL. :func:`dpone.adapters.sources._common.file_identity` uses
the prefetched digest only when the file's device, inode, size, mtime and ctime are
the same before the hash, after it and when the identity is asked for; otherwise it
hashes again. Either way every load checks the bytes it reads against the identity
(a DuckDB scan, which reads the file itself, may rely on a vouched identity instead:
:func:`vouched_identity`, ADR 0004).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

__all__ = [
    "RACY_NS",
    "StatKey",
    "hash_file",
    "prefetch_identity",
    "settled",
    "sha256_of_file",
    "stat_key",
    "take_prefetched",
    "vouch",
    "vouched_identity",
]

_CHUNK = 1 << 20

#: A file whose mtime or ctime is less than this before a moment is "racy" then (git's
#: word): a write in the same timestamp tick as its last one (a jiffy on Linux, 1 s on
#: ext3, 2 s on FAT) could leave its size, mtime and ctime as they were, so its stat
#: does not prove its bytes unchanged. A settled file cannot be written without a new,
#: later stamp (ADR 0004).
RACY_NS = 3_000_000_000

StatKey = tuple[int, int, int, int, int]  # dev, inode, size, mtime_ns, ctime_ns


def sha256_of_file(path: Path) -> str:
    """Return ``sha256:<hex>`` of the file's bytes, read in 1 MiB chunks.

    Raises:
        OSError: the file cannot be opened or read.
    """
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as handle:
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while size := handle.readinto(buffer):
            digest.update(view[:size])
    return "sha256:" + digest.hexdigest()


def stat_key(st: os.stat_result) -> StatKey:
    """What identifies a file's bytes to its stat: device, inode, size, mtime, ctime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat_key(path: Path) -> StatKey:
    return stat_key(os.stat(path))


def settled(key: StatKey, now_ns: int) -> bool:
    """Whether a file with this stat had not been written for ``RACY_NS`` at ``now_ns``."""
    return max(key[3], key[4]) < now_ns - RACY_NS


#: Identities whose stat vouches for them: by resolved path, the stat the file had before
#: and after it was hashed, and had not changed for ``RACY_NS`` before the hash began.
_VOUCHED: dict[str, tuple[StatKey, str]] = {}


def vouch(path: Path, key: StatKey, identity: str) -> None:
    """Record that ``identity`` was hashed from ``path`` while it had the settled stat ``key``."""
    with _LOCK:
        _VOUCHED[str(path.resolve())] = (key, identity)


def vouched_identity(path: Path, key: StatKey) -> str | None:
    """The identity this process hashed from ``path`` when its stat was ``key``, if settled.

    A file that still has that device, inode, size, mtime and ctime has not been written
    since (it was settled when hashed), so it still has those bytes.
    """
    found = _VOUCHED.get(str(path.resolve())) if _VOUCHED else None
    return found[1] if found is not None and found[0] == key else None


def hash_file(path: Path) -> str:
    """``sha256_of_file``, vouched for (:func:`vouched_identity`) when the file was settled.

    Raises:
        OSError: the file cannot be opened or read.
    """
    now = time.time_ns()  # before the stat: a write after it is stamped later than this
    before = _stat_key(path)
    identity = sha256_of_file(path)
    if settled(before, now) and _stat_key(path) == before:
        vouch(path, before, identity)
    return identity


class _Prefetch:
    """One file hashed in a daemon thread; the digest counts only for an unchanged file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.key: StatKey | None = None
        self.identity: str | None = None
        self.settled = False
        self._thread = threading.Thread(target=self._run, name="dpone-identity", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            now = time.time_ns()
            before = _stat_key(self.path)
            identity = sha256_of_file(self.path)
            if _stat_key(self.path) == before:
                self.key, self.identity = before, identity
                self.settled = settled(before, now)
        except Exception:  # noqa: BLE001, S110 - the real call hashes again and reports it
            pass

    def result(self) -> str | None:
        """The digest, if the file still is exactly what was hashed; else None."""
        self._thread.join()
        if self.identity is None:
            return None
        try:
            unchanged = _stat_key(self.path) == self.key
        except OSError:
            return None
        if not unchanged or self.key is None:
            return None
        if self.settled:
            vouch(self.path, self.key, self.identity)
        return self.identity


#: Prefetched identities by resolved path; each is taken at most once.
_PREFETCHED: dict[str, _Prefetch] = {}
_LOCK = threading.Lock()


def prefetch_identity(path: Path) -> None:
    """Start hashing ``path`` in a background thread, for a later ``file_identity``.

    It changes no result (see the module docstring); an error is left to the real call.
    """
    key = str(path.resolve())
    with _LOCK:
        if key not in _PREFETCHED:
            _PREFETCHED[key] = _Prefetch(Path(key))


def take_prefetched(path: Path) -> str | None:
    """The prefetched identity of ``path`` if there is one and the file is unchanged."""
    if not _PREFETCHED:
        return None
    with _LOCK:
        pending = _PREFETCHED.pop(str(path.resolve()), None)
    return pending.result() if pending is not None else None
