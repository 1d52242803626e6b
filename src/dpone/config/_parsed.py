"""A workload file's parsed YAML, kept between runs so a run need not import PyYAML.

Importing PyYAML and parsing a workload costs 15-30 ms of every ``dpone run`` and every
Airflow DAG parse, for a file that rarely changes. This module keeps the *parsed* YAML
document (plain mappings, lists, strings, numbers, booleans and nulls) under the
SHA-256 of the file's bytes and the installed PyYAML's stamp (ADR 0015). Validation is
not cached: every load still validates the document into a ``Workload``.

A cached document is as trusted as the workload file itself, so the cache is used only
where nobody else can write: a directory owned by this user and not writable by group or
others, files likewise. Anything unexpected (missing, corrupt, foreign, unwritable) is a
miss, never an error: the file is then parsed as always.

Location: ``$DPONE_CACHE_DIR`` (empty: no cache), else ``$XDG_CACHE_HOME/dpone``, else
``~/.cache/dpone``; entries live in its ``workloads/`` folder.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from dpone._version import __version__

__all__ = ["MISS", "cached", "remember"]

#: Returned by :func:`cached` when there is no usable entry.
MISS: Any = object()

_FORMAT = "1"
#: Documents larger than this many nodes are not kept (a workload has a few dozen; a
#: YAML alias bomb expands to millions once its shared references are written out).
_MAX_NODES = 10_000
_MAX_DEPTH = 32
#: Past this many entries the least recently used half is removed on the next write.
_MAX_ENTRIES = 1024
#: A hit marks its entry used (its mtime) at most once a day.
_TOUCH_AFTER_S = 86_400
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def cached(raw: bytes) -> Any:
    """Return the parsed YAML kept for a file whose bytes are ``raw``, or :data:`MISS`."""
    try:
        folder = _folder()
        if folder is None or not _private(os.stat(folder)):
            return MISS
        fd = os.open(folder / _name(raw), os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not _private(st):
                return MISS
            document = msgspec.msgpack.decode(handle.read())
            if time.time() - st.st_mtime > _TOUCH_AFTER_S:
                os.utime(handle.fileno())  # in use: pruning removes the least recently used
    except (OSError, ValueError, msgspec.DecodeError):
        return MISS
    return document if isinstance(document, dict) else MISS


def remember(raw: bytes, document: Any) -> None:
    """Keep ``document``, parsed from ``raw``, when it is plain data of a workload's size."""
    if not isinstance(document, dict) or not _plain(document, [_MAX_NODES], 0):
        return
    temporary: Path | None = None
    try:
        folder = _folder()
        if folder is None:
            return
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(os.stat(folder)):
            return
        payload = msgspec.msgpack.encode(document)
        name = _name(raw)
        temporary = folder / f".{name}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(temporary, folder / name)
        temporary = None
        _prune(folder)
    except (OSError, ValueError, TypeError, OverflowError, UnicodeError):
        return  # a cache that cannot be written is no cache; the run goes on
    finally:
        if temporary is not None:
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _folder() -> Path | None:
    setting = os.environ.get("DPONE_CACHE_DIR")
    if setting is not None:
        return Path(setting) / "workloads" if setting.strip() else None
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "dpone" / "workloads"


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _name(raw: bytes) -> str:
    """The entry's file name: the file's digest and what parsed it."""
    key = hashlib.sha256(raw)
    key.update(f"\0{_FORMAT}\0{__version__}\0{_pyyaml_stamp()}".encode())
    return key.hexdigest()


def _pyyaml_stamp() -> str:
    """The installed PyYAML's ``__init__.py`` (path, size, mtime), found without importing it.

    Another PyYAML may parse the same bytes differently: its documents are other entries.
    """
    module = sys.modules.get("yaml")
    origin = getattr(module, "__file__", None)
    if origin is None:
        import importlib.util

        spec = importlib.util.find_spec("yaml")
        origin = spec.origin if spec is not None else None
    if origin is None:
        raise OSError("PyYAML is not installed")
    st = os.stat(origin)
    return f"{origin}\0{st.st_size}\0{st.st_mtime_ns}"


def _plain(value: object, budget: list[int], depth: int) -> bool:
    """True for mappings with text keys, lists, text, numbers, booleans and nulls only.

    Dates, timestamps, binary and sets (which msgpack would not give back as they were)
    and anything deeper or larger than a workload are not plain.
    """
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        return False
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if type(value) is dict:
        return all(
            type(key) is str and _plain(item, budget, depth + 1) for key, item in value.items()
        )
    if type(value) is list:
        return all(_plain(item, budget, depth + 1) for item in value)
    return False


def _prune(folder: Path) -> None:
    """Remove the least recently used half once there are more than ``_MAX_ENTRIES``."""
    entries = [entry for entry in os.scandir(folder) if not entry.name.startswith(".")]
    if len(entries) <= _MAX_ENTRIES:
        return
    entries.sort(key=lambda entry: entry.stat().st_mtime_ns)
    for entry in entries[: len(entries) // 2]:
        try:
            os.unlink(entry.path)
        except OSError:
            pass
