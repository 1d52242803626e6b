"""``dpone demo``: a crash right after the target commit, and the retry that fixes it."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dpone.errors import ConfigInvalid

WORKLOAD = """\
workload: orders
release: "2026.11.0"
deployment: demo
journal: sqlite:///.dpone/journal.db
lease_ttl_seconds: 30
source:
  kind: csv
  path: data/orders-{day}.csv
  columns: {{order_id: integer, customer: text, amount: real, ordered_at: timestamp}}
target: {{kind: sqlite, url: sqlite:///warehouse.db, table: orders}}
load: {{strategy: append, key: [order_id], interval_column: ordered_at}}
"""


def _make_data(root: Path, day: int, rows: int) -> None:
    rng = random.Random(day)  # noqa: S311 - sample data, not security
    path = root / "data" / f"orders-{day}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["order_id", "customer", "amount", "ordered_at"])
        for i in range(rows):
            seconds = rng.randrange(86_400)
            out.writerow(
                [
                    day * 10_000_000 + i,
                    f"customer-{rng.randrange(500)}",
                    f"{rng.uniform(5, 500):.2f}",
                    f"2026-11-{day:02d}T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:"
                    f"{seconds % 60:02d}Z",
                ]
            )
    (root / f"day{day}.yaml").write_text(WORKLOAD.format(day=day), encoding="utf-8")


def _dpone(
    root: Path, *args: str, failpoints: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_FAILPOINTS"}
    env["COLUMNS"] = "150"  # room for the history table in captured output
    if failpoints:
        env["DPONE_FAILPOINTS"] = failpoints
    return subprocess.run(
        [sys.executable, "-m", "dpone", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _show(console: Console, proc: subprocess.CompletedProcess[str]) -> None:
    for line in (proc.stderr + proc.stdout).strip().splitlines():
        console.print(f"    {line}", markup=False, highlight=False)


def run_demo(*, directory: Path | None, rows: int, console: Console) -> int:
    """Run the demo in ``directory`` (a fresh temp dir by default); return an exit code."""
    started = time.monotonic()
    root = Path(directory or tempfile.mkdtemp(prefix="dpone-demo-")).resolve()
    if root.exists() and any(root.iterdir()):
        raise ConfigInvalid(
            f"demo directory {root} is not empty; the demo never overwrites files",
            field="--dir",
            hint="pass a new or empty directory, or leave --dir out for a temporary one",
        )
    root.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]dpone demo: safe retries on the embedded default")
    console.print(f"work directory: {root}")
    for day in (1, 2):
        _make_data(root, day, rows)
    console.print(f"1. made two days of sample orders, {rows:,} rows each (data/*.csv)")

    day1 = ["run", "day1.yaml", "--interval", "2026-11-01/2026-11-02", "--no-progress"]
    console.print(
        "2. [bold]dpone run day1.yaml[/] with DPONE_FAILPOINTS=after:fence.mutate=kill: "
        "the process is SIGKILLed right after the target committed, before the journal heard"
    )
    crashed = _dpone(root, *day1, failpoints="after:fence.mutate=kill")
    _show(console, crashed)
    killed = crashed.returncode == -signal.SIGKILL
    console.print(f"   exit status {crashed.returncode} ({'SIGKILL' if killed else 'unexpected'})")
    with closing(sqlite3.connect(root / "warehouse.db")) as db:
        landed = db.execute("SELECT count(*) FROM orders").fetchone()[0]
    console.print(f"   the warehouse already holds {landed:,} rows of day 1; the journal says:")
    listed = _dpone(root, "journal", "list", "--journal", "sqlite:///.dpone/journal.db", "--json")
    entries = json.loads(listed.stdout or "[]")
    op_id = entries[0]["operation_id"] if entries else "?"
    console.print(f"   {op_id} {entries[0]['state'] if entries else '?'}", markup=False)

    console.print("3. [bold]dpone recovery target-commit inspect[/] (read-only):")
    _show(
        console,
        _dpone(
            root, "recovery", "target-commit", "inspect", "--operation-id", op_id, "-w", "day1.yaml"
        ),
    )

    console.print(
        "4. the retry (what Airflow would do): it reads the fence, finds the commit, "
        "and completes without writing again"
    )
    retry = _dpone(root, *day1)
    _show(console, retry)
    console.print("5. day 2 runs normally; then both are run once more (replays):")
    _show(
        console,
        _dpone(
            root, "run", "day2.yaml", "--interval", "2026-11-02/2026-11-03", "--no-progress", "-q"
        ),
    )
    replay = _dpone(root, *day1, "-q")
    _show(console, replay)

    table = Table("operation", "interval", "state", "rows recorded", "rows in target", "duplicates")
    ok = retry.returncode == 0 and replay.returncode == 0 and killed
    listed = _dpone(root, "journal", "list", "--journal", "sqlite:///.dpone/journal.db", "--json")
    with closing(sqlite3.connect(root / "warehouse.db")) as db:
        for entry in sorted(json.loads(listed.stdout), key=lambda e: e["metadata"]["interval"]):
            start, end = entry["metadata"]["interval"].split("/")
            in_target, distinct = db.execute(
                "SELECT count(*), count(DISTINCT order_id) FROM orders "
                "WHERE ordered_at >= ? AND ordered_at < ?",
                (start, end),
            ).fetchone()
            recorded = (entry["result"] or {}).get("rows_written", 0)
            ok = ok and in_target == recorded == rows and distinct == in_target
            table.add_row(
                entry["operation_id"][:23] + "…",
                entry["metadata"]["interval"],
                entry["state"],
                f"{recorded:,}",
                f"{in_target:,}",
                str(in_target - distinct),
            )
    console.print("6. rows per operation:")
    console.print(table)
    took = time.monotonic() - started
    verdict = "[green]every row exactly once[/]" if ok else "[red]MISMATCH[/]"
    console.print(f"{verdict} - demo took {took:.1f}s")
    return 0 if ok else 1
