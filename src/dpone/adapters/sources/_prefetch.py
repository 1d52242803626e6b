"""A file's content hash computed ahead, in a background thread (no other dpone import).

``dpone run`` starts it before importing the rest of dpone (``dpone.cli._early``), so
the identity hash overlaps with start-up that holds the interpreter: ``hashlib`` and
file reads release the GIL. :func:`dpone.adapters.sources._common.file_identity` uses
the prefetched digest only when the file's device, inode, size, mtime and ctime are
the same before the hash, after it and when the identity is asked for; otherwise it
hashes again. Either way every load checks the bytes it reads against the identity.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

__all__ = ["prefetch_identity", "sha256_of_file", "take_prefetched"]

_CHUNK = 1 << 20


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


def _stat_key(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Prefetch:
    """One file hashed in a daemon thread; the digest counts only for an unchanged file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.key: tuple[int, ...] | None = None
        self.identity: str | None = None
        self._thread = threading.Thread(target=self._run, name="dpone-identity", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            before = _stat_key(self.path)
            identity = sha256_of_file(self.path)
            if _stat_key(self.path) == before:
                self.key, self.identity = before, identity
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
        return self.identity if unchanged else None


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
