"""Third-party connectors found through the dpone.connectors entry-point group, end to end."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

from dpone.config.workload import plugin_kinds
from dpone.testing.crash import run_dpone, run_until_done, write_orders_csv

RUN = ("run", "w.yaml", "--interval", "2026-11-01/2026-11-02", "--no-progress", "-q")
WORKLOAD = """\
workload: events
release: "1"
deployment: test
journal: sqlite:///journal.db
source: {kind: csv, path: orders.csv}
target: {kind: example_append, path: out.db, table: events}
load: {strategy: append}
"""


def test_the_example_connector_is_discovered_without_importing_it() -> None:
    """Installed connector packages are listed from metadata (the example is installed)."""
    assert "example_append" in plugin_kinds()


def test_a_plugin_route_recovers_after_a_kill_after_its_commit(tmp_path: Path) -> None:
    """A third-party transactional-marker connector gets dpone's recovery: rows once."""
    write_orders_csv(tmp_path / "orders.csv", 300)
    (tmp_path / "w.yaml").write_text(WORKLOAD, encoding="utf-8")
    assert run_dpone(RUN, cwd=tmp_path, failpoints="after:fence.mutate=kill").returncode == -9
    outcome = run_until_done(RUN, cwd=tmp_path)
    assert outcome.final == 0, outcome.last_stderr
    with closing(sqlite3.connect(tmp_path / "out.db")) as db:
        assert db.execute("SELECT count(*), count(DISTINCT order_id) FROM events").fetchone() == (
            300,
            300,
        )
    listed = run_dpone(("journal", "list", "-w", "w.yaml", "--json"), cwd=tmp_path)
    [entry] = json.loads(listed.stdout)
    assert entry["state"] == "COMPLETE"
    assert entry["metadata"]["capability"] == "transactional_marker"


def test_unknown_kind_names_the_installed_connectors(tmp_path: Path) -> None:
    """A typo in target.kind is a config error listing built-in and installed kinds."""
    write_orders_csv(tmp_path / "orders.csv", 3)
    (tmp_path / "w.yaml").write_text(
        WORKLOAD.replace("example_append", "exampel_append"), encoding="utf-8"
    )
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 2
    assert "target.kind" in proc.stderr
    assert "example_append" in proc.stderr
