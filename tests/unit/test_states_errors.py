"""State table, error tree and evidence safety."""

from __future__ import annotations

import pickle

import pytest

from dpone import errors
from dpone.contracts.evidence import looks_secret, safe_mapping
from dpone.contracts.states import (
    ALLOWED_TRANSITIONS,
    ATOMIC_FOLDS,
    FOLD_PATHS,
    CommitState,
    is_allowed,
)

S = CommitState


def test_design_transitions_are_exactly_the_allowed_ones() -> None:
    """The table equals ARCHITECTURE section 6: single steps plus folds, nothing more."""
    expected = {
        (S.PREPARING, S.PREPARED),
        (S.PREPARED, S.COMMITTING),
        (S.COMMITTING, S.TARGET_COMMITTED),
        (S.TARGET_COMMITTED, S.COMPLETE),
        (S.COMMITTING, S.COMMIT_UNKNOWN),
        (S.COMMITTING, S.PREPARED),
        (S.TARGET_COMMITTED, S.COMMITTED_INCOMPLETE),
        (S.COMMITTED_INCOMPLETE, S.COMPLETE),
        (S.PREPARING, S.FAILED_PRE_COMMIT),
        (S.PREPARED, S.FAILED_PRE_COMMIT),
        (S.FAILED_PRE_COMMIT, S.PREPARING),
        (S.COMMIT_UNKNOWN, S.TARGET_COMMITTED),
        (S.COMMIT_UNKNOWN, S.FAILED_PRE_COMMIT),
        (S.PREPARING, S.COMMITTING),
        (S.COMMITTING, S.COMPLETE),
        (S.PREPARING, S.COMPLETE),
        (S.PREPARED, S.COMPLETE),
        (S.FAILED_PRE_COMMIT, S.COMPLETE),
    }
    actual = {(a, b) for a, tos in ALLOWED_TRANSITIONS.items() for b in tos}
    assert actual == expected
    assert not ALLOWED_TRANSITIONS[S.COMPLETE]
    assert all(is_allowed(*pair) for pair in FOLD_PATHS)
    assert set(FOLD_PATHS) >= ATOMIC_FOLDS


def test_fold_paths_are_chains_of_single_steps() -> None:
    """Each fold's recorded path is a sequence of legal single steps."""
    for (frm, to), path in FOLD_PATHS.items():
        assert path[0] is frm
        assert path[-1] is to
        assert len(path) >= 3


def test_error_codes_are_stable_and_unique() -> None:
    """Every error class has its own documented code and a retryability."""
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.DponeError) and c is not errors.DponeError
    ]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    assert errors.CommitUnknown.code.value == "DPONE_TARGET_COMMIT_UNKNOWN"
    assert errors.IntentConflict.code.value == "DPONE_TARGET_COMMIT_INTENT_CONFLICT"
    assert errors.CommittedIncomplete.code.value == "DPONE_TARGET_COMMITTED_INCOMPLETE"
    assert errors.RecoveryConflict.code.value == "DPONE_TARGET_COMMIT_RECOVERY_CONFLICT"
    assert errors.JournalUnavailable.code.value == "DPONE_TARGET_COMMIT_JOURNAL_UNAVAILABLE"
    assert errors.FenceUnavailable.code.value == "DPONE_TARGET_COMMIT_FENCE_UNAVAILABLE"
    assert errors.CommitUnknown.retryability is errors.Retryability.STOP
    assert errors.IntentConflict.retryability is errors.Retryability.STOP
    assert errors.JournalUnavailable("x").retryable
    assert not errors.CommitUnknown("x").retryable
    assert not errors.ConfigInvalid("x").retryable
    # a source that cannot be reached is transient (retried, CLI exit 75); a bad one is not
    from dpone.cli.main import EXIT_FAILED, EXIT_RETRYABLE, exit_code_for

    assert errors.SourceUnavailable.code.value == "DPONE_SOURCE_UNAVAILABLE"
    assert errors.SourceUnavailable("x").retryable
    assert exit_code_for(errors.SourceUnavailable("x")) == EXIT_RETRYABLE == 75
    assert exit_code_for(errors.SourceInvalid("x")) == EXIT_FAILED


def test_errors_pickle_with_their_safe_fields() -> None:
    """An error survives pickling (multiprocessing, Airflow) with code and fields."""
    exc = errors.CommitUnknown("m", operation_id="sha256:ab", state="COMMITTING", journal_version=4)
    back = pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes
    assert type(back) is errors.CommitUnknown
    assert back.attrs() == exc.attrs()
    assert back.attrs()["journal_version"] == 4
    assert set(back.attrs()) <= {"code", "retryability", "message", *errors.SAFE_FIELDS}


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://user:hunter2@db/prod",
        "password=hunter2",
        "Bearer abcdefghijklmnop",
        "AKIAABCDEFGHIJKLMNOP",
        "https://bucket.s3/x?X-Amz-Signature=abc",
        "-----BEGIN RSA PRIVATE KEY-----",
    ],
)
def test_secret_looking_values_are_refused(value: str) -> None:
    """Evidence never accepts a credential, DSN with password or signed URL."""
    assert looks_secret(value)
    with pytest.raises(errors.UnsafeValue):
        safe_mapping({"reason": value})


def test_evidence_keys_are_allow_listed_and_scalar() -> None:
    """Unknown keys and non-scalar values are refused; good ones are frozen."""
    with pytest.raises(errors.UnsafeValue):
        safe_mapping({"sql": "select 1"})
    with pytest.raises(errors.UnsafeValue):
        safe_mapping({"reason": ["a"]})
    frozen = safe_mapping({"row_count": 3, "reason": "ok"})
    assert dict(frozen) == {"row_count": 3, "reason": "ok"}
    with pytest.raises(TypeError):
        frozen["row_count"] = 4  # type: ignore[index]
