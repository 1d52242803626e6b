"""A 'born' history row reads as the rows the unfolded path writes (ADR 0023)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from dpone.adapters.journal import _rules
from dpone.contracts.journal import JournalEntry
from dpone.contracts.states import FOLD_PATHS
from dpone.contracts.states import CommitState as S

OP = "sha256:" + "ab" * 32
ACTOR = "host:42:7"
EVIDENCE = MappingProxyType({"mode": "atomic"})


def _born(state: S) -> tuple[object, ...]:
    return _rules.born_rows(
        operation_id=OP, state=state, actor=ACTOR, lease_epoch=1, evidence=EVIDENCE, at=12.5
    )


@pytest.mark.parametrize("state", [S.COMPLETE, S.COMMITTING])
def test_the_frozen_paths_are_todays_fold_paths(state: S) -> None:
    """If the fold rules change, stored 'born' rows must not change with them: this fails
    first, and the new path needs a new kind."""
    assert _rules.BORN_PATHS[state] == FOLD_PATHS[(S.PREPARING, state)]


@pytest.mark.parametrize("state", [S.COMPLETE, S.COMMITTING])
def test_born_rows_are_the_unfolded_rows(state: S) -> None:
    """create, lease, then the CAS PREPARING -> state, by the shared rules, at one time."""
    entry = JournalEntry(
        operation_id=OP,
        intent_digest="sha256:" + "cd" * 32,
        state=S.PREPARING,
        version=1,
        lease_owner=ACTOR,
        lease_epoch=1,
        lease_expires_at=None,
        metadata=MappingProxyType({}),
        result=None,
        created_at=12.5,
        updated_at=12.5,
    )
    unfolded = (
        _rules.create_row(entry, actor=ACTOR),
        _rules.lease_row(entry, seq=1),
        *_rules.transition_rows(
            operation_id=OP,
            from_state=S.PREPARING,
            to_state=state,
            version=2,
            actor=ACTOR,
            lease_epoch=1,
            evidence=EVIDENCE,
            at=12.5,
        ),
    )
    assert _born(state) == unfolded


def test_born_complete_reads_as_these_six_rows() -> None:
    """The pinned reading of a stored row (what schema 5 stored as six rows)."""
    rows = [
        (t.version, t.seq, t.from_state, t.to_state, t.kind, dict(t.evidence))
        for t in _rules.born_rows(
            operation_id=OP,
            state=S.COMPLETE,
            actor=ACTOR,
            lease_epoch=1,
            evidence=EVIDENCE,
            at=12.5,
        )
    ]
    assert rows == [
        (1, 0, None, S.PREPARING, "create", {}),
        (1, 1, S.PREPARING, S.PREPARING, "lease", {"owner": ACTOR, "lease_epoch": 1}),
        (2, 0, S.PREPARING, S.PREPARED, "fold", {"mode": "atomic"}),
        (2, 1, S.PREPARED, S.COMMITTING, "fold", {"mode": "atomic"}),
        (2, 2, S.COMMITTING, S.TARGET_COMMITTED, "fold", {"mode": "atomic"}),
        (2, 3, S.TARGET_COMMITTED, S.COMPLETE, "fold", {"mode": "atomic"}),
    ]


@pytest.mark.parametrize("state", [S.PREPARING, S.PREPARED, S.TARGET_COMMITTED])
def test_no_entry_is_born_in_another_state(state: S) -> None:
    with pytest.raises(ValueError, match="no entry is born"):
        _born(state)
