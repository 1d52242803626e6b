"""Who this executor is, and whether a lease holder on this host is provably dead."""

from __future__ import annotations

import os
import socket
from functools import cache

__all__ = ["executor_label", "proven_dead"]


def _start_ticks(pid: int) -> str | None:
    # Field 22 of /proc/PID/stat is the start time: (pid, start) names a process uniquely,
    # so a recycled pid is never mistaken for the original holder.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


@cache
def executor_label() -> str:
    """Return ``host:pid:start`` naming this process; safe to store (no secrets)."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid) or '0'}"


def proven_dead(label: str | None) -> bool:
    """Return True only when ``label`` names a process on this host that no longer runs.

    A holder on another host is never proven dead here: its lease must expire by the
    journal's clock. Safety never rests on this check (the fence epoch does); it only
    spares a retry on the same machine from waiting out the lease.
    """
    if not label or label == executor_label():
        return False
    host, _, rest = label.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    current = _start_ticks(int(pid_text))
    return current is None or current != start
