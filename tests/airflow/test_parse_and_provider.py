"""DAG parsing touches nothing and imports nothing heavy; Airflow lists the provider.

The parse runs inside each Airflow environment with every socket call refused, on
workloads whose journals and targets are PostgreSQL/MariaDB servers that do not exist
(and credentials in variables that are not set): parsing must not care.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.airflow.conftest import Airflow, both
from tests.airflow.scenarios import workload

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(480)]

PROBE = Path(__file__).with_name("parse_probe.py")
FILES = 20
DAG_FILE = """
from dpone.airflow import dags_from_folder

globals().update(dags_from_folder("{folder}", partitions={{"w_0": ["eu", "us"]}}))
"""


def _workloads(folder: Path, count: int) -> None:
    kinds = [
        "{kind: postgres, url_env: UNSET_WAREHOUSE_DSN, table: analytics.orders}",
        "{kind: mariadb, url: 'mysql://u:p@192.0.2.1:3306/db', table: orders}",
        "{kind: duckdb, url: 'duckdb:////nonexistent/dir/w.duckdb', table: orders}",
        "{kind: sqlite, url: 'sqlite:////nonexistent/dir/w.db', table: orders}",
        # a REST delivery (receiver unreachable, token unset): it parses as a deferrable task
        "{kind: rest, url: 'http://192.0.2.1:9', credential: 'env:UNSET_RX_TOKEN'}",
    ]
    for i in range(count):
        path = workload(
            folder, f"w_{i}", source="/nonexistent/{partition}/orders.csv",
            journal=Path("/nonexistent/journal.db"), target=kinds[i % len(kinds)],
        )  # fmt: skip
        if i % 2:  # a PostgreSQL journal on a host that does not exist
            text = path.read_text().replace(
                "journal: sqlite:////nonexistent/journal.db",
                "journal: postgresql://dpone@192.0.2.1:5432/control",
            )
            path.write_text(text)


def _parse(airflow: Airflow, tmp: Path) -> dict[str, object]:
    work = tmp / airflow.label
    folder = work / "workloads"
    _workloads(folder, FILES)
    dag_file = work / "dags.py"
    dag_file.write_text(DAG_FILE.format(folder=folder))
    home = airflow.home(work)
    env = airflow.env(home, work)
    done = airflow.run(["python", str(PROBE), str(dag_file)], env)
    assert done.returncode == 0, f"Airflow {airflow.label}: {done.stderr[-3000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_dag_parse_does_no_io_and_imports_no_driver(
    airflows: dict[str, Airflow], tmp_path: Path
) -> None:
    for label, report in both(airflows, lambda af: _parse(af, tmp_path)).items():
        assert report["dags"] == FILES, (label, report)
        assert report["tasks"] == FILES, (label, report)
        assert report["connection_attempts"] == [], (label, report)
        assert report["forbidden_new"] == [], (label, report)
        operators = report["operators"]
        assert isinstance(operators, dict), (label, report)
        rest = {f"dpone_w_{i}" for i in range(FILES) if i % 5 == 4}
        for dag_id, classes in operators.items():
            expected = "DponeDeliveryOperator" if dag_id in rest else "DponeRunOperator"
            assert classes == [expected], (label, dag_id, classes)


def _providers(airflow: Airflow, tmp: Path) -> subprocess.CompletedProcess[str]:
    work = tmp / airflow.label
    work.mkdir(parents=True, exist_ok=True)
    home = airflow.home(work)
    return airflow.run(
        ["airflow", "providers", "list", "--output", "json"], airflow.env(home, work)
    )


def test_airflow_lists_the_provider(airflows: dict[str, Airflow], tmp_path: Path) -> None:
    for label, done in both(airflows, lambda af: _providers(af, tmp_path)).items():
        assert done.returncode == 0, (label, done.stderr[-2000:])
        start = done.stdout.index("[")
        providers = {p["package_name"]: p for p in json.loads(done.stdout[start:])}
        assert "dpone" in providers, (label, sorted(providers))
        assert "Retry-safe" in providers["dpone"]["description"]
