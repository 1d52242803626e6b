"""What a load writes: strategy, columns, plan and the report of a mutation."""

from __future__ import annotations

import enum
import re

import msgspec

from dpone.contracts.audit import Audits
from dpone.contracts.fence import FenceObservation
from dpone.contracts.identity import Interval

__all__ = [
    "IDENTIFIER_RE",
    "Column",
    "ColumnType",
    "LoadPlan",
    "LoadStrategy",
    "MutationReport",
    "is_identifier",
]

IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_identifier(name: str) -> bool:
    """Return True for a plain SQL identifier ``[A-Za-z_][A-Za-z0-9_]*``."""
    return bool(IDENTIFIER_RE.fullmatch(name))


class LoadStrategy(str, enum.Enum):
    """How rows land in the target table."""

    APPEND = "append"
    REPLACE = "replace"
    MERGE = "merge"
    REPLACE_INTERVAL = "replace_interval"


class ColumnType(str, enum.Enum):
    """Portable column types a source can declare or dpone can infer."""

    INTEGER = "integer"
    REAL = "real"
    TEXT = "text"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"


class Column(msgspec.Struct, frozen=True, kw_only=True):
    """One column of the rows a source yields."""

    name: str
    type: ColumnType


class LoadPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a connector needs to apply one operation's rows."""

    table: str  # "table" or "schema.table", validated identifiers
    strategy: LoadStrategy
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    interval_column: str | None = None
    interval: Interval | None = None
    #: write-audit-publish checks run inside the write transaction before it commits
    audits: Audits | None = None


class MutationReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a committed mutation wrote, as recorded in the fence."""

    row_count: int
    content_digest: str
    #: The fence row exactly as the acknowledged commit left it (COMMITTED at the
    #: mutation's epoch), built from what that very transaction wrote and read back
    #: under the row lock; None when the connector cannot say it (the protocol then
    #: observes). ``committed`` is terminal, so it is what ``observe`` reads afterwards
    #: (ADR 0013; the fence conformance suite checks it).
    committed: FenceObservation | None = None
