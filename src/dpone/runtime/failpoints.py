"""Named fault-injection points, zero cost unless configured (ARCHITECTURE section 12).

Spec: ``"after:COMMITTING=kill;before:fence.mutate=raise;after:fence.prepare=sleep(0.5)"``.
Actions: ``kill`` (SIGKILL to the own process), ``raise`` (InjectedFault), ``sleep(S)``,
``hang`` (sleep until killed). A ``@N`` suffix on the action fires on the N-th hit only.
"""

from __future__ import annotations

import os
import re
import time

import msgspec

from dpone.errors import ConfigInvalid, InjectedFault

__all__ = [
    "DELIVERY_FAILPOINT_NAMES",
    "FAILPOINT_NAMES",
    "PUBLICATION_FAILPOINT_NAMES",
    "armed",
    "configure",
    "hit",
]

#: Every failpoint the runtime fires, in the order a first attempt meets them.
FAILPOINT_NAMES: tuple[str, ...] = (
    "before:journal.create",
    "after:journal.create",
    "before:lease.acquire",
    "after:lease.acquire",
    "before:PREPARED",
    "after:PREPARED",
    "before:COMMITTING",
    "after:COMMITTING",
    "before:fence.mutate",
    "fence.mutate.before_commit",
    "after:fence.mutate",
    "before:fence.observe",
    "after:fence.observe",
    "before:fence.seal",
    "after:fence.seal",
    "before:TARGET_COMMITTED",
    "after:TARGET_COMMITTED",
    "before:COMMITTED_INCOMPLETE",
    "after:COMMITTED_INCOMPLETE",
    "before:COMPLETE",
    "after:COMPLETE",
    "before:COMMIT_UNKNOWN",
    "after:COMMIT_UNKNOWN",
    "before:FAILED_PRE_COMMIT",
    "after:FAILED_PRE_COMMIT",
    "before:PREPARING",
    "after:PREPARING",
    "before:lease.release",
    "after:lease.release",
    "before:recovery.seal",
    "after:recovery.seal",
    "before:recovery.apply",
    "after:recovery.apply",
)

#: Failpoints of resumable delivery (runtime/delivery.py); kept apart because the
#: commit-protocol crash matrices iterate ``FAILPOINT_NAMES``.
DELIVERY_FAILPOINT_NAMES: tuple[str, ...] = (
    "after:delivery.SUBMITTING",
    "before:delivery.submit",
    "after:delivery.submit",
    "after:delivery.ACCEPTED",
    "before:delivery.observe",
    "before:delivery.promote",
    "before:delivery.COMPLETE",
)
#: Failpoints of partition publication (publish's two writes). Kept apart from
#: FAILPOINT_NAMES, which the crash matrices of single-operation routes iterate.
PUBLICATION_FAILPOINT_NAMES: tuple[str, ...] = (
    "before:publication.manifest",
    "after:publication.manifest",
    "before:publication.current",
    "after:publication.current",
)
_KNOWN = frozenset(FAILPOINT_NAMES + DELIVERY_FAILPOINT_NAMES + PUBLICATION_FAILPOINT_NAMES)

_ACTION_RE = re.compile(r"^(kill|raise|hang|sleep\((\d+(?:\.\d+)?)\))(?:@(\d+))?$")


class _Point(msgspec.Struct):
    action: str
    seconds: float
    nth: int | None
    hits: int = 0


_points: dict[str, _Point] = {}


def configure(spec: str | None) -> None:
    """Replace the active failpoints with those in ``spec`` (None or empty clears them)."""
    _points.clear()
    if not spec:
        return
    for raw in spec.split(";"):
        item = raw.strip()
        if not item:
            continue
        name, sep, action = item.rpartition("=")
        match = _ACTION_RE.match(action.strip())
        if not sep or not match or name.strip() not in _KNOWN:
            raise ConfigInvalid(
                f"failpoint {item!r} is not NAME=ACTION",
                field="DPONE_FAILPOINTS",
                hint="NAME is one of dpone.runtime.failpoints.FAILPOINT_NAMES (or "
                "PUBLICATION_FAILPOINT_NAMES); ACTION is "
                "kill, raise, hang or sleep(SECONDS), optionally @N",
            )
        kind = match.group(1).split("(")[0]
        seconds = float(match.group(2) or 0.0)
        nth = int(match.group(3)) if match.group(3) else None
        _points[name.strip()] = _Point(kind, seconds, nth)


def any_armed() -> bool:
    """True when any failpoint is configured (this process is under a crash test)."""
    return bool(_points)


def armed(*names: str) -> bool:
    """True when any of ``names`` is configured (a caller may then stop where they fire)."""
    return bool(_points) and any(name in _points for name in names)


def hit(name: str) -> None:
    """Fire the failpoint ``name`` if configured; a dictionary miss otherwise."""
    if not _points:
        return
    point = _points.get(name)
    if point is None:
        return
    point.hits += 1
    if point.nth is not None and point.hits != point.nth:
        return
    if point.action == "kill":
        import signal  # only a kill failpoint needs it

        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # never reached; SIGKILL cannot be caught
    elif point.action == "raise":
        raise InjectedFault(f"failpoint {name} raised on purpose")
    elif point.action == "sleep":
        time.sleep(point.seconds)
    elif point.action == "hang":
        while True:
            time.sleep(3600)
