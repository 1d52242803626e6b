"""Recovery service on the in-memory journal and connector: plan and audited apply."""

from __future__ import annotations

import pytest

from dpone.adapters.journal.memory import InMemoryCommitJournal
from dpone.contracts.journal import AuditRequest
from dpone.contracts.states import CommitState
from dpone.errors import RecoveryRefused, Unauthorized
from dpone.recovery.service import Action, RecoveryService
from dpone.testing.memory import InMemoryConnector

S = CommitState
OP = "sha256:" + "b" * 64
AUDIT = AuditRequest(principal="ops", action="test", reason="drive the entry")


def drive_to(journal: InMemoryCommitJournal, target: InMemoryConnector, state: CommitState) -> int:
    """Create the operation and walk it to ``state``; commit the fence when past COMMITTING."""
    entry = journal.create_intent(
        operation_id=OP,
        intent_digest="sha256:" + "1" * 64,
        metadata={},
        actor="t",
        lease_owner="other-host:1:1",
        lease_ttl_seconds=0.01,
    )
    path = {
        S.COMMITTING: [S.COMMITTING],
        S.COMMITTED_INCOMPLETE: [S.COMMITTING, S.TARGET_COMMITTED, S.COMMITTED_INCOMPLETE],
        S.COMMIT_UNKNOWN: [S.COMMITTING, S.COMMIT_UNKNOWN],
    }[state]
    for step in path:
        entry = journal.compare_and_set(
            operation_id=OP,
            expected_version=entry.version,
            expected_states=frozenset({entry.state}),
            next_state=step,
            lease_epoch=entry.lease_epoch,
            actor="t",
        )
        if step is S.TARGET_COMMITTED:
            target.prepare(operation_id=OP, intent_digest=entry.intent_digest, epoch=1)
            from dpone.contracts.identity import parse_interval
            from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy

            plan = LoadPlan(
                table="t",
                strategy=LoadStrategy.APPEND,
                columns=(Column(name="id", type=ColumnType.INTEGER),),
                interval=parse_interval("2026-11-01/2026-11-02"),
            )
            target.mutate(
                operation_id=OP,
                intent_digest=entry.intent_digest,
                epoch=1,
                plan=plan,
                batches=[[(1,), (2,)]],
                content_digest="d",
            )
    journal.release_lease(operation_id=OP, owner="other-host:1:1", lease_epoch=entry.lease_epoch)
    return entry.version


@pytest.fixture
def parts() -> tuple[InMemoryCommitJournal, InMemoryConnector, RecoveryService]:
    journal = InMemoryCommitJournal()
    target = InMemoryConnector()
    service = RecoveryService(
        journal=journal, connector=target, authorized_principals=frozenset({"alice"})
    )
    return journal, target, service


def test_complete_state_applies_with_audit(parts) -> None:  # type: ignore[no-untyped-def]
    """COMMITTED_INCOMPLETE + committed fence: complete-state moves to COMPLETE, audited."""
    journal, target, service = parts
    version = drive_to(journal, target, S.COMMITTED_INCOMPLETE)
    plan = service.plan(OP)
    assert Action.COMPLETE_STATE in plan.allowed_actions
    done = service.apply(
        OP,
        action=Action.COMPLETE_STATE,
        expected_version=version,
        principal="alice",
        reason="finish",
    )
    assert done.state is S.COMPLETE
    [record] = journal.audit_log(OP)
    assert (record.principal, record.outcome, record.after_state) == (
        "alice",
        "applied",
        S.COMPLETE,
    )


def test_unauthorized_principal_is_refused_and_audited(parts) -> None:  # type: ignore[no-untyped-def]
    """A principal outside the policy changes nothing; the refusal is in the audit log."""
    journal, target, service = parts
    version = drive_to(journal, target, S.COMMITTED_INCOMPLETE)
    with pytest.raises(Unauthorized):
        service.apply(
            OP,
            action=Action.COMPLETE_STATE,
            expected_version=version,
            principal="mallory",
            reason="x",
        )
    assert journal.get(OP).version == version  # type: ignore[union-attr]
    assert [(a.principal, a.outcome) for a in journal.audit_log(OP)] == [("mallory", "refused")]


def test_refusal_by_the_fence_leaves_the_version_untouched(parts) -> None:  # type: ignore[no-untyped-def]
    """mark-committed against a fence that shows nothing is refused before any write."""
    journal, target, service = parts
    version = drive_to(journal, target, S.COMMIT_UNKNOWN)
    with pytest.raises(RecoveryRefused, match="fence"):
        service.apply(
            OP,
            action=Action.MARK_COMMITTED,
            expected_version=version,
            principal="alice",
            reason="x",
        )
    assert journal.get(OP).version == version  # type: ignore[union-attr]


def test_mark_not_committed_seals_the_fence_first(parts) -> None:  # type: ignore[no-untyped-def]
    """On a marker route mark-not-committed is proven by sealing: no old writer can land."""
    journal, target, service = parts
    version = drive_to(journal, target, S.COMMIT_UNKNOWN)
    done = service.apply(
        OP,
        action=Action.MARK_NOT_COMMITTED,
        expected_version=version,
        principal="alice",
        reason="fence shows nothing",
    )
    assert done.state is S.FAILED_PRE_COMMIT
    seen = target.observe(operation_id=OP)
    assert seen.epoch == done.lease_epoch  # sealed at the recovery's fresh epoch


def test_stale_expected_version_is_refused(parts) -> None:  # type: ignore[no-untyped-def]
    """An operator acting on an old plan is refused; nothing changes."""
    journal, target, service = parts
    version = drive_to(journal, target, S.COMMITTED_INCOMPLETE)
    with pytest.raises(RecoveryRefused, match="moved"):
        service.apply(
            OP,
            action=Action.COMPLETE_STATE,
            expected_version=version - 1,
            principal="alice",
            reason="x",
        )
    assert journal.get(OP).state is S.COMMITTED_INCOMPLETE  # type: ignore[union-attr]
