"""The ``dpone`` command: parse, call the library, print text or --json. Nothing else."""

from __future__ import annotations

import gc
import getpass
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from dpone.cli._early import prefetch_run_source
from dpone.cli._run import (
    EXIT_COMMIT_UNKNOWN,
    EXIT_COMMITTED_INCOMPLETE,
    EXIT_FAILED,
    EXIT_INTENT_CONFLICT,
    EXIT_LEASE_HELD,
    EXIT_OK,
    EXIT_RETRYABLE,
    EXIT_USAGE,
    INTERRUPTED,
    LogFormat,
    _cli_provenance,
    _setup_logging,
    err,
    exit_code_for,
    fast_run,
    out,
    print_error,
    run_loaded,
)
from dpone.cli.delivery import delivery_app
from dpone.cli.publication import publication_app, write_publication
from dpone.contracts.states import CommitState
from dpone.errors import ConfigInvalid, DponeError

# The documented exit codes (README "Exit codes") are importable from here.
__all__ = [
    "EXIT_COMMITTED_INCOMPLETE",
    "EXIT_COMMIT_UNKNOWN",
    "EXIT_FAILED",
    "EXIT_INTENT_CONFLICT",
    "EXIT_LEASE_HELD",
    "EXIT_OK",
    "EXIT_RETRYABLE",
    "EXIT_USAGE",
    "app",
    "err",
    "exit_code_for",
    "main",
    "out",
]

if TYPE_CHECKING:
    from rich.text import Text

app = typer.Typer(
    name="dpone",
    help="Batch data delivery that is safe to retry.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
recovery_app = typer.Typer(help="Operator tools for unresolved operations.", no_args_is_help=True)
target_commit_app = typer.Typer(
    help="Inspect, plan and apply recovery of one operation.", no_args_is_help=True
)
journal_app = typer.Typer(help="Read the operation journal.", no_args_is_help=True)
runs_app = typer.Typer(help="Read the run ledger: runs and their attempts.", no_args_is_help=True)
checkpoints_app = typer.Typer(
    help="Watermarks of incremental workloads (moved only by COMPLETE operations).",
    no_args_is_help=True,
)
recovery_app.add_typer(target_commit_app, name="target-commit")
app.add_typer(recovery_app, name="recovery")
app.add_typer(journal_app, name="journal")
app.add_typer(delivery_app, name="delivery")
app.add_typer(checkpoints_app, name="checkpoints")
app.add_typer(runs_app, name="runs")
app.add_typer(publication_app, name="publication")


def _print_version(value: bool) -> None:
    if value:
        import dpone

        out.print(dpone.__version__)
        raise typer.Exit(0)


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the dpone version and exit (as `dpone version`).",
        ),
    ] = False,
) -> None:
    pass


# ------------------------------------------------------------------ error boundary
def _fail(exc: DponeError, *, as_json: bool) -> NoReturn:
    raise typer.Exit(print_error(exc, as_json=as_json))


@contextmanager
def _boundary(as_json: bool) -> Iterator[None]:
    try:
        yield
    except DponeError as exc:
        _fail(exc, as_json=as_json)
    except KeyboardInterrupt:
        err.print(INTERRUPTED)
        raise typer.Exit(130) from None


def _emit_json(payload: object) -> None:
    out.print_json(json.dumps(payload, default=str))


# ------------------------------------------------------------------ run
@app.command()
def run(
    workload: Annotated[Path, typer.Argument(help="Workload YAML file.", metavar="WORKLOAD")],
    interval: Annotated[
        str | None,
        typer.Option(
            help="START/END, half-open, ISO-8601 (UTC if naive). Omit for an incremental "
            "workload: the next interval comes from its checkpoint."
        ),
    ] = None,
    partition: Annotated[str | None, typer.Option(help="Mapped partition identity.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    log_format: Annotated[LogFormat, typer.Option(help="Log line format on stderr.")] = (
        LogFormat.text
    ),
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="Progress bar (default: on a TTY)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors.")] = False,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            help="Names the run; a replay returns the existing run (default: from the "
            "operation id)."
        ),
    ] = None,
    poll_budget: Annotated[
        float,
        typer.Option(min=0.0, help="REST workloads: seconds to keep observing the accepted job."),
    ] = 0.0,
) -> None:
    """Run one operation of WORKLOAD for an interval: write once, resume, or replay.

    A publication workload runs whole: every partition, reconcile, publish (with
    --partition: that one partition only, as a mapped task). A REST workload
    (target.kind rest) delivers once and prints the outcome: completed or pending
    (exit 0; `dpone delivery resume` continues a pending one) or blocked (exit 3).
    """
    from dpone.config.workload import load_workload

    with _boundary(as_json):
        loaded = load_workload(workload)  # once: the publication check and the run share it
    if loaded.target.kind == "rest":
        _setup_logging(log_format, quiet)
        _deliver(workload, interval, partition, idempotency_key, poll_budget, as_json=as_json)
        return
    if loaded.publication is not None:
        write_publication(
            workload,
            interval=interval,
            backfill=None,
            partitions=[partition] if partition else None,
            as_json=as_json,
            publish=partition is None,
        )
        return
    code = run_loaded(
        loaded,
        interval=interval,
        partition=partition,
        as_json=as_json,
        log_format=log_format,
        progress=progress,
        quiet=quiet,
        idempotency_key=idempotency_key,
    )
    if code != EXIT_OK:
        raise typer.Exit(code)


def _deliver(
    workload: Path,
    interval: str | None,
    partition: str | None,
    idempotency_key: str | None,
    poll_budget: float,
    *,
    as_json: bool,
) -> NoReturn:
    """`dpone run` of a REST workload: deliver (or continue) and print the outcome."""
    from dpone.api import Runner
    from dpone.cli.delivery import print_result
    from dpone.errors import ConfigInvalid

    with _boundary(as_json):
        if idempotency_key is not None:
            raise ConfigInvalid(
                "--idempotency-key is not taken by REST workloads: the run is named by "
                "its operation id (op:<operation id>)",
                field="idempotency_key",
                hint="leave --idempotency-key out",
            )
        with Runner(workload) as runner:
            result = runner.deliver(
                interval=interval,
                partition=partition,
                provenance=_cli_provenance(),
                poll_budget_s=poll_budget,
            )
    raise typer.Exit(print_result(result, as_json=as_json))


# ------------------------------------------------------------------ check
@app.command()
def check(
    workload: Annotated[Path, typer.Argument(help="Workload YAML file.", metavar="WORKLOAD")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Validate WORKLOAD's file without running it: nothing is connected to or written.

    Every field is checked as `dpone run` checks it when it reads the file, and the
    environment variables it names for the journal's, the source's and the target's
    URLs (journal_env, url_env) must be set. What only opening them can tell (a server
    that cannot be reached, a driver that is not installed, a plugin's own options, a
    credential) is left to `dpone run`. Exit 0 when the file is valid; otherwise the
    DPONE_* error says what is wrong and how to fix it. No URL is printed.
    """
    from dpone.config.workload import load_workload

    with _boundary(as_json):
        spec = load_workload(workload, remember=False)  # not even the parse cache
        spec.check_environment()
    table = getattr(spec.target, "table", None)
    summary: dict[str, object] = {
        "valid": True,
        "workload": spec.workload,
        "release": spec.release,
        "deployment": spec.deployment,
        "source": spec.source.kind,
        "target": spec.target.kind,
        "table": table,
        "strategy": spec.load.strategy.value,
        "publication": spec.publication is not None,
        "require_certified": spec.require_certified,
    }
    if as_json:
        _emit_json(summary)
        return
    into = f" table {table}" if table else ""
    published = ", published by partition" if spec.publication else ""
    out.print(
        f"valid: workload {spec.workload} (release {spec.release}, deployment "
        f"{spec.deployment}): {spec.source.kind} -> {spec.target.kind}{into}, "
        f"{spec.load.strategy.value}{published}",
        markup=False,
        highlight=False,
    )


# ------------------------------------------------------------------ journal
def _open_journal(workload: Path | None, journal: str | None, *, read_only: bool = True) -> Any:
    from dpone.config.bootstrap import open_journal

    if journal:
        return open_journal(journal, base_dir=Path.cwd(), read_only=read_only)
    if workload is not None:
        from dpone.config.workload import load_workload

        spec = load_workload(workload)
        return open_journal(
            spec.journal_url(),
            base_dir=spec.base_dir,
            schema=spec.journal_schema,
            read_only=read_only,
        )
    url = os.environ.get("DPONE_JOURNAL") or "sqlite:///.dpone/journal.db"
    return open_journal(url, base_dir=Path.cwd(), read_only=read_only)


WorkloadOpt = Annotated[
    Path | None, typer.Option("--workload", "-w", help="Workload file naming the journal.")
]
JournalOpt = Annotated[
    str | None, typer.Option("--journal", help="Journal URL (default: $DPONE_JOURNAL or .dpone).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _entry_json(entry: Any) -> dict[str, Any]:
    return {
        "operation_id": entry.operation_id,
        "state": entry.state.value,
        "version": entry.version,
        "intent_digest": entry.intent_digest,
        "lease_owner": entry.lease_owner,
        "lease_epoch": entry.lease_epoch,
        "lease_expires_at": entry.lease_expires_at,
        "metadata": dict(entry.metadata),
        "result": dict(entry.result) if entry.result is not None else None,
        "created_at": entry.created_at,
        "updated_at": entry.updated_at,
    }


def _cells(*values: str) -> list[Text]:
    """Table cells as plain text: stored values are never read as rich markup."""
    from rich.text import Text

    return [Text(v) for v in values]


def _ts(value: float | None) -> str:
    if value is None:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")


@journal_app.command("list")
def journal_list(
    state: Annotated[
        list[CommitState] | None,
        typer.Option("--state", help="Only this state (repeatable).", metavar="STATE"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many entries.")] = 100,
    workload: WorkloadOpt = None,
    journal: JournalOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List operations, newest first."""
    with _boundary(as_json):
        store = _open_journal(workload, journal)
        try:
            entries = store.list_entries(states=frozenset(state) if state else None, limit=limit)
        finally:
            store.close()
    if as_json:
        _emit_json([_entry_json(e) for e in entries])
        return
    lines = [
        (
            e.operation_id,
            e.state.value,
            str(e.version),
            str(e.metadata.get("workload_id", "")),
            str(e.metadata.get("interval", "")),
            str((e.result or {}).get("rows_written", "")),
            _ts(e.updated_at),
        )
        for e in entries
    ]
    headers = ("operation_id", "state", "version", "workload", "interval", "rows", "updated")
    if not out.is_terminal:
        # piped or logged: whole lines, never cut, easy to grep and copy ids from
        for line in (headers, *lines):
            out.print("\t".join(line), markup=False, highlight=False, soft_wrap=True)
    else:
        from rich.table import Table

        table = Table(*headers[1:])
        table.add_column("operation_id", no_wrap=True)  # copied into recovery commands
        for line in lines:
            table.add_row(*_cells(*line[1:], line[0]))
        out.print(table)
    unresolved = [e for e in entries if e.state is CommitState.COMMIT_UNKNOWN]
    if unresolved:
        err.print(
            f"warning: {len(unresolved)} operation(s) in COMMIT_UNKNOWN need an operator: "
            "dpone recovery target-commit plan --operation-id ID -w WORKLOAD",
            markup=False,
        )


@checkpoints_app.command("list")
def checkpoints_list(
    workload: WorkloadOpt = None,
    journal: JournalOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List every incremental stream's watermark (all intervals before it are COMPLETE)."""
    with _boundary(as_json):
        store = _open_journal(workload, journal)
        try:
            lister = getattr(store, "list_checkpoints", None)
            found = lister() if callable(lister) else []
        finally:
            store.close()
    rows = [c.as_dict() for c in found]
    if as_json:
        _emit_json(rows)
        return
    headers = ("workload", "partition", "watermark", "pending", "next_interval", "stream_id")
    lines = [
        (
            str(r["workload_id"]),
            str(r["partition"]),
            str(r["watermark"]),
            str(r["pending_intervals"]),
            str(r["next_interval"] or "-"),
            str(r["stream_id"]),
        )
        for r in rows
    ]
    if not out.is_terminal:
        for line in (headers, *lines):
            out.print("\t".join(line), markup=False, highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(*headers)
    for line in lines:
        table.add_row(*_cells(*line))
    out.print(table)


@journal_app.command("history")
def journal_history(
    operation_id: Annotated[
        str, typer.Argument(help="sha256:… operation id.", metavar="OPERATION_ID")
    ],
    workload: WorkloadOpt = None,
    journal: JournalOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the append-only transition history of one operation."""
    with _boundary(as_json):
        _checked_operation_id(operation_id)
        store = _open_journal(workload, journal)
        try:
            rows = store.history(operation_id)
        finally:
            store.close()
    if as_json:
        _emit_json([_transition_json(t) for t in rows])
        return
    _print_history(rows)


@journal_app.command("migrate")
def journal_migrate(
    workload: WorkloadOpt = None, journal: JournalOpt = None, as_json: JsonOpt = False
) -> None:
    """Create or upgrade the journal's schema (idempotent; runs automatically where safe)."""
    with _boundary(as_json):
        store = _open_journal(workload, journal, read_only=False)
        try:
            migrate = getattr(store, "migrate", None)
            applied = list(migrate()) if migrate is not None else []
        finally:
            store.close()
    if as_json:
        _emit_json({"applied": applied})
        return
    out.print(f"applied schema versions {applied}" if applied else "journal schema is up to date")


def _transition_json(t: Any) -> dict[str, Any]:
    return {
        "version": t.version,
        "seq": t.seq,
        "from": t.from_state.value if t.from_state else None,
        "to": t.to_state.value,
        "kind": t.kind,
        "actor": t.actor,
        "lease_epoch": t.lease_epoch,
        "evidence": dict(t.evidence),
        "at": t.at,
    }


def _print_history(rows: list[Any]) -> None:
    from rich.table import Table

    table = Table("version", "from", "to", "kind", "epoch", "actor", "at", "evidence")
    for t in rows:
        table.add_row(
            *_cells(
                str(t.version),
                t.from_state.value if t.from_state else "-",
                t.to_state.value,
                t.kind,
                str(t.lease_epoch),
                t.actor,
                _ts(t.at),
                " ".join(f"{k}={v}" for k, v in t.evidence.items()),
            )
        )
    out.print(table)


# ------------------------------------------------------------------ runs
def _ledger(workload: Path | None, journal: str | None) -> tuple[Any, Any]:
    from dpone.config.bootstrap import ledger_of

    store = _open_journal(workload, journal)
    try:
        return store, ledger_of(store)
    except BaseException:
        store.close()
        raise


def _run_json(run: Any) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "idempotency_key": run.idempotency_key,
        "operation_id": run.operation_id,
        "state": run.state.value,
        "attempt": run.current_attempt,
        "unresolved": run.unresolved,
        "request_hash": run.request_hash,
        "definition_hash": run.definition_hash,
        "access_digest": run.access_digest,
        "access": dict(run.access),
        "provenance": dict(run.provenance),
        "error": None
        if run.error is None
        else {
            "code": run.error.code,
            "retryability": run.error.retryability,
            "message": run.error.message,
        },
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "warning": _run_warning(run),
    }


def _attempt_json(a: Any) -> dict[str, Any]:
    return {
        "attempt": a.attempt,
        "state": a.state.value,
        "owner": a.owner,
        "error_code": a.error_code,
        "provenance": dict(a.provenance),
        "started_at": a.started_at,
        "ended_at": a.ended_at,
    }


def _run_warning(run: Any) -> str | None:
    """The explicit warning line an unresolved run gets (None for settled runs)."""
    from dpone.contracts.run import RunState

    if run.state is RunState.UNRESOLVED:
        code = run.error.code if run.error is not None else "unknown"
        return (
            f"warning: run {run.run_id} is UNRESOLVED ({code}): nothing will retry it "
            "automatically; an operator must decide: dpone recovery target-commit plan "
            f"--operation-id {run.operation_id} -w WORKLOAD"
        )
    if run.state is RunState.RUNNING:
        return (
            f"warning: run {run.run_id} is RUNNING at attempt {run.current_attempt}: in "
            "flight, or interrupted; rerunning the same command resumes it safely"
        )
    return None


@runs_app.command("list")
def runs_list(
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="Only this run state (repeatable).", metavar="STATE"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs.")] = 100,
    workload: WorkloadOpt = None,
    journal: JournalOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List runs, newest first, with a warning line for each unresolved one."""
    from dpone.contracts.run import RunState

    with _boundary(as_json):
        try:
            states = frozenset(RunState(s.upper()) for s in state) if state else None
        except ValueError:
            raise ConfigInvalid(
                "unknown run state",
                field="--state",
                hint="use one of: " + ", ".join(s.value for s in RunState),
            ) from None
        store, ledger = _ledger(workload, journal)
        try:
            runs = ledger.list_runs(states=states, limit=limit)
        finally:
            store.close()
    if as_json:
        _emit_json([_run_json(r) for r in runs])
        return
    headers = ("run_id", "state", "attempt", "error", "operation_id", "key", "updated")
    lines = [
        (
            r.run_id,
            r.state.value,
            str(r.current_attempt),
            r.error.code if r.error is not None else "-",
            r.operation_id,
            r.idempotency_key,
            _ts(r.updated_at),
        )
        for r in runs
    ]
    for line in (headers, *lines):
        out.print("\t".join(line), markup=False, highlight=False, soft_wrap=True)
    for r in runs:
        warning = _run_warning(r)
        if warning:
            err.print(warning, markup=False)


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="run-… id from `dpone runs list`.", metavar="RUN")],
    workload: WorkloadOpt = None,
    journal: JournalOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one run: its request, provenance, attempts and operation."""
    with _boundary(as_json):
        if not run_id.startswith("run-") or not run_id.isprintable() or len(run_id) > 64:
            raise ConfigInvalid(
                "the run id is not of the form run-<hex>",
                field="RUN",
                hint="copy it from `dpone runs list`",
            )
        store, ledger = _ledger(workload, journal)
        try:
            run = ledger.get_run(run_id)
            attempts = ledger.attempts(run_id) if run is not None else []
            entry = store.get(run.operation_id) if run is not None else None
        finally:
            store.close()
        if run is None:
            raise ConfigInvalid(
                f"no run {run_id} is recorded in this journal",
                field="RUN",
                hint="check --workload/--journal, or list runs with `dpone runs list`",
            )
    if as_json:
        _emit_json(
            {
                "run": _run_json(run),
                "attempts": [_attempt_json(a) for a in attempts],
                "operation": None if entry is None else _entry_json(entry),
            }
        )
        return
    out.print(f"run          {run.run_id} ({run.state.value})", markup=False)
    out.print(f"key          {run.idempotency_key}", markup=False)
    out.print(f"operation    {run.operation_id}", markup=False)
    if entry is not None:
        out.print(
            f"  journal    {entry.state.value} (version {entry.version}, lease epoch "
            f"{entry.lease_epoch})",
            markup=False,
        )
    out.print(f"definition   {run.definition_hash}", markup=False)
    out.print(f"request      {run.request_hash}", markup=False)
    out.print(f"access       {run.access_digest} {dict(run.access)}", markup=False)
    origin = " ".join(f"{k}={v}" for k, v in run.provenance.items())
    out.print(f"provenance   {origin}", markup=False)
    if run.error is not None:
        out.print(
            f"error        {run.error.code} ({run.error.retryability}): {run.error.message}",
            markup=False,
        )
    from rich.table import Table

    table = Table("attempt", "state", "error", "owner", "started", "ended")
    for a in attempts:
        table.add_row(
            *_cells(
                str(a.attempt),
                a.state.value,
                a.error_code or "-",
                a.owner,
                _ts(a.started_at),
                _ts(a.ended_at),
            )
        )
    out.print(table)
    warning = _run_warning(run)
    if warning:
        err.print(warning, markup=False)


# ------------------------------------------------------------------ recovery
def _recovery_service(workload: Path, *, read_only: bool = True) -> tuple[Any, Any]:
    from dpone.config.bootstrap import build_route
    from dpone.config.workload import load_workload
    from dpone.recovery.service import RecoveryService

    spec = load_workload(workload)
    route = build_route(spec, read_only=read_only)
    service = RecoveryService(
        journal=route.journal,
        connector=route.connector,
        authorized_principals=frozenset(spec.recovery.authorized_principals),
    )
    return service, route


def _checked_operation_id(value: str) -> str:
    from dpone.contracts.identity import is_operation_id

    if not is_operation_id(value):
        # never echo the value: a mistyped argument may hold anything, secrets included
        raise ConfigInvalid(
            "the operation id is not of the form sha256:<64 lowercase hex digits>",
            field="--operation-id",
            hint="copy it from `dpone journal list` or from the run's output",
        )
    return value


OperationOpt = Annotated[str, typer.Option("--operation-id", help="sha256:… operation id.")]
RequiredWorkload = Annotated[
    Path, typer.Option("--workload", "-w", help="Workload file naming journal and target.")
]


@target_commit_app.command("inspect")
def recovery_inspect(
    operation_id: OperationOpt, workload: RequiredWorkload, as_json: JsonOpt = False
) -> None:
    """Show journal state, history, lease and fence. Writes nothing."""
    with _boundary(as_json):
        _checked_operation_id(operation_id)
        service, route = _recovery_service(workload)
        try:
            seen = service.inspect(operation_id)
        finally:
            route.close()
    fence = seen.fence
    payload = {
        "entry": _entry_json(seen.entry),
        "capability": seen.capability.value,
        "fence": None
        if fence is None
        else {
            "status": fence.status.value,
            "epoch": fence.epoch,
            "row_count": fence.row_count,
            "content_digest": fence.content_digest,
        },
        "fence_error": seen.fence_error,
        "lease_live": seen.lease_live,
        "lease_expires_in": seen.lease_expires_in,
        "lease_holder_dead": seen.lease_holder_dead,
        "history": [_transition_json(t) for t in seen.history],
        "audit": [
            {
                "principal": a.principal,
                "action": a.action,
                "outcome": a.outcome,
                "reason": a.reason,
                "before": a.before_state,
                "after": a.after_state,
                "at": a.at,
            }
            for a in seen.audit
        ],
    }
    if as_json:
        _emit_json(payload)
        return
    e = seen.entry
    out.print(f"operation  {e.operation_id}", markup=False)
    out.print(f"state      {e.state.value} (version {e.version})", markup=False)
    if seen.lease_live:
        lease = f"held by {e.lease_owner} for {seen.lease_expires_in:.0f}s more"
    elif seen.lease_holder_dead:
        lease = f"held by {e.lease_owner}, a process that has ended: the next run takes over"
    else:
        lease = "free"
    out.print(f"lease      epoch {e.lease_epoch}, {lease}", markup=False)
    if fence is None:
        out.print(f"fence      unreadable ({seen.fence_error})", markup=False)
    else:
        details = [f"capability {seen.capability.value}"]
        details += [f"epoch {fence.epoch}"] if fence.epoch is not None else []
        details += [f"rows {fence.row_count}"] if fence.row_count is not None else []
        out.print(f"fence      {fence.status.value} ({', '.join(details)})", markup=False)
    meta = e.metadata
    out.print(
        f"workload   {meta.get('workload_id')} interval {meta.get('interval')} "
        f"partition {meta.get('partition')}",
        markup=False,
    )
    _print_history(seen.history)
    for a in seen.audit:
        out.print(
            f"audit      {_ts(a.at)} {a.principal} {a.action} {a.outcome}: {a.reason}",
            markup=False,
        )


@target_commit_app.command("plan")
def recovery_plan(
    operation_id: OperationOpt, workload: RequiredWorkload, as_json: JsonOpt = False
) -> None:
    """Recommend the next step. Writes nothing."""
    with _boundary(as_json):
        _checked_operation_id(operation_id)
        service, route = _recovery_service(workload)
        try:
            plan = service.plan(operation_id)
        finally:
            route.close()
    if as_json:
        _emit_json(
            {
                "operation_id": plan.operation_id,
                "state": plan.state.value,
                "version": plan.version,
                "recommended": plan.recommended,
                "explanation": plan.explanation,
                "allowed_actions": [a.value for a in plan.allowed_actions],
            }
        )
        return
    out.print(f"state        {plan.state.value} (version {plan.version})", markup=False)
    out.print(f"recommended  {plan.recommended}", markup=False)
    out.print(f"why          {plan.explanation}", markup=False)
    if plan.allowed_actions:
        actions = "|".join(a.value for a in plan.allowed_actions)
        out.print(
            f"apply with   dpone recovery target-commit apply --operation-id {plan.operation_id} "
            f"-w {workload} --action {actions} --expected-version {plan.version} --reason TEXT",
            markup=False,
        )


def _principal() -> str:
    return os.environ.get("DPONE_PRINCIPAL") or getpass.getuser()


@target_commit_app.command("apply")
def recovery_apply(
    operation_id: OperationOpt,
    workload: RequiredWorkload,
    action: Annotated[
        str, typer.Option(help="complete-state | mark-committed | mark-not-committed")
    ],
    expected_version: Annotated[int, typer.Option(help="The version plan showed.")],
    reason: Annotated[str, typer.Option(help="Why; recorded in the audit log.")],
    attest_no_live_writer: Annotated[
        bool, typer.Option(help="Attest every earlier process has ended (capability none).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Apply an audited operator action (needs an authorized principal)."""
    from dpone.recovery.service import Action

    with _boundary(as_json):
        _checked_operation_id(operation_id)
        try:
            chosen = Action(action)
        except ValueError:
            raise ConfigInvalid(
                f"unknown action {action!r}",
                field="--action",
                hint="use one of: " + ", ".join(a.value for a in Action),
            ) from None
        service, route = _recovery_service(workload, read_only=False)
        try:
            entry = service.apply(
                operation_id,
                action=chosen,
                expected_version=expected_version,
                principal=_principal(),
                reason=reason,
                attest_no_live_writer=attest_no_live_writer,
            )
        finally:
            route.close()
    if as_json:
        _emit_json(_entry_json(entry))
        return
    out.print(f"applied {chosen.value}: {entry.state.value} (version {entry.version})")


# ------------------------------------------------------------------ certify
@app.command()
def certify(
    workload: Annotated[
        Path, typer.Argument(help="Workload whose route to certify.", metavar="WORKLOAD")
    ],
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Evidence directory (default .dpone/certifications)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Certify a route against its live target: fence probe, crash matrix, race, conflicts.

    Exit 0 only when every check is VERIFIED; 1 when one FAILED; 75 when the target or
    journal could not be reached (UNVERIFIED).
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from dpone.certification import certify as run_certify

    with (
        _boundary(as_json),
        Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err.console,
            transient=True,
            disable=as_json or not err.is_terminal,
        ) as bar,
    ):
        tasks: dict[str, Any] = {}

        def progress(name: str, status: str) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=None)
            bar.update(tasks[name], description=f"{name}: {status.lower()}")
            if status != "running" and not as_json:
                err.print(f"{name:<18} {status}", markup=False)

        result, path = run_certify(workload, out_dir=out_dir, progress=progress)
    if as_json:
        _emit_json({**result.to_json(), "evidence": str(path)})
    else:
        out.print(
            f"{result.verdict}: {result.connector} ({result.capability}) on "
            f"{result.database} [{result.server_version}]",
            markup=False,
        )
        for c in result.checks:
            figures = " ".join(f"{k}={v}" for k, v in c.figures.items())
            out.print(f"  {c.status:<10} {c.name:<18} {figures} {c.detail}".rstrip(), markup=False)
        out.print(f"evidence: {path} (and {path.with_suffix('.md').name})", markup=False)
    codes = {"VERIFIED": EXIT_OK, "FAILED": EXIT_FAILED}
    raise typer.Exit(codes.get(result.verdict, EXIT_RETRYABLE))


# ------------------------------------------------------------------ demo, version
@app.command()
def demo(
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Work directory (default: a new temp dir).")
    ] = None,
    rows: Annotated[int, typer.Option(min=10, help="Rows in the sample dataset.")] = 20_000,
) -> None:
    """Show a crash after the target commit, and the retry that completes without a duplicate."""
    from dpone.demo import run_demo

    with _boundary(False):
        code = run_demo(directory=directory, rows=rows, console=out.console)
    raise typer.Exit(code)


@app.command()
def version() -> None:
    """Print the dpone version."""
    import dpone

    out.print(dpone.__version__)


def main() -> None:
    """Console-script entry point."""
    gc.disable()  # while dpone imports: see dpone.cli.entry
    prefetch_run_source(sys.argv[1:])
    code = fast_run(sys.argv[1:])  # `dpone run ...` without typer's parse (dpone.cli._run)
    if code is not None:
        sys.exit(code)
    # Everything imported so far lives as long as the process: move it out of the cyclic
    # collector's sight, so the full collections that millions of row tuples trigger do not
    # re-walk typer/msgspec/rich on every pass (measured: -20% CPU on publication runs).
    gc.freeze()
    gc.enable()
    try:
        app()
    except DponeError as exc:  # pragma: no cover - commands catch their own
        err.print(str(exc), markup=False)
        sys.exit(exit_code_for(exc))


if __name__ == "__main__":
    main()
