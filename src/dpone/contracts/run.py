"""Runs and attempts: the run ledger's records, provenance and access context.

A *run* is one logical request to bring an operation to COMPLETE, named by its
idempotency key; an *attempt* is one lease epoch of that run's operation (the attempt
number is the lease epoch, so it doubles as the fencing token). Every field here is
safe to store: no secrets, no DSNs with credentials, no row values.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import msgspec

from dpone.contracts.evidence import SafeMapping, Scalar, looks_secret, safe_mapping
from dpone.contracts.identity import digest_of
from dpone.errors import ConfigInvalid, DponeError

__all__ = [
    "PROVENANCE_KEYS",
    "AccessContext",
    "AirflowProvenance",
    "ApiProvenance",
    "AttemptRecord",
    "AttemptState",
    "CliProvenance",
    "Provenance",
    "RunError",
    "RunRecord",
    "RunStart",
    "RunState",
    "check_idempotency_key",
    "default_idempotency_key",
    "run_id_for",
]

_MAX_KEY = 256
_ACCESS_KEYS = frozenset({"principal", "connections"})
_MAX_MESSAGE = 1000


class RunState(str, enum.Enum):
    """Where a run stands, as its newest attempt left it.

    RUNNING: an attempt is in flight, or was interrupted (a rerun resumes it).
    COMPLETE: the operation is COMPLETE; replays return the recorded result.
    FAILED: the newest attempt failed; ``error_retryability`` says whether a replay
        starts a new attempt (transient) or returns the recorded failure (terminal).
    UNRESOLVED: the outcome needs an operator (COMMIT_UNKNOWN and the other STOP errors).
    """

    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"
    UNRESOLVED = "UNRESOLVED"


class AttemptState(str, enum.Enum):
    """How one attempt ended; SUPERSEDED: a newer attempt (higher epoch) took over."""

    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"
    UNRESOLVED = "UNRESOLVED"
    SUPERSEDED = "SUPERSEDED"


#: Keys a provenance record may hold (all scalar, all checked for secrets).
PROVENANCE_KEYS: frozenset[str] = frozenset(
    {
        "kind",
        "user",
        "host",
        "command",
        "caller",
        "reference",
        "dag_id",
        "run_id",
        "task_id",
        "try_number",
        "map_index",
    }
)


class CliProvenance(msgspec.Struct, frozen=True, kw_only=True):
    """A ``dpone run`` from a shell: OS user, host and the command line (secret-checked)."""

    kind: ClassVar[str] = "cli"
    user: str
    host: str
    command: str

    def record(self) -> SafeMapping:
        """Return the safe mapping stored in the ledger."""
        command = self.command if not looks_secret(self.command) else "dpone run <redacted>"
        return _safe({"kind": self.kind, "user": self.user, "host": self.host, "command": command})


class ApiProvenance(msgspec.Struct, frozen=True, kw_only=True):
    """A call through :mod:`dpone.api`: the caller names itself (and an optional reference)."""

    kind: ClassVar[str] = "api"
    caller: str
    host: str = ""
    reference: str | None = None

    def record(self) -> SafeMapping:
        """Return the safe mapping stored in the ledger."""
        values: dict[str, Scalar] = {"kind": self.kind, "caller": self.caller}
        if self.host:
            values["host"] = self.host
        if self.reference is not None:
            values["reference"] = self.reference
        return _safe(values)


class AirflowProvenance(msgspec.Struct, frozen=True, kw_only=True):
    """An Airflow task try: DAG, DAG run, task, try number and map index.

    The try number is provenance only: it never enters the operation's identity.
    """

    kind: ClassVar[str] = "airflow"
    dag_id: str
    run_id: str
    task_id: str
    try_number: int
    map_index: int = -1
    host: str = ""

    def record(self) -> SafeMapping:
        """Return the safe mapping stored in the ledger."""
        values: dict[str, Scalar] = {
            "kind": self.kind,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "try_number": self.try_number,
            "map_index": self.map_index,
        }
        if self.host:
            values["host"] = self.host
        return _safe(values)


Provenance = CliProvenance | ApiProvenance | AirflowProvenance


def _safe(values: Mapping[str, object]) -> SafeMapping:
    return safe_mapping(values, allowed=PROVENANCE_KEYS)


class AccessContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who runs, and which connections by *name* (env variable or credential-free locator).

    Only the names and a digest of them are stored; a resolved URL or password never is.
    """

    principal: str
    connections: tuple[str, ...]

    def __post_init__(self) -> None:
        for value in (self.principal, *self.connections):
            if looks_secret(value):
                raise ConfigInvalid(
                    "a connection name in the access context looks like a secret",
                    field="access",
                    hint="name connections by environment variable or credential-free URL",
                )

    def digest(self) -> str:
        """Return ``sha256:`` of the principal and the sorted connection names."""
        return digest_of({"principal": self.principal, "connections": sorted(self.connections)})

    def record(self) -> SafeMapping:
        """Return the safe mapping stored in the ledger beside the digest."""
        return safe_mapping(
            {"principal": self.principal, "connections": ",".join(sorted(self.connections))},
            allowed=_ACCESS_KEYS,
        )


class RunError(msgspec.Struct, frozen=True, kw_only=True):
    """The safe summary of the error a run or attempt ended with."""

    code: str
    retryability: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> RunError:
        """Summarize ``exc``; non-dpone exceptions keep only their type name."""
        if isinstance(exc, DponeError):
            return cls(
                code=exc.code.value,
                retryability=exc.retryability.value,
                message=exc.message[:_MAX_MESSAGE],
            )
        return cls(
            code="unexpected",
            retryability="transient",
            message=f"unexpected {type(exc).__name__}",
        )


class RunStart(msgspec.Struct, frozen=True, kw_only=True):
    """The fields a run is recorded with before anything executes; fixed for its life."""

    run_id: str
    idempotency_key: str
    operation_id: str
    request_hash: str
    definition_hash: str
    access_digest: str
    access: SafeMapping = msgspec.field(default_factory=lambda: MappingProxyType({}))
    provenance: SafeMapping = msgspec.field(default_factory=lambda: MappingProxyType({}))


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One run as the ledger holds it."""

    run_id: str
    idempotency_key: str
    operation_id: str
    request_hash: str
    definition_hash: str
    access_digest: str
    access: SafeMapping
    provenance: SafeMapping
    state: RunState
    current_attempt: int
    error: RunError | None
    created_at: float
    updated_at: float

    @property
    def unresolved(self) -> bool:
        """True when the run is not settled: in flight, interrupted, or awaiting an operator."""
        return self.state in (RunState.RUNNING, RunState.UNRESOLVED)


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt (one lease epoch) of a run."""

    run_id: str
    attempt: int
    owner: str
    provenance: SafeMapping
    state: AttemptState
    error_code: str | None
    started_at: float
    ended_at: float | None


def check_idempotency_key(key: str) -> str:
    """Validate a caller's idempotency key: 1-256 printable characters, nothing secret.

    Raises:
        ConfigInvalid: the key is empty, too long, has control characters or looks secret.

    """
    if not isinstance(key, str) or not key.strip() or len(key) > _MAX_KEY:
        raise ConfigInvalid(
            f"the idempotency key must be 1 to {_MAX_KEY} characters",
            field="--idempotency-key",
            hint="use a stable name for the request, e.g. orders-2024-01-01",
        )
    if not key.isprintable() or looks_secret(key):
        raise ConfigInvalid(
            "the idempotency key has control characters or looks like a secret",
            field="--idempotency-key",
            hint="use a stable, non-secret name for the request",
        )
    return key


def default_idempotency_key(operation_id: str) -> str:
    """The key a run gets when the caller gives none: derived from the operation id."""
    return f"op:{operation_id}"


def run_id_for(idempotency_key: str) -> str:
    """Return the run id of a key: ``run-`` + 20 hex digits of its SHA-256 (deterministic).

    Deterministic, so two processes replaying one key name the same run without a lookup.
    """
    return "run-" + hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:20]
