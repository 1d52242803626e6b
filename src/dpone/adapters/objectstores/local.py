"""Local directory object store: the embedded default (atomic rename, link and a lock file)."""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from dpone.contracts.objects import StoredObject
from dpone.errors import ConfigInvalid, DponeError, ObjectStoreUnavailable

try:  # POSIX advisory locks serialize conditional updates across processes on one host
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LocalObjectStore", "check_key"]

_TMP = ".dpone-tmp-"
_LOCK = ".dpone-store.lock"


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative ``/``-separated key, else raise ConfigInvalid."""
    parts = PurePosixPath(key).parts
    if (
        not key
        or key.startswith("/")
        or "\\" in key
        or any(p in ("", ".", "..") for p in key.split("/"))
        or any(p.startswith(_TMP) or p == _LOCK for p in parts)
    ):
        raise ConfigInvalid(
            f"object key {key!r} is not a relative a/b/c key",
            field="key",
            hint="use letters, digits, '-', '_', '=' and '.' in '/'-separated parts",
        )
    return key


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _describe(key: str, path: Path) -> StoredObject | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    # every write renames a new file into place, so the inode changes with each version
    etag = f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"
    return StoredObject(key=key, size=st.st_size, etag=etag, modified_at=st.st_mtime)


class LocalObjectStore:
    """Objects are files under ``root``; each write is a temp file renamed into place.

    - ``put``: write + fsync a temp file, ``rename`` over the key, fsync the directory.
    - ``put_if_absent``: ``link`` the temp file to the key (fails if it exists): atomic.
    - ``put_if_match`` and ``delete``: under an exclusive ``flock`` on a lock file in
      ``root``, so a compare and its rename are one step for every process on the host.
      The kernel drops the lock when a holder dies (SIGKILL included).

    Args:
        root: the directory; created when missing.
    """

    def __init__(self, root: str | Path) -> None:
        if not str(root):
            raise ConfigInvalid("the local object store needs a directory", field="store.path")
        self._root = Path(root).expanduser().resolve()
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._error(exc, "create the store directory") from exc

    @property
    def kind(self) -> str:
        """Adapter name."""
        return "local"

    @property
    def root(self) -> Path:
        """The resolved directory."""
        return self._root

    def location(self) -> str:
        """Return ``local:<abs dir>``."""
        return f"local:{self._root}"

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*check_key(key).split("/"))

    # ------------------------------------------------------------------ reads
    def read(self, key: str) -> tuple[bytes, StoredObject] | None:
        """Return bytes and description (described from the open file), or None."""
        path = self._path(key)
        try:
            with path.open("rb") as handle:
                st = os.fstat(handle.fileno())
                data = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(exc, "read an object") from exc
        etag = f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"
        return data, StoredObject(key=key, size=st.st_size, etag=etag, modified_at=st.st_mtime)

    def head(self, key: str) -> StoredObject | None:
        """Describe ``key`` or return None."""
        try:
            return _describe(key, self._path(key))
        except OSError as exc:
            raise self._error(exc, "describe an object") from exc

    def list(self, prefix: str) -> list[StoredObject]:
        """Every object under the directory ``prefix`` (``""`` for all), sorted by key."""
        base = self._root if not prefix.strip("/") else self._path(prefix.strip("/"))
        found: list[StoredObject] = []
        try:
            for directory, _dirs, files in os.walk(base):
                for name in files:
                    if name.startswith(_TMP) or name == _LOCK:
                        continue
                    path = Path(directory) / name
                    key = path.relative_to(self._root).as_posix()
                    described = _describe(key, path)
                    if described is not None:
                        found.append(described)
        except OSError as exc:
            raise self._error(exc, "list objects") from exc
        return sorted(found, key=lambda o: o.key)

    # ------------------------------------------------------------------ writes
    def put(self, key: str, data: bytes) -> StoredObject:
        """Replace ``key`` atomically (rename) and durably."""
        path = self._path(key)
        try:
            tmp = self._temp(path, data)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise self._error(exc, "write an object") from exc
        return self._described(key, path)

    def put_if_absent(self, key: str, data: bytes) -> StoredObject | None:
        """Create ``key`` with ``link``, which fails when the key exists."""
        path = self._path(key)
        try:
            tmp = self._temp(path, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return None
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise self._error(exc, "create an object") from exc
        return self._described(key, path)

    def put_if_match(self, key: str, data: bytes, *, etag: str) -> StoredObject | None:
        """Compare the tag and rename, both under the store's lock."""
        path = self._path(key)
        try:
            tmp = self._temp(path, data)
            try:
                with self._locked():
                    current = _describe(key, path)
                    if current is None or current.etag != etag:
                        return None
                    os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise self._error(exc, "update an object") from exc
        return self._described(key, path)

    def delete(self, key: str) -> None:
        """Remove ``key`` (absent is fine) and empty parent directories."""
        path = self._path(key)
        try:
            with self._locked():
                path.unlink(missing_ok=True)
            parent = path.parent
            while parent != self._root:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent
        except OSError as exc:
            raise self._error(exc, "delete an object") from exc

    def close(self) -> None:
        """Nothing stays open. Idempotent."""

    # ------------------------------------------------------------------ helpers
    def _temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{_TMP}{path.name}-{os.getpid()}-{secrets.token_hex(4)}")
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def _described(self, key: str, path: Path) -> StoredObject:
        described = _describe(key, path)
        if described is None:  # pragma: no cover - deleted between write and stat
            raise ObjectStoreUnavailable("an object vanished right after it was written")
        return described

    @contextmanager
    def _locked(self) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover - Windows
            yield
            return
        fd = os.open(self._root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def _error(self, exc: OSError, what: str) -> DponeError:
        name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR):
            return ConfigInvalid(
                f"could not {what} in the local object store ({name})",
                field="store.path",
                hint="check the directory exists and is writable",
            )
        return ObjectStoreUnavailable(f"could not {what} in the local object store ({name})")
