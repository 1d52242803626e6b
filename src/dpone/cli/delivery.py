"""``dpone delivery status|resume|reconcile``: look at and continue resumable deliveries."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

delivery_app = typer.Typer(
    help="Resumable deliveries to REST receivers: status, resume, reconcile.",
    no_args_is_help=True,
)

#: Exit code of a delivery blocked for an operator (shared with COMMIT_UNKNOWN).
EXIT_BLOCKED = 3

OperationOpt = Annotated[
    str, typer.Option("--operation-id", help="The delivery's operation id (sha256:...).")
]
JournalOpt = Annotated[
    str | None,
    typer.Option("--journal", help="Journal URL (default: $DPONE_JOURNAL or .dpone)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
WorkloadOpt = Annotated[
    Path | None,
    typer.Option("--workload", "-w", help="Workload file: its journal (URL and schema) is used."),
]
SchemaOpt = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="PostgreSQL schema of the journal (default: the workload's journal_schema, "
        "else dpone; ignored for SQLite).",
    ),
]


def _journal_url(journal: str | None) -> str:
    return journal or os.environ.get("DPONE_JOURNAL") or "sqlite:///.dpone/journal.db"


def _record_json(record: Any) -> dict[str, Any]:
    return {
        "operation_id": record.operation_id,
        "state": record.state.value,
        "version": record.version,
        "receiver": record.receiver,
        "credential_ref": record.credential_ref,
        "payload_digest": record.payload.digest,
        "payload_bytes": record.payload.size_bytes,
        "payload_rows": record.payload.rows,
        "chunk_count": record.payload.chunk_count,
        "attempts": record.attempts,
        "receipt": record.receipt,
        "remote_status": record.remote_status.value if record.remote_status else None,
        "rows_processed": record.rows_processed,
        "due_at": record.due_at,
        "next_check_at": record.next_check_at,
        "lease_owner": record.lease_owner,
        "lease_expires_at": record.lease_expires_at,
        "block_reason": record.block_reason.value if record.block_reason else None,
        "detail": record.detail,
        "updated_at": record.updated_at,
        "parent_id": record.parent_id,
        "child_index": record.child_index,
    }


def _parent_json(operation_id: str, children: list[Any]) -> dict[str, Any]:
    done = sum(1 for c in children if c.state.value == "COMPLETE")
    return {
        "operation_id": operation_id,
        "kind": "split delivery (parent)",
        "children_complete": f"{done}/{len(children)}",
        "children": [_record_json(c) for c in children],
    }


def _result_json(result: Any) -> tuple[dict[str, Any], int]:
    from dpone.contracts.delivery import DeliveryBlocked, DeliveryCompleted

    if isinstance(result, DeliveryCompleted):
        return (
            {
                "outcome": "completed",
                "operation_id": result.operation_id,
                "receipt": result.receipt,
                "rows": result.rows,
                "replayed": result.replayed,
            },
            0,
        )
    if isinstance(result, DeliveryBlocked):
        return (
            {
                "outcome": "blocked",
                "operation_id": result.operation_id,
                "state": result.state.value,
                "reason": result.reason.value,
                "message": result.message,
                "recovery_ref": result.recovery_ref,
            },
            EXIT_BLOCKED,
        )
    return (
        {
            "outcome": "pending",
            "operation_id": result.operation_id,
            "continuation": result.continuation,
            "next_check_at": result.next_check_at,
        },
        0,
    )


def print_result(result: Any, *, as_json: bool) -> int:
    """Print a delivery outcome; return its exit code (0 completed/pending, 3 blocked)."""
    payload, code = _result_json(result)
    if not as_json and payload["outcome"] == "pending":
        payload["next"] = f"dpone delivery resume --operation-id {result.operation_id}"
    _print(payload, as_json=as_json)
    return code


def _print(payload: dict[str, Any], *, as_json: bool) -> None:
    from dpone.cli.main import _emit_json, out

    if as_json:
        _emit_json(payload)
        return
    for key, value in payload.items():
        if isinstance(value, list):
            out.print(f"{key}:", markup=False)
            for item in value:
                out.print(f"  {item}", markup=False, highlight=False)
        else:
            out.print(f"{key}: {'-' if value is None else value}", markup=False, highlight=False)


@delivery_app.command("status")
def status(
    operation_id: OperationOpt,
    journal: JournalOpt = None,
    workload: WorkloadOpt = None,
    schema_name: SchemaOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a delivery: state, receipt, attempts, observations, capacity (read-only)."""
    from dpone.cli.main import _boundary
    from dpone.config.delivery import open_delivery_store
    from dpone.errors import OperationNotFound

    with _boundary(as_json):
        url, base, schema = _journal_of(journal, workload, schema_name)
        store = open_delivery_store(url, base_dir=base, schema=schema, read_only=True)
        try:
            record = store.get(operation_id)
            children = store.children(operation_id) if record is None else []
            if record is None and not children:
                raise OperationNotFound(
                    "no delivery is recorded for this operation id", operation_id=operation_id
                )
            if record is None:
                payload = _parent_json(operation_id, children)
                payload["checkpoint"] = _checkpoint_json(url, base, schema, operation_id)
                _print(payload, as_json=as_json)
                return
            payload = _record_json(record)
            payload["checkpoint"] = _checkpoint_json(url, base, schema, operation_id)
            payload["capacity_held_at_receiver"] = store.active_reservations(record.receiver)
            payload["attempt_log"] = store.attempts(operation_id)
            payload["observations"] = [
                {"status": o.status.value, "rows_processed": o.rows_processed}
                for o in store.observations(operation_id)
            ]
            payload["history"] = [
                f"v{h['version']} {h['from_state'] or '-'} -> {h['to_state']}"
                for h in store.history(operation_id)
            ]
        finally:
            store.close()
        _print(payload, as_json=as_json)


def _checkpoint_json(url: str, base: Path, schema: str, operation_id: str) -> Any:
    """What the delivery promotes and where its stream stands (None: it promotes nothing)."""
    from dpone.config.bootstrap import open_journal
    from dpone.contracts.checkpoint import from_micros
    from dpone.contracts.identity import Interval

    journal = open_journal(url, base_dir=base, schema=schema, read_only=True)
    try:
        bound = getattr(journal, "delivery_checkpoint", None)
        advance = bound(operation_id) if callable(bound) else None
        if advance is None:
            return None
        current = journal.get_checkpoint(advance.stream_id)  # type: ignore[attr-defined]
    finally:
        journal.close()
    window = Interval(start=from_micros(advance.start), end=from_micros(advance.end))
    view = current.as_dict() if current is not None else {}
    return {
        "promotes_interval": window.canonical(),
        "stream_id": advance.stream_id,
        "watermark": view.get("watermark"),
        "pending_intervals": view.get("pending_intervals"),
        "watermark_covers_interval": current is not None and current.watermark >= advance.end,
    }


@delivery_app.command("send")
def send(
    payload: Annotated[Path, typer.Option(help="JSON-lines file to deliver.")],
    receiver: Annotated[str, typer.Option(help="Receiver base URL (no credentials in it).")],
    workload_id: Annotated[str, typer.Option(help="Workload name (part of the identity).")],
    interval: Annotated[str, typer.Option(help="START/END, part of the identity.")],
    credential: Annotated[
        str | None, typer.Option(help="Bearer token reference: env:NAME or file:PATH.")
    ] = None,
    partition: Annotated[str, typer.Option(help="Partition (part of the identity).")] = "-",
    release: Annotated[str, typer.Option(help="Release id (part of the identity).")] = "-",
    deployment: Annotated[str, typer.Option(help="Deployment id (identity).")] = "-",
    rows_per_child: Annotated[
        int, typer.Option(min=0, help="Split into child jobs of this many rows (0: one job).")
    ] = 0,
    capacity: Annotated[
        int | None, typer.Option(min=1, help="Limit of active jobs at this receiver.")
    ] = None,
    chunk_bytes: Annotated[int, typer.Option(min=1024, help="Upload chunk size.")] = 1 << 20,
    staging_dir: Annotated[
        Path, typer.Option(help="Where payloads are staged (content-addressed copies).")
    ] = Path(".dpone/staging"),
    journal: JournalOpt = None,
    schema_name: SchemaOpt = None,
    poll_budget: Annotated[
        float, typer.Option(min=0.0, help="Seconds to keep observing a running job.")
    ] = 0.0,
    wait_budget: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for capacity or a due retry.")
    ] = 0.0,
    poll_interval: Annotated[float, typer.Option(min=0.05, help="Seconds between checks.")] = 5.0,
    as_json: JsonOpt = False,
) -> None:
    """Stage a payload and deliver it once (or continue the same delivery if it exists).

    The operation id comes from the identity options, so the same command is safe to
    run again: it resumes, and never creates a second remote job. Exit 0 when
    completed or pending (see "outcome"), 3 when blocked.
    """
    from dpone.adapters.delivery.rest import KIND, normalize_receiver_url
    from dpone.cli.main import _boundary
    from dpone.config.delivery import (
        delivery_operation_id,
        open_delivery_processor,
        stage_payload_copy,
    )
    from dpone.runtime.delivery import (
        DeliveryPolicy,
        DeliveryRequest,
        ParentDeliveryRequest,
        delivery_intent_digest,
    )

    policy = DeliveryPolicy(
        poll_interval_s=poll_interval, poll_budget_s=poll_budget, wait_budget_s=wait_budget
    )
    with _boundary(as_json):
        receiver = normalize_receiver_url(receiver)
        target = f"{KIND}:{receiver}"
        operation_id = delivery_operation_id(
            workload_id=workload_id,
            interval=interval,
            partition=partition,
            release=release,
            deployment=deployment,
            receiver=target,
        )
        staged = stage_payload_copy(payload, staging_dir=staging_dir, chunk_bytes=chunk_bytes)
        intent = delivery_intent_digest(
            payload=staged, receiver=target, pack_fingerprint=f"cli:{workload_id}"
        )
        url, base, schema = _journal_of(journal, None, schema_name)
        proc = open_delivery_processor(url, base_dir=base, policy=policy, schema=schema)
        try:
            if rows_per_child:
                result = proc.deliver_parent(
                    ParentDeliveryRequest(
                        operation_id=operation_id,
                        intent_digest=intent,
                        payload=staged,
                        rows_per_child=rows_per_child,
                        receiver_url=receiver,
                        credential_ref=credential,
                        capacity_limit=capacity,
                    )
                )
            else:
                result = proc.deliver(
                    DeliveryRequest(
                        operation_id=operation_id,
                        intent_digest=intent,
                        payload=staged,
                        receiver_url=receiver,
                        credential_ref=credential,
                        capacity_limit=capacity,
                    )
                )
        finally:
            proc.close()
            proc.store.close()
        body, code = _result_json(result)
        _print(body, as_json=as_json)
        raise typer.Exit(code)


@delivery_app.command("resume")
def resume(
    operation_id: OperationOpt,
    journal: JournalOpt = None,
    workload: WorkloadOpt = None,
    schema_name: SchemaOpt = None,
    poll_budget: Annotated[
        float, typer.Option(min=0.0, help="Seconds to keep observing a running job.")
    ] = 0.0,
    wait_budget: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for capacity or a due retry.")
    ] = 0.0,
    poll_interval: Annotated[float, typer.Option(min=0.05, help="Seconds between checks.")] = 5.0,
    as_json: JsonOpt = False,
) -> None:
    """Continue a delivery from its recorded state: observe, retry when due, or reconcile.

    A workload's delivery promotes the checkpoint bound to it once the remote success
    is verified, then COMPLETE; the run ledger records the attempt. Exit 0 when
    completed or still pending (see "outcome"), 3 when blocked for an operator.
    """
    import socket

    from dpone.cli.main import _boundary
    from dpone.config.delivery import open_delivery_service
    from dpone.contracts.run import ApiProvenance
    from dpone.runtime.delivery import DeliveryPolicy

    policy = DeliveryPolicy(poll_interval_s=poll_interval, wait_budget_s=wait_budget)
    with _boundary(as_json):
        url, base, schema = _journal_of(journal, workload, schema_name)
        service, journal_port = open_delivery_service(
            url, base_dir=base, policy=policy, schema=schema
        )
        who = ApiProvenance(caller="dpone delivery resume", host=socket.gethostname())
        try:
            result = service.resume(
                operation_id, provenance=who.record(), poll_budget_s=poll_budget
            )
        finally:
            service.store.close()
            journal_port.close()
    raise typer.Exit(print_result(result, as_json=as_json))


def _journal_of(
    journal: str | None, workload: Path | None, schema: str | None = None
) -> tuple[str, Path, str]:
    """The journal URL, its base directory and schema, the same way for every command.

    The URL is --journal, else the workload's journal, else $DPONE_JOURNAL or .dpone;
    the schema is --schema, else the workload's journal_schema, else "dpone".
    """
    if workload is None:
        return _journal_url(journal), Path.cwd(), schema or "dpone"
    from dpone.config.workload import load_workload

    loaded = load_workload(workload)
    if journal is not None:
        return journal, Path.cwd(), schema or loaded.journal_schema
    return loaded.journal_url(), loaded.base_dir, schema or loaded.journal_schema


@delivery_app.command("reconcile")
def reconcile(
    operation_id: OperationOpt,
    journal: JournalOpt = None,
    workload: WorkloadOpt = None,
    schema_name: SchemaOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask the receiver what happened to an unanswered submit (key lookup); never submits."""
    from dpone.cli.main import _boundary
    from dpone.config.delivery import open_delivery_processor
    from dpone.contracts.delivery import DeliveryState

    with _boundary(as_json):
        url, base, schema = _journal_of(journal, workload, schema_name)
        proc = open_delivery_processor(url, base_dir=base, schema=schema)
        try:
            record = proc.reconcile(operation_id)
        finally:
            proc.close()
            proc.store.close()
        payload = _record_json(record)
        if record.state is DeliveryState.SUBMIT_UNKNOWN:
            payload["finding"] = "no job under this key; `dpone delivery resume` submits again"
        elif record.state is DeliveryState.BLOCKED:
            payload["finding"] = "blocked: " + (record.detail or "an operator must decide")
        else:
            payload["finding"] = f"job found under this key, receipt {record.receipt}"
        _print(payload, as_json=as_json)
        raise typer.Exit(EXIT_BLOCKED if record.state is DeliveryState.BLOCKED else 0)


@delivery_app.command("release-capacity")
def release_capacity(
    operation_id: OperationOpt,
    expected_version: Annotated[int, typer.Option(help="The version status showed.")],
    reason: Annotated[str, typer.Option(help="Why; recorded in the audit log.")],
    journal: JournalOpt = None,
    workload: WorkloadOpt = None,
    schema_name: SchemaOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give a BLOCKED delivery's capacity slot back (audited; the delivery stays BLOCKED).

    Only after checking at the receiver that no job of it is active. The principal
    ($DPONE_PRINCIPAL or the login name) must be listed in $DPONE_DELIVERY_OPERATORS.
    """
    import getpass

    from dpone.cli.main import _boundary
    from dpone.config.delivery import open_delivery_store
    from dpone.errors import Unauthorized

    principal = os.environ.get("DPONE_PRINCIPAL") or getpass.getuser()
    allowed = {p.strip() for p in os.environ.get("DPONE_DELIVERY_OPERATORS", "").split(",")}
    with _boundary(as_json):
        if principal not in allowed - {""}:
            raise Unauthorized(
                f"principal {principal!r} may not apply delivery operator actions",
                operation_id=operation_id,
                hint="list the principal in DPONE_DELIVERY_OPERATORS (comma-separated)",
            )
        url, base, schema = _journal_of(journal, workload, schema_name)
        store = open_delivery_store(url, base_dir=base, schema=schema)
        try:
            record = store.release_capacity(
                operation_id=operation_id,
                expected_version=expected_version,
                principal=principal,
                reason=reason,
            )
            payload = _record_json(record)
            payload["capacity_held_at_receiver"] = store.active_reservations(record.receiver)
            payload["audit"] = store.audit_log(operation_id)
        finally:
            store.close()
        _print(payload, as_json=as_json)
