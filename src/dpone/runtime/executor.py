"""Who this executor is, and whether a lease holder on this host is provably dead."""

from __future__ import annotations

import itertools
import os
import socket
from functools import cache

__all__ = ["executor_label", "new_owner", "proven_dead"]

_instances = itertools.count(1)


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


def new_owner() -> str:
    """Return ``host:pid:start:n``: a lease owner unique to one executor in this process.

    Two executors in one process (threads of one Runner) must never look like the same
    lease owner: each would take the other's lease for its own and share its epoch.
    """
    return f"{executor_label()}:{next(_instances)}"


def proven_dead(label: str | None) -> bool:
    """Return True only when ``label`` names a process on this host that no longer runs.

    A holder on another host is never proven dead here: its lease must expire by the
    journal's clock. Safety never rests on this check (the fence epoch does); it only
    spares a retry on the same machine from waiting out the lease.
    """
    if not label:
        return False
    host, _, rest = label.partition(":")
    pid_text, _, rest = rest.partition(":")
    start = rest.partition(":")[0]  # an executor number may follow
    if f"{host}:{pid_text}:{start}" == executor_label():
        return False  # this very process is alive
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    current = _start_ticks(int(pid_text))
    return current is None or current != start
