"""A delivery worker process: deliver one payload file to a receiver, print the outcome.

argv: JOURNAL RECEIVER_URL PAYLOAD OPERATION_ID LIMIT POLL_BUDGET WAIT_BUDGET CHECKPOINT
[ROWS_PER_CHILD] (given: a split delivery whose children run one after another)
(JOURNAL: a SQLite path, or a PostgreSQL DSN with the schema in DPONE_TEST_DELIVERY_SCHEMA)
Exit: 0 completed, 10 pending, 3 blocked, 5 lease held, 75 other retryable errors.
The checkpoint file gets the payload digest written (an absolute write) by ``promote``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dpone.adapters.delivery.rest import RestDeliverySink
from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore
from dpone.contracts.delivery import DeliveryBlocked, DeliveryCompleted
from dpone.errors import DponeError, LeaseHeld
from dpone.runtime import failpoints
from dpone.runtime.delivery import (
    DeliveryPolicy,
    DeliveryRequest,
    ParentDeliveryRequest,
    ResumableDeliveryProcessor,
    delivery_intent_digest,
    stage_payload,
)


def main() -> int:
    journal, url, payload_path, op, limit, poll, wait, checkpoint = sys.argv[1:9]
    rows_per_child = int(sys.argv[9]) if len(sys.argv) > 9 else 0
    failpoints.configure(os.environ.get("DPONE_FAILPOINTS"))
    if journal.startswith("postgresql://"):
        from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

        store = PostgresDeliveryStore(journal, schema=os.environ["DPONE_TEST_DELIVERY_SCHEMA"])
    else:
        store = SqliteDeliveryStore(Path(journal))
    payload = stage_payload(Path(payload_path), chunk_bytes=64)

    def promote(record) -> None:
        Path(checkpoint).write_text(record.payload.digest + "\n")
        with Path(checkpoint + ".log").open("a") as log:
            log.write(f"{os.getpid()}\n")

    proc = ResumableDeliveryProcessor(
        store=store,
        sink_factory=lambda u, ref: RestDeliverySink(u, credential_ref=ref, timeout_s=5.0),
        policy=DeliveryPolicy(
            poll_interval_s=0.1,
            poll_budget_s=float(poll),
            wait_budget_s=float(wait),
            retry_base_s=0.1,
            retry_max_s=0.5,
            submit_lease_s=0.3,
        ),
        promote=promote,
    )
    intent = delivery_intent_digest(payload=payload, receiver=url, pack_fingerprint="crash-pack")
    common = {
        "operation_id": op,
        "intent_digest": intent,
        "payload": payload,
        "receiver_url": url,
        "credential_ref": "env:DPONE_TEST_DELIVERY_TOKEN",
        "capacity_limit": int(limit),
    }
    try:
        if rows_per_child:
            result = proc.deliver_parent(
                ParentDeliveryRequest(**common, rows_per_child=rows_per_child)
            )
        else:
            result = proc.deliver(DeliveryRequest(**common))
    except LeaseHeld:
        return 5
    except DponeError as exc:
        print(json.dumps(exc.attrs()))
        return 75 if exc.retryable else 1
    finally:
        proc.close()
        store.close()
    print(json.dumps({"result": type(result).__name__}))
    if isinstance(result, DeliveryCompleted):
        return 0
    if isinstance(result, DeliveryBlocked):
        return 3
    return 10


if __name__ == "__main__":
    sys.exit(main())
