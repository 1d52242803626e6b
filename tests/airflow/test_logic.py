"""The provider's pure parts, without Airflow: identity, outcome mapping, connections."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpone.airflow.connections import (
    JOURNAL_ENV,
    TARGET_ENV,
    apply_connections,
    connection_url,
)
from dpone.airflow.identity import TaskIdentity, logical_run_identity
from dpone.airflow.outcome import failure, xcom_summary
from dpone.airflow.provider import get_provider_info
from dpone.config.workload import parse_workload, to_json_dict
from dpone.contracts.result import OperationResult, RunMode
from dpone.contracts.states import CommitState
from dpone.errors import (
    CommitUnknown,
    ConfigInvalid,
    IntentConflict,
    JournalUnavailable,
    LeaseHeld,
    recovery_ref,
)

OP = "sha256:" + "ab" * 32


def test_every_try_of_a_task_has_one_context_and_tasks_differ() -> None:
    a = TaskIdentity(dag_id="etl", run_id="scheduled__2026-11-01T00:00:00+00:00", task_id="load")
    assert a.run_context() == TaskIdentity(**vars_of(a)).run_context()
    b = TaskIdentity(dag_id="etl", run_id=a.run_id, task_id="load_copy")
    assert a.run_context().dag_id == "etl/load"
    assert a.run_context() != b.run_context()
    assert a.run_context().dag_run_logical_identity == a.run_id
    # the try number is provenance, never identity
    assert a.provenance(try_number=1)["try_number"] == "1"
    recorded = a.ledger_provenance(try_number=2).record()
    assert (recorded["kind"], recorded["try_number"], recorded["dag_id"]) == (
        "airflow",
        2,
        a.dag_id,
    )
    assert "try" not in repr(a.run_context())


def vars_of(task: TaskIdentity) -> dict[str, object]:
    return {name: getattr(task, name) for name in ("dag_id", "run_id", "task_id", "map_index")}


def test_manual_run_ids_with_microseconds_are_digested_stably() -> None:
    manual = "manual__2026-11-30T10:11:12.345678+00:00"
    first, second = logical_run_identity(manual), logical_run_identity(manual)
    assert first == second
    assert first.startswith("run_id_sha256:")
    assert first != logical_run_identity("manual__2026-11-30T10:11:12.345679+00:00")
    assert logical_run_identity("scheduled__2026-11-01T00:00:00+00:00").startswith("scheduled__")
    with pytest.raises(ConfigInvalid):
        logical_run_identity("")


def test_partition_identity_comes_from_the_partition_or_the_map_index() -> None:
    mapped = TaskIdentity(dag_id="d", run_id="r", task_id="t", map_index=3)
    assert mapped.partition("eu") == "eu"
    assert mapped.partition(None) == "map_index=3"
    assert TaskIdentity(dag_id="d", run_id="r", task_id="t").partition(None) is None
    with pytest.raises(ConfigInvalid):
        mapped.partition("")


def _result(**changes: object) -> OperationResult:
    fields: dict[str, object] = {
        "operation_id": OP,
        "state": CommitState.COMPLETE,
        "journal_version": 4,
        "mode": RunMode.FORWARD_RECOVERY,
        "rows_written": 100,
        "content_digest": "sha256:" + "cd" * 32,
        "replayed": False,
        "resumed": True,
        "lease_epoch": 2,
    }
    fields.update(changes)
    return OperationResult(**fields)  # type: ignore[arg-type]


def test_xcom_carries_only_the_safe_summary() -> None:
    summary = xcom_summary(_result())
    assert summary == {
        "operation_id": OP,
        "state": "COMPLETE",
        "rows_written": 100,
        "replayed": False,
        "resumed": True,
    }


@pytest.mark.parametrize(
    "error",
    [
        CommitUnknown("the target cannot prove", operation_id=OP, state="COMMIT_UNKNOWN"),
        IntentConflict("another intent", operation_id=OP, recovery_ref=recovery_ref(OP)),
    ],
)
def test_stop_families_fail_with_the_recovery_command(error: Exception) -> None:
    stop = failure(error, workload="/w/orders.yaml")  # type: ignore[arg-type]
    assert stop is not None
    assert f"dpone recovery target-commit plan --operation-id {OP} -w /w/orders.yaml" in (
        stop.message
    )
    assert "remaining retries are not used" in stop.message


def test_terminal_errors_fail_with_the_fix_and_transient_ones_retry() -> None:
    stop = failure(ConfigInvalid("bad", field="x", hint="do this"), workload="w.yaml")
    assert stop is not None
    assert "DPONE_CONFIG_INVALID" in stop.message
    assert "do this" in stop.message
    assert failure(JournalUnavailable("down"), workload="w.yaml") is None
    assert failure(LeaseHeld("busy", operation_id=OP), workload="w.yaml") is None


@dataclass
class Conn:
    conn_id: str = "c"
    conn_type: str | None = "postgres"
    host: str | None = "db.internal"
    schema: str | None = "warehouse"
    login: str | None = "loader"
    password: str | None = "p@ss/word"  # noqa: S105 - a fake password for the URL test
    port: int | None = 5432

    def get_uri(self) -> str:
        return "custom://x"


def test_connections_become_dpone_urls() -> None:
    assert connection_url(Conn()) == "postgresql://loader:p%40ss%2Fword@db.internal:5432/warehouse"
    assert connection_url(Conn(conn_type="mysql", port=None)).startswith("mysql://loader:")
    assert connection_url(Conn(conn_type="sqlite", host="/data/w.db")) == "sqlite:////data/w.db"
    assert connection_url(Conn(conn_type="other")) == "custom://x"
    with pytest.raises(ConfigInvalid):
        connection_url(Conn(conn_type="sqlite", host="relative.db"))
    with pytest.raises(ConfigInvalid):
        connection_url(Conn(host=None))


def test_connections_are_applied_through_a_private_environment(tmp_path: Path) -> None:
    spec = parse_workload(
        {
            "workload": "orders",
            "release": "r",
            "deployment": "d",
            "source": {"kind": "csv", "path": "o.csv"},
            "target": {"kind": "postgres", "url": "postgresql://x@h/db", "table": "t"},
            "load": {"strategy": "append"},
        },
        base_dir=tmp_path,
    )
    seen: list[str] = []

    def lookup(conn_id: str) -> Conn:
        seen.append(conn_id)
        return Conn(conn_id=conn_id)

    environ = {"KEEP": "1"}
    workload, env = apply_connections(
        spec, target_conn_id="wh", journal_conn_id="ctl", lookup=lookup, environ=environ
    )
    assert seen == ["wh", "ctl"]
    assert workload.target_url(env).startswith("postgresql://loader:")
    assert workload.journal_url(env) == env[JOURNAL_ENV]
    assert env["KEEP"] == "1"
    assert TARGET_ENV not in environ  # the caller's environment is untouched
    assert "p%40ss" not in json.dumps(to_json_dict(workload))  # the URL is not in the workload
    same, env2 = apply_connections(
        spec, target_conn_id=None, journal_conn_id=None, lookup=lookup, environ=environ
    )
    assert same is spec
    assert env2 == environ


def test_provider_info_lists_the_operator() -> None:
    info = get_provider_info()
    assert info["package-name"] == "dpone"
    modules = [m for op in info["operators"] for m in op["python-modules"]]
    for module in modules:
        assert importlib.util.find_spec(module) is not None


def test_importing_the_package_imports_no_airflow_and_no_adapter() -> None:
    for name in [m for m in sys.modules if m.startswith("dpone.airflow")]:
        del sys.modules[name]
    before = set(sys.modules)
    importlib.import_module("dpone.airflow")
    importlib.import_module("dpone.airflow.provider")
    new = set(sys.modules) - before
    assert not [m for m in new if m.startswith(("airflow", "dpone.adapters", "dpone.api"))]


@pytest.mark.parametrize("field", ["target_conn_id", "journal_conn_id"])
def test_a_missing_connection_fails_at_once_naming_it(tmp_path: Path, field: str) -> None:
    spec = parse_workload(
        {
            "workload": "orders",
            "release": "r",
            "deployment": "d",
            "source": {"kind": "csv", "path": "o.csv"},
            "target": {"kind": "postgres", "url": "postgresql://x@h/db", "table": "t"},
            "load": {"strategy": "append"},
        },
        base_dir=tmp_path,
    )
    ids = {"target_conn_id": None, "journal_conn_id": None, field: "no_such_conn"}
    with pytest.raises(ConfigInvalid) as caught:
        apply_connections(spec, **ids, lookup=lambda _conn_id: None, environ={})
    assert caught.value.field == field
    assert not caught.value.retryable  # retrying cannot create the connection
    stop = failure(caught.value, workload="/w/orders.yaml")
    assert stop is not None
    assert "DPONE_CONFIG_INVALID" in stop.message
    assert "'no_such_conn'" in stop.message
    assert "airflow connections add no_such_conn --conn-uri URI" in stop.message
    assert "AIRFLOW_CONN_NO_SUCH_CONN" in stop.message
    assert "remaining retries are not used" in stop.message
