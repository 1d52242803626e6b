"""dpone certify against live targets, and the require_certified deployment policy."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from dpone.testing.crash import run_dpone, write_orders_csv

pytestmark = pytest.mark.slow

CANARY = "CANARYcert7731"
BASE = """\
workload: orders
release: "1"
deployment: prod
journal: sqlite:///.dpone/journal.db
source: {kind: csv, path: orders.csv}
load: {strategy: append}
"""


def write_workload(root: Path, target: str, *, policy: str = "") -> None:
    (root / "w.yaml").write_text(BASE + policy + f"target: {target}\n", encoding="utf-8")


def certify(
    root: Path, target: str, env: dict[str, str] | None = None, *, policy: str = ""
) -> tuple[int, dict]:
    write_workload(root, target, policy=policy)
    proc = run_dpone(("certify", "w.yaml", "--json"), cwd=root, env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    evidence = Path(report["evidence"])
    assert evidence.exists()
    assert evidence.with_suffix(".md").exists()
    assert CANARY not in evidence.read_text() + evidence.with_suffix(".md").read_text()
    assert CANARY not in proc.stdout + proc.stderr
    return proc.returncode, report


def statuses(report: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_postgres_route_is_verified(tmp_path: Path, pg_schema: str) -> None:
    """The PostgreSQL route (journal in SQLite, target in PostgreSQL) certifies."""
    code, report = certify(
        tmp_path,
        f"{{kind: postgres, url_env: WH, table: {pg_schema}.orders, fence_schema: {pg_schema}}}",
        env={"WH": "postgresql://postgres@127.0.0.1:5432/test"},
    )
    assert code == 0, report
    assert report["server_version"].startswith("PostgreSQL")


def test_mariadb_route_is_verified(tmp_path: Path, mariadb_database: str) -> None:
    """The MariaDB route certifies against the machine's server."""
    code, report = certify(
        tmp_path, "{kind: mariadb, url_env: WH, table: orders}", env={"WH": mariadb_database}
    )
    assert code == 0, report
    assert report["server_version"].startswith("MariaDB 10.")


def test_duckdb_route_is_verified(tmp_path: Path) -> None:
    """The DuckDB route certifies (the file lock is released between the campaign's runs)."""
    code, report = certify(tmp_path, '{kind: duckdb, url: "duckdb:///wh.duckdb", table: orders}')
    assert code == 0, report
    assert report["server_version"].startswith("DuckDB")


def test_a_lying_fence_fails_certification(tmp_path: Path) -> None:
    """A connector whose fence lies is FAILED, with the duplicates it would cause counted."""
    code, report = certify(tmp_path, "{kind: example_lying, path: lie.db, table: orders}")
    assert code == 1
    assert report["verdict"] == "FAILED"
    assert statuses(report)["fence_conformance"] == "FAILED"
    crash = next(c for c in report["checks"] if c["name"] == "crash_matrix")
    assert crash["figures"]["duplicates"] > 0


def test_an_unreachable_target_is_unverified(tmp_path: Path) -> None:
    """With the target down nothing is claimed: UNVERIFIED, exit 75, no secret anywhere."""
    code, report = certify(
        tmp_path,
        "{kind: postgres, url_env: WH, table: public.orders}",
        env={"WH": f"postgresql://u:{CANARY}@127.0.0.1:1/test"},
    )
    assert code == 75
    assert report["verdict"] == "UNVERIFIED"
    assert set(statuses(report).values()) == {"UNVERIFIED"}


def test_capability_none_is_not_certifiable(tmp_path: Path) -> None:
    """A route that cannot prove outcomes is reported as not certifiable, and why."""
    code, report = certify(tmp_path, "{kind: jsonl_append, path: out.jsonl}")
    assert code == 1
    fence = next(c for c in report["checks"] if c["name"] == "fence_conformance")
    assert fence["status"] == "FAILED"
    assert "cannot prove" in fence["detail"]


# The SQLite route, reached through a password-carrying URL (the password must appear
# in no evidence or output) under the deployment policy require_certified.
POLICY = "require_certified: true\n"
SQLITE = "{kind: sqlite, url_env: WH, table: orders}"
RUN = ("run", "w.yaml", "--interval", "2026-11-01/2026-11-02", "--no-progress", "-q")


def warehouse(db: str) -> dict[str, str]:
    return {"WH": f"sqlite://u:{CANARY}@/{db}"}


def crash_then_rerun(root: Path, db: str) -> subprocess.CompletedProcess[str]:
    """A run killed after its target commit, then the rerun that must settle it."""
    env = warehouse(db)
    assert run_dpone(RUN, cwd=root, env=env, failpoints="after:fence.mutate=kill").returncode == -9
    return run_dpone(RUN, cwd=root, env=env)


def test_require_certified_stops_recovery_without_evidence(tmp_path: Path) -> None:
    """Without evidence a crash in COMMITTING ends in COMMIT_UNKNOWN, and the run says why."""
    write_orders_csv(tmp_path / "orders.csv", 50)
    write_workload(tmp_path, SQLITE, policy=POLICY)
    proc = crash_then_rerun(tmp_path, "wh.db")
    assert proc.returncode == 3
    assert "require_certified" in proc.stderr
    assert "dpone certify" in proc.stderr


def test_sqlite_route_is_verified_and_its_evidence_counts_only_for_its_own_database(
    tmp_path: Path,
) -> None:
    """Every check VERIFIED on SQLite, with figures, and no secret in the evidence. The
    evidence is bound to connector, capability and target database: for this database
    recovery is automatic again; for another it is not.

    One certification serves all three (a campaign costs about 20-25 s)."""
    write_orders_csv(tmp_path / "orders.csv", 50)
    code, report = certify(tmp_path, SQLITE, env=warehouse("wh.db"), policy=POLICY)
    assert code == 0, report
    assert report["verdict"] == "VERIFIED"
    assert set(statuses(report).values()) == {"VERIFIED"}
    crash = next(c for c in report["checks"] if c["name"] == "crash_matrix")
    assert crash["figures"]["duplicates"] == 0
    assert crash["figures"]["kills"] > 5
    assert report["server_version"].startswith("SQLite")
    # another database: this evidence does not count, the crash stays COMMIT_UNKNOWN
    other = crash_then_rerun(tmp_path, f"other-{uuid.uuid4().hex[:6]}.db")
    assert other.returncode == 3, other.stderr
    assert CANARY not in other.stdout + other.stderr
    # the certified database: the same crash recovers by itself
    proc = crash_then_rerun(tmp_path, "wh.db")
    assert proc.returncode == 0, proc.stderr
