"""A deliberately BROKEN connector whose fence lies: it exists to show `dpone certify` failing.

Never use it for data. It writes without checking the fence and claims every operation is
absent, so a retry after a crash writes the rows a second time, which certification catches.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dpone.contracts.fence import FenceObservation, FenceStatus, SealOutcome, SealResult
from dpone.contracts.load import LoadPlan, MutationReport
from dpone.ports.connector import Rows, WithinTransaction
from dpone_example.connector import ExampleConnector
from dpone_example.connector import build as build_honest


def build(
    options: Mapping[str, object], *, base_dir: Path, environ: Mapping[str, str]
) -> LyingConnector:
    """Entry point ``example_lying``."""
    honest = build_honest(options, base_dir=base_dir, environ=environ)
    return LyingConnector(honest._path, table=honest._table)


class LyingConnector(ExampleConnector):
    """Claims a fence it does not keep."""

    kind = "example_lying"

    def observe(self, *, operation_id: str) -> FenceObservation:
        return FenceObservation(status=FenceStatus.ABSENT)

    def seal(self, *, operation_id: str, epoch: int) -> SealResult:
        return SealResult(
            outcome=SealOutcome.NOT_COMMITTED,
            observation=FenceObservation(status=FenceStatus.PREPARED, epoch=epoch),
        )

    def mutate(
        self,
        *,
        operation_id: str,
        intent_digest: str,
        epoch: int,
        plan: LoadPlan,
        batches: Rows,
        content_digest: str,
        within: WithinTransaction | None = None,
        prepare: bool = False,
    ) -> MutationReport:
        # the lie: drop the fence row first, so the epoch check never refuses anything
        self._write(
            lambda conn: conn.execute(
                "DELETE FROM example_fence WHERE operation_id = ?", (operation_id,)
            ),
            operation_id=operation_id,
        )
        return super().mutate(
            operation_id=operation_id,
            intent_digest=intent_digest,
            epoch=epoch,
            plan=plan,
            batches=batches,
            content_digest=content_digest,
            within=within,
            prepare=True,
        )
