"""The one entry point the CLI, the Airflow operator and the benchmarks all call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from dpone.config.bootstrap import (
    RunContext,
    build_route,
    configure_failpoints,
    plan_operation,
)
from dpone.config.workload import Workload, load_workload
from dpone.contracts.identity import Interval
from dpone.contracts.result import OperationResult
from dpone.runtime.commit_protocol import CommitProtocol
from dpone.runtime.executor import executor_label

__all__ = ["RunContext", "run_operation"]


def run_operation(
    workload: Workload | str | Path,
    *,
    interval: Interval | str,
    partition: str | None = None,
    context: RunContext | None = None,
    on_rows: Callable[[int], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> OperationResult:
    """Run (or resume, or replay) one operation of ``workload`` and return its result.

    Args:
        workload: a workload file path or an already loaded :class:`Workload`.
        interval: ``START/END`` (half-open, UTC) or an :class:`Interval`.
        partition: the mapped partition identity, if the workload is partitioned.
        context: logical run identity (Airflow fills it); never a try number.
        on_rows: called with the size of each batch as it is written (progress).
        environ: environment to resolve ``*_env`` references from (default ``os.environ``).

    Returns:
        The COMPLETE operation's result; ``replayed`` is True when it was already complete
        and nothing was written.

    Raises:
        DponeError: a typed error from :mod:`dpone.errors`; its ``code`` and
            ``retryability`` say what to do next.

    """
    spec_workload = workload if isinstance(workload, Workload) else load_workload(workload)
    configure_failpoints(environ)
    route = build_route(spec_workload, environ=environ)
    try:
        spec = plan_operation(
            spec_workload, route, interval=interval, partition=partition, context=context
        )
        assert route.source is not None  # noqa: S101 - build_route opened it
        protocol = CommitProtocol(
            journal=route.journal,
            connector=route.connector,
            source=route.source,
            owner=executor_label(),
            atomic_journal=route.atomic,
            on_rows=on_rows,
        )
        return protocol.run(spec)
    finally:
        route.close()
