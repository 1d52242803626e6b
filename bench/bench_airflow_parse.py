"""DAG parse speed: 100 workload files -> 100 DAGs through the dpone DAG factory.

Runs the DAG file inside each Airflow environment (the ones tests/airflow creates, in
``$DPONE_AIRFLOW_VENVS`` or ``.airflow-venvs``; created with uv if missing) with every
socket call refused, in a fresh process per round, and reports the parse time of the
DAG file (Airflow's own import is the baseline every DAG file pays and is reported
apart) and any database driver or HTTP client the parse imported.
Budget: under 2 s for 100 files, no driver or HTTP client imported.

Usage: python bench/bench_airflow_parse.py [--files 100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "airflow" / "parse_probe.py"
VERSIONS = ("3.3.2", "2.11.2")
COMPAT_PIN = "apache-airflow-providers-common-compat==1.23.0"
KINDS = [
    "{kind: postgres, url_env: WAREHOUSE_DSN, table: analytics.orders}",
    "{kind: mariadb, url_env: MARIADB_DSN, table: orders}",
    "{kind: duckdb, url: 'duckdb:///w.duckdb', table: orders}",
    "{kind: sqlite, url: 'sqlite:///w.db', table: orders}",
]
DAG_FILE = """
from dpone.airflow import dags_from_folder

globals().update(dags_from_folder("{folder}", partitions={{"w_0": ["eu", "us", "apac"]}}))
"""


def venv_for(version: str) -> Path:
    root = Path(os.environ.get("DPONE_AIRFLOW_VENVS") or REPO / ".airflow-venvs")
    venv = root / f"airflow-{version}"
    if not (venv / "bin" / "airflow").exists():
        uv = [sys.executable, "-m", "uv"]
        subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        subprocess.run(
            [*uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
             f"apache-airflow=={version}", COMPAT_PIN, "-e", f"{REPO}[airflow]"],
            check=True,
        )  # fmt: skip
    return venv


def write_workloads(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for i in range(count):
        journal = "journal_env: CONTROL_DSN" if i % 2 else "journal: sqlite:///journal.db"
        (folder / f"w_{i}.yaml").write_text(
            f"workload: w_{i}\nrelease: '2026.11.{i}'\ndeployment: prod\n{journal}\n"
            "source: {kind: csv, path: 'data/{partition}/orders.csv'}\n"
            f"target: {KINDS[i % len(KINDS)]}\n"
            "load: {strategy: merge, key: [order_id]}\n"
        )


def one_round(venv: Path, dag_file: Path, home: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON"))}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    started = time.perf_counter()
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(PROBE), str(dag_file)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    report["process_seconds"] = time.perf_counter() - started
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpone-bench-af-") as tmp:
        folder = Path(tmp) / "workloads"
        write_workloads(folder, args.files)
        dag_file = Path(tmp) / "dpone_dags.py"
        dag_file.write_text(DAG_FILE.format(folder=folder))
        for version in VERSIONS:
            venv = venv_for(version)
            home = Path(tmp) / f"home-{version}"
            home.mkdir()
            rounds = [one_round(venv, dag_file, home) for _ in range(args.repeat)]
            parse = [float(str(r["seconds"])) for r in rounds]
            whole = [float(str(r["process_seconds"])) for r in rounds]
            last = rounds[-1]
            assert last["dags"] == args.files, last
            print(
                f"Airflow {version}: {last['dags']} DAGs from {args.files} files; parse "
                f"median {statistics.median(parse):.3f} s (best {min(parse):.3f}, worst "
                f"{max(parse):.3f}); whole process incl. Airflow import median "
                f"{statistics.median(whole):.2f} s; drivers/HTTP clients imported by the "
                f"parse: {last['forbidden_new'] or 'none'}; connection attempts: "
                f"{len(list(last['connection_attempts']))}"  # type: ignore[arg-type]
            )


if __name__ == "__main__":
    main()
