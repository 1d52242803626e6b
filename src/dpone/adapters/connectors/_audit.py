"""Write-audit-publish: the audits, built once as SQL, run by each SQL connector.

Each connector calls :func:`audit_staged` inside its write transaction, after the rows
and before the commit, with a function that runs one ``SELECT count`` on that same
transaction. Any violation raises ``AuditFailed`` so the connector rolls everything back
(data and fence): the target is untouched and the operation can be retried. Findings are
counts and audit names only, never rows or SQL text.
"""

from __future__ import annotations

from collections.abc import Callable

from dpone.contracts.audit import Audits
from dpone.contracts.load import LoadPlan
from dpone.errors import AuditFailed

__all__ = ["audit_queries", "audit_staged"]

Count = Callable[[str], int]


def audit_queries(
    audits: Audits, *, table_sql: str, quote: Callable[[str], str]
) -> list[tuple[str, str]]:
    """Return ``(audit name, SELECT returning one violation count)`` for the SQL audits."""
    queries: list[tuple[str, str]] = [
        (f"not_null:{column}", f"SELECT count(*) FROM {table_sql} WHERE {quote(column)} IS NULL")
        for column in audits.not_null
    ]
    if audits.unique_key:
        key = ", ".join(quote(c) for c in audits.unique_key)
        queries.append(
            (
                f"unique_key:{','.join(audits.unique_key)}",
                f"SELECT count(*) FROM (SELECT 1 AS d FROM {table_sql} GROUP BY {key} "
                "HAVING count(*) > 1) dpone_duplicates",
            )
        )
    for custom in audits.custom:
        body = custom.query.replace("{table}", table_sql)
        queries.append((f"sql:{custom.name}", f"SELECT count(*) FROM ({body}) dpone_violations"))
    return queries


def audit_staged(
    plan: LoadPlan,
    *,
    rows: int,
    count: Count,
    table_sql: str,
    quote: Callable[[str], str],
    operation_id: str,
) -> None:
    """Run the plan's audits on the open transaction; raise ``AuditFailed`` on a violation.

    Args:
        plan: the load plan; nothing happens when it has no audits.
        rows: how many rows this operation wrote.
        count: runs one ``SELECT count(*) ...`` on the write transaction.
        table_sql: the target table, quoted for the dialect.
        quote: quotes one column name for the dialect.
        operation_id: for the error.
    """
    audits = plan.audits
    if not audits:
        return
    results: list[tuple[str, int]] = []
    if audits.min_rows is not None:
        results.append(("min_rows", max(audits.min_rows - rows, 0)))
    if audits.max_rows is not None:
        results.append(("max_rows", max(rows - audits.max_rows, 0)))
    for name, query in audit_queries(audits, table_sql=table_sql, quote=quote):
        results.append((name, int(count(query))))
    failed = [(name, violations) for name, violations in results if violations > 0]
    if not failed:
        return
    first, violations = failed[0]
    summary = ", ".join(f"{name}: {n}" for name, n in failed)
    raise AuditFailed(
        f"{len(failed)} of {len(results)} audit(s) failed ({summary}); the write was rolled "
        "back, nothing was published",
        operation_id=operation_id,
        hint="fix the source data or the audit, then run the same operation again",
        findings={
            "audit_failed": first,
            "audit_violations": violations,
            "audits_failed": len(failed),
            "audits_run": len(results),
        },
    )
