"""Plain JSON Lines append target: capability ``none``, so its outcome can never be proven."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from dpone.contracts.fence import (
    FenceCapability,
    FenceObservation,
    FenceStatus,
    SealOutcome,
    SealResult,
)
from dpone.contracts.load import LoadPlan, MutationReport
from dpone.errors import ConfigInvalid, DponeError, TargetWriteFailed
from dpone.ports.connector import Rows, WithinTransaction

try:  # POSIX advisory locks serialize appenders on one host; elsewhere nothing does.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["JsonlAppendConnector"]

_UNKNOWN = FenceObservation(status=FenceStatus.UNKNOWN)


@contextmanager
def _exclusive(handle: IO[bytes]) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JsonlAppendConnector:
    """Appends each row as one JSON object per line; nothing records whether it happened.

    It exists to show ``COMMIT_UNKNOWN``: a crash or error after the journal says
    COMMITTING cannot be resolved automatically, because a re-read of the file cannot
    tell this operation's lines from anyone else's. Empty strings are written as ``null``,
    as the SQL connectors store them as NULL.

    Args:
        path: the file to append to; it and its directory are created when missing.
    """

    def __init__(self, path: str | Path) -> None:
        if not str(path):
            raise ConfigInvalid("the jsonl_append target needs a file path", field="path")
        self._path = Path(path).expanduser().resolve()

    @property
    def kind(self) -> str:
        """Connector name."""
        return "jsonl_append"

    @property
    def capability(self) -> FenceCapability:
        """A plain append proves nothing."""
        return FenceCapability.NONE

    @property
    def path(self) -> Path:
        """The resolved absolute file."""
        return self._path

    def target_identity(self) -> str:
        """Return ``jsonl_append:<abs path>``."""
        return f"jsonl_append:{self._path}"

    def database_locator(self) -> str:
        """Return the file's identity; no journal shares it, so atomic mode never applies."""
        return f"jsonl_append:{self._path}"

    def check_plan(self, plan: LoadPlan) -> None:
        """Nothing to check: a file takes any columns."""

    def prepare(self, *, operation_id: str, intent_digest: str, epoch: int) -> FenceObservation:
        """Install nothing (there is no fence) and report ABSENT."""
        return FenceObservation(status=FenceStatus.ABSENT)

    def mutate(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        plan: LoadPlan,
        batches: Rows,
        content_digest: str,
        within: WithinTransaction | None = None,
        prepare: bool = False,  # nothing to prepare: there is no fence
    ) -> MutationReport:
        """Append the rows, call ``within(None)``, fsync; on an error cut the file back.

        There is no transaction for ``within`` to join, so it gets ``None`` (an atomic-mode
        journal refuses that, and the append is cut back). Cutting back is best effort: a
        crash can still leave part of the rows, which is why the capability is ``none``.

        Raises:
            TargetWriteFailed: a row cannot be encoded as JSON or the file cannot be written.
        """
        names = [c.name for c in plan.columns]
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            created = not self._path.exists()
            handle = self._path.open("ab")
        except OSError as exc:
            raise self._os_error(exc, operation_id) from exc
        with handle, _exclusive(handle):
            start = handle.seek(0, os.SEEK_END)
            try:
                count = self._append(handle, names, batches, operation_id=operation_id)
                handle.flush()
                if within is not None:
                    within(None)
                os.fsync(handle.fileno())
                if created:
                    _fsync_dir(self._path.parent)
            except BaseException as exc:
                self._cut_back(handle, start)
                if isinstance(exc, OSError):
                    raise self._os_error(exc, operation_id) from exc
                raise
        return MutationReport(row_count=count, content_digest=content_digest)

    def _append(
        self, handle: IO[bytes], names: list[str], batches: Rows, *, operation_id: str
    ) -> int:
        encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
        count = 0
        for batch in batches:
            try:
                lines = [
                    encode({n: (None if v == "" else v) for n, v in zip(names, row, strict=True)})
                    for row in batch
                ]
            except (TypeError, ValueError) as exc:
                raise TargetWriteFailed(
                    "a row has the wrong number of values or a value JSON cannot hold; "
                    "nothing was appended",
                    operation_id=operation_id,
                ) from exc
            if lines:
                handle.write(("\n".join(lines) + "\n").encode("utf-8"))
            count += len(lines)
        return count

    @staticmethod
    def _cut_back(handle: IO[bytes], size: int) -> None:
        try:
            handle.flush()
            handle.truncate(size)
            os.fsync(handle.fileno())
        except OSError:
            # The primary error matters more; the route is COMMIT_UNKNOWN either way.
            pass

    def _os_error(self, exc: OSError, operation_id: str) -> DponeError:
        name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        return TargetWriteFailed(
            f"could not append to the jsonl_append file ({name})", operation_id=operation_id
        )

    def observe(self, *, operation_id: str) -> FenceObservation:
        """Report UNKNOWN: the file cannot tell whether this operation's rows are in it."""
        return _UNKNOWN

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        """Report UNKNOWN: nothing can stop or detect an earlier append."""
        return SealResult(outcome=SealOutcome.UNKNOWN, observation=_UNKNOWN)

    def close(self) -> None:
        """Nothing stays open between calls. Idempotent."""
