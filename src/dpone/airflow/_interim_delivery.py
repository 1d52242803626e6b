"""INTERIM (remove at merge): the delivery runtime behind ``DponeDeliveryOperator``.

Until ``Runner.deliver`` / ``Runner.resume_delivery`` (``dpone.api``, with workload files
of ``target: {kind: rest}``) land, this module gives the operator the same two calls on
the existing composition (``dpone.config.delivery``). It reads the few workload keys a
REST delivery needs with PyYAML:

    workload: orders_rest
    release: "r1"
    deployment: prod
    journal: sqlite:////abs/journal.db      # or postgresql://user@host/db
    source: {kind: jsonl, path: /abs/orders.jsonl}
    target: {kind: rest, url: "http://receiver:8080", credential: env:RECEIVER_TOKEN}

The checkpoint it promotes is a stand-in: one JSON line per promotion in
``<journal dir>/<workload>.checkpoints.jsonl``, written by the processor's ``promote``
hook, i.e. only after the remote job was observed ``succeeded`` and before COMPLETE.
The lead swaps :func:`dpone.airflow.delivery._delivery_runtime` to ``Runner`` and deletes
this file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dpone.config.bootstrap import RunContext
from dpone.contracts.delivery import DeliveryRecord, DeliveryResult
from dpone.contracts.identity import derive_operation_id, parse_interval
from dpone.errors import ConfigInvalid

__all__ = ["InterimDeliveryRuntime"]


class InterimDeliveryRuntime:
    """``deliver`` / ``resume_delivery`` with the signatures ``Runner`` will have."""

    def __init__(self, workload_path: str, *, environ: Mapping[str, str]) -> None:
        from dpone.adapters.delivery.rest import check_credential_ref, normalize_receiver_url
        from dpone.config.workload import resolve_sqlite_url

        path = Path(workload_path)
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            raise ConfigInvalid("the workload file cannot be read", field="workload") from None
        target = spec.get("target") if isinstance(spec, dict) else None
        if not isinstance(target, dict) or target.get("kind") != "rest":
            raise ConfigInvalid(
                "DponeDeliveryOperator needs a workload with target.kind: rest", field="target"
            )
        self.name = str(spec["workload"])
        self.release = str(spec.get("release", "-"))
        self.deployment = str(spec.get("deployment", "-"))
        self.receiver = normalize_receiver_url(str(target["url"]))
        self.credential = check_credential_ref(target.get("credential"))
        self.source = Path(str(spec["source"]["path"]))
        journal = str(spec.get("journal") or environ.get("DPONE_JOURNAL") or "")
        if journal.startswith("sqlite:"):
            db = resolve_sqlite_url(journal, base_dir=path.parent, field="journal")
            self.journal_url = f"sqlite:///{db}"
            self._dir = db.parent
        else:
            self.journal_url = journal
            self._dir = path.parent
        self._processor: Any = None

    def _proc(self, poll_budget_s: float) -> Any:
        from dpone.config.delivery import open_delivery_store, rest_sink_factory
        from dpone.runtime.delivery import DeliveryPolicy, ResumableDeliveryProcessor

        if self._processor is None:
            self._processor = ResumableDeliveryProcessor(
                store=open_delivery_store(self.journal_url, base_dir=self._dir),
                sink_factory=rest_sink_factory(),
                policy=DeliveryPolicy(poll_budget_s=poll_budget_s, poll_interval_s=1.0),
                promote=self._promote,
            )
        return self._processor

    @property
    def store_locator(self) -> str:
        """``sqlite:/abs/path`` for a SQLite control plane, else the journal URL."""
        if self.journal_url.startswith("sqlite:"):
            return str(self._proc(0.0).store.locator)
        return self.journal_url

    def _promote(self, record: DeliveryRecord) -> None:
        line = json.dumps({"operation_id": record.operation_id, "receipt": record.receipt})
        with (self._dir / f"{self.name}.checkpoints.jsonl").open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def deliver(
        self,
        *,
        interval: str,
        partition: str | None,
        context: RunContext,
        provenance: Any,
        poll_budget_s: float = 0.0,
    ) -> DeliveryResult:
        """Stage the source, then submit once by key (or continue the same delivery)."""
        from dpone.config.delivery import stage_payload_copy
        from dpone.runtime.delivery import DeliveryRequest, delivery_intent_digest

        del provenance  # the Runner records it in the run ledger; not built here
        target = f"rest:{self.receiver}"
        operation_id = derive_operation_id(
            release_id=self.release,
            deployment_id=self.deployment,
            dag_id=context.dag_id,
            dag_run_logical_identity=context.dag_run_logical_identity,
            workload_id=self.name,
            mapped_partition_identity=partition or "-",
            canonical_interval=parse_interval(interval),
            canonical_target_identity=target,
        )
        staged = stage_payload_copy(
            self.source, staging_dir=self._dir / "staging", chunk_bytes=1 << 20
        )
        proc = self._proc(poll_budget_s)
        result: DeliveryResult = proc.deliver(
            DeliveryRequest(
                operation_id=operation_id,
                intent_digest=delivery_intent_digest(
                    payload=staged, receiver=target, pack_fingerprint=f"workload:{self.name}"
                ),
                payload=staged,
                receiver_url=self.receiver,
                credential_ref=self.credential,
            )
        )
        return result

    def resume_delivery(self, operation_id: str, *, poll_budget_s: float = 0.0) -> DeliveryResult:
        """Reread the control plane, observe once if not terminal, promote on success."""
        result: DeliveryResult = self._proc(poll_budget_s).resume(operation_id)
        return result

    def close(self) -> None:
        """Close the processor's store and sinks."""
        if self._processor is not None:
            self._processor.close()
            close = getattr(self._processor.store, "close", None)
            if close is not None:
                close()
            self._processor = None
