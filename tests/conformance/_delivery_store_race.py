"""One racer: register an operation, then try to reserve a slot (advance to SUBMITTING).

argv: BACKEND (sqlite|postgres) LOCATION SCHEMA RECEIVER START_AT
Prints "reserved" or "full".
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

from dpone.contracts.delivery import DeliveryState, DeliveryStep, PayloadRef
from dpone.errors import DeliveryCapacityFull


def main() -> None:
    backend, location, schema, receiver, start_at = sys.argv[1:6]
    if backend == "sqlite":
        from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore

        store = SqliteDeliveryStore(location)
    else:
        from dpone.adapters.delivery.postgres_store import PostgresDeliveryStore

        store = PostgresDeliveryStore(location, schema=schema)
    op = "sha256:" + hashlib.sha256(f"{os.getpid()}-{time.time_ns()}".encode()).hexdigest()
    record = store.register(
        operation_id=op,
        intent_digest="sha256:" + "1" * 64,
        receiver=receiver,
        receiver_url="http://127.0.0.1:1",
        credential_ref=None,
        payload=PayloadRef(
            path="/nonexistent", digest="sha256:" + "2" * 64, size_bytes=1, rows=1, chunk_bytes=1
        ),
        capacity_limit=3,
        actor=f"racer:{os.getpid()}",
    )
    time.sleep(max(float(start_at) - time.time(), 0.0))
    try:
        store.advance(
            operation_id=op,
            expected_version=record.version,
            step=DeliveryStep(to_state=DeliveryState.SUBMITTING, start_attempt=True),
            actor=f"racer:{os.getpid()}",
        )
        print("reserved")
    except DeliveryCapacityFull:
        print("full")
    finally:
        store.close()


if __name__ == "__main__":
    main()
