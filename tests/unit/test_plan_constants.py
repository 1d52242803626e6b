"""Planning caches what depends on the workload alone, and derives the same operation."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpone
from dpone.config.bootstrap import (
    RunContext,
    build_route,
    open_source,
    pack_fingerprint,
    plan_operation,
    source_path,
)
from dpone.config.workload import Workload, parse_workload
from dpone.contracts.identity import derive_intent_digest, digest_of, parse_interval
from dpone.errors import ConfigInvalid

DAY = parse_interval("2026-11-01/2026-11-02")


def _workload(base: Path, path: str = "in/p{partition}.csv", **load: object) -> Workload:
    return parse_workload(
        {
            "workload": "orders",
            "release": "r1",
            "deployment": "dev",
            "journal": "memory://",
            "source": {"kind": "csv", "path": path},
            "target": {"kind": "sqlite", "url": "sqlite:///w.db", "table": "orders"},
            "load": {"strategy": "append", **load},
        },
        base_dir=base,
    )


def _csv(base: Path, name: str, text: str) -> None:
    (base / "in").mkdir(exist_ok=True)
    (base / "in" / name).write_text(text, encoding="utf-8")


def test_every_operation_is_planned_as_from_scratch(tmp_path: Path) -> None:
    """The second and later operations of a workload: intent and metadata from first principles."""
    _csv(tmp_path, "p1.csv", "id,v\n1,a\n")
    _csv(tmp_path, "p2.csv", "id,v\n2,b\n")
    _csv(tmp_path, "p3.csv", "id,v,w\n3,c,d\n")
    workload = _workload(tmp_path, key=["id"])
    route = build_route(workload, environ={})
    try:
        target = route.connector.target_identity()
        ctx = RunContext(dag_id="dag", dag_run_logical_identity="2026-11-01")
        for partition, names in (("1", ["id", "v"]), ("2", ["id", "v"]), ("3", ["id", "v", "w"])):
            source = open_source(workload, DAY, partition)
            spec = plan_operation(
                workload, route, source, interval=DAY, partition=partition, context=ctx
            )
            identity = source.snapshot_identity()
            columns = [[name, "integer" if name == "id" else "text"] for name in names]
            assert spec.intent_digest == derive_intent_digest(
                pack_fingerprint=pack_fingerprint(workload, target),
                normalized_load_strategy="append|key=id|interval_column=",
                source_snapshot_identity=identity,
                target_contract=f"sqlite|orders|{route.connector.capability.value}",
                schema_fingerprint=digest_of({"columns": columns}),
            )
            assert dict(spec.metadata) == {
                "workload_id": "orders",
                "release_id": "r1",
                "deployment_id": "dev",
                "dag_id": "dag",
                "dag_run": "2026-11-01",
                "partition": partition,
                "interval": DAY.canonical(),
                "target_identity": target,
                "target_kind": "sqlite",
                "capability": route.connector.capability.value,
                "table": "orders",
                "strategy": "append",
                "source_kind": "csv",
                "source_identity": identity,
                "pack_fingerprint": pack_fingerprint(workload, target),
                "dpone_version": dpone.__version__,
            }
            assert [c.name for c in spec.plan.columns] == names
            assert spec.plan.key == ("id",)
    finally:
        route.close()


def test_a_missing_key_column_is_refused_after_a_planned_operation(tmp_path: Path) -> None:
    """The key check follows the source's columns, also once the workload is cached."""
    _csv(tmp_path, "p1.csv", "id,v\n1,a\n")
    _csv(tmp_path, "p2.csv", "other,v\n2,b\n")
    workload = _workload(tmp_path, key=["id"])
    route = build_route(workload, environ={})
    try:
        plan_operation(workload, route, open_source(workload, DAY, "1"), interval=DAY)
        with pytest.raises(ConfigInvalid, match=r"load\.key names column 'id'"):
            plan_operation(workload, route, open_source(workload, DAY, "2"), interval=DAY)
        plan_operation(workload, route, open_source(workload, DAY, "1"), interval=DAY)
    finally:
        route.close()


@pytest.mark.parametrize(
    "template",
    ["in/p{partition}.csv", "./in//p{partition}.csv", "in/./p{partition}.csv/", "x/../in/a..b"],
)
def test_a_source_path_is_the_workload_relative_path(tmp_path: Path, template: str) -> None:
    workload = _workload(tmp_path, template)
    filled = template.format(partition="7")
    assert source_path(workload, DAY, "7") == workload.resolve_path(filled)


def test_a_source_path_under_the_root_directory(tmp_path: Path) -> None:
    workload = _workload(Path("/"), "tmp/p{partition}.csv")
    assert str(source_path(workload, DAY, "7")) == "/tmp/p7.csv"
    absolute = _workload(tmp_path, str(tmp_path / "p{partition}.csv"))
    assert source_path(absolute, DAY, "7") == tmp_path / "p7.csv"
