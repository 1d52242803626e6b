"""Write-audit-publish audits: checks on the staged rows before the target commits."""

from __future__ import annotations

import msgspec

__all__ = ["Audits", "CustomAudit"]


class CustomAudit(msgspec.Struct, frozen=True, kw_only=True):
    """A named SELECT whose result rows are violations; ``{table}`` names the target table."""

    name: str
    query: str


class Audits(msgspec.Struct, frozen=True, kw_only=True):
    """The audits of one workload; all must pass for the write to be published.

    ``min_rows`` / ``max_rows`` bound the rows this operation writes; ``not_null``,
    ``unique_key`` and ``custom`` look at the target table as it would be published
    (inside the open transaction, after the write, before the commit).
    """

    min_rows: int | None = None
    max_rows: int | None = None
    not_null: tuple[str, ...] = ()
    unique_key: tuple[str, ...] = ()
    custom: tuple[CustomAudit, ...] = ()

    def __bool__(self) -> bool:
        return bool(
            self.min_rows is not None
            or self.max_rows is not None
            or self.not_null
            or self.unique_key
            or self.custom
        )
