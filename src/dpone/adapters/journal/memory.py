"""In-memory reference commit journal: thread-safe, for unit tests; passes the conformance suite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import msgspec

from dpone.adapters.journal import _ledger_sql, _rules
from dpone.contracts.checkpoint import (
    Checkpoint,
    CheckpointAdvance,
    advance_watermark,
    next_claim,
)
from dpone.contracts.evidence import SafeMapping, safe_mapping
from dpone.contracts.journal import AuditRecord, AuditRequest, JournalEntry, Transition
from dpone.contracts.run import (
    PROVENANCE_KEYS,
    AttemptRecord,
    AttemptState,
    RunError,
    RunRecord,
    RunStart,
    RunState,
)
from dpone.contracts.states import CommitState

if TYPE_CHECKING:
    from dpone.ports.checkpoint import CheckpointStorePort
    from dpone.ports.journal import CommitJournalPort
    from dpone.ports.ledger import RunLedgerPort

__all__ = ["InMemoryCommitJournal"]


class InMemoryCommitJournal:
    """A CommitJournalPort held in process memory behind one lock.

    It keeps the exact semantics of the durable adapters (CAS, epochs, fold history,
    audit) so that runtime tests on it mean something; it offers no atomic mode
    (``compare_and_set_within``) because there is no target transaction to join.

    Args:
        clock: the journal's clock in seconds since the epoch; lease expiry is judged by it.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # RLock: helpers that read under the lock may be called from writers holding it.
        self._lock = threading.RLock()
        self._entries: dict[str, JournalEntry] = {}
        self._history: dict[str, list[Transition]] = {}
        self._audit: list[AuditRecord] = []
        self._checkpoints: dict[str, Checkpoint] = {}
        self._intervals: dict[str, set[tuple[int, int]]] = {}
        self._bindings: dict[str, CheckpointAdvance] = {}
        self._runs: dict[str, RunRecord] = {}
        self._attempts: dict[str, dict[int, AttemptRecord]] = {}

    # ------------------------------------------------------------------ reads
    def get(self, operation_id: str) -> JournalEntry | None:
        """Return the entry or None."""
        with self._lock:
            return self._entries.get(operation_id)

    def list_entries(
        self,
        *,
        states: frozenset[CommitState] | None = None,
        updated_before: float | None = None,
        limit: int = 100,
    ) -> list[JournalEntry]:
        """Return entries, newest update first, filtered by state and age."""
        with self._lock:
            # insertion order breaks ties so that equal clock readings list newest first too
            found = [
                (entry.updated_at, order, entry)
                for order, entry in enumerate(self._entries.values())
                if (states is None or entry.state in states)
                and (updated_before is None or entry.updated_at < updated_before)
            ]
        found.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [entry for _, _, entry in found[: max(limit, 0)]]

    def history(self, operation_id: str) -> list[Transition]:
        """Return the transition history in order."""
        with self._lock:
            return list(self._history.get(operation_id, ()))

    def audit_log(self, operation_id: str | None = None) -> list[AuditRecord]:
        """Return audit records in order, for one operation or all."""
        with self._lock:
            return [
                r for r in self._audit if operation_id is None or r.operation_id == operation_id
            ]

    def now(self) -> float:
        """Return the journal's clock."""
        return float(self._clock())

    # ------------------------------------------------------------------ writes
    def create_intent(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_owner: str | None = None,
        lease_ttl_seconds: float | None = None,
    ) -> JournalEntry:
        """Create the entry in PREPARING if absent (leased at epoch 1 when asked)."""
        _rules.check_identity("operation_id", operation_id)
        _rules.check_identity("intent_digest", intent_digest)
        safe_metadata = _rules.safe_values(metadata)
        _rules.safe_actor(actor)
        ttl = _rules.lease_request(lease_owner, lease_ttl_seconds)
        with self._lock:
            existing = self._entries.get(operation_id)
            if existing is not None:
                if existing.intent_digest != intent_digest:
                    raise _rules.intent_conflict(existing)
                return existing
            at = self.now()
            entry = JournalEntry(
                operation_id=operation_id,
                intent_digest=intent_digest,
                state=CommitState.PREPARING,
                version=1,
                lease_owner=lease_owner if ttl is not None else None,
                lease_epoch=1 if ttl is not None else 0,
                lease_expires_at=at + ttl if ttl is not None else None,
                metadata=safe_metadata,
                result=None,
                created_at=at,
                updated_at=at,
            )
            self._entries[operation_id] = entry
            self._history[operation_id] = [_rules.create_row(entry, actor=actor)]
            if ttl is not None:
                self._history[operation_id].append(_rules.lease_row(entry, seq=1))
            return entry

    def compare_and_set(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        next_state: CommitState,
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
        audit: AuditRequest | None = None,
        release_lease: bool = False,
    ) -> JournalEntry:
        """Move the entry to ``next_state`` if version, state and epoch match; version + 1."""
        _rules.check_move(
            operation_id=operation_id,
            expected_states=expected_states,
            next_state=next_state,
            atomic=False,
            audited=audit is not None,
        )
        safe_evidence = _rules.safe_values(evidence)
        safe_result = _rules.safe_values(result) if result is not None else None
        _rules.safe_actor(actor)
        if audit is not None:
            _rules.safe_audit(audit, "applied")
        with self._lock:
            current = self._require(operation_id)
            if (
                current.version != expected_version
                or current.state not in expected_states
                or current.lease_epoch != lease_epoch
            ):
                raise _rules.conflict(
                    expected_version=expected_version,
                    expected_states=expected_states,
                    lease_epoch=lease_epoch,
                    current=current,
                )
            at = self.now()
            new = msgspec.structs.replace(
                current,
                state=next_state,
                version=current.version + 1,
                result=safe_result if safe_result is not None else current.result,
                updated_at=at,
            )
            if release_lease:
                new = msgspec.structs.replace(new, lease_owner=None, lease_expires_at=at)
            self._entries[operation_id] = new
            self._history[operation_id].extend(
                _rules.transition_rows(
                    operation_id=operation_id,
                    from_state=current.state,
                    to_state=next_state,
                    version=new.version,
                    actor=actor,
                    lease_epoch=lease_epoch,
                    evidence=safe_evidence,
                    at=at,
                )
            )
            if audit is not None:
                self._audit.append(
                    _rules.audit_record(
                        operation_id=operation_id,
                        request=audit,
                        outcome="applied",
                        before_state=current.state,
                        before_version=current.version,
                        after=new,
                        at=at,
                    )
                )
            return new

    def acquire_lease(
        self,
        *,
        operation_id: str,
        owner: str,
        ttl_seconds: float,
        expected_version: int | None = None,
        break_owner: str | None = None,
    ) -> JournalEntry:
        """Grant the lease to ``owner`` at epoch + 1; version + 1."""
        ttl = _rules.check_ttl(ttl_seconds)
        _rules.safe_actor(owner)
        with self._lock:
            current = self._require(operation_id)
            if expected_version is not None and current.version != expected_version:
                raise _rules.conflict(
                    expected_version=expected_version,
                    expected_states=None,
                    lease_epoch=None,
                    current=current,
                )
            at = self.now()
            if not _rules.lease_is_free(
                lease_owner=current.lease_owner,
                lease_expires_at=current.lease_expires_at,
                now=at,
                owner=owner,
                break_owner=break_owner,
            ):
                raise _rules.lease_held(current, now=at)
            new = msgspec.structs.replace(
                current,
                lease_owner=owner,
                lease_epoch=current.lease_epoch + 1,
                lease_expires_at=at + ttl,
                version=current.version + 1,
                updated_at=at,
            )
            self._entries[operation_id] = new
            self._history[operation_id].append(_rules.lease_row(new))
            return new

    def renew_lease(
        self, *, operation_id: str, owner: str, lease_epoch: int, ttl_seconds: float
    ) -> JournalEntry:
        """Extend the caller's lease; the version does not change."""
        ttl = _rules.check_ttl(ttl_seconds)
        with self._lock:
            current = self._require(operation_id)
            if current.lease_owner != owner or current.lease_epoch != lease_epoch:
                raise _rules.lease_lost(current, lease_epoch=lease_epoch)
            new = msgspec.structs.replace(current, lease_expires_at=self.now() + ttl)
            self._entries[operation_id] = new
            return new

    def release_lease(self, *, operation_id: str, owner: str, lease_epoch: int) -> None:
        """Expire the caller's lease now if it still holds it; otherwise do nothing."""
        with self._lock:
            current = self._entries.get(operation_id)
            if (
                current is None
                or current.lease_owner != owner
                or current.lease_epoch != lease_epoch
            ):
                return
            self._entries[operation_id] = msgspec.structs.replace(
                current, lease_owner=None, lease_expires_at=self.now()
            )

    def append_audit(
        self,
        *,
        operation_id: str,
        request: AuditRequest,
        outcome: str,
        entry: JournalEntry | None,
    ) -> AuditRecord:
        """Record an operator action that changed no state."""
        _rules.check_identity("operation_id", operation_id)
        _rules.safe_audit(request, outcome)
        with self._lock:
            record = _rules.audit_record(
                operation_id=operation_id,
                request=request,
                outcome=outcome,
                before_state=None if entry is None else entry.state,
                before_version=None if entry is None else entry.version,
                after=entry,
                at=self.now(),
            )
            self._audit.append(record)
            return record

    # ------------------------------------------------------------------ checkpoints
    def complete_with_checkpoint(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        checkpoint: CheckpointAdvance,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """CAS to COMPLETE and promote the checkpoint under one lock."""
        with self._lock:
            entry = self.compare_and_set(
                operation_id=operation_id,
                expected_version=expected_version,
                expected_states=expected_states,
                next_state=CommitState.COMPLETE,
                lease_epoch=lease_epoch,
                actor=actor,
                evidence=evidence,
                result=result,
                release_lease=True,
            )
            self._promote(checkpoint, operation_id)
            return entry

    def promote_completed(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Promote the checkpoint of an already COMPLETE operation (state checked here)."""
        with self._lock:
            entry = self._entries.get(operation_id)
            if entry is None or entry.state is not CommitState.COMPLETE:
                return False
            self._promote(checkpoint, operation_id)
            return True

    def bind_delivery_checkpoint(
        self, *, operation_id: str, checkpoint: CheckpointAdvance
    ) -> CheckpointAdvance:
        """Record what a delivery promotes once it succeeds; return the recorded binding."""
        with self._lock:
            return self._bindings.setdefault(operation_id, checkpoint)

    def delivery_checkpoint(self, operation_id: str) -> CheckpointAdvance | None:
        """Return what a delivery promotes, or None."""
        with self._lock:
            return self._bindings.get(operation_id)

    def promote_delivered(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Absolute checkpoint write for a verified delivery; False when already recorded."""
        with self._lock:
            done = self._intervals.get(checkpoint.stream_id, set())
            if (checkpoint.start, checkpoint.end) in done:
                return False
            self._promote(checkpoint, operation_id)
            return True

    def _promote(self, checkpoint: CheckpointAdvance, operation_id: str) -> None:
        with self._lock:
            current = self._ensure_checkpoint(checkpoint)
            done = self._intervals.setdefault(checkpoint.stream_id, set())
            done.add((checkpoint.start, checkpoint.end))
            moved = advance_watermark(current.watermark, done)
            if moved != current.watermark:
                current = msgspec.structs.replace(
                    current, watermark=moved, operation_id=operation_id, updated_at=self.now()
                )
            self._checkpoints[checkpoint.stream_id] = msgspec.structs.replace(
                current, pending=sum(1 for start, _ in done if start > current.watermark)
            )

    def get_checkpoint(self, stream_id: str) -> Checkpoint | None:
        """Return the stream's checkpoint, or None."""
        with self._lock:
            return self._checkpoints.get(stream_id)

    def list_checkpoints(self) -> list[Checkpoint]:
        """Return every stream's checkpoint."""
        with self._lock:
            found = list(self._checkpoints.values())
        return sorted(found, key=lambda c: (c.workload_id, c.partition, c.stream_id))

    def claim_interval(
        self,
        *,
        stream_id: str,
        workload_id: str,
        partition: str,
        target_identity: str,
        origin: int,
        proposed_end: int,
    ) -> tuple[int, int] | None:
        """Return and record the stream's next interval (the recorded claim is reused)."""
        template = CheckpointAdvance(
            stream_id=stream_id,
            workload_id=workload_id,
            partition=partition,
            target_identity=target_identity,
            origin=origin,
            start=origin,
            end=origin,
        )
        with self._lock:
            current = self._ensure_checkpoint(template)
            chosen = next_claim(
                watermark=current.watermark,
                claim_start=current.claim_start,
                claim_end=current.claim_end,
                proposed_end=proposed_end,
            )
            if chosen is not None:
                self._checkpoints[stream_id] = msgspec.structs.replace(
                    current, claim_start=chosen[0], claim_end=chosen[1]
                )
            return chosen

    def _ensure_checkpoint(self, advance: CheckpointAdvance) -> Checkpoint:
        found = self._checkpoints.get(advance.stream_id)
        if found is None:
            found = Checkpoint(
                stream_id=advance.stream_id,
                workload_id=advance.workload_id,
                partition=advance.partition,
                target_identity=advance.target_identity,
                origin=advance.origin,
                watermark=advance.origin,
                operation_id=None,
                pending=0,
                claim_start=None,
                claim_end=None,
                updated_at=self.now(),
            )
            self._checkpoints[advance.stream_id] = found
        return found

    # ------------------------------------------------------------------ run ledger
    def begin_run(self, start: RunStart) -> tuple[RunRecord, bool]:
        """Record the run if its idempotency key is new; else return the existing run."""
        _ledger_sql.check_start(start)
        with self._lock:
            for run in self._runs.values():
                if run.idempotency_key == start.idempotency_key:
                    return run, False
            now = self.now()
            run = RunRecord(
                run_id=start.run_id,
                idempotency_key=start.idempotency_key,
                operation_id=start.operation_id,
                request_hash=start.request_hash,
                definition_hash=start.definition_hash,
                access_digest=start.access_digest,
                access=start.access,
                provenance=start.provenance,
                state=RunState.RUNNING,
                current_attempt=0,
                error=None,
                created_at=now,
                updated_at=now,
            )
            self._runs[run.run_id] = run
            self._attempts[run.run_id] = {}
            return run, True

    def get_run(self, run_id: str) -> RunRecord | None:
        """Return one run or None."""
        with self._lock:
            return self._runs.get(run_id)

    def list_runs(
        self, *, states: frozenset[RunState] | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """Return runs, newest update first."""
        with self._lock:
            found = [
                (run.updated_at, order, run)
                for order, run in enumerate(self._runs.values())
                if states is None or run.state in states
            ]
        found.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [run for _, _, run in found[: max(limit, 0)]]

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Return a run's attempts in order."""
        with self._lock:
            rows = self._attempts.get(run_id, {})
            return [rows[n] for n in sorted(rows)]

    def begin_attempt(
        self, *, run_id: str, attempt: int, owner: str, provenance: SafeMapping | None = None
    ) -> AttemptRecord:
        """Record attempt ``attempt`` (the lease epoch) and make it current; refuse stale ones."""
        _rules.safe_actor(owner)
        origin = safe_mapping(provenance, allowed=PROVENANCE_KEYS)
        if int(attempt) < 1:
            raise ValueError("an attempt number is a lease epoch, at least 1")
        with self._lock:
            run = self._require_run(run_id)
            rows = self._attempts[run_id]
            if attempt <= run.current_attempt:
                same = rows.get(attempt)
                if attempt == run.current_attempt and same is not None and same.owner == owner:
                    return same
                raise _ledger_sql.stale_attempt(run_id, attempt, run.current_attempt)
            now = self.now()
            for number, row in list(rows.items()):
                if row.state is AttemptState.RUNNING:
                    rows[number] = msgspec.structs.replace(
                        row, state=AttemptState.SUPERSEDED, ended_at=now
                    )
            rows[attempt] = AttemptRecord(
                run_id=run_id,
                attempt=attempt,
                owner=owner,
                provenance=origin,
                state=AttemptState.RUNNING,
                error_code=None,
                started_at=now,
                ended_at=None,
            )
            self._runs[run_id] = msgspec.structs.replace(
                run, current_attempt=attempt, state=RunState.RUNNING, error=None, updated_at=now
            )
            return rows[attempt]

    def end_attempt(
        self, *, run_id: str, attempt: int, state: RunState, error: RunError | None = None
    ) -> RunRecord:
        """Record how the current attempt ended; refuse a stale attempt's write."""
        if state is RunState.RUNNING:
            raise ValueError("an attempt ends in COMPLETE, FAILED or UNRESOLVED, not RUNNING")
        with self._lock:
            run = self._require_run(run_id)
            if attempt != run.current_attempt:
                raise _ledger_sql.stale_attempt(run_id, attempt, run.current_attempt)
            now = self.now()
            row = self._attempts[run_id].get(attempt)
            if row is not None and row.state is AttemptState.RUNNING:
                self._attempts[run_id][attempt] = msgspec.structs.replace(
                    row,
                    state=_ledger_sql.attempt_state(state),
                    error_code=None if error is None else error.code,
                    ended_at=now,
                )
            run = msgspec.structs.replace(run, state=state, error=error, updated_at=now)
            self._runs[run_id] = run
            return run

    def close(self) -> None:
        """Do nothing: there is no connection to release, and tests may read on afterwards."""

    # ------------------------------------------------------------------ helpers
    def _require_run(self, run_id: str) -> RunRecord:
        run = self._runs.get(run_id)
        if run is None:
            raise _ledger_sql.run_not_found(run_id)
        return run

    def _require(self, operation_id: str) -> JournalEntry:
        entry = self._entries.get(operation_id)
        if entry is None:
            raise _rules.not_found(operation_id)
        return entry


if TYPE_CHECKING:

    def _conforms(journal: InMemoryCommitJournal) -> CommitJournalPort:
        # mypy proves here that the adapter matches the port, without inheriting from it
        return journal

    def _stores_checkpoints(journal: InMemoryCommitJournal) -> CheckpointStorePort:
        # the same static proof for the checkpoint port
        return journal

    def _keeps_runs(journal: InMemoryCommitJournal) -> RunLedgerPort:
        return journal
