"""``dpone publication write|status|reconcile|publish|read|cleanup`` (docs/publication.md)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

publication_app = typer.Typer(
    help="Write-audit-publish of partitioned outputs: staging generations, reconcile, publish.",
    no_args_is_help=True,
)

WorkloadArg = Annotated[
    Path, typer.Argument(help="Publication workload YAML file.", metavar="WORKLOAD")
]
IntervalOpt = Annotated[
    str | None,
    typer.Option(help="START/END (default: the workload's publication.interval)."),
]
BackfillOpt = Annotated[
    str | None,
    typer.Option(help="Backfill label: write/publish a new, isolated generation."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def is_publication_workload(workload: Path) -> bool:
    """True when the workload file has a ``publication:`` section."""
    from dpone.config.workload import load_workload

    return load_workload(workload).publication is not None


def _open(workload: Path, interval: str | None) -> Any:
    from dpone.config.publication import Publication

    return Publication(workload, interval=interval)


def _ui() -> Any:
    from dpone.cli import main

    return main


def _result_json(result: Any) -> dict[str, Any]:
    summary: dict[str, Any] = result.summary()
    return summary


@contextmanager
def _frozen_gc() -> Iterator[None]:
    """Hide every object alive now from the cyclic collector while partitions are written.

    What opening a publication imported (workload settings, pyarrow) lives as long as the
    command; without this, each full collection that millions of row tuples trigger
    re-walks it (docs/benchmarks.md, partition publication). Scoped, so a caller that runs
    the command in-process (tests, embedding) gets its objects back into collection after.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def write_publication(
    workload: Path,
    *,
    interval: str | None,
    backfill: str | None,
    partitions: list[str] | None,
    as_json: bool,
    publish: bool,
) -> None:
    """Write partitions (and publish when asked); shared by ``write`` and ``dpone run``."""
    ui = _ui()
    with ui._boundary(as_json), _open(workload, interval) as pub, _frozen_gc():
        results = pub.write(backfill=backfill, partitions=partitions)
        published = pub.publish(backfill=backfill) if publish else None
        generation = pub.layout(backfill).generation
    payload: dict[str, Any] = {
        "generation": generation,
        "partitions": [
            {"partition": p, **_result_json(r)}
            for p, r in zip(partitions or pub.spec.partitions, results, strict=True)
        ],
    }
    if published is not None:
        payload["published"] = asdict(published)
    if as_json:
        ui._emit_json(payload)
        return
    for item in payload["partitions"]:
        note = " (already complete, nothing written)" if item.get("replayed") else ""
        ui.out.print(
            f"partition {item['partition']}: {item['state']} rows={item.get('rows_written')}{note}",
            markup=False,
        )
    if published is not None:
        _print_published(published)
    else:
        ui.out.print(f"generation {generation} written; next: dpone publication publish")


def _print_published(result: Any) -> None:
    ui = _ui()
    if result.already_current:
        ui.out.print(
            f"generation {result.generation} is already current "
            f"({result.partitions} partitions, {result.rows} rows); nothing changed",
            markup=False,
        )
        return
    ui.out.print(
        f"published generation {result.generation}: {result.partitions} partitions, "
        f"{result.rows} rows (previous: {result.previous_generation or 'none'})",
        markup=False,
    )


@publication_app.command("write")
def write_cmd(
    workload: WorkloadArg,
    interval: IntervalOpt = None,
    backfill: BackfillOpt = None,
    partition: Annotated[
        list[str] | None,
        typer.Option(help="Write only this partition (repeatable; a mapped task)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write partitions of the interval's generation, each as its own operation."""
    write_publication(
        workload,
        interval=interval,
        backfill=backfill,
        partitions=partition,
        as_json=as_json,
        publish=False,
    )


@publication_app.command("status")
def status_cmd(
    workload: WorkloadArg,
    interval: IntervalOpt = None,
    backfill: BackfillOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show committed / missing partitions of the generation and what is current."""
    ui = _ui()
    with ui._boundary(as_json), _open(workload, interval) as pub:
        status = pub.status(backfill=backfill)
    if as_json:
        ui._emit_json(status)
        return
    for key, value in status.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        ui.out.print(f"{key:<22} {shown}", markup=False)


@publication_app.command("reconcile")
def reconcile_cmd(
    workload: WorkloadArg,
    interval: IntervalOpt = None,
    backfill: BackfillOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check the generation: complete set, one generation, one source, checksums, audits."""
    ui = _ui()
    with ui._boundary(as_json), _open(workload, interval) as pub:
        manifest = pub.reconcile(backfill=backfill)
    if as_json:
        ui._emit_json({"ok": True, "manifest": asdict(manifest)})
        return
    ui.out.print(
        f"generation {manifest.generation} is complete: {len(manifest.partitions)} partitions, "
        f"{manifest.rows} rows; next: dpone publication publish",
        markup=False,
    )


@publication_app.command("publish")
def publish_cmd(
    workload: WorkloadArg,
    interval: IntervalOpt = None,
    backfill: BackfillOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reconcile, write the manifest, and move ``current`` to it in one atomic step."""
    ui = _ui()
    with ui._boundary(as_json), _open(workload, interval) as pub:
        result = pub.publish(backfill=backfill)
    if as_json:
        ui._emit_json(asdict(result))
        return
    _print_published(result)


@publication_app.command("read")
def read_cmd(
    workload: WorkloadArg,
    interval: IntervalOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the files of the current generation (readers resolve only through current)."""
    ui = _ui()
    with ui._boundary(as_json), _open(workload, interval) as pub:
        view = pub.read()
        location = pub.store.location()
    if view is None:
        if as_json:
            ui._emit_json({"current": None, "files": []})
        else:
            ui.out.print("nothing published yet for this interval")
        return
    files = [asdict(p) for p in view.manifest.partitions]
    if as_json:
        ui._emit_json(
            {
                "store": location,
                "current": asdict(view.pointer),
                "rows": view.manifest.rows,
                "files": files,
            }
        )
        return
    ui.out.print(
        f"generation {view.pointer.generation} (published {view.pointer.published_at}), "
        f"{view.manifest.rows} rows in {location}",
        markup=False,
    )
    for item in files:
        ui.out.print(f"  {item['key']}  rows={item['rows']}  {item['sha256']}", markup=False)


@publication_app.command("cleanup")
def cleanup_cmd(
    workload: WorkloadArg,
    interval: IntervalOpt = None,
    older_than_hours: Annotated[
        float | None,
        typer.Option(min=0, help="Retention cutoff (default: publication.retention_hours)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report, delete nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete staging generations that are not current, past retention, not in recovery."""
    ui = _ui()
    with ui._boundary(as_json), _open(workload, interval) as pub:
        report = pub.cleanup(older_than_hours=older_than_hours, dry_run=dry_run)
    if as_json:
        ui._emit_json(
            {
                "deleted": list(report.deleted),
                "kept": dict(report.kept),
                "objects_deleted": report.objects_deleted,
                "dry_run": dry_run,
            }
        )
        return
    verb = "would delete" if dry_run else "deleted"
    for generation in report.deleted:
        ui.out.print(f"{verb} generation {generation}", markup=False)
    for generation, why in report.kept.items():
        ui.out.print(f"kept generation {generation}: {why}", markup=False)


@publication_app.command("run")
def run_cmd(
    workload: WorkloadArg,
    interval: IntervalOpt = None,
    backfill: BackfillOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The whole publication: every partition, reconcile, publish (``dpone run`` does this too)."""
    write_publication(
        workload,
        interval=interval,
        backfill=backfill,
        partitions=None,
        as_json=as_json,
        publish=True,
    )
