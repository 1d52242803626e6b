"""Crash campaign helpers: run ``dpone`` in real processes, SIGKILL them, rerun, check."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dpone.contracts.journal import Transition
from dpone.contracts.states import CommitState

__all__ = [
    "EXIT_COMMIT_UNKNOWN",
    "Outcome",
    "check_history",
    "dpone_cmd",
    "run_dpone",
    "run_until_done",
    "start_dpone",
    "write_orders_csv",
]

EXIT_COMMIT_UNKNOWN = 3
_RETRYABLE = {5, 6, 75}


def dpone_cmd(*args: str) -> list[str]:
    """Return the argv that runs ``dpone`` with this interpreter."""
    return [sys.executable, "-m", "dpone", *args]


def _env(failpoints: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_FAILPOINTS"}
    if failpoints:
        env["DPONE_FAILPOINTS"] = failpoints
    env.update(extra or {})
    return env


def run_dpone(
    args: Sequence[str],
    *,
    cwd: Path,
    failpoints: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``dpone ARGS`` to the end (or its death) and capture its output."""
    return subprocess.run(
        dpone_cmd(*args),
        cwd=cwd,
        env=_env(failpoints, env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_dpone(
    args: Sequence[str],
    *,
    cwd: Path,
    failpoints: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Start ``dpone ARGS`` without waiting (for random kills and races)."""
    return subprocess.Popen(
        dpone_cmd(*args),
        cwd=cwd,
        env=_env(failpoints, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass(slots=True)
class Outcome:
    """Exit codes of a crash-and-rerun sequence and the output of its last run."""

    codes: list[int] = field(default_factory=list)
    last_stdout: str = ""
    last_stderr: str = ""

    @property
    def final(self) -> int:
        """Exit code of the last run."""
        return self.codes[-1]


def run_until_done(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    max_runs: int = 8,
    pause: float = 0.2,
) -> Outcome:
    """Rerun ``dpone ARGS`` without failpoints while it exits with a retryable code."""
    outcome = Outcome()
    for _ in range(max_runs):
        proc = run_dpone(args, cwd=cwd, env=env)
        outcome.codes.append(proc.returncode)
        outcome.last_stdout, outcome.last_stderr = proc.stdout, proc.stderr
        if proc.returncode not in _RETRYABLE:
            break
        time.sleep(pause)
    return outcome


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a started process and reap it."""
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=30)


def write_orders_csv(path: Path, rows: int, *, day: int = 1, start_id: int = 0) -> None:
    """Write ``rows`` sample orders dated on 2026-11-<day>."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["order_id", "customer", "amount", "ordered_at"])
        for i in range(rows):
            seconds = (i * 37) % 86_400
            out.writerow(
                [
                    start_id + i,
                    f"c{i % 97}",
                    f"{(i % 1000) / 10:.2f}",
                    f"2026-11-{day:02d}T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:"
                    f"{seconds % 60:02d}Z",
                ]
            )


def check_history(history: Sequence[Transition]) -> list[str]:
    """Return the incoherences of an operation's history (empty when coherent).

    Coherent: starts with creation in PREPARING; versions never decrease and rise by one
    per write; each state step starts where the previous one ended; it ends in COMPLETE.
    """
    problems: list[str] = []
    if not history:
        return ["history is empty"]
    first = history[0]
    if first.from_state is not None or first.to_state is not CommitState.PREPARING:
        problems.append("history does not start with creation in PREPARING")
    state: CommitState | None = None
    version = 0
    for row in history:
        if row.version < version or row.version > version + 1:
            problems.append(f"version jumps from {version} to {row.version}")
        version = row.version
        if row.kind == "lease":
            if row.to_state is not state:
                problems.append(f"lease row changes state {state} -> {row.to_state}")
            continue
        if row.from_state is not state:
            problems.append(f"step {row.from_state}->{row.to_state} does not start at {state}")
        state = row.to_state
    if state is not CommitState.COMPLETE:
        problems.append(f"history ends in {state}, not COMPLETE")
    return problems
