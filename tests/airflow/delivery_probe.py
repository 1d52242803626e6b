"""Run inside an Airflow environment by test_delivery_airflow.py; prints one JSON line.

``trigger OP LOCATOR_JSON``: import only the trigger, round-trip it through Airflow's own
trigger row (Airflow's serializer and encryption), run the rebuilt trigger once, and
report the event and which dpone modules were imported.

``operator WORKLOAD OP [WORKLOAD OP ...]``: per operation, call ``execute_complete`` of
the real operator four times (two duplicate events, then a ``missing`` and a
``locator_unresolved`` one) and report what it returned, how it deferred or how it failed.

``blocked WORKLOAD OP``: one ``execute_complete`` whose remote job failed; report the
``AirflowFailException`` message.

``execute WORKLOAD``: one ``execute`` of a fresh task (a first try); report what it
returned, how it deferred, or the ``AirflowFailException`` message.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from typing import Any


def _trigger(op: str, locator: dict[str, Any]) -> dict[str, Any]:
    from dpone.airflow.triggers import DponeReceiptTrigger

    trigger = DponeReceiptTrigger(
        operation_id=op, journal=locator, poll_interval_s=0.2, max_polls=50, lease_s=2.0
    )
    classpath, kwargs = trigger.serialize()
    from airflow.models.trigger import Trigger

    row = Trigger(classpath=classpath, kwargs=kwargs)  # Airflow's serializer + encryption
    module, _, name = row.classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**row.kwargs)

    async def first() -> Any:
        async for event in rebuilt.run():
            return event.payload
        return None

    payload = asyncio.run(first())
    return {
        "kwargs": kwargs,
        "stored": json.loads(json.dumps(row.kwargs, default=str)),
        "same": rebuilt.serialize() == (classpath, kwargs),
        "event": payload,
        "dpone_modules": sorted(m for m in sys.modules if m.startswith("dpone")),
        "airflow_loaded": "airflow.triggers.base" in sys.modules,
    }


def _operator(pairs: list[str]) -> dict[str, Any]:
    return {"ops": [_calls(w, op) for w, op in zip(pairs[::2], pairs[1::2], strict=True)]}


def _context() -> dict[str, Any]:
    """A task context as Airflow hands it to the operator (try 1 of a manual run)."""
    from types import SimpleNamespace

    ti = SimpleNamespace(dag_id="probe", task_id="deliver", map_index=-1, try_number=1)
    return {"ti": ti, "dag_run": SimpleNamespace(run_id="manual__probe")}


def _calls(workload: str, op: str) -> dict[str, Any]:
    from airflow.providers.common.compat.sdk import AirflowFailException, TaskDeferred

    from dpone.airflow.delivery import DponeDeliveryOperator

    task = DponeDeliveryOperator(
        task_id="deliver", workload=workload, poll_interval_s=0.5, lease_s=2.0
    )
    out: list[Any] = []
    events = (
        {"operation_id": op, "status": "succeeded"},
        {"status": "forged"},
        {"operation_id": op, "status": "missing"},
        {"operation_id": op, "status": "locator_unresolved"},
    )
    for event in events:
        try:
            out.append({"returned": task.execute_complete(_context(), event, operation_id=op)})
        except AirflowFailException as stop:
            out.append({"failed": str(stop)})
        except TaskDeferred as deferred:
            classpath, kwargs = deferred.trigger.serialize()
            out.append(
                {
                    "deferred": classpath,
                    "kwargs": kwargs,
                    "method": deferred.method_name,
                    "next_kwargs": deferred.kwargs,
                }
            )
    return {"calls": out}


def _blocked(workload: str, op: str) -> dict[str, Any]:
    from airflow.providers.common.compat.sdk import AirflowFailException

    from dpone.airflow.delivery import DponeDeliveryOperator

    task = DponeDeliveryOperator(task_id="deliver", workload=workload)
    try:
        returned = task.execute_complete(
            _context(), {"operation_id": op, "status": "succeeded"}, op
        )
    except AirflowFailException as stop:
        return {"failed": str(stop)}
    return {"returned": returned}


def _execute(workload: str) -> dict[str, Any]:

    from airflow.providers.common.compat.sdk import AirflowFailException, TaskDeferred

    from dpone.airflow.delivery import DponeDeliveryOperator

    task = DponeDeliveryOperator(
        task_id="deliver", workload=workload, interval="2026-11-01T00:00:00Z/2026-11-02T00:00:00Z"
    )
    try:
        return {"returned": task.execute(_context())}
    except AirflowFailException as stop:
        return {"failed": str(stop)}
    except TaskDeferred as deferred:
        return {"deferred": deferred.trigger.serialize()[1]}


def main() -> None:
    mode = sys.argv[1]
    if mode == "trigger":
        result = _trigger(sys.argv[2], json.loads(sys.argv[3]))
    elif mode == "blocked":
        result = _blocked(sys.argv[2], sys.argv[3])
    elif mode == "execute":
        result = _execute(sys.argv[2])
    else:
        result = _operator(sys.argv[2:])
    print("PROBE " + json.dumps(result, default=str))


if __name__ == "__main__":
    main()
