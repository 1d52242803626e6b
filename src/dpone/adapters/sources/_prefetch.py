"""A file's content hash computed ahead, beside start-up (no other dpone import).

``dpone run`` starts it before importing the rest of dpone (``dpone.cli._early``), so
the identity hash overlaps with start-up that holds the interpreter: ``hashlib`` and
file reads release the GIL, so a background thread does it. A CSV file bound for a
target that reads the file itself (DuckDB) is also checked ahead (``_csvcheck``): those
scans hold the GIL, so a process forked before any thread exists hashes and checks it
on the core the imports leave idle, and sends both back through a pipe; the target's
scan then has every core (``checked_ahead``, ADR 0004's amendment of session 6).
:func:`dpone.adapters.sources._common.file_identity` uses
the prefetched digest only when the file's device, inode, size, mtime and ctime are
the same before the hash, after it and when the identity is asked for; otherwise it
hashes again. Either way every load checks the bytes it reads against the identity
(a DuckDB scan, which reads the file itself, may rely on a vouched identity instead:
:func:`vouched_identity`, ADR 0004).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "CHECK_AHEAD_MAX_BYTES",
    "RACY_NS",
    "CheckedAhead",
    "StatKey",
    "checked_ahead",
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


class CheckedAhead(NamedTuple):
    """What the CSV checks found in a file with one stat (``_csvcheck.Checker``)."""

    header: tuple[str, ...]
    records: int  # records after the header
    refused: str | None  # why a target's parser could read the file differently


#: A forked check may still be running when the target asks: wait this long, no longer.
_CHECK_WAIT_S = 0.05


def checked_ahead(
    path: Path, key: StatKey | None, *, identity: str, delimiter: str, crlf: bool
) -> CheckedAhead | None:
    """The check made ahead of ``path`` while it had the settled stat ``key``, if any.

    It holds only when ``key`` (the file's stat now; None when it cannot be read) is the
    stat that vouched for ``identity`` and the check ran with ``delimiter`` and ``crlf``:
    a file that still has that stat has the bytes checked. Each check is used once; one
    that cannot be used has its child ended at once.
    """
    pending = _PREFETCHED_CHECKS.pop(str(path.resolve()), None)
    if pending is None:
        return None
    if (
        key is None
        or vouched_identity(path, key) != identity
        or (pending.key, pending.delimiter, True) != (key, delimiter, crlf)
    ):
        pending._finish(kill=True)  # it checked other bytes, or as another target reads
        return None
    return pending.collect_check()


def _child_hash_and_check(path: Path, delimiter: str, out: int, parent: int) -> None:
    """In the forked child: send the identity line, then the check line (JSON each).

    The child stops as soon as its parent is gone (it checks between chunks), so a
    ``dpone run`` killed mid-way leaves no process reading on for seconds.
    """
    from dpone.adapters.sources._csvcheck import Checker, CsvRefused  # imported before fork

    now = time.time_ns()
    before = _stat_key(path)
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as handle:
        while chunk := handle.read(_CHUNK):
            if os.getppid() != parent:
                return
            digest.update(chunk)
    if _stat_key(path) != before:
        return
    _send(
        out,
        {
            "key": before,
            "identity": "sha256:" + digest.hexdigest(),
            "settled": settled(before, now),
        },
    )
    checker = Checker(delimiter.encode("ascii"), None, crlf=True)
    refused = None
    last = b""
    try:
        with path.open("rb", buffering=0) as handle:
            chunk = handle.read(_CHUNK)
            while chunk:
                if os.getppid() != parent:
                    return
                following = handle.read(_CHUNK)
                checker.check(chunk, final=not following)
                last, chunk = chunk, following
    except CsvRefused as exc:
        refused = str(exc)
    if _stat_key(path) != before:
        return
    records = checker.newlines - 1 + (bool(last) and not last.endswith(b"\n"))
    _send(out, {"header": checker.header or (), "records": records, "refused": refused})


def _send(out: int, message: dict[str, object]) -> None:
    data = (json.dumps(message) + "\n").encode("utf-8")
    while data:
        data = data[os.write(out, data) :]


def _quiet_child(keep: int) -> int:
    """In the forked child: no stdio of the parent's, no descriptor but ``keep`` open.

    Whoever reads the parent's output to its end, or holds a lock through a descriptor
    the parent inherited (``flock``), waits for the parent alone. Returns the descriptor
    ``keep`` now has. The open descriptors are listed, not ranged over: a process may be
    allowed a billion of them, and ``close_range`` is not everywhere.
    """
    while keep < 3:  # started with stdio closed: the pipe took one of their numbers
        keep = os.dup(keep)  # the lower copies are replaced by the dup2s below
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(quiet, fd)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, already closed
    return keep


def _close(fd: int | None) -> None:
    """Close ``fd`` if there is one; an error closing it changes nothing here."""
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class _ForkedPrefetch:
    """One CSV file hashed, then checked, by a child process forked for it.

    Forked only while this process runs no other thread (``_may_fork``), so the child
    is a plain copy of a single-threaded interpreter that imports nothing. It ends with
    ``_exit`` (no atexit handler, no buffered output of the parent runs twice), when its
    parent is gone, or when the parent ends it (``_end_children`` at exit). Nothing the
    parent asks of it raises: any failure means "no prefetch", and the run hashes and
    checks the file itself, as without it.
    """

    def __init__(self, path: Path, delimiter: str) -> None:
        self.path = path
        self.delimiter = delimiter
        self.key: StatKey | None = None  # the settled stat the child hashed and checked
        self._buffer = b""
        # Imported here, not in the child: a child never waits on an import lock.
        from dpone.adapters.sources import _csvcheck  # noqa: F401

        parent = os.getpid()
        read, write = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            raise
        if pid == 0:  # the child
            code = 1
            try:
                write = _quiet_child(write)
                _child_hash_and_check(path, delimiter, write, parent)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self._pid: int | None = pid
        self._fd: int | None = read
        # A descriptor for the child itself: a kill can never reach another process that
        # reused the pid (a child the kernel reaped at once when SIGCHLD is ignored).
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None
        _LIVE.add(self)

    def _line(self, timeout: float | None) -> dict[str, object] | None:
        """The child's next message; None when it ended without one or is not done in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._fd is not None and b"\n" not in self._buffer:
            if deadline is not None:
                poller = select.poll()
                poller.register(self._fd, select.POLLIN)
                left = deadline - time.monotonic()
                if left <= 0 or not poller.poll(left * 1000):
                    return None
            data = os.read(self._fd, 1 << 16)
            if not data:
                self._finish()
                break
            self._buffer += data
        line, found, self._buffer = self._buffer.partition(b"\n")
        if not found:
            return None
        message = json.loads(line)
        return message if isinstance(message, dict) else None

    def _finish(self, *, kill: bool = False, wait: bool = True) -> None:
        """Close the pipe and reap the child (ending it first with ``kill``). Never raises.

        Without ``wait`` a child still running is left to init once it ends (at exit).
        """
        hung_up = self._hung_up()
        _close(self._fd)
        self._fd = None
        if self._pid is not None:
            if kill and not hung_up:
                self._kill()
            try:
                os.waitpid(self._pid, 0 if wait else os.WNOHANG)
            except OSError:
                pass  # already reaped by the kernel (SIGCHLD ignored)
            self._pid = None
        _close(self._pidfd)
        self._pidfd = None
        _LIVE.discard(self)

    def _hung_up(self) -> bool:
        """Whether the child closed its end of the pipe: it has exited (it held that end)."""
        if self._fd is None:
            return False
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        try:
            return any(event & select.POLLHUP for _, event in poller.poll(0))
        except OSError:
            return False

    def _kill(self) -> None:
        """SIGKILL the child, which was seen alive (its end of the pipe open). Never raises."""
        import signal  # only here: a run that kills no child never loads it

        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                return
            except ProcessLookupError:
                return  # it has exited since
            except OSError:
                pass  # refused (a sandbox's rule): by pid, as without a pidfd
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass

    def result(self) -> str | None:
        """The digest, if the file still is exactly what was hashed; else None."""
        try:
            identity = self._take_identity()
        except Exception:  # noqa: BLE001 - no prefetch: the run hashes the file itself
            identity = None
        if identity is None or self.key is None:
            self._finish(kill=True)
        return identity

    def _take_identity(self) -> str | None:
        message = self._line(timeout=None)
        if message is None:
            return None
        raw_key, identity = message.get("key"), message.get("identity")
        if not (
            isinstance(raw_key, list)
            and len(raw_key) == 5
            and all(isinstance(v, int) for v in raw_key)
            and isinstance(identity, str)
        ):
            return None
        key: StatKey = (raw_key[0], raw_key[1], raw_key[2], raw_key[3], raw_key[4])
        if _stat_key(self.path) != key:
            return None
        if message.get("settled") is True:
            self.key = key  # only a settled file's check can be relied on
            vouch(self.path, key, identity)
            with _LOCK:
                _PREFETCHED_CHECKS[str(self.path)] = self
        return identity

    def collect_check(self) -> CheckedAhead | None:
        """The child's check (the child ended and reaped), waiting a little for it at most."""
        try:
            message = self._line(timeout=_CHECK_WAIT_S)
        except Exception:  # noqa: BLE001 - no check ahead: the target checks as it reads
            message = None
        self._finish(kill=message is None)
        if message is None:
            return None
        header, records, refused = (message.get(k) for k in ("header", "records", "refused"))
        if not (
            isinstance(header, list)
            and all(isinstance(n, str) for n in header)
            and isinstance(records, int)
            and (refused is None or isinstance(refused, str))
        ):
            return None
        return CheckedAhead(header=tuple(header), records=records, refused=refused)


#: Children still running or unreaped; ended when this process exits.
_LIVE: set[_ForkedPrefetch] = set()


def _end_children(*, wait: bool = False) -> None:
    """End every child still running; at exit one that does not end at once is init's."""
    for pending in list(_LIVE):
        pending._finish(kill=True, wait=wait)


def _forget_children() -> None:
    """In a process forked from this one (not a prefetch child): none of these are its."""
    _LIVE.clear()
    _PREFETCHED.clear()
    _PREFETCHED_CHECKS.clear()


_exit_hook = False


def _at_exit_end_children() -> None:
    global _exit_hook  # noqa: PLW0603 - registered once per process
    if not _exit_hook:
        import atexit

        atexit.register(_end_children)
        # a process forked from this one (without exec) has no child of ours to end,
        # and no pipe of ours to read
        os.register_at_fork(after_in_child=_forget_children)
        _exit_hook = True


#: Prefetched identities by resolved path; each is taken at most once.
_PREFETCHED: dict[str, _Prefetch | _ForkedPrefetch] = {}
#: Forked prefetches whose check is still to be collected, by resolved path.
_PREFETCHED_CHECKS: dict[str, _ForkedPrefetch] = {}
_LOCK = threading.Lock()


def prefetch_identity(path: Path, *, check_csv: str | None = None) -> None:
    """Start hashing ``path`` beside start-up, for a later ``file_identity``.

    With ``check_csv`` (the file's delimiter), on Linux, for a file of at most
    ``CHECK_AHEAD_MAX_BYTES`` and while this process runs no other thread, a forked
    child hashes the file and then runs the CSV checks with ``crlf`` for a target that
    reads the file itself (``checked_ahead``); otherwise a thread hashes it. It changes
    no result (see the module docstring); an error is left to the real call.
    """
    key = str(path.resolve())
    with _LOCK:
        if key in _PREFETCHED:
            return
    pending: _Prefetch | _ForkedPrefetch | None = None
    if check_csv is not None and _may_fork():
        try:
            if os.stat(key).st_size <= CHECK_AHEAD_MAX_BYTES:
                # not under _LOCK: a lock held at the fork would stay held in the child
                pending = _ForkedPrefetch(Path(key), check_csv)
                _at_exit_end_children()
        except OSError:
            pass  # no process to spare, or no file: a thread hashes it (or reports it)
    with _LOCK:
        if key not in _PREFETCHED:
            _PREFETCHED[key] = pending if pending is not None else _Prefetch(Path(key))
            return
    if isinstance(pending, _ForkedPrefetch):  # another call was first
        pending._finish(kill=True)


#: Above this size the checks cannot end before the scan starts (they run at about
#: 2 ns a byte, after the hash), so the target checks as it reads, as without a prefetch.
CHECK_AHEAD_MAX_BYTES = 64 << 20


def _may_fork() -> bool:
    """Forking copies only the calling thread: safe while it is the only one (Linux).

    Threads that Python does not know of (a native library's) count too: the kernel's
    list of this process's tasks must hold this one alone.
    """
    if not sys.platform.startswith("linux") or threading.active_count() != 1:
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def take_prefetched(path: Path) -> str | None:
    """The prefetched identity of ``path`` if there is one and the file is unchanged."""
    if not _PREFETCHED:
        return None
    with _LOCK:
        pending = _PREFETCHED.pop(str(path.resolve()), None)
    return pending.result() if pending is not None else None
