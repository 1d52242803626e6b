"""PostgreSQL commit journal: pooled or one session, server-clock leases, one-statement CAS."""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cache, lru_cache, partial
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.rows import tuple_row

from dpone.adapters import _pg
from dpone.adapters.journal import _checkpoint_sql, _ledger_sql, _rules
from dpone.adapters.journal._ahead import PipelineSession, SendsAhead, SessionLost
from dpone.adapters.journal._behind import Finish, WriteBehind
from dpone.adapters.journal._rows import audit_from_row as _audit
from dpone.adapters.journal._rows import entry_from_row as _entry
from dpone.adapters.journal._rows import transition_from_row as _transition
from dpone.contracts.checkpoint import Checkpoint, CheckpointAdvance
from dpone.contracts.evidence import SafeMapping
from dpone.contracts.journal import AuditRecord, AuditRequest, JournalEntry, Transition
from dpone.contracts.run import AttemptRecord, RunError, RunRecord, RunStart, RunState
from dpone.contracts.states import CommitState
from dpone.errors import ConfigInvalid, DponeError, JournalConflict, JournalUnavailable
from dpone.ports.connector import Fused

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from dpone.ports.checkpoint import TransactionalCheckpointStorePort
    from dpone.ports.journal import (
        FoldingJournalPort,
        ForwardFoldingJournalPort,
        ProvenCompletionJournalPort,
    )
    from dpone.ports.ledger import (
        FoldingLedgerPort,
        LookupLedgerPort,
        RunEndingLedgerPort,
        RunLedgerPort,
    )

__all__ = ["SCHEMA_VERSION", "PostgresCommitJournal"]

_T = TypeVar("_T")
#: A queued INSERT's collector (``QueuedWithin``): the entry, or None (not its error).
PendingEntry = Callable[[BaseException | None], JournalEntry | None]
_Conn = psycopg.Connection[tuple[Any, ...]]

# Plain identifiers only: the schema is also quoted everywhere, so this is a second belt.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
_APPLICATION_NAME = "dpone-journal"
# A statement may first wait its full lock bound, then still has to run.
_STATEMENT_MARGIN_S = 30.0
# A run ledger write on the one session (pooled=False): queued in a pipeline before the
# write, it holds for the implicit transaction that ends at the pipeline's Sync only.
_ASYNC_COMMIT_LOCAL = "SELECT set_config('synchronous_commit', 'off', true)"
# A write sent behind its caller (ADR 0017) sends its Sync and reads its answer later,
# through the pipeline's own bookkeeping: psycopg has no public call that sends a Sync
# without waiting for the answer. Without these the journal writes as it always did.
_SENDS_BEHIND = all(
    callable(getattr(psycopg.Pipeline, name, None))
    for name in ("_enqueue_sync", "_communicate_gen", "_fetch_gen")
)
_BIRTH_ACTION = "read the run and record the intent"
# Every session's bounds, and durable commits: ``_configure``.
_SESSION_SETTINGS = (
    "set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false), "
    "set_config('synchronous_commit', CASE current_setting('synchronous_commit') "
    "WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)"
)
_STATES_SQL = ", ".join(f"'{s.value}'" for s in CommitState)
_ALL_STATES = sorted(s.value for s in CommitState)
#: The oldest schema a read-only open reads as it is (it never migrates): version 4 only
#: adds the delivery bindings table (_MIGRATIONS), whose absence reads as "binds nothing",
#: version 5 only swaps two foreign keys for triggers (nothing a read sees), and version 6
#: only adds a comment (a schema below 6 holds no 'born' history row, ADR 0023).
_READ_ONLY_OLDEST = 3


# Migrations, in order; entry N-1 brings the schema to version N. Never edit a released
# one: add a new entry. ``{s}`` is the quoted schema. Times are ``timestamptz`` (readable
# with psql, indexable); the adapter hands them out as float epoch seconds, always through
# the same ``extract(epoch ...)::float8`` so a value read twice compares equal.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"""
        CREATE TABLE IF NOT EXISTS {{s}}.dpone_journal (
            operation_id     text PRIMARY KEY,
            intent_digest    text NOT NULL,
            state            text NOT NULL CHECK (state IN ({_STATES_SQL})),
            previous_state   text,
            version          bigint NOT NULL CHECK (version >= 1),
            lease_owner      text,
            lease_epoch      bigint NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),
            lease_expires_at timestamptz,
            metadata         jsonb NOT NULL DEFAULT '{{}}',
            result           jsonb,
            created_at       timestamptz NOT NULL,
            updated_at       timestamptz NOT NULL
        )
        """,
        # `journal list --state X` with millions of entries: one backward index range
        # per state (see _Statements.list_entries), never a sort of the whole table.
        "CREATE INDEX IF NOT EXISTS dpone_journal_state_updated "
        "ON {s}.dpone_journal (state, updated_at DESC)",
        # No surrogate key: (operation_id, version, seq) is the order history is read in.
        """
        CREATE TABLE IF NOT EXISTS {s}.dpone_transitions (
            operation_id text NOT NULL REFERENCES {s}.dpone_journal (operation_id),
            version      bigint NOT NULL,
            seq          integer NOT NULL,
            from_state   text,
            to_state     text NOT NULL,
            kind         text NOT NULL,
            actor        text NOT NULL,
            lease_epoch  bigint NOT NULL,
            evidence     jsonb NOT NULL,
            at           timestamptz NOT NULL,
            PRIMARY KEY (operation_id, version, seq)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS {s}.dpone_audit (
            id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            operation_id   text NOT NULL,
            principal      text NOT NULL,
            action         text NOT NULL,
            reason         text NOT NULL,
            attestation    text,
            before_state   text,
            after_state    text,
            before_version bigint,
            after_version  bigint,
            outcome        text NOT NULL,
            at             timestamptz NOT NULL
        )
        """,
        "CREATE INDEX IF NOT EXISTS dpone_audit_operation ON {s}.dpone_audit (operation_id, id)",
        # History and audit are evidence: the database itself refuses to rewrite them
        # (for every role but the tables' owner, who could drop the triggers).
        """
        CREATE OR REPLACE FUNCTION {s}.dpone_refuse_rewrite() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '% is append-only', TG_TABLE_NAME
                USING ERRCODE = 'restrict_violation';
        END
        $$
        """,
        "CREATE TRIGGER dpone_transitions_append_only BEFORE UPDATE OR DELETE "
        "ON {s}.dpone_transitions FOR EACH ROW EXECUTE FUNCTION {s}.dpone_refuse_rewrite()",
        "CREATE TRIGGER dpone_transitions_no_truncate BEFORE TRUNCATE "
        "ON {s}.dpone_transitions FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpone_refuse_rewrite()",
        "CREATE TRIGGER dpone_audit_append_only BEFORE UPDATE OR DELETE "
        "ON {s}.dpone_audit FOR EACH ROW EXECUTE FUNCTION {s}.dpone_refuse_rewrite()",
        "CREATE TRIGGER dpone_audit_no_truncate BEFORE TRUNCATE "
        "ON {s}.dpone_audit FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpone_refuse_rewrite()",
    ),
    # checkpoints of incremental streams (watermarks promoted with COMPLETE)
    (
        """
        CREATE TABLE IF NOT EXISTS {s}.dpone_checkpoints (
            stream_id       text PRIMARY KEY,
            workload_id     text NOT NULL,
            partition       text NOT NULL,
            target_identity text NOT NULL,
            origin_us       bigint NOT NULL,
            watermark_us    bigint NOT NULL,
            operation_id    text,
            claim_start_us  bigint,
            claim_end_us    bigint,
            updated_at      float8 NOT NULL
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS {s}.dpone_checkpoint_intervals (
            stream_id    text NOT NULL REFERENCES {s}.dpone_checkpoints (stream_id),
            start_us     bigint NOT NULL,
            end_us       bigint NOT NULL CHECK (end_us > start_us),
            operation_id text NOT NULL,
            completed_at float8 NOT NULL,
            PRIMARY KEY (stream_id, start_us, end_us)
        )
        """,
    ),
    # the run ledger: runs and their attempts (docs/runs-and-retries.md)
    _ledger_sql.POSTGRES_MIGRATION,
    # what a REST delivery promotes once its success is verified (docs/delivery.md)
    _checkpoint_sql.POSTGRES_BINDINGS_MIGRATION,
    # the rows history and attempts refer to are kept by triggers, not foreign keys (ADR
    # 0020): a foreign key checked each history row and attempt as it was written
    (
        "ALTER TABLE {s}.dpone_transitions "
        "DROP CONSTRAINT IF EXISTS dpone_transitions_operation_id_fkey",
        "ALTER TABLE {s}.dpone_run_attempts "
        "DROP CONSTRAINT IF EXISTS dpone_run_attempts_run_id_fkey",
        """
        CREATE OR REPLACE FUNCTION {s}.dpone_refuse_removal() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '% rows are kept: the journal never deletes or re-keys them',
                TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
        END
        $$
        """,
        "CREATE TRIGGER dpone_journal_kept BEFORE DELETE OR UPDATE OF operation_id "
        "ON {s}.dpone_journal FOR EACH ROW EXECUTE FUNCTION {s}.dpone_refuse_removal()",
        "CREATE TRIGGER dpone_journal_no_truncate BEFORE TRUNCATE "
        "ON {s}.dpone_journal FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpone_refuse_removal()",
        "CREATE TRIGGER dpone_runs_kept BEFORE DELETE OR UPDATE OF run_id "
        "ON {s}.dpone_runs FOR EACH ROW EXECUTE FUNCTION {s}.dpone_refuse_removal()",
        "CREATE TRIGGER dpone_runs_no_truncate BEFORE TRUNCATE "
        "ON {s}.dpone_runs FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpone_refuse_removal()",
    ),
    # an entry born past PREPARING keeps its birth as ONE history row of kind 'born' (ADR
    # 0023). No table changes; the version makes an older dpone, which would read that
    # row as it is, refuse this schema instead.
    (
        "COMMENT ON COLUMN {s}.dpone_transitions.kind IS "
        "'create, lease, transition or fold; born: one row for a birth past PREPARING, "
        "read as its create, lease and fold rows (ADR 0023)'",
    ),
)
#: The schema version this code writes and reads.
SCHEMA_VERSION = len(_MIGRATIONS)


# ---------------------------------------------------------------------- SQL
_RUN_WIDTH = 15  # columns of _ledger_sql.run_columns
_ENTRY_WIDTH = 11  # columns of _entry_columns


def _entry_columns(alias: str) -> str:
    a = alias
    return (
        f"{a}.operation_id, {a}.intent_digest, {a}.state, {a}.version, {a}.lease_owner, "
        f"{a}.lease_epoch, extract(epoch FROM {a}.lease_expires_at)::float8, "
        f"{a}.metadata::text, {a}.result::text, extract(epoch FROM {a}.created_at)::float8, "
        f"extract(epoch FROM {a}.updated_at)::float8"
    )


_TRANSITION_INSERT = (
    "operation_id, version, seq, from_state, to_state, kind, actor, lease_epoch, evidence, at"
)
_AUDIT_INSERT = (
    "operation_id, principal, action, reason, attestation, before_state, after_state, "
    "before_version, after_version, outcome, at"
)
_NOW = "extract(epoch FROM clock_timestamp())::float8"


class _Statements(msgspec.Struct, frozen=True):
    """Every statement of one schema, built once. Time is always the server's clock.

    Each write is ONE statement: the conditional UPDATE (or INSERT) and its history
    and audit rows are data-modifying CTEs of it, so they commit together in one round
    trip and one WAL flush. The clock is read once per statement (``clock``: the
    server's ``clock_timestamp()`` when the statement starts, not ``now()``, which inside
    a long target transaction would be its start), so ``updated_at``, the history times
    and a new lease expiry (``updated_at + ttl``) agree exactly. A statement that waits
    on the row lock keeps its start time: leases then look live a little longer, never
    expired too early.
    """

    migrate_lock: str
    version_table: str
    installed_version: str
    record_version: str
    create_intent: str
    born_complete: str
    born_committing: str
    #: templates: ``_cas_sql`` fills in the expected states, the next state and the steps
    cas: str
    cas_audited: str
    #: ``cas`` to COMPLETE that also ends the run's attempt COMPLETE (ADR 0013)
    cas_ending_run: str
    acquire: str
    renew: str
    release: str
    get: str
    get_with_now: str
    list_entries: str
    history: str
    audit_all: str
    audit_one: str
    append_audit: str
    now: str

    @classmethod
    def build(cls, schema: str) -> _Statements:
        s = '"' + schema + '"'
        j = f"{s}.dpone_journal"
        t = f"{s}.dpone_transitions"
        au = f"{s}.dpone_audit"
        cas_head = f"""
            WITH moved AS (
                UPDATE {j} AS j
                SET previous_state = j.state, state = @NEXT@, version = j.version + 1,
                    result = COALESCE(%(result)s::jsonb, j.result), updated_at = clock.now,
                    -- release_lease: the lease ends with this write, no second round trip
                    lease_owner = CASE WHEN %(release)s THEN NULL ELSE j.lease_owner END,
                    lease_expires_at = CASE WHEN %(release)s THEN clock.now
                                            ELSE j.lease_expires_at END
                FROM (SELECT clock_timestamp() AS now) AS clock
                WHERE j.operation_id = %(operation_id)s AND j.version = %(expected_version)s
                  AND j.state IN (@EXPECTED@)
                  AND j.lease_epoch = %(lease_epoch)s
                RETURNING j.*
            ), history AS (
                INSERT INTO {t} ({_TRANSITION_INSERT})
                SELECT m.operation_id, m.version, step.seq, step.from_state, step.to_state,
                       step.kind, %(actor)s, m.lease_epoch, %(evidence)s::jsonb, m.updated_at
                FROM moved AS m
                JOIN (VALUES @STEPS@) AS step(source, seq, from_state, to_state, kind)
                  ON step.source = m.previous_state
            )"""
        cas_tail = f"SELECT {_entry_columns('m')}, m.previous_state FROM moved AS m"
        # the run ledger's end of the attempt, written only when ``moved`` has a row
        run_end = _ledger_sql.end_complete_ctes(
            _ledger_sql.LedgerDialect(placeholder="%s", prefix=f"{s}.", now="now()", postgres=True),
            after="moved",
        )
        cas_ending_tail = (
            f"SELECT {_entry_columns('m')}, m.previous_state, "
            "EXISTS (SELECT 1 FROM run_ended) FROM moved AS m"
        )
        audit_cte = f""", audit AS (
                INSERT INTO {au} ({_AUDIT_INSERT})
                SELECT m.operation_id, %(principal)s, %(action)s, %(reason)s, %(attestation)s,
                       m.previous_state, m.state, %(expected_version)s, m.version, 'applied',
                       m.updated_at
                FROM moved AS m
            )"""
        transition_columns = (
            "operation_id, version, seq, from_state, to_state, kind, actor, lease_epoch, "
            "evidence::text, extract(epoch FROM at)::float8"
        )
        audit_columns = (
            "operation_id, principal, action, reason, attestation, before_state, after_state, "
            "before_version, after_version, outcome, extract(epoch FROM at)::float8"
        )
        return cls(
            migrate_lock="SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            version_table=(
                f"CREATE TABLE IF NOT EXISTS {s}.dpone_schema_version ("
                "version integer PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ),
            installed_version=f"SELECT COALESCE(max(version), 0) FROM {s}.dpone_schema_version",
            record_version=f"INSERT INTO {s}.dpone_schema_version (version) VALUES (%s)",
            # A replay (the entry exists) is answered by the same round trip: the second
            # branch reads the row when the INSERT did nothing. Both branches share one
            # snapshot, so a row committed by a concurrent creator after it may be in
            # neither; the caller then reads again.
            create_intent=f"""
                WITH created AS (
                    INSERT INTO {j} (operation_id, intent_digest, state, version, lease_owner,
                                     lease_epoch, lease_expires_at, metadata, created_at,
                                     updated_at)
                    SELECT %(operation_id)s, %(intent_digest)s, 'PREPARING', 1, %(owner)s::text,
                           %(lease_epoch)s, clock.now + make_interval(secs => %(ttl)s::float8),
                           %(metadata)s::jsonb, clock.now, clock.now
                    FROM (SELECT clock_timestamp() AS now) AS clock
                    ON CONFLICT (operation_id) DO NOTHING
                    RETURNING *
                ), history AS (
                    -- _rules.create_row, then _rules.lease_row(seq=1) for a leased birth
                    INSERT INTO {t} ({_TRANSITION_INSERT})
                    SELECT c.operation_id, c.version, 0, NULL, c.state, 'create', %(actor)s,
                           c.lease_epoch, '{{}}'::jsonb, c.created_at
                    FROM created AS c
                    UNION ALL
                    SELECT c.operation_id, c.version, 1, c.state, c.state, 'lease', c.lease_owner,
                           c.lease_epoch,
                           jsonb_build_object('owner', c.lease_owner, 'lease_epoch', c.lease_epoch),
                           c.updated_at
                    FROM created AS c WHERE c.lease_owner IS NOT NULL
                )
                SELECT {_entry_columns("c")} FROM created AS c
                UNION ALL
                SELECT {_entry_columns("x")} FROM {j} AS x
                WHERE x.operation_id = %(operation_id)s AND NOT EXISTS (SELECT 1 FROM created)
            """,
            # An entry born past PREPARING, its whole history with it (ADR 0003): COMPLETE
            # inside the target transaction (atomic first attempt), or COMMITTING and
            # leased (forward first attempt).
            born_complete=_born_statement(j, t, CommitState.COMPLETE),
            born_committing=_born_statement(j, t, CommitState.COMMITTING),
            cas=cas_head + "\n" + cas_tail,
            cas_audited=cas_head + audit_cte + "\n" + cas_tail,
            cas_ending_run=cas_head + ", " + run_end + "\n" + cas_ending_tail,
            # The lease predicate mirrors _rules.lease_is_free, judged by the server clock;
            # the history row mirrors _rules.lease_row (tests compare them).
            acquire=f"""
                WITH granted AS (
                    UPDATE {j} AS j
                    SET lease_owner = %(owner)s, lease_epoch = j.lease_epoch + 1,
                        lease_expires_at = clock.now + make_interval(secs => %(ttl)s),
                        version = j.version + 1, updated_at = clock.now
                    FROM (SELECT clock_timestamp() AS now) AS clock
                    WHERE j.operation_id = %(operation_id)s
                      AND (%(expected_version)s::bigint IS NULL
                           OR j.version = %(expected_version)s::bigint)
                      AND (j.lease_owner IS NULL OR j.lease_expires_at IS NULL
                           OR j.lease_expires_at <= clock.now
                           OR j.lease_owner = %(owner)s
                           OR j.lease_owner = %(break_owner)s::text)
                    RETURNING j.*
                ), history AS (
                    INSERT INTO {t} ({_TRANSITION_INSERT})
                    SELECT g.operation_id, g.version, 0, g.state, g.state, 'lease', g.lease_owner,
                           g.lease_epoch,
                           jsonb_build_object('owner', g.lease_owner, 'lease_epoch', g.lease_epoch),
                           g.updated_at
                    FROM granted AS g
                )
                SELECT {_entry_columns("g")} FROM granted AS g
            """,
            renew=f"""
                UPDATE {j} AS j
                SET lease_expires_at = clock.now + make_interval(secs => %(ttl)s)
                FROM (SELECT clock_timestamp() AS now) AS clock
                WHERE j.operation_id = %(operation_id)s AND j.lease_owner = %(owner)s
                  AND j.lease_epoch = %(lease_epoch)s
                RETURNING {_entry_columns("j")}
            """,
            release=f"""
                UPDATE {j} AS j SET lease_owner = NULL, lease_expires_at = clock.now
                FROM (SELECT clock_timestamp() AS now) AS clock
                WHERE j.operation_id = %(operation_id)s AND j.lease_owner = %(owner)s
                  AND j.lease_epoch = %(lease_epoch)s
            """,
            get=f"SELECT {_entry_columns('j')} FROM {j} AS j WHERE j.operation_id = %s",
            get_with_now=(
                f"SELECT {_entry_columns('j')}, {_NOW} FROM {j} AS j WHERE j.operation_id = %s"
            ),
            # One short backward range scan of (state, updated_at DESC) per state, then a
            # merge of at most limit rows per state: fast with millions of entries, also
            # for several states or all of them (a plain ``state = ANY`` would sort them all).
            list_entries=f"""
                SELECT {_entry_columns("x")}
                FROM unnest(%(states)s::text[]) AS wanted(state)
                CROSS JOIN LATERAL (
                    SELECT j.* FROM {j} AS j
                    WHERE j.state = wanted.state
                      AND j.updated_at < COALESCE(to_timestamp(%(before)s::float8), 'infinity')
                    ORDER BY j.updated_at DESC, j.operation_id DESC
                    LIMIT %(limit)s
                ) AS x
                ORDER BY x.updated_at DESC, x.operation_id DESC
                LIMIT %(limit)s
            """,
            history=(
                f"SELECT {transition_columns} FROM {t} "
                "WHERE operation_id = %s ORDER BY version, seq"
            ),
            audit_all=f"SELECT {audit_columns} FROM {au} ORDER BY id",
            audit_one=f"SELECT {audit_columns} FROM {au} WHERE operation_id = %s ORDER BY id",
            append_audit=(
                f"INSERT INTO {au} ({_AUDIT_INSERT}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, clock_timestamp()) "
                "RETURNING extract(epoch FROM at)::float8"
            ),
            now=f"SELECT {_NOW}",
        )


@cache
def _born_statement(
    j: str,
    t: str,
    state: CommitState,
    *,
    run_ctes: str = "",
    only_with_run: bool = False,
    select: str | None = None,
) -> str:
    """INSERT an entry born in ``state`` with its history, in ONE statement (ADR 0003).

    The history is ONE row of kind ``_rules.BORN_KIND`` (ADR 0023): ``history()`` reads it
    as ``_rules.born_rows``, the create, lease and fold rows the unfolded path writes,
    which all follow from the state, the actor, the epoch and the fold's evidence that
    the row keeps. Born COMPLETE the lease
    has ended (no owner, expired at birth); born COMMITTING it is the actor's for
    ``ttl`` seconds. ``run_ctes`` (``_ledger_sql.first_attempt_ctes``) come first: the
    run and its attempt 1 commit with the entry or not at all (ADR 0011).

    No ON CONFLICT: an existing entry (or run) is a unique violation, and inside a target
    transaction it aborts the data too. ``only_with_run``: the entry is written only
    when the CTE ``run`` wrote the run (its INSERT carries the guard, ADR 0018).
    ``select`` replaces the statement's closing SELECT of the entry born (``created``).
    """
    closing = select or f"SELECT {_entry_columns('c')} FROM created AS c"
    ctes = _born_ctes(j, t, state, run_ctes=run_ctes, only_with_run=only_with_run)
    return f"""
        WITH {ctes}
        {closing}
    """


def _born_ctes(
    j: str,
    t: str,
    state: CommitState,
    *,
    run_ctes: str = "",
    only_with_run: bool = False,
    gated: bool = False,
) -> str:
    """``_born_statement``'s CTEs (``created``, ``history``, after ``run_ctes``).

    ``gated``: the entry's INSERT waits for the host statement's one-row CTE ``gate``
    (``Fused``, ADR 0022); ``run_ctes`` are then gated by their caller.
    """
    if state is CommitState.COMPLETE:
        owner, ttl, result = "NULL::text", "0", "%(result)s::jsonb"
    else:
        owner, ttl, result = "%(actor)s", "%(ttl)s::float8", "NULL::jsonb"
    head = f"{run_ctes}, " if run_ctes else ""
    conditions = ["EXISTS (SELECT 1 FROM run)"] if only_with_run else []
    if gated:
        conditions.append("EXISTS (SELECT 1 FROM gate)")
    guard = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return f"""{head}created AS (
            INSERT INTO {j} (operation_id, intent_digest, state, previous_state, version,
                             lease_owner, lease_epoch, lease_expires_at, metadata,
                             result, created_at, updated_at)
            SELECT %(operation_id)s, %(intent_digest)s, {_literal(state.value)},
                   {_literal(CommitState.PREPARING.value)}, {_BORN_VERSION}, {owner}, 1,
                   clock.now + make_interval(secs => {ttl}),
                   %(metadata)s::jsonb, {result}, clock.now, clock.now
            FROM (SELECT clock_timestamp() AS now) AS clock{guard}
            RETURNING *
        ), history AS (
            -- ONE row for the whole birth (ADR 0023): history() reads it as
            -- _rules.born_rows, the rows the unfolded path writes
            INSERT INTO {t} ({_TRANSITION_INSERT})
            SELECT c.operation_id, 1, 0, NULL, c.state, {_literal(_rules.BORN_KIND)}, %(actor)s,
                   c.lease_epoch, %(evidence)s::jsonb, c.created_at
            FROM created AS c
        )"""


#: The version an entry is born with past PREPARING: create and lease at 1, the fold at 2.
_BORN_VERSION = 2


def _literal(text: str | None) -> str:
    """A constant of this module (a state or kind name) as an SQL literal."""
    return "NULL" if text is None else "'" + text.replace("'", "''") + "'"


@lru_cache(maxsize=256)
def _cas_sql(
    sql: _Statements,
    expected_states: frozenset[CommitState],
    next_state: CommitState,
    *,
    audited: bool,
    ending_run: bool = False,
) -> str:
    """The CAS statement of one move, its history rows written in as constants.

    The rows come from ``_rules.transition_rows`` for every state the entry may be in;
    the statement keeps those of the state it actually left, so a CAS that accepts
    several states records the exact (fold) path it took. They depend only on the move,
    so they are built once per move and schema, not sent with every write.
    """
    steps: list[str] = []
    for frm in sorted(expected_states, key=lambda s: s.value):
        for t in _rules.transition_rows(
            operation_id="-",
            from_state=frm,
            to_state=next_state,
            version=0,  # the statement uses the new version
            actor="-",
            lease_epoch=0,
            evidence=MappingProxyType({}),
            at=0.0,  # and the server's time
        ):
            source = None if t.from_state is None else t.from_state.value
            steps.append(
                f"({_literal(frm.value)}::text, {t.seq}, {_literal(source)}::text, "
                f"{_literal(t.to_state.value)}::text, {_literal(t.kind)}::text)"
            )
    expected = ", ".join(_literal(s.value) for s in sorted(expected_states, key=lambda s: s.value))
    template = sql.cas_audited if audited else sql.cas_ending_run if ending_run else sql.cas
    return (
        template.replace("@EXPECTED@", expected)
        .replace("@NEXT@", _literal(next_state.value))
        .replace("@STEPS@", ", ".join(steps))
    )


# ---------------------------------------------------------------------- the adapter
class PostgresCommitJournal:
    """A CommitJournalPort (transactional and folding, see the ports) in one PostgreSQL schema.

    Every method is one round trip on a pooled autocommit connection: each write is a
    single statement whose CTEs add the history and audit rows, so a CAS is one
    conditional ``UPDATE`` committed with its history. Leases and timestamps use the
    server's clock only. Nothing connects in the constructor: the first call migrates
    the schema (idempotent, serialized by an advisory lock) and opens the pool. After a
    ``fork`` the child opens its own pool and never touches the parent's connections.
    With ``pooled=False`` (one operation in a process: ``dpone run``) the migration's
    connection stays open as the journal's one session, shared by threads one call at a
    time (a run ledger write there takes a second round trip: ``_run_on_session``), and
    ``psycopg_pool`` is never imported.
    Times are stored as ``timestamptz`` and handed out as float epoch seconds; metadata,
    results and evidence as ``jsonb``.

    Args:
        dsn: a ``postgresql://`` URL or ``key=value`` DSN; it is never logged or repeated.
        schema: the schema holding the journal tables; created when missing.
        pool_min: connections kept open.
        pool_max: at most this many connections (threads beyond it wait).
        lock_timeout_s: how long a statement waits for a row lock before
            ``JournalUnavailable``; statements are cancelled after this plus 30 s.
        connect_timeout_s: bound on connecting and on waiting for a pooled connection
            (libpq counts whole seconds, at least 2).
        read_only: never create or migrate a schema (list, history, inspect, plan).
        pooled: False for one session instead of the pools (``_run_on_session``); the
            pool sizes are then unused.

    Raises:
        ConfigInvalid: a bad DSN, schema name or bound (no I/O happens here).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "dpone",
        pool_min: int = 1,
        pool_max: int = 4,
        lock_timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        read_only: bool = False,
        pooled: bool = True,
    ) -> None:
        # read_only (list, history, inspect, plan): never create or migrate a schema
        self._read_only = read_only
        self._locator = _pg.pg_locator(dsn) if isinstance(dsn, str) and dsn.strip() else ""
        if not self._locator:
            raise ConfigInvalid("the PostgreSQL journal needs a DSN", field="journal")
        if not isinstance(schema, str) or not _IDENTIFIER.fullmatch(schema):
            raise ConfigInvalid(
                "the journal schema must be a plain identifier: a letter or _ then up to 62 "
                "letters, digits, _ or $",
                field="schema",
            )
        if not (isinstance(pool_min, int) and isinstance(pool_max, int)):
            raise ConfigInvalid("pool sizes must be integers", field="pool_max")
        if pool_min < 0 or pool_max < max(1, pool_min):
            raise ConfigInvalid(
                "need 0 <= pool_min <= pool_max and pool_max >= 1", field="pool_max"
            )
        self._dsn = dsn
        self._schema = schema
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._pooled = pooled
        self._lock_timeout_s = _positive(lock_timeout_s, "lock_timeout_s")
        self._connect_timeout_s = _positive(connect_timeout_s, "connect_timeout_s")
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            # libpq counts whole seconds and treats anything below 2 as 2.
            "connect_timeout": max(2, math.ceil(self._connect_timeout_s)),
        }
        if not conninfo_to_dict(dsn).get("application_name"):
            self._connect_kwargs["application_name"] = _APPLICATION_NAME
        self._settings = (
            f"{round(self._lock_timeout_s * 1000)}ms",
            f"{round((self._lock_timeout_s + _STATEMENT_MARGIN_S) * 1000)}ms",
        )
        self._sql = _Statements.build(schema)
        self._ledger_dialect = _ledger_sql.LedgerDialect(
            placeholder="%s", prefix=f'"{schema}".', now="now()", postgres=True
        )
        self._run_complete = _ledger_sql.first_attempt_sql(self._ledger_dialect, complete=True)
        # an entry born with its new run at attempt 1 (ADR 0011): COMPLETE with the run
        # COMPLETE (atomic), COMMITTING with the run RUNNING (forward)
        j_name, t_name = f'"{schema}".dpone_journal', f'"{schema}".dpone_transitions'
        self._born_with_run = {
            state: _born_statement(
                j_name,
                t_name,
                state,
                run_ctes=_ledger_sql.first_attempt_ctes(
                    self._ledger_dialect, complete=state is CommitState.COMPLETE
                ),
            )
            for state in (CommitState.COMPLETE, CommitState.COMMITTING)
        }
        # the same two births COMPLETE as CTEs of a connector's statement, gated by its
        # lock (``Fused``, ADR 0022), keyed by the statement they stand in for
        gated = "EXISTS (SELECT 1 FROM gate)"
        self._fusions = {
            self._sql.born_complete: _positional(
                _born_ctes(j_name, t_name, CommitState.COMPLETE, gated=True)
            ),
            self._born_with_run[CommitState.COMPLETE]: _positional(
                _born_ctes(
                    j_name,
                    t_name,
                    CommitState.COMPLETE,
                    run_ctes=_ledger_sql.first_attempt_ctes(
                        self._ledger_dialect, complete=True, only_if=gated
                    ),
                    # the entry reads ``run``: the run's INSERT (and a key conflict) then
                    # comes before the unread rows' (ADR 0022), as in the queued form
                    only_with_run=True,
                    gated=True,
                )
            ),
        }
        # ... born COMMITTING only while neither the run's key nor the entry exists: the
        # birth sent with the lookup, a no-op (no error) when the lookup finds either
        self._born_unless_found = _born_statement(
            f'"{schema}".dpone_journal',
            f'"{schema}".dpone_transitions',
            CommitState.COMMITTING,
            run_ctes=_ledger_sql.first_attempt_ctes(
                self._ledger_dialect,
                complete=False,
                only_if=(
                    f'NOT EXISTS (SELECT 1 FROM "{schema}".dpone_runs '
                    "WHERE idempotency_key = %(run_key)s) "
                    f'AND NOT EXISTS (SELECT 1 FROM "{schema}".dpone_journal '
                    "WHERE operation_id = %(operation_id)s)"
                ),
            ),
            only_with_run=True,
            # the run and entry as they were before this statement (its snapshot), and
            # the entry it bore, side by side in one row
            select=self._run_and_entry_sql(
                "%(run_key)s",
                "%(operation_id)s",
                born=f"LEFT JOIN LATERAL (SELECT {_entry_columns('c')} FROM created AS c) AS b",
            ),
        )
        # the run under a key and the operation's entry, side by side in one row
        self._find_run = self._run_and_entry_sql("%s", "%s")
        self._where = f"the PostgreSQL journal {self._locator} (schema {schema})"
        # the last new run's checked values (``_run_params``)
        self._run_memo: tuple[RunStart, str, SafeMapping | None, dict[str, object]] | None = None
        self._lock = threading.Lock()
        # forward mode's proven COMPLETE of attempt 1, written behind its caller (ADR 0017)
        self._behind = WriteBehind()
        # the session those writes are sent on: a ledger session (asynchronous commit)
        self._behind_pipe = PipelineSession(self._connect_behind)
        # forward mode's birth, sent ahead of its answer (ADR 0021), and the statement of
        # the COMPLETE built while that answer is awaited: (its arguments, the statement)
        self._ahead = SendsAhead(self._connect_ahead)
        self._ending_ready: tuple[dict[str, Any], tuple[str, dict[str, Any]]] | None = None
        self._pool: ConnectionPool[_Conn] | None = None
        self._ledger_pool: ConnectionPool[_Conn] | None = None
        self._ledger_pid = os.getpid()
        # pooled=False: the one session, and the lock that gives it to one call at a time
        self._session: _Conn | None = None
        self._session_lock = threading.RLock()
        # Pools and sessions inherited through fork belong to the parent: never used, never
        # closed (closing would end the parent's sessions on the server).
        self._inherited: list[object] = []
        self._pid = os.getpid()
        self._ready = False
        self._unborn = False  # read_only found no journal in the schema (version 0)
        self._closed = False
        # libpq's view (host as connected, port, dbname) of our own connections; a
        # target transaction must show the same one to join atomic mode.
        self._server: str | None = None
        self._same_server: dict[tuple[str, int, str], bool] = {}

    def _run_and_entry_sql(self, key: str, operation: str, *, born: str = "") -> str:
        """SELECT the run under ``key`` and the entry of ``operation`` side by side in one row
        (each all NULL when absent); ``born`` joins one more entry's columns after them."""
        schema = self._schema
        return (
            f"SELECT r.*, e.*{', b.*' if born else ''} FROM (SELECT 1) AS one "
            "LEFT JOIN LATERAL (SELECT "
            f'{_ledger_sql.run_columns(self._ledger_dialect)} FROM "{schema}".dpone_runs '
            f"WHERE idempotency_key = {key}) AS r ON true "
            f'LEFT JOIN LATERAL (SELECT {_entry_columns("j")} FROM "{schema}".dpone_journal '
            f"AS j WHERE j.operation_id = {operation}) AS e ON true"
            + (f" {born} ON true" if born else "")
        )

    # ------------------------------------------------------------------ identity
    @property
    def locator(self) -> str:
        """This journal's database identity, ``postgresql://host:port/dbname``; no secret."""
        return self._locator

    @property
    def schema(self) -> str:
        """The schema holding the journal tables."""
        return self._schema

    def shares_database_with(self, locator: str) -> bool:
        """Return True when ``locator`` names this journal's database (atomic mode possible)."""
        if not isinstance(locator, str) or not locator.lower().startswith(
            ("postgresql://", "postgres://")
        ):
            return False
        try:
            return _pg.pg_locator(locator) == self._locator
        except DponeError:
            return False

    # ------------------------------------------------------------------ schema
    def migrate(self) -> list[int]:
        """Bring the schema to SCHEMA_VERSION; return the versions this call applied.

        Safe from many processes at once: one applies, the others wait on an advisory
        lock and then find nothing to do (an empty list).

        Raises:
            JournalUnavailable: the server is unreachable or a lock wait ran out.
            ConfigInvalid: the schema is newer than this dpone.
        """
        with self._lock:
            self._check_open()
            return self._migrate()

    # ------------------------------------------------------------------ reads
    def get(self, operation_id: str) -> JournalEntry | None:
        """Return the entry or None; reads see every committed write."""
        row = self._run(
            "read a journal entry",
            lambda conn: conn.execute(self._sql.get, (operation_id,)).fetchone(),
            repeatable=True,
        )
        return None if row is None else _entry(row)

    def list_entries(
        self,
        *,
        states: frozenset[CommitState] | None = None,
        updated_before: float | None = None,
        limit: int = 100,
    ) -> list[JournalEntry]:
        """Return entries, newest update first, filtered by state and age."""
        if states is not None and not states:
            return []
        params = {
            "states": _ALL_STATES if states is None else sorted(s.value for s in states),
            "before": None if updated_before is None else float(updated_before),
            "limit": max(int(limit), 0),
        }
        rows = self._run(
            "list journal entries",
            lambda conn: conn.execute(self._sql.list_entries, params).fetchall(),
            repeatable=True,
        )
        return [_entry(row) for row in rows]

    def history(self, operation_id: str) -> list[Transition]:
        """Return the append-only transition history in order."""
        rows = self._run(
            "read the transition history",
            lambda conn: conn.execute(self._sql.history, (operation_id,)).fetchall(),
            repeatable=True,
        )
        return [step for row in rows for step in _transitions(row)]

    def audit_log(self, operation_id: str | None = None) -> list[AuditRecord]:
        """Return audit records in order, for one operation or all."""
        query = self._sql.audit_all if operation_id is None else self._sql.audit_one
        params: tuple[str, ...] = () if operation_id is None else (operation_id,)
        rows = self._run(
            "read the audit log",
            lambda conn: conn.execute(query, params).fetchall(),
            repeatable=True,
        )
        return [_audit(row) for row in rows]

    def now(self) -> float:
        """Return the server's clock, seconds since the epoch."""
        row = self._run(
            "read the server clock",
            lambda conn: conn.execute(self._sql.now).fetchone(),
            repeatable=True,
        )
        assert row is not None  # noqa: S101 - SELECT without FROM returns one row
        return float(row[0])

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
        """Create the entry in PREPARING if absent (leased at epoch 1 when asked).

        An existing entry is returned unchanged, in the same round trip.
        """
        _rules.check_identity("operation_id", operation_id)
        _rules.check_identity("intent_digest", intent_digest)
        safe_metadata = _rules.safe_values(metadata)
        _rules.safe_actor(actor)
        ttl = _rules.lease_request(lease_owner, lease_ttl_seconds)
        params = {
            "operation_id": operation_id,
            "intent_digest": intent_digest,
            "metadata": _rules.encode_mapping(safe_metadata),
            "actor": actor,
            "owner": lease_owner if ttl is not None else None,
            "lease_epoch": 1 if ttl is not None else 0,
            "ttl": ttl,
        }

        def write(conn: _Conn) -> tuple[Any, ...] | None:
            row = conn.execute(self._sql.create_intent, params).fetchone()
            if row is None:
                # A concurrent creator committed after this statement's snapshot.
                row = conn.execute(self._sql.get, (operation_id,)).fetchone()
            return row

        # Repeating is safe: a create that did commit is found by the repeat.
        row = self._run("record the intent", write, repeatable=True)
        if row is None:  # pragma: no cover - the insert conflicted on this very key
            raise _rules.not_found(operation_id)
        entry = _entry(row)
        if entry.intent_digest != intent_digest:
            raise _rules.intent_conflict(entry)
        return entry

    def create_committing(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """Create the entry already COMMITTING, leased to ``actor`` at epoch 1 (ADR 0003).

        One write for create, lease and PREPARING -> COMMITTING, with the history the
        unfolded path writes. An existing entry is returned unchanged (check its
        version and owner: only a version-2 entry leased to ``actor`` is the new one).

        Raises:
            IntentConflict: the entry exists with another intent digest.
            JournalUnavailable: the journal could not be written.
        """
        params = self._committing_params(
            operation_id, intent_digest, metadata, actor, lease_ttl_seconds, evidence
        )

        def write(conn: _Conn) -> tuple[Any, ...] | None:
            try:
                return conn.execute(self._sql.born_committing, params).fetchone()
            except pg_errors.UniqueViolation:
                # it exists (autocommit: nothing to roll back): answer with it
                return conn.execute(self._sql.get, (operation_id,)).fetchone()

        # Repeating is safe: a create that did commit is found by the repeat.
        row = self._run("record the intent", write, repeatable=True)
        if row is None:  # pragma: no cover - the insert conflicted on this very key
            raise _rules.not_found(operation_id)
        entry = _entry(row)
        if entry.intent_digest != intent_digest:
            raise _rules.intent_conflict(entry)
        return entry

    def find_run_or_create_committing(
        self,
        start: RunStart,
        *,
        provenance: SafeMapping | None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> tuple[RunRecord | None, JournalEntry | None, bool]:
        """``find_run``, and ``create_committing_with_run`` unless it finds anything: one statement.

        Forward mode's first attempt (ADR 0018). A birth guarded by the absence of both
        the run's key and the entry, which returns the run and entry as they were before
        it (its snapshot) beside the entry it bore; it writes nothing (and raises
        nothing) when either exists. Returns ``(None, entry, True)``
        for an entry born COMMITTING now with its run RUNNING at attempt 1, as
        ``create_committing_with_run`` returns ``(entry, True)``; else ``(run, entry,
        False)`` as ``find_run`` read them. Both None and False: another executor created
        one of them after this statement's snapshot; nothing of this write was kept, and
        the caller reads again.
        """
        params = self._birth_params(
            start,
            provenance=provenance,
            operation_id=operation_id,
            intent_digest=intent_digest,
            metadata=metadata,
            actor=actor,
            lease_ttl_seconds=lease_ttl_seconds,
            evidence=evidence,
        )
        self._behind.settle(only=operation_id)
        return self._find_or_create_now(start, params, actor=actor, repeated=False)

    def send_find_run_or_create_committing(
        self,
        start: RunStart,
        *,
        provenance: SafeMapping | None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> Callable[[], tuple[RunRecord | None, JournalEntry | None, bool]] | None:
        """``find_run_or_create_committing``, sent now; what it returns is read later (ADR 0021).

        Returns what reads the answer (once; it raises what the call would), or None,
        having committed nothing, when this journal cannot send ahead now (no pool,
        psycopg without the pipeline calls ADR 0017 uses, another birth's answer unread,
        or its session could not take the statement): the caller then makes the call. A
        bad value raises here. The statement commits on its own session, synchronously:
        once the answer says born, the entry is durable. A session lost with the answer
        unread is judged as ``_run`` judges a lost reply: the statement runs again on a
        pooled session, and a birth that had landed is found as this call's own.
        """
        if not self.completes_behind:
            return None
        params = self._birth_params(
            start,
            provenance=provenance,
            operation_id=operation_id,
            intent_digest=intent_digest,
            metadata=metadata,
            actor=actor,
            lease_ttl_seconds=lease_ttl_seconds,
            evidence=evidence,
        )
        self._behind.settle(only=operation_id)
        try:
            answer = self._ahead.send(self._born_unless_found, params)
        except SessionLost:
            # maybe sent: answer as a repeat, which finds a birth that did land
            return lambda: self._find_or_create_now(start, params, actor=actor, repeated=True)
        except psycopg.Error:
            return None  # not sent, or refused at once: the caller makes the call itself
        if answer is None:
            return None

        def read() -> tuple[RunRecord | None, JournalEntry | None, bool]:
            try:
                row = answer()
            except pg_errors.UniqueViolation:
                return None, None, False  # created meanwhile: nothing of this write was kept
            except SessionLost:
                # lost with the answer: maybe born, judged as a repeat
                return self._find_or_create_now(start, params, actor=actor, repeated=True)
            except psycopg.Error as exc:
                raise self._translate(exc, _BIRTH_ACTION) from exc
            return self._birth_outcome(row, start, actor=actor, repeated=False)

        return read

    def _birth_params(
        self,
        start: RunStart,
        *,
        provenance: SafeMapping | None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None,
    ) -> dict[str, Any]:
        params = self._committing_params(
            operation_id, intent_digest, metadata, actor, lease_ttl_seconds, evidence
        )
        params.update(self._run_params(start, owner=actor, provenance=provenance))
        return params

    def _find_or_create_now(
        self, start: RunStart, params: dict[str, Any], *, actor: str, repeated: bool
    ) -> tuple[RunRecord | None, JournalEntry | None, bool]:
        """The birth-or-lookup statement on a pooled session; ``repeated``: maybe ran before."""
        statement = self._born_unless_found
        sent: list[bool] = [True] if repeated else []

        def work(conn: _Conn) -> tuple[Any, ...] | None:
            sent.append(True)
            try:  # ONE statement: its own transaction on an autocommit session
                return conn.execute(statement, params).fetchone()
            except pg_errors.UniqueViolation:
                return None  # created meanwhile: nothing of this write was kept

        # Repeating is safe: a birth that did commit is then found by the lookup (below).
        row = self._run_now(_BIRTH_ACTION, work, repeatable=True)
        return self._birth_outcome(row, start, actor=actor, repeated=len(sent) > 1)

    @staticmethod
    def _birth_outcome(
        row: tuple[Any, ...] | None, start: RunStart, *, actor: str, repeated: bool
    ) -> tuple[RunRecord | None, JournalEntry | None, bool]:
        """What the birth-or-lookup statement's row says; ``repeated``: it may have run twice."""
        if row is None:
            return None, None, False
        born = _RUN_WIDTH + _ENTRY_WIDTH
        if row[born] is not None:
            return None, _entry(tuple(row[born:])), True
        run, entry = _run_and_entry(row[:born])
        if (
            repeated
            and run is not None
            and entry is not None
            and run.run_id == start.run_id
            and run.current_attempt == 1
            and entry.state is CommitState.COMMITTING
            and entry.lease_owner == actor
            and entry.lease_epoch == 1
        ):
            # this call's own birth, repeated after its reply was lost: born. Only then:
            # the same owner's earlier try of the run (``call_with_retries``) left this
            # too, and that one is resumed, as after any lookup.
            return None, entry, True
        return run, entry, False

    def create_committing_with_run(
        self,
        start: RunStart,
        *,
        provenance: SafeMapping | None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None = None,
    ) -> tuple[JournalEntry, bool]:
        """``create_committing`` and the new run at attempt 1 (RUNNING) in one transaction.

        Forward mode's first attempt (ADR 0008): the run, its attempt 1 (the lease epoch
        the entry is born with, owned by ``actor``) and the entry COMMITTING commit
        together: one statement (ADR 0011), one round trip and one WAL flush. When the
        entry or the run already exists, nothing of this write is kept: the entry is then
        created (or found) by ``create_committing`` alone and the second value is False
        (the caller records the run the ordinary way). Returns and raises as
        ``FoldingLedgerPort.create_committing_with_run`` says.
        """
        params = self._committing_params(
            operation_id, intent_digest, metadata, actor, lease_ttl_seconds, evidence
        )
        params.update(self._run_params(start, owner=actor, provenance=provenance))
        statement = self._born_with_run[CommitState.COMMITTING]

        def write(conn: _Conn) -> tuple[Any, ...] | None:
            # ONE statement (ADR 0011): on an autocommit session it is its own transaction
            try:
                return conn.execute(statement, params).fetchone()
            except pg_errors.UniqueViolation:
                return None  # the entry or the run exists: nothing of this write was kept

        # Repeating is safe: a write that did commit makes the repeat a unique violation,
        # and the plain create below then finds the entry (ours: the caller resumes it).
        row = self._run(
            "record the intent and the run", write, repeatable=True, touching=operation_id
        )
        if row is None:
            entry = self.create_committing(
                operation_id=operation_id,
                intent_digest=intent_digest,
                metadata=metadata,
                actor=actor,
                lease_ttl_seconds=lease_ttl_seconds,
                evidence=evidence,
            )
            return entry, False
        entry = _entry(row)
        return entry, True

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
        """Move the entry to ``next_state`` in one conditional UPDATE; version + 1.

        ``release_lease`` also lets the caller's lease expire now, in the same write.
        """
        query, params = self._cas_statement(
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            next_state=next_state,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
            audit=audit,
            release_lease=release_lease,
            atomic=False,
        )
        # Never repeated: a CAS whose commit was lost in transit must not be sent again.
        return self._run(
            "write the journal state",
            lambda conn: self._cas(conn, query, params, expected_states=expected_states),
            repeatable=False,
        )

    def complete_proven(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """COMPLETE (lease ended) on an asynchronous-commit session: no flush of its own.

        Only for a COMPLETE the target's fence proves (ADR 0008). WAL is flushed in
        order, so the write is durable with the next synchronous commit on this server
        (or the WAL writer's next flush, within ``wal_writer_delay``); a server crash
        before that returns the entry to COMMITTING, which the next run completes after
        observing the committed fence, writing nothing.
        """
        query, params = self._complete_statement(
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
        )
        # Never repeated (as compare_and_set); the asynchronous-commit sessions are the
        # run ledger's (``_ready_ledger_pool``)
        return self._run(
            "write the journal state",
            lambda conn: self._cas(conn, query, params, expected_states=expected_states),
            repeatable=False,
            ledger=True,
        )

    def complete_proven_ending_run(
        self,
        *,
        run_id: str,
        attempt: int,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> tuple[JournalEntry, bool]:
        """``complete_proven`` and ``end_attempt(run_id, attempt, COMPLETE)`` as ONE statement.

        Forward mode's first attempt (ADR 0013): the run ledger's end of the attempt
        rides on the COMPLETE the fence proves, on the same asynchronous-commit session
        both used apart. The run moves only when the entry did (a conflict raises
        ``JournalConflict`` and ends nothing) and only while it is at ``attempt``.

        Returns:
            ``(entry, run_ended)``: ``run_ended`` False when the run was not at
            ``attempt`` (the caller ends it the ordinary way, which says why).
        """
        query, params = self._ending_statement(
            run_id=run_id,
            attempt=attempt,
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
        )
        # Never repeated (as complete_proven)
        row = self._run(
            "write the journal state and end the run",
            lambda conn: self._cas_row(conn, query, params, expected_states=expected_states),
            repeatable=False,
            ledger=True,
        )
        return _entry(row), bool(row[-1])

    @property
    def completes_behind(self) -> bool:
        """True when ``complete_proven_ending_run_behind`` returns before its write lands.

        Only a pooled journal does (``dpone.api.Runner``): a one-session journal serves one
        operation per process, with nothing to overlap the write with.
        """
        return self._pooled and _SENDS_BEHIND

    def prepare_proven_ending_run_behind(
        self,
        *,
        run_id: str,
        attempt: int,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> None:
        """Build the statement of a later ``complete_proven_ending_run_behind`` now.

        For a caller with time to spare while it waits (the birth's gate, ADR 0021):
        the next ``complete_proven_ending_run_behind`` whose arguments equal these sends
        the statement built here; any other builds its own, as always. Also reads the
        answer of the write behind the last caller. Raises nothing a later call would
        not: a bad value is left for that call to raise.
        """
        cas = _ending_arguments(
            run_id=run_id,
            attempt=attempt,
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
        )
        try:
            self._ending_ready = (cas, self._ending_statement(**cas))
        except DponeError:
            self._ending_ready = None
        self._behind.settle()

    def complete_proven_ending_run_behind(
        self,
        *,
        on_failure: Callable[[DponeError], None],
        run_id: str,
        attempt: int,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> None:
        """``complete_proven_ending_run``, sent now and its answer read later.

        Only for a COMPLETE the target's fence proves (ADR 0017): losing it leaves the
        entry COMMITTING, which the next run of the operation completes from the fence,
        as after a crash between the commit and COMPLETE (or a server crash losing that
        asynchronous commit, ADR 0013). The statement is built here, so a bad value
        raises here. The journal settles the write before any later call that could
        read or move what it writes; a failure, or a run the write did not end, goes to
        ``on_failure`` then, and never to the unrelated call that settled it.
        """
        query, params = self._ready_ending(
            _ending_arguments(
                run_id=run_id,
                attempt=attempt,
                operation_id=operation_id,
                expected_version=expected_version,
                expected_states=expected_states,
                lease_epoch=lease_epoch,
                actor=actor,
                evidence=evidence,
                result=result,
            )
        )

        action = "write the journal state and end the run"

        def send() -> Finish:
            conn, pipeline = self._behind_session()
            cur = conn.cursor()
            try:
                cur.execute(query, params)
                # the Sync that commits it (asynchronously, as on every ledger session),
                # sent now; its answer is read by finish
                pipeline._enqueue_sync()
                conn.wait(pipeline._communicate_gen())
            except psycopg.Error as exc:
                # Sending also reads any answer already there. Not the session's loss: the
                # statement's own answer came early; it is this write's error, read at
                # settle like any other. The session, aborted mid-pipeline, is dropped.
                cur.close()
                lost = conn.broken or conn.closed
                self._behind_pipe.drop()
                if lost:
                    raise self._translate(exc, action) from exc
                refused, cause = self._translate(exc, action), exc

                def answered() -> None:
                    raise refused from cause

                return answered

            def again() -> tuple[Any, ...]:
                # the session was lost (a server restart, an idle kill): its answer, and
                # maybe the write, with it. The same CAS on a pooled session instead; if
                # the first did land, the entry moved on and reads COMPLETE.
                try:
                    # repeatable: the pool's idle sessions may be lost too, and a repeat of
                    # a CAS that landed is a conflict, judged below
                    return self._run_now(
                        action,
                        lambda c: self._cas_row(c, query, params, expected_states=expected_states),
                        repeatable=True,
                        ledger=True,
                    )
                except JournalConflict as conflict:
                    if (
                        conflict.current_state != CommitState.COMPLETE.value
                        or conflict.current_version != expected_version + 1
                    ):
                        raise  # not (only) this write's COMPLETE: another executor's
                    return (True,)  # landed the first time: its run ended with it

            def finish() -> None:
                try:
                    conn.wait(pipeline._fetch_gen(flush=False))
                    row = cur.fetchone()
                except psycopg.Error as exc:
                    if not (conn.broken or conn.closed):
                        raise self._translate(exc, action) from exc
                    self._behind_pipe.drop()
                    row = again()
                except Exception as exc:  # psycopg's private calls changed: a lost write
                    self._behind_pipe.drop()
                    raise JournalUnavailable(
                        f"the journal write behind the caller could not be read back ({action})",
                        operation_id=operation_id,
                    ) from exc
                finally:
                    cur.close()
                if row is None:
                    raise JournalConflict(
                        f"the journal entry moved on from version {expected_version} at epoch "
                        f"{lease_epoch} before its COMPLETE",
                        operation_id=operation_id,
                    )
                if not row[-1]:
                    raise JournalConflict(
                        f"the run {run_id} was not at attempt {attempt}: its end was not "
                        "recorded with the COMPLETE",
                        operation_id=operation_id,
                    )

            return finish

        if not self._behind.submit(operation_id, send, on_failure=on_failure):
            # closed: written now, as without this (and refused as closed from here on)
            self.complete_proven_ending_run(
                run_id=run_id,
                attempt=attempt,
                operation_id=operation_id,
                expected_version=expected_version,
                expected_states=expected_states,
                lease_epoch=lease_epoch,
                actor=actor,
                result=result,
                evidence=evidence,
            )

    def compare_and_set_within(
        self,
        txn: object,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        next_state: CommitState,
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None = None,
        result: Mapping[str, object] | None = None,
        release_lease: bool = False,
    ) -> JournalEntry:
        """Run the CAS on the target's open transaction ``txn``; atomic folds allowed.

        Args:
            txn: a ``psycopg.Connection`` to this journal's database, inside a
                transaction. It is never begun, committed or rolled back here.

        Raises:
            TypeError: ``txn`` is not a ``psycopg.Connection``.
            ValueError: ``txn`` is not in a transaction or is connected elsewhere.
            IllegalTransition, JournalConflict, OperationNotFound: as ``compare_and_set``;
                the caller must roll its transaction back.
            JournalUnavailable: the statement failed (the transaction is then aborted).
        """
        if not isinstance(txn, psycopg.Connection):
            raise TypeError("txn must be the target's psycopg.Connection")
        query, params = self._cas_statement(
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            next_state=next_state,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
            audit=None,
            release_lease=release_lease,
            atomic=True,
        )
        self._check_txn(txn)
        try:
            # The target may use another row factory; decoding expects tuples.
            with txn.cursor(row_factory=tuple_row) as cur:
                return self._cas(cur, query, params, expected_states=expected_states)
        except psycopg.Error as exc:
            raise self._translate(exc, "write the journal state in the target transaction") from exc

    # ------------------------------------------------------------------ checkpoints
    def _checkpoints(self) -> _checkpoint_sql.Dialect:
        return _checkpoint_sql.Dialect(
            ph="%s", prefix='"' + self._schema + '".', lock=" FOR UPDATE"
        )

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
        """CAS to COMPLETE and promote the checkpoint in one transaction."""
        query, params = self._complete_statement(
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
        )
        dialect = self._checkpoints()

        def write(conn: _Conn) -> JournalEntry:
            with conn.transaction(), conn.cursor() as cur:
                entry = self._cas(cur, query, params, expected_states=expected_states)
                _checkpoint_sql.promote(
                    cur, dialect, checkpoint, operation_id=operation_id, at=_pg_now(cur)
                )
                return entry

        # Never repeated: a CAS whose commit was lost in transit must not be sent again.
        return self._run("complete and promote the checkpoint", write, repeatable=False)

    def complete_with_checkpoint_within(
        self,
        txn: object,
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
        """``compare_and_set_within`` to COMPLETE, then promote the checkpoint on ``txn``."""
        entry = self.compare_and_set_within(
            txn,
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
        assert isinstance(txn, psycopg.Connection)  # noqa: S101 - checked by the CAS above
        try:
            with txn.cursor(row_factory=tuple_row) as cur:
                _checkpoint_sql.promote(
                    cur,
                    self._checkpoints(),
                    checkpoint,
                    operation_id=operation_id,
                    at=_pg_now(cur),
                )
        except psycopg.Error as exc:
            raise self._translate(exc, "promote the checkpoint in the target transaction") from exc
        return entry

    def promote_completed(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Promote the checkpoint of an already COMPLETE operation (state checked here)."""
        dialect = self._checkpoints()

        def write(conn: _Conn) -> bool:
            with conn.transaction(), conn.cursor() as cur:
                row = cur.execute(self._sql.get, (operation_id,)).fetchone()
                if row is None or _entry(row).state is not CommitState.COMPLETE:
                    return False
                _checkpoint_sql.promote(
                    cur, dialect, checkpoint, operation_id=operation_id, at=_pg_now(cur)
                )
                return True

        return self._run("promote the checkpoint", write, repeatable=True)

    def bind_delivery_checkpoint(
        self, *, operation_id: str, checkpoint: CheckpointAdvance
    ) -> CheckpointAdvance:
        """Record what a delivery promotes once it succeeds; return the recorded binding."""
        dialect = self._checkpoints()

        def write(conn: _Conn) -> CheckpointAdvance:
            with conn.transaction(), conn.cursor() as cur:
                return _checkpoint_sql.bind(
                    cur, dialect, checkpoint, operation_id=operation_id, at=_pg_now(cur)
                )

        return self._run("bind a delivery's checkpoint", write, repeatable=True)

    def delivery_checkpoint(self, operation_id: str) -> CheckpointAdvance | None:
        """Return what a delivery promotes, or None when it promotes nothing."""
        dialect = self._checkpoints()
        if self._read_only and not self._ready:
            try:
                self._ready_connections()
            except ConfigInvalid:
                if self._unborn:
                    return None  # no journal here yet (e.g. only `dpone delivery send` ran)
                raise

        def read(conn: _Conn) -> CheckpointAdvance | None:
            try:
                return _checkpoint_sql.bound(conn.cursor(), dialect, operation_id)
            except pg_errors.UndefinedTable:
                if not self._read_only:
                    raise  # a writable open migrated it: a missing table is an error
                return None  # read-only on a schema before version 4: it binds nothing

        return self._run("read a delivery's checkpoint", read, repeatable=True)

    def promote_delivered(self, *, operation_id: str, checkpoint: CheckpointAdvance) -> bool:
        """Absolute checkpoint write for a delivery whose remote success is verified.

        Returns False when the interval was already recorded (nothing changes).
        """
        dialect = self._checkpoints()

        def write(conn: _Conn) -> bool:
            with conn.transaction(), conn.cursor() as cur:
                # now() is the transaction's start: one read serves both writes
                return _checkpoint_sql.promote_unrecorded(
                    cur, dialect, checkpoint, operation_id=operation_id, at=_pg_now(cur)
                )

        return self._run("promote a delivery's checkpoint", write, repeatable=True)

    def get_checkpoint(self, stream_id: str) -> Checkpoint | None:
        """Return the stream's checkpoint, or None."""
        dialect = self._checkpoints()
        return self._run(
            "read a checkpoint",
            lambda conn: _checkpoint_sql.read(conn.cursor(), dialect, stream_id),
            repeatable=True,
        )

    def list_checkpoints(self) -> list[Checkpoint]:
        """Return every stream's checkpoint."""
        dialect = self._checkpoints()
        return self._run(
            "list checkpoints",
            lambda conn: _checkpoint_sql.list_all(conn.cursor(), dialect),
            repeatable=True,
        )

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
        dialect = self._checkpoints()

        def write(conn: _Conn) -> tuple[int, int] | None:
            with conn.transaction(), conn.cursor() as cur:
                return _checkpoint_sql.claim(
                    cur, dialect, template, proposed_end=proposed_end, at=_pg_now(cur)
                )

        return self._run("claim the next interval", write, repeatable=True)

    def create_complete_within(
        self,
        txn: object,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> JournalEntry:
        """Insert the entry already COMPLETE, in the target's open transaction ``txn``.

        The atomic first attempt (ADR 0003): one INSERT whose CTE writes the history the
        unfolded path would (``create`` and ``lease`` at version 1, the fold to COMPLETE
        at version 2); the lease ends in the same write. ``txn`` is never begun,
        committed or rolled back here.

        Raises:
            TypeError: ``txn`` is not a ``psycopg.Connection``.
            ValueError: ``txn`` is not in a transaction or is connected elsewhere.
            JournalConflict: the entry already exists (committed by another executor);
                the transaction is aborted and the caller must roll it back.
            JournalUnavailable: the statement failed (the transaction is then aborted).
        """
        return self._complete_within(
            txn,
            statement=self._sql.born_complete,
            what="the journal entry",
            operation_id=operation_id,
            intent_digest=intent_digest,
            metadata=metadata,
            actor=actor,
            result=result,
            evidence=evidence,
        )

    def queue_complete_within(
        self,
        txn: object,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> PendingEntry:
        """``create_complete_within``, queued on a pipelining target (ADR 0016).

        Sends the same INSERT (in pipeline mode: queues it) and returns its collector,
        which the connector calls once the transaction's sync has the results; it
        returns the entry, or raises ``JournalConflict`` / ``JournalUnavailable`` exactly
        as ``create_complete_within`` would when this INSERT is what failed.
        """
        return self._queue_complete_within(
            txn,
            statement=self._sql.born_complete,
            what="the journal entry",
            operation_id=operation_id,
            intent_digest=intent_digest,
            metadata=metadata,
            actor=actor,
            result=result,
            evidence=evidence,
        )

    def fuse_complete_within(self, txn: object, **fields: Any) -> Fused:
        """``queue_complete_within``'s INSERT as a ``Fused`` part (ADR 0022).

        Takes the same arguments; the target's connection ``txn`` need not be in a
        transaction: the connector writes the part inside its own one statement.
        """
        return self._fuse_complete_within(
            txn, statement=self._sql.born_complete, what="the journal entry", **fields
        )

    def _complete_within(self, txn: object, **fields: Any) -> JournalEntry:
        """Insert the entry born COMPLETE (and the run, given ``run_params``) in ``txn``.

        ``fields``: ``_queue_complete_within``'s keyword arguments; its collector is
        called at once, which reads the INSERT's result (in pipeline mode too).
        """
        entry = self._queue_complete_within(txn, **fields)(None)
        assert entry is not None  # noqa: S101 - collected without an error
        return entry

    def _queue_complete_within(
        self, txn: object, *, statement: str, what: str, **fields: Any
    ) -> PendingEntry:
        """``_complete_within`` queued: returns the INSERT's collector (ADR 0016)."""
        return self._born_queued(txn, statement, self._complete_params(**fields), what)

    def _fuse_complete_within(
        self, txn: object, *, statement: str, what: str, **fields: Any
    ) -> Fused:
        """``_queue_complete_within`` as a ``Fused`` part (ADR 0022)."""
        return self._born_fused(txn, statement, self._complete_params(**fields), what)

    def _complete_params(
        self,
        *,
        run_params: Mapping[str, object] | None = None,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        result: Mapping[str, object],
        evidence: Mapping[str, object] | None = None,
    ) -> dict[str, Any]:
        """The parameters of an entry born COMPLETE (and of its run, given ``run_params``)."""
        params = self._born_params(
            CommitState.COMPLETE,
            ttl=None,
            operation_id=operation_id,
            intent_digest=intent_digest,
            metadata=metadata,
            actor=actor,
            result=result,
            evidence=evidence,
        )
        if run_params is not None:
            params.update(run_params)
        return params

    def _born_fused(self, txn: object, statement: str, params: dict[str, Any], what: str) -> Fused:
        """``_born_queued``'s INSERT as a ``Fused`` part of the target's statement.

        Its collector reads the entry from the host row's first columns; given the
        host statement's error it raises ``JournalConflict`` for a unique violation in
        this journal's tables (the run's key or the entry exists: everything rolled
        back), this journal's translation for any other error on them, and returns for
        an error it cannot tell its own (ADR 0022).
        """
        if not isinstance(txn, psycopg.Connection):
            raise TypeError("txn must be the target's psycopg.Connection")
        self._behind.settle()
        self._check_database(txn)
        ctes, names = self._fusions[statement]
        operation_id = params["operation_id"]
        schema = self._schema

        def collect(
            columns: Sequence[object] | None, error: BaseException | None
        ) -> JournalEntry | None:
            if error is None:
                assert columns is not None  # noqa: S101 - the host row holds our columns
                return _entry(tuple(columns))
            if not isinstance(error, psycopg.Error) or not _on_tables(error, schema, _FUSED_TABLES):
                return None  # not an error of this journal's tables
            if isinstance(error, pg_errors.UniqueViolation):
                raise JournalConflict(
                    f"{what} was created by another executor first; read it and decide again",
                    operation_id=operation_id,
                ) from error
            raise self._translate(error, "create the journal entry in the target transaction")

        return Fused(
            ctes=ctes,
            params=[params[name] for name in names],
            select=_ENTRY_SELECT,
            source=b"created AS c",
            width=_ENTRY_WIDTH,
            collect=collect,
        )

    def _born_queued(
        self, txn: object, statement: str, params: dict[str, Any], what: str
    ) -> PendingEntry:
        """Send (or, in pipeline mode, queue) the INSERT of an entry born COMPLETE.

        Returns its collector (``QueuedWithin``, ADR 0016): called with None it reads the
        entry the INSERT returned; called with the error the target's sync raised, it
        raises this statement's own translation when the statement failed (it then has no
        result) and returns None otherwise (the error is another statement's).
        """
        if not isinstance(txn, psycopg.Connection):
            raise TypeError("txn must be the target's psycopg.Connection")
        self._check_txn(txn)
        operation_id = params["operation_id"]

        def failed(exc: psycopg.Error) -> DponeError:
            if isinstance(exc, pg_errors.UniqueViolation):
                return JournalConflict(
                    f"{what} was created by another executor first; read it and decide again",
                    operation_id=operation_id,
                )
            return self._translate(exc, "create the journal entry in the target transaction")

        cur = txn.cursor(row_factory=tuple_row)
        # In pipeline mode ``execute`` also reads the results that have arrived, so it
        # could raise an EARLIER statement's error: a pipelining connector queues this
        # statement first in its transaction (after BEGIN), so an error here is ours.
        try:
            cur.execute(statement, params)
        except psycopg.Error as exc:
            cur.close()
            raise failed(exc) from exc

        def collect(error: BaseException | None) -> JournalEntry | None:
            try:
                if error is not None:
                    if cur.pgresult is not None:
                        return None  # this INSERT succeeded: the error is not ours
                    if isinstance(error, psycopg.Error):
                        raise failed(error) from error
                    raise error
                try:
                    row = cur.fetchone()
                except psycopg.Error as exc:
                    raise failed(exc) from exc
                assert row is not None  # noqa: S101 - INSERT ... RETURNING of one row
                return _entry(row)
            finally:
                cur.close()

        return collect

    def acquire_lease(
        self,
        *,
        operation_id: str,
        owner: str,
        ttl_seconds: float,
        expected_version: int | None = None,
        break_owner: str | None = None,
    ) -> JournalEntry:
        """Grant the lease to ``owner`` at epoch + 1 in one conditional UPDATE; version + 1."""
        ttl = _rules.check_ttl(ttl_seconds)
        _rules.safe_actor(owner)
        params = {
            "operation_id": operation_id,
            "owner": owner,
            "ttl": ttl,
            "expected_version": expected_version,
            "break_owner": break_owner,
        }

        def write(conn: _Conn) -> JournalEntry:
            row = conn.execute(self._sql.acquire, params).fetchone()
            if row is not None:
                return _entry(row)
            found = conn.execute(self._sql.get_with_now, (operation_id,)).fetchone()
            if found is None:
                raise _rules.not_found(operation_id)
            current = _entry(found)
            if expected_version is not None and current.version != expected_version:
                raise _rules.conflict(
                    expected_version=expected_version,
                    expected_states=None,
                    lease_epoch=None,
                    current=current,
                )
            raise _rules.lease_held(current, now=float(found[11]))

        # Not repeated: a grant whose reply was lost would be granted again (epoch + 2).
        return self._run("acquire the lease", write, repeatable=False)

    def renew_lease(
        self, *, operation_id: str, owner: str, lease_epoch: int, ttl_seconds: float
    ) -> JournalEntry:
        """Extend the caller's lease by the server clock; the version does not change."""
        ttl = _rules.check_ttl(ttl_seconds)
        params = {
            "operation_id": operation_id,
            "owner": owner,
            "lease_epoch": lease_epoch,
            "ttl": ttl,
        }

        def write(conn: _Conn) -> JournalEntry:
            row = conn.execute(self._sql.renew, params).fetchone()
            if row is not None:
                return _entry(row)
            found = conn.execute(self._sql.get, (operation_id,)).fetchone()
            if found is None:
                raise _rules.not_found(operation_id)
            raise _rules.lease_lost(_entry(found), lease_epoch=lease_epoch)

        # Repeating a renewal only sets the same kind of expiry again.
        return self._run("renew the lease", write, repeatable=True)

    def release_lease(self, *, operation_id: str, owner: str, lease_epoch: int) -> None:
        """Expire the caller's lease now if it still holds it; otherwise do nothing."""
        params = {"operation_id": operation_id, "owner": owner, "lease_epoch": lease_epoch}
        self._run(
            "release the lease",
            lambda conn: conn.execute(self._sql.release, params),
            repeatable=True,
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
        state = None if entry is None else entry.state.value
        version = None if entry is None else entry.version
        params = (
            operation_id,
            request.principal,
            request.action,
            request.reason,
            request.attestation,
            state,
            state,
            version,
            version,
            outcome,
        )
        row = self._run(
            "append the audit record",
            lambda conn: conn.execute(self._sql.append_audit, params).fetchone(),
            repeatable=False,
        )
        assert row is not None  # noqa: S101 - INSERT ... RETURNING of one row
        return _rules.audit_record(
            operation_id=operation_id,
            request=request,
            outcome=outcome,
            before_state=None if entry is None else entry.state,
            before_version=version,
            after=entry,
            at=float(row[0]),
        )

    # ------------------------------------------------------------------ run ledger
    def begin_run(self, start: RunStart) -> tuple[RunRecord, bool]:
        """Record the run if its idempotency key is new; else return the existing run."""
        # repeatable: inserting a key that exists returns the existing run
        return self._ledger("record the run", lambda d, c: _ledger_sql.begin_run(c, d, start))

    def get_run(self, run_id: str) -> RunRecord | None:
        """Return one run or None."""
        return self._ledger("read a run", lambda d, c: _ledger_sql.get_run(c, d, run_id))

    def list_runs(
        self, *, states: frozenset[RunState] | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """Return runs, newest update first."""
        return self._ledger(
            "list runs", lambda d, c: _ledger_sql.list_runs(c, d, states=states, limit=limit)
        )

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Return a run's attempts in order."""
        return self._ledger(
            "read a run's attempts", lambda d, c: _ledger_sql.list_attempts(c, d, run_id)
        )

    def begin_attempt(
        self, *, run_id: str, attempt: int, owner: str, provenance: SafeMapping | None = None
    ) -> AttemptRecord:
        """Record attempt ``attempt`` (the lease epoch) and make it current; refuse stale ones."""
        return self._ledger(
            "record the attempt",
            lambda d, c: _ledger_sql.begin_attempt(
                c, d, run_id=run_id, attempt=attempt, owner=owner, provenance=provenance
            ),
        )

    def end_attempt(
        self, *, run_id: str, attempt: int, state: RunState, error: RunError | None = None
    ) -> RunRecord:
        """Record how the current attempt ended; refuse a stale attempt's write."""
        return self._ledger(
            "record the end of the attempt",
            lambda d, c: _ledger_sql.end_attempt(
                c, d, run_id=run_id, attempt=attempt, state=state, error=error
            ),
        )

    def find_run(
        self, *, idempotency_key: str, operation_id: str
    ) -> tuple[RunRecord | None, JournalEntry | None]:
        """Return the run under the key and the operation's journal entry, in one read.

        The replay of a finished run needs nothing else (ADR 0008): one round trip on a
        journal session, no write.
        """
        row = self._run(
            "read the run and its journal entry",
            lambda conn: conn.execute(self._find_run, (idempotency_key, operation_id)).fetchone(),
            repeatable=True,
            touching=operation_id,
        )
        assert row is not None  # noqa: S101 - the outer SELECT always returns one row
        return _run_and_entry(row)

    def complete_run_writer(
        self, start: RunStart, *, owner: str, provenance: SafeMapping | None = None
    ) -> Callable[[object], None]:
        """Check the run now; return the writer of the run COMPLETE in the target transaction.

        The folded atomic first attempt (ADR 0008): the run, attempt 1 and their
        COMPLETE end commit with the rows, the fence and the journal entry, or not at
        all. In a pipelined transaction the statement is only queued: its error, if any,
        is raised by the next statement that reads a result (the journal entry's INSERT,
        which turns a unique violation into ``JournalConflict``).
        """
        params = self._run_params(start, owner=owner, provenance=provenance)
        statement = self._run_complete

        def write(txn: object) -> None:
            if not isinstance(txn, psycopg.Connection):
                raise TypeError("txn must be the target's psycopg.Connection")
            self._check_txn(txn)
            try:
                with txn.cursor(row_factory=tuple_row) as cur:
                    cur.execute(statement, params)
            except pg_errors.UniqueViolation as exc:
                raise JournalConflict(
                    "the run was recorded by another executor first; read it and decide again",
                    operation_id=start.operation_id,
                ) from exc
            except psycopg.Error as exc:
                raise self._translate(exc, "record the run in the target transaction") from exc

        return write

    def complete_run_entry_writer(
        self, start: RunStart, *, owner: str, provenance: SafeMapping | None = None
    ) -> Callable[..., JournalEntry]:
        """Check the run now; return the writer of the run AND the entry born COMPLETE.

        ``complete_run_writer`` and ``create_complete_within`` as ONE statement (ADR
        0011): the writer takes the target's open transaction and
        ``create_complete_within``'s keyword arguments and inserts the run COMPLETE at
        attempt 1, that attempt COMPLETE, the entry COMPLETE and its history. A unique
        violation (the run's key or the entry exists) is ``JournalConflict``, as either
        write alone raises it.

        Raises:
            UnsafeValue: provenance or access hold a secret-looking value (checked here,
                before any write).
        """
        return partial(
            self._complete_within,
            statement=self._born_with_run[CommitState.COMPLETE],
            what="the journal entry or the run",
            run_params=self._run_params(start, owner=owner, provenance=provenance),
        )

    def queue_complete_run_entry_writer(
        self, start: RunStart, *, owner: str, provenance: SafeMapping | None = None
    ) -> Callable[..., PendingEntry]:
        """``complete_run_entry_writer``, queued on a pipelining target (ADR 0016).

        The writer takes the same arguments and returns the statement's collector (see
        ``queue_complete_within``) instead of the entry.
        """
        return partial(
            self._queue_complete_within,
            statement=self._born_with_run[CommitState.COMPLETE],
            what="the journal entry or the run",
            run_params=self._run_params(start, owner=owner, provenance=provenance),
        )

    def fuse_complete_run_entry_writer(
        self, start: RunStart, *, owner: str, provenance: SafeMapping | None = None
    ) -> Callable[..., Fused]:
        """``queue_complete_run_entry_writer``'s writer as a ``Fused`` part (ADR 0022)."""
        return partial(
            self._fuse_complete_within,
            statement=self._born_with_run[CommitState.COMPLETE],
            what="the journal entry or the run",
            run_params=self._run_params(start, owner=owner, provenance=provenance),
        )

    def _run_params(
        self, start: RunStart, *, owner: str, provenance: SafeMapping | None
    ) -> dict[str, object]:
        """``complete_run_params``, checked once per run: the run service asks for both
        folds of a new run (atomic and forward) before the protocol picks one."""
        memo = self._run_memo
        if memo is not None and memo[0] is start and memo[1] == owner and memo[2] is provenance:
            return memo[3]
        params = _ledger_sql.complete_run_params(start, owner=owner, provenance=provenance)
        self._run_memo = (start, owner, provenance, params)
        return params

    def _ledger(self, action: str, work: Callable[[_ledger_sql.LedgerDialect, _Conn], _T]) -> _T:
        """Run ledger statements in one transaction; every ledger write is repeatable."""
        dialect = self._ledger_dialect

        # Every ledger write is one statement (the PostgreSQL branches of _ledger_sql), run
        # on its own autocommit session whose commits do not wait for their WAL flush.
        # The ledger is the record of who ran what, not the source of truth (the journal
        # is), and WAL is flushed in order: a ledger write that precedes a journal or
        # target commit on this server is durable once that commit is. Only a server
        # crash can lose the last ledger write, and the next replay of the run writes it
        # again (docs/runs-and-retries.md). This keeps the ledger out of the WAL-sync and
        # round-trip budgets of issue 3.
        return self._run(action, lambda conn: work(dialect, conn), repeatable=True, ledger=True)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the connection pool. Idempotent; a forked child leaves the parent's alone."""
        # the write behind the last caller is read first (ADR 0017), then its session closed
        self._behind.close(then=self._behind_pipe.drop)
        self._ahead.close()
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            ledger, self._ledger_pool = self._ledger_pool, None
            session, self._session = self._session, None
            forked = os.getpid() != self._pid
            ledger_forked = os.getpid() != self._ledger_pid
        if session is not None:
            self._close_session(session, forked=forked)
        if ledger is not None:
            if ledger_forked:
                self._inherited.append(ledger)
            else:
                ledger.close()
        if pool is None:
            return
        if forked:
            self._inherited.append(pool)
            return
        pool.close()

    def __enter__(self) -> PostgresCommitJournal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresCommitJournal({self._locator!r}, schema={self._schema!r})"

    # ------------------------------------------------------------------ internals
    def _cas_statement(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        next_state: CommitState,
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None,
        result: Mapping[str, object] | None,
        audit: AuditRequest | None,
        release_lease: bool,
        atomic: bool,
        ending_run: bool = False,
    ) -> tuple[str, dict[str, Any]]:
        """Check the move and the values; return the CAS statement with its parameters.

        ``atomic``: the CAS runs in the target's transaction, where folds are allowed
        (``_rules.check_move``).

        The history rows come from ``_rules.transition_rows`` for every state the entry
        may be in; the statement keeps those of the state it actually left, so a CAS
        that accepts several states records the exact (fold) path it took.
        """
        _rules.check_move(
            operation_id=operation_id,
            expected_states=expected_states,
            next_state=next_state,
            atomic=atomic,
            audited=audit is not None,
        )
        safe_evidence = _rules.safe_values(evidence)
        safe_result = _rules.safe_values(result) if result is not None else None
        _rules.safe_actor(actor)
        if audit is not None:
            _rules.safe_audit(audit, "applied")
        params: dict[str, Any] = {
            "operation_id": operation_id,
            "expected_version": expected_version,
            "lease_epoch": lease_epoch,
            "release": bool(release_lease),
            "result": None if safe_result is None else _rules.encode_mapping(safe_result),
            "actor": actor,
            "evidence": _rules.encode_mapping(safe_evidence),
        }
        query = _cas_sql(
            self._sql, expected_states, next_state, audited=audit is not None, ending_run=ending_run
        )
        if audit is None:
            return query, params
        params.update(
            principal=audit.principal,
            action=audit.action,
            reason=audit.reason,
            attestation=audit.attestation,
        )
        return query, params

    def _complete_statement(
        self,
        *,
        operation_id: str,
        expected_version: int,
        expected_states: frozenset[CommitState],
        lease_epoch: int,
        actor: str,
        evidence: Mapping[str, object] | None,
        result: Mapping[str, object] | None,
        ending_run: bool = False,
    ) -> tuple[str, dict[str, Any]]:
        """The CAS to COMPLETE that also ends the lease (non-atomic, unaudited).

        The statement ``complete_proven`` and ``complete_with_checkpoint`` share;
        ``ending_run`` adds the run's end (``complete_proven_ending_run``).
        """
        return self._cas_statement(
            operation_id=operation_id,
            expected_version=expected_version,
            expected_states=expected_states,
            next_state=CommitState.COMPLETE,
            lease_epoch=lease_epoch,
            actor=actor,
            evidence=evidence,
            result=result,
            audit=None,
            release_lease=True,
            atomic=False,
            ending_run=ending_run,
        )

    def _ready_ending(self, cas: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``_ending_statement(**cas)``: the one ``prepare_proven_ending_run_behind`` built
        for exactly these arguments, else a new one."""
        ready, self._ending_ready = self._ending_ready, None
        if ready is not None and ready[0] == cas:
            return ready[1]
        return self._ending_statement(**cas)

    def _ending_statement(
        self, *, run_id: str, attempt: int, **cas: Any
    ) -> tuple[str, dict[str, Any]]:
        """``_complete_statement`` that also ends the run's ``attempt`` (ADR 0013)."""
        query, params = self._complete_statement(**cas, ending_run=True)
        params.update(end_run_id=run_id, end_attempt=int(attempt))
        return query, params

    def _check_txn(self, txn: psycopg.Connection[Any]) -> None:
        """Refuse a target transaction that is not open or not in this journal's database."""
        self._behind.settle()
        info = txn.info
        status = info.transaction_status
        # in pipeline mode a statement queued in the transaction (the run ledger's,
        # ADR 0008) shows it ACTIVE until the next result is read
        queued = status == TransactionStatus.ACTIVE and info.pipeline_status != PipelineStatus.OFF
        if status != TransactionStatus.INTRANS and not queued:
            raise ValueError(
                "txn must be inside an open, healthy transaction: atomic mode needs it"
            )
        self._check_database(txn)

    def _check_database(self, txn: psycopg.Connection[Any]) -> None:
        """Refuse a target connection that is not to this journal's database."""
        server = self._server_identity()
        info = txn.info
        key = (info.host, info.port, info.dbname)
        same = self._same_server.get(key)
        if same is None:  # libpq's view of a connection never changes: judge it once
            same = self._same_server[key] = _info_locator(info) == server
        if not same:
            raise ValueError("txn is connected to another database than this journal's")

    def _committing_params(
        self,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        lease_ttl_seconds: float,
        evidence: Mapping[str, object] | None,
    ) -> dict[str, Any]:
        """Parameters of an entry born COMMITTING, leased to ``actor`` (forward mode)."""
        return self._born_params(
            CommitState.COMMITTING,
            ttl=_rules.check_ttl(lease_ttl_seconds),
            operation_id=operation_id,
            intent_digest=intent_digest,
            metadata=metadata,
            actor=actor,
            result=None,
            evidence=evidence,
        )

    def _born_params(
        self,
        state: CommitState,
        *,
        operation_id: str,
        intent_digest: str,
        metadata: Mapping[str, object],
        actor: str,
        result: Mapping[str, object] | None,
        evidence: Mapping[str, object] | None,
        ttl: float | None,
    ) -> dict[str, Any]:
        """Check the values of an entry born in ``state``: ``_born_statement``'s parameters.

        Born COMPLETE the lease has ended (``ttl`` None, no ``result`` needed otherwise);
        born COMMITTING it is the actor's, for ``ttl`` seconds.
        """
        _rules.check_identity("operation_id", operation_id)
        _rules.check_identity("intent_digest", intent_digest)
        _rules.safe_actor(actor)
        params: dict[str, Any] = {
            "operation_id": operation_id,
            "intent_digest": intent_digest,
            "metadata": _rules.encode_mapping(_rules.safe_values(metadata)),
            "actor": actor,
            "evidence": _rules.encode_mapping(_rules.safe_values(evidence)),
        }
        if state is CommitState.COMPLETE:
            params["result"] = _rules.encode_mapping(_rules.safe_values(result))
        else:
            params["ttl"] = ttl
        return params

    def _cas(
        self,
        conn: _Conn | psycopg.Cursor[tuple[Any, ...]],
        query: str,
        params: dict[str, Any],
        *,
        expected_states: frozenset[CommitState],
    ) -> JournalEntry:
        """Run the CAS statement; on zero rows read the entry and raise the conflict."""
        return _entry(self._cas_row(conn, query, params, expected_states=expected_states))

    def _cas_row(
        self,
        conn: _Conn | psycopg.Cursor[tuple[Any, ...]],
        query: str,
        params: dict[str, Any],
        *,
        expected_states: frozenset[CommitState],
    ) -> tuple[Any, ...]:
        """``_cas``, returning the statement's row as it is."""
        row: tuple[Any, ...] | None = conn.execute(query, params).fetchone()
        if row is not None:
            return row
        found = conn.execute(self._sql.get, (params["operation_id"],)).fetchone()
        if found is None:
            raise _rules.not_found(params["operation_id"])
        raise _rules.conflict(
            expected_version=params["expected_version"],
            expected_states=expected_states,
            lease_epoch=params["lease_epoch"],
            current=_entry(found),
        )

    def _run(
        self,
        action: str,
        work: Callable[[_Conn], _T],
        *,
        repeatable: bool,
        ledger: bool = False,
        touching: str | None = None,
    ) -> _T:
        """``_run_now``, once the write behind the last caller has settled (ADR 0017).

        ``touching`` names the one operation ``work`` reads or writes (with its run), when
        it touches no other: a write in flight for another operation then stays in flight.
        """
        self._behind.settle(only=touching)
        return self._run_now(action, work, repeatable=repeatable, ledger=ledger)

    def _run_now(
        self,
        action: str,
        work: Callable[[_Conn], _T],
        *,
        repeatable: bool,
        ledger: bool = False,
    ) -> _T:
        """Run ``work`` on a pooled connection; translate every driver error.

        A connection found dead (the server restarted since it was pooled) is dropped
        with the pool's other idle ones; ``repeatable`` work then runs once more on a
        fresh connection, since running it twice is harmless.
        """
        if not self._pooled:
            return self._run_on_session(action, work, repeatable=repeatable, ledger=ledger)
        for attempt in (1, 2):
            pool = self._ready_ledger_pool() if ledger else self._ready_pool()
            lost = False
            try:
                with pool.connection() as conn:
                    try:
                        return work(conn)
                    except psycopg.Error:
                        lost = conn.broken or conn.closed
                        raise
            except psycopg.Error as exc:
                if lost:
                    self._drop_dead_connections(pool)
                    if repeatable and attempt == 1:
                        continue
                raise self._translate(exc, action) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop_dead_connections(self, pool: ConnectionPool[_Conn]) -> None:
        try:
            pool.check()
        except psycopg.Error:
            pass  # the pool replaces what it could not check; the caller's error matters

    def _ready_pool(self) -> ConnectionPool[_Conn]:
        """Return this process's pool, migrating the schema and opening it on first use."""
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        if self._pid != os.getpid():
            # A forked child: another thread of the parent may have held the lock.
            self._lock = threading.Lock()
        with self._lock:
            self._check_open()
            if self._pid != os.getpid():
                if self._pool is not None:
                    self._inherited.append(self._pool)
                self._pool = None
                self._pid = os.getpid()
            if not self._ready:
                self._migrate()
            if self._pool is None:
                from psycopg_pool import ConnectionPool  # lazily: a one-shot run never pools

                self._pool = ConnectionPool(
                    self._dsn,
                    kwargs=self._connect_kwargs,
                    min_size=self._pool_min,
                    max_size=self._pool_max,
                    open=False,
                    configure=self._configure,
                    name=_APPLICATION_NAME,
                    timeout=self._connect_timeout_s,
                    num_workers=2,
                )
                self._pool.open(wait=False)
            return self._pool

    def _ready_ledger_pool(self) -> ConnectionPool[_Conn]:
        """The run ledger's sessions: asynchronous commit (see ``_ledger``), a small pool."""
        pool = self._ledger_pool
        if pool is not None and self._pid == os.getpid():
            return pool
        self._ready_pool()  # migrated, opened, this process's
        with self._lock:
            self._check_open()
            if self._ledger_pool is None or self._ledger_pid != os.getpid():
                if self._ledger_pool is not None:
                    self._inherited.append(self._ledger_pool)
                from psycopg_pool import ConnectionPool  # lazily: a one-shot run never pools

                self._ledger_pool = ConnectionPool(
                    self._dsn,
                    kwargs=self._connect_kwargs,
                    min_size=0,
                    max_size=max(1, min(2, self._pool_max)),
                    open=False,
                    configure=self._configure_ledger,
                    name=f"{_APPLICATION_NAME}-ledger",
                    timeout=self._connect_timeout_s,
                    num_workers=1,
                )
                self._ledger_pool.open(wait=False)
                self._ledger_pid = os.getpid()
            return self._ledger_pool

    # -------------------------------------------------- one session (pooled=False)
    def _ready_connections(self) -> None:
        """Migrate and connect as the first call would (the pool or the one session)."""
        if self._pooled:
            self._ready_pool()
            return
        self._adopt_fork()
        with self._session_lock:
            self._ready_session()

    def _run_on_session(
        self,
        action: str,
        work: Callable[[_Conn], _T],
        *,
        repeatable: bool,
        ledger: bool,
    ) -> _T:
        """``_run`` on the one session: one call at a time, a lost session replaced.

        A run ledger write (``ledger``) turns off the wait for its WAL flush for its own
        transaction only: ``set_config(..., true)`` and the write are pipelined into one
        implicit transaction that the pipeline's Sync commits, so the session's journal
        writes keep committing synchronously (see ``_ledger``).
        """
        self._adopt_fork()
        for attempt in (1, 2):
            with self._session_lock:
                conn = self._ready_session()
                try:
                    if not ledger:
                        return work(conn)
                    with _pg.pipeline_quietly(conn):
                        conn.execute(_ASYNC_COMMIT_LOCAL)
                        return work(conn)
                except psycopg.Error as exc:
                    lost = conn.broken or conn.closed
                    if lost:
                        self._session = None
                        conn.close()
                    if not (lost and repeatable and attempt == 1):
                        raise self._translate(exc, action) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _ready_session(self) -> _Conn:
        """The one session, migrating the schema on first use. Hold ``_session_lock``."""
        conn = self._session
        if conn is not None:
            return conn
        with self._lock:
            self._check_open()
            if not self._ready:
                self._migrate(keep=True)
            else:  # the session was lost: a new one (the schema is migrated)
                try:
                    conn = self._new_session(self._configure)
                except psycopg.Error as exc:
                    raise self._translate(exc, "connect to the journal") from exc
                self._session = conn
            assert self._session is not None  # noqa: S101 - set just above
            return self._session

    def _adopt_fork(self) -> None:
        """In a forked child, set the parent's session aside (never used, never closed)."""
        if self._pid == os.getpid():
            return
        # another thread of the parent may have held either lock at the fork
        self._lock = threading.Lock()
        self._session_lock = threading.RLock()
        if self._session is not None:
            self._inherited.append(self._session)
        self._session = None
        self._pid = os.getpid()

    def _close_session(self, session: _Conn, *, forked: bool) -> None:
        if forked:
            self._inherited.append(session)
            return
        with self._session_lock:  # after the call in progress, if any
            session.close()

    def _behind_session(self) -> tuple[_Conn, psycopg.Pipeline]:
        """The session writes behind their caller are sent on, kept in pipeline mode.

        A ledger session (asynchronous commit), outside the pools: a pooled connection
        cannot stay in pipeline mode between uses. Only ``WriteBehind`` calls this, under
        its lock.
        """
        try:
            return self._behind_pipe.get()
        except psycopg.Error as exc:
            raise self._translate(exc, "connect to the journal") from exc

    def _connect_behind(self) -> _Conn:
        self._ready_pool()  # migrated, and open
        return self._new_session(self._configure_ledger)

    def _connect_ahead(self) -> _Conn:
        """A session for births sent ahead (``SendsAhead``): autocommit, commits synchronously."""
        self._ready_pool()  # migrated, and open
        return self._new_session(self._configure)

    def _new_session(self, configure: Callable[[_Conn], None]) -> _Conn:
        """A new connection outside the pools, configured (closed again if that fails)."""
        conn = psycopg.connect(self._dsn, **self._connect_kwargs)
        try:
            configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure_ledger(self, conn: _Conn) -> None:
        self._configure(conn)
        conn.execute("SELECT set_config('synchronous_commit', 'off', false)")

    def _configure(self, conn: _Conn) -> None:
        """Bound every lock wait and statement of a new connection; commit durably.

        A server, database, role or DSN that turns ``synchronous_commit`` off would let
        the journal acknowledge a COMMITTING it could still lose: it is turned back on
        (any stronger setting, such as ``remote_apply``, is kept). Ledger sessions turn
        it off afterwards for their own writes only (``_configure_ledger``).
        """
        conn.execute(f"SELECT {_SESSION_SETTINGS}", self._settings)

    def _check_open(self) -> None:
        if self._closed:
            raise JournalUnavailable(
                f"{self._where} was closed by this process; open it again",
                hint="create a new PostgresCommitJournal",
            )

    def _server_identity(self) -> str:
        """Return libpq's view of our server (set by the first connection)."""
        self._ready_connections()
        assert self._server is not None  # noqa: S101 - set by the migration connection
        return self._server

    def _migrate(self, *, keep: bool = False) -> list[int]:
        """Connect directly (fast, precise failure) and bring the schema up to date.

        Must hold ``self._lock``. The direct connection also records the server identity;
        ``keep`` makes it the one session (``pooled=False``) instead of closing it.
        """
        try:
            conn = psycopg.connect(self._dsn, **self._connect_kwargs)
            try:
                self._server = _info_locator(conn.info)
                applied = self._migrate_on(conn, self._configure_reading_version(conn))
            except BaseException:
                conn.close()
                raise
        except psycopg.Error as exc:
            raise self._translate(exc, "migrate the journal schema") from exc
        self._ready = True
        if keep:
            self._session = conn
        else:
            conn.close()
        return applied

    def _configure_reading_version(self, conn: _Conn) -> int:
        """``_configure`` and the installed version in one round trip (0: no journal yet)."""
        try:
            row = conn.execute(
                f"SELECT ({self._sql.installed_version}), {_SESSION_SETTINGS}", self._settings
            ).fetchone()
        except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
            # no journal yet; the failed statement's settings rolled back with it
            self._configure(conn)
            return 0
        return self._checked_version(row)

    def _migrate_on(self, conn: _Conn, installed: int) -> list[int]:
        if installed == SCHEMA_VERSION:
            return []  # the usual case: one read, no lock
        if self._read_only and installed >= _READ_ONLY_OLDEST:
            return []  # read as it is: a look never migrates (a writer's open does)
        if self._read_only:
            self._unborn = installed == 0
            raise ConfigInvalid(
                f"{self._where} has no dpone journal (schema version {installed}); nothing "
                "has run against it, or the URL or journal_schema is wrong",
                field="journal",
                hint="check the journal URL and journal_schema; dpone run creates the journal",
            )
        applied: list[int] = []
        with conn.transaction():
            # Creating tables in an existing journal may wait on locks: keep lock_timeout,
            # lift the statement bound for this transaction only.
            conn.execute("SET LOCAL statement_timeout = 0")
            conn.execute(self._sql.migrate_lock, (f"dpone.journal.migrate:{self._schema}",))
            _pg.create_schema(conn, self._schema)  # the delivery store may create it too
            conn.execute(self._sql.version_table)
            current = self._installed_version(conn, missing_ok=False)  # again, under the lock
            quoted = '"' + self._schema + '"'
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[version - 1]:
                    conn.execute(statement.replace("{s}", quoted))
                conn.execute(self._sql.record_version, (version,))
                applied.append(version)
        return applied

    def _installed_version(self, conn: _Conn, *, missing_ok: bool) -> int:
        try:
            row = conn.execute(self._sql.installed_version).fetchone()
        except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
            if not missing_ok:
                raise
            return 0  # autocommit: the failed read leaves nothing to roll back
        return self._checked_version(row)

    def _checked_version(self, row: tuple[Any, ...] | None) -> int:
        version = int(row[0]) if row is not None else 0
        if version > SCHEMA_VERSION:
            raise ConfigInvalid(
                f"{self._where} has schema version {version}, newer than this dpone "
                f"supports ({SCHEMA_VERSION})",
                field="journal",
                hint="upgrade dpone, or point it at another schema",
            )
        return version

    def _translate(self, exc: BaseException, action: str) -> DponeError:
        return _pg.translate(
            exc,
            action=f"could not {action}",
            unavailable=JournalUnavailable,
            rejected=JournalUnavailable,
            lock_timeout_s=self._lock_timeout_s,
            subject=self._where,
        )


# ---------------------------------------------------------------------- helpers
def _transitions(row: tuple[Any, ...]) -> tuple[Transition, ...]:
    """The history a stored row stands for: itself, or a whole birth (ADR 0023)."""
    if row[5] != _rules.BORN_KIND:
        return (_transition(row),)
    return _rules.born_rows(
        operation_id=row[0],
        state=CommitState(row[4]),
        actor=row[6],
        lease_epoch=int(row[7]),
        evidence=_rules.decode_mapping(row[8]),
        at=float(row[9]),
    )


def _pg_now(cur: psycopg.Cursor[Any]) -> float:
    row = cur.execute("SELECT extract(epoch FROM now())::float8").fetchone()
    return float(row[0]) if row is not None else 0.0


_NAMED = re.compile(r"%\((\w+)\)s")


_ENTRY_SELECT = _entry_columns("c").encode()
#: the tables a fused birth writes (``_born_ctes``, ``_ledger_sql.first_attempt_ctes``)
_FUSED_TABLES = frozenset(
    {"dpone_journal", "dpone_transitions", "dpone_runs", "dpone_run_attempts"}
)


def _on_tables(error: psycopg.Error, schema: str, tables: frozenset[str]) -> bool:
    """True when ``error`` names one of ``tables`` in ``schema`` (a constraint's, say)."""
    diag = error.diag
    return diag.schema_name == schema and diag.table_name in tables


def _positional(statement: str) -> tuple[bytes, tuple[str, ...]]:
    """A statement with named ``%(name)s`` placeholders as positional ``%s`` ones.

    Returns the statement and the names in placeholder order (a name may repeat), for a
    host statement whose own placeholders are positional (``Fused``). No other ``%`` may
    appear: it would be read as a placeholder.
    """
    names = tuple(_NAMED.findall(statement))
    positional = _NAMED.sub("%s", statement)
    if positional.count("%") != len(names):
        raise ValueError("a fused statement may hold no '%' but its placeholders")
    return positional.encode(), names


def _positive(value: float, field: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigInvalid(f"{field} must be a positive number of seconds", field=field)
    return number


def _info_locator(info: psycopg.ConnectionInfo) -> str:
    """The locator of a live connection, normalized like a DSN's (``_pg.pg_locator``)."""
    return _pg.pg_locator(make_conninfo(host=info.host, port=info.port, dbname=info.dbname))


# ---------------------------------------------------------------------- row decoding
if TYPE_CHECKING:

    def _conforms(journal: PostgresCommitJournal) -> FoldingJournalPort:
        # mypy proves here that the adapter matches the port, without inheriting from it
        return journal

    def _stores_checkpoints(journal: PostgresCommitJournal) -> TransactionalCheckpointStorePort:
        # the same static proof for the checkpoint port
        return journal

    def _keeps_runs(journal: PostgresCommitJournal) -> RunLedgerPort:
        return journal

    def _finds_runs(journal: PostgresCommitJournal) -> LookupLedgerPort:
        return journal

    def _folds_runs(journal: PostgresCommitJournal) -> FoldingLedgerPort:
        return journal

    def _conforms_forward(journal: PostgresCommitJournal) -> ForwardFoldingJournalPort:
        return journal

    def _completes_proven(journal: PostgresCommitJournal) -> ProvenCompletionJournalPort:
        return journal

    def _ends_runs(journal: PostgresCommitJournal) -> RunEndingLedgerPort:
        return journal


def _ending_arguments(**cas: Any) -> dict[str, Any]:
    """The arguments of an ending COMPLETE, its mappings copied: a key to compare later."""
    evidence, result = cas["evidence"], cas["result"]
    cas["evidence"] = None if evidence is None else dict(evidence)
    cas["result"] = dict(result)
    return cas


def _run_and_entry(row: tuple[Any, ...]) -> tuple[RunRecord | None, JournalEntry | None]:
    """The run and the entry of a ``_run_and_entry_sql`` row (None where all NULL)."""
    width = _RUN_WIDTH
    run = None if row[0] is None else _ledger_sql.run_from_row(tuple(row[:width]))
    entry = None if row[width] is None else _entry(tuple(row[width : width + _ENTRY_WIDTH]))
    return run, entry
