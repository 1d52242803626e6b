"""Parse a DAG file the way Airflow does, with the network shut, and report what it imported.

Runs inside an Airflow virtual environment (not the development one):
``python parse_probe.py DAG_FILE`` prints one JSON object: DAG count, parse seconds, the
modules the parse imported beyond Airflow's own, and every connection attempt.
Used by tests/airflow/test_parse.py and bench/bench_airflow_parse.py.
"""

from __future__ import annotations

import json
import runpy
import socket
import sys
import time

#: modules a DAG parse must not import: database drivers, HTTP clients, dpone's I/O layers
FORBIDDEN = (
    "sqlite3", "psycopg", "psycopg2", "psycopg_pool", "pymysql", "MySQLdb", "duckdb",
    "requests", "httpx", "urllib3", "aiohttp", "dpone.adapters", "dpone.api",
    "dpone.runtime.commit_protocol", "dpone.recovery",
)  # fmt: skip


def _class_name(task: object) -> str:
    """The operator class name of a task, mapped or not (2.x keeps a dict for it)."""
    spec = getattr(task, "operator_class", None)
    if isinstance(spec, type):
        return spec.__name__
    if isinstance(spec, dict):
        return str(spec.get("task_type") or type(task).__name__)
    if isinstance(spec, str):
        return spec.rpartition(".")[2]
    return type(task).__name__


def main(dag_file: str) -> None:
    # Airflow itself (metadata models, the SDK) is the baseline every DAG file pays
    from airflow.providers.common.compat.sdk import DAG, BaseOperator  # noqa: F401

    attempts: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(repr(args[1:2] or args[:1]))
        raise OSError("network disabled while parsing DAGs")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]
    before = set(sys.modules)
    started = time.perf_counter()
    namespace = runpy.run_path(dag_file)
    seconds = time.perf_counter() - started
    new = sorted(set(sys.modules) - before)
    dags = [v for v in namespace.values() if isinstance(v, DAG)]
    forbidden = sorted(m for m in set(sys.modules) if m in FORBIDDEN)
    print(
        json.dumps(
            {
                "dags": len(dags),
                "tasks": sum(len(d.tasks) for d in dags),
                # what each task would run (a mapped task reports its operator's class)
                "operators": {d.dag_id: sorted(_class_name(t) for t in d.tasks) for d in dags},
                "seconds": seconds,
                "new_modules": len(new),
                "forbidden_loaded": forbidden,
                "forbidden_new": [m for m in forbidden if m in new],
                "connection_attempts": attempts,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
