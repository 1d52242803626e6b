"""Commit states and the only transitions the journal accepts (ARCHITECTURE section 6)."""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = [
    "ALLOWED_TRANSITIONS",
    "ATOMIC_FOLDS",
    "FOLD_PATHS",
    "RECOVERY_ONLY_TRANSITIONS",
    "CommitState",
    "is_allowed",
]


class CommitState(str, enum.Enum):
    """Where an operation stands; values equal names."""

    PREPARING = "PREPARING"
    PREPARED = "PREPARED"
    COMMITTING = "COMMITTING"
    TARGET_COMMITTED = "TARGET_COMMITTED"
    COMMITTED_INCOMPLETE = "COMMITTED_INCOMPLETE"
    COMPLETE = "COMPLETE"
    COMMIT_UNKNOWN = "COMMIT_UNKNOWN"
    FAILED_PRE_COMMIT = "FAILED_PRE_COMMIT"


S = CommitState

#: Single steps of the state machine.
_STEPS: Mapping[CommitState, frozenset[CommitState]] = {
    S.PREPARING: frozenset({S.PREPARED, S.FAILED_PRE_COMMIT}),
    S.PREPARED: frozenset({S.COMMITTING, S.FAILED_PRE_COMMIT}),
    S.COMMITTING: frozenset({S.TARGET_COMMITTED, S.COMMIT_UNKNOWN, S.PREPARED}),
    S.TARGET_COMMITTED: frozenset({S.COMPLETE, S.COMMITTED_INCOMPLETE}),
    S.COMMITTED_INCOMPLETE: frozenset({S.COMPLETE}),
    S.FAILED_PRE_COMMIT: frozenset({S.PREPARING}),
    S.COMMIT_UNKNOWN: frozenset({S.TARGET_COMMITTED, S.FAILED_PRE_COMMIT}),
    S.COMPLETE: frozenset(),
}

#: One journal write standing for several steps; history records every step.
FOLD_PATHS: Mapping[tuple[CommitState, CommitState], tuple[CommitState, ...]] = {
    (S.PREPARING, S.COMMITTING): (S.PREPARING, S.PREPARED, S.COMMITTING),
    (S.COMMITTING, S.COMPLETE): (S.COMMITTING, S.TARGET_COMMITTED, S.COMPLETE),
    # atomic mode only: data, fence and this write share one target transaction
    (S.PREPARING, S.COMPLETE): (
        S.PREPARING,
        S.PREPARED,
        S.COMMITTING,
        S.TARGET_COMMITTED,
        S.COMPLETE,
    ),
    (S.PREPARED, S.COMPLETE): (S.PREPARED, S.COMMITTING, S.TARGET_COMMITTED, S.COMPLETE),
    (S.FAILED_PRE_COMMIT, S.COMPLETE): (
        S.FAILED_PRE_COMMIT,
        S.PREPARING,
        S.PREPARED,
        S.COMMITTING,
        S.TARGET_COMMITTED,
        S.COMPLETE,
    ),
}

#: Folds that only an atomic-mode write (inside the data transaction) may use.
ATOMIC_FOLDS: frozenset[tuple[CommitState, CommitState]] = frozenset(
    {(S.PREPARING, S.COMPLETE), (S.PREPARED, S.COMPLETE), (S.FAILED_PRE_COMMIT, S.COMPLETE)}
)

#: Transitions that need an audited operator action (recovery apply).
RECOVERY_ONLY_TRANSITIONS: frozenset[tuple[CommitState, CommitState]] = frozenset(
    {(S.COMMIT_UNKNOWN, S.TARGET_COMMITTED), (S.COMMIT_UNKNOWN, S.FAILED_PRE_COMMIT)}
)

#: Every transition the journal accepts: single steps plus folds.
ALLOWED_TRANSITIONS: Mapping[CommitState, frozenset[CommitState]] = {
    state: steps | frozenset(to for (frm, to) in FOLD_PATHS if frm is state)
    for state, steps in _STEPS.items()
}


def is_allowed(frm: CommitState, to: CommitState) -> bool:
    """Return True when the journal may move an entry from ``frm`` to ``to``."""
    return to in ALLOWED_TRANSITIONS[frm]
