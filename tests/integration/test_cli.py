"""The dpone command end to end on real SQLite files: config errors, recovery, secrets."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dpone.testing.crash import run_dpone, write_orders_csv

INTERVAL = "2026-11-01/2026-11-02"
RUN = ("run", "w.yaml", "--interval", INTERVAL, "--no-progress")

GOOD = {
    "workload": "orders",
    "release": "2026.11.0",
    "deployment": "dev",
    "journal": "sqlite:///journal.db",
    "source": {"kind": "csv", "path": "orders.csv"},
    "target": {"kind": "sqlite", "url": "sqlite:///warehouse.db", "table": "orders"},
    "load": {"strategy": "append", "key": ["order_id"], "interval_column": "ordered_at"},
    "recovery": {"authorized_principals": ["alice"]},
}


def write(root: Path, data: dict[str, object], rows: int = 100) -> None:
    if not (root / "orders.csv").exists():
        write_orders_csv(root / "orders.csv", rows)
    (root / "w.yaml").write_text(json.dumps(data), encoding="utf-8")  # JSON is YAML


def with_(path: str, value: object) -> dict[str, object]:
    data = json.loads(json.dumps(GOOD))
    node = data
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("surprise", 1, "surprise"),
        ("release", _DELETE, "release"),
        ("load.strategy", "upsert", "load.strategy"),
        ("load.key", [], "load"),  # append with an empty key is fine, so use merge below
        ("target.table", 'x"; DROP TABLE y; --', "target.table"),
        ("target.url", "postgres://h/db", "target.url"),
        ("source.kind", "xml", "source"),
        ("load.interval_column", "9bad", "load.interval_column"),
        ("lease_ttl_seconds", -1, "lease_ttl_seconds"),
    ],
)
def test_config_mistakes_are_exit_2_with_the_field_named(
    tmp_path: Path, path: str, value: object, named: str
) -> None:
    """Every workload mistake is DPONE_CONFIG_INVALID naming the field, exit 2, no traceback."""
    data = with_(path, value)
    if path == "load.key":
        data["load"]["strategy"] = "merge"  # type: ignore[index]
    write(tmp_path, data)
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "DPONE_CONFIG_INVALID" in proc.stderr
    assert named in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "warehouse.db").exists()


@pytest.mark.parametrize(
    "interval", ["2026-11-02/2026-11-01", "2026-11-01", "soon/later", "2026-11-01/2026-11-01"]
)
def test_bad_intervals_are_exit_2(tmp_path: Path, interval: str) -> None:
    """A reversed, empty or malformed interval is a config error naming the interval."""
    write(tmp_path, GOOD)
    proc = run_dpone(("run", "w.yaml", "--interval", interval), cwd=tmp_path)
    assert proc.returncode == 2
    assert "DPONE_CONFIG_INVALID" in proc.stderr
    assert "interval" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_workload_and_bad_yaml_are_exit_2(tmp_path: Path) -> None:
    """A missing file or broken YAML is a clear config error."""
    proc = run_dpone(("run", "nope.yaml", "--interval", INTERVAL), cwd=tmp_path)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
    (tmp_path / "w.yaml").write_text("workload: [unclosed", encoding="utf-8")
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 2
    assert "not valid YAML" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_existing_table_that_does_not_match_fails_before_any_write(tmp_path: Path) -> None:
    """A target table lacking a source column is an error before the journal or target change."""
    write(tmp_path, GOOD)
    with closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
        db.execute("CREATE TABLE orders (order_id INTEGER, customer TEXT)")
        db.commit()
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "DPONE_TARGET_SCHEMA_MISMATCH" in proc.stderr
    with closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
        assert db.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    listed = run_dpone(("journal", "list", "-w", "w.yaml", "--json"), cwd=tmp_path)
    assert json.loads(listed.stdout) == []


def test_not_null_column_the_load_cannot_fill_fails_before_any_write(tmp_path: Path) -> None:
    """An extra NOT NULL column without a default is found before the journal or target change."""
    write(tmp_path, GOOD)
    with closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
        db.execute(
            "CREATE TABLE orders (order_id INTEGER, customer TEXT, amount REAL, "
            "ordered_at TEXT, region TEXT NOT NULL)"
        )
        db.commit()
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "DPONE_TARGET_SCHEMA_MISMATCH" in proc.stderr
    assert "'region'" in proc.stderr
    listed = run_dpone(("journal", "list", "-w", "w.yaml", "--json"), cwd=tmp_path)
    assert json.loads(listed.stdout) == []


def test_changed_source_is_an_intent_conflict_exit_4(tmp_path: Path) -> None:
    """A source that changed under the same operation is exit 4 and nothing is written."""
    write(tmp_path, GOOD)
    assert run_dpone(RUN, cwd=tmp_path).returncode == 0
    write_orders_csv(tmp_path / "orders.csv", 150)
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 4
    assert "DPONE_TARGET_COMMIT_INTENT_CONFLICT" in proc.stderr
    with closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
        assert db.execute("SELECT count(*) FROM orders").fetchone() == (100,)


def test_run_json_and_replay(tmp_path: Path) -> None:
    """--json prints a safe summary; a rerun replays the recorded result (exit 0)."""
    write(tmp_path, GOOD)
    first = json.loads(run_dpone((*RUN, "--json"), cwd=tmp_path).stdout)
    again = json.loads(run_dpone((*RUN, "--json"), cwd=tmp_path).stdout)
    assert first["state"] == again["state"] == "COMPLETE"
    assert first["rows_written"] == again["rows_written"] == 100
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert first["mode"] == "forward_recovery"
    history = run_dpone(
        ("journal", "history", first["operation_id"], "-w", "w.yaml", "--json"), cwd=tmp_path
    )
    steps = [row["to"] for row in json.loads(history.stdout)]
    assert steps[0] == "PREPARING"
    assert steps[-1] == "COMPLETE"


def test_json_log_lines_one_per_transition(tmp_path: Path) -> None:
    """--log-format json writes JSON lines with operation id, state and version."""
    write(tmp_path, GOOD)
    proc = run_dpone((*RUN, "--log-format", "json"), cwd=tmp_path)
    records = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    states = [r["state"] for r in records if r.get("event") == "transition"]
    assert states == ["COMMITTING", "COMPLETE"]
    journal_records = [r for r in records if "state" in r]
    assert all(r["operation_id"].startswith("sha256:") and r["version"] for r in journal_records)
    # the run ledger's line names the run before anything executes
    [run] = [r for r in records if r.get("event") == "run"]
    assert run["run_id"].startswith("run-")
    assert run["run_state"] == "RUNNING"


def test_atomic_mode_when_journal_is_the_target_database(tmp_path: Path) -> None:
    """Journal and target in one SQLite file run in atomic mode."""
    write(tmp_path, {**GOOD, "journal": "sqlite:///warehouse.db"})
    result = json.loads(run_dpone((*RUN, "--json"), cwd=tmp_path).stdout)
    assert result["mode"] == "atomic"
    assert result["rows_written"] == 100


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        for suffix in ("", "-wal"):
            f = Path(f"{p}{suffix}")
            if f.exists():
                h.update(f.read_bytes())
    return h.hexdigest()


NONE_ROUTE = {
    **GOOD,
    "target": {"kind": "jsonl_append", "path": "out.jsonl"},
    "load": {"strategy": "append"},
}


def test_inspect_and_plan_write_nothing_and_apply_is_audited(tmp_path: Path) -> None:
    """inspect/plan leave journal and target byte-identical; apply needs policy and version."""
    write(tmp_path, NONE_ROUTE)
    killed = run_dpone(RUN, cwd=tmp_path, failpoints="after:fence.mutate=kill")
    assert killed.returncode == -9
    unknown = run_dpone(RUN, cwd=tmp_path)
    assert unknown.returncode == 3
    [entry] = json.loads(
        run_dpone(("journal", "list", "-w", "w.yaml", "--json"), cwd=tmp_path).stdout
    )
    op = entry["operation_id"]
    files = (tmp_path / "journal.db", tmp_path / "out.jsonl")
    before = _digest(*files)
    inspected = run_dpone(
        ("recovery", "target-commit", "inspect", "--operation-id", op, "-w", "w.yaml", "--json"),
        cwd=tmp_path,
    )
    planned = run_dpone(
        ("recovery", "target-commit", "plan", "--operation-id", op, "-w", "w.yaml", "--json"),
        cwd=tmp_path,
    )
    assert _digest(*files) == before
    assert json.loads(inspected.stdout)["entry"]["state"] == "COMMIT_UNKNOWN"
    plan = json.loads(planned.stdout)
    assert set(plan["allowed_actions"]) == {"mark-committed", "mark-not-committed"}
    version = plan["version"]
    apply = (
        "recovery",
        "target-commit",
        "apply",
        "--operation-id",
        op,
        "-w",
        "w.yaml",
        "--action",
        "mark-committed",
        "--reason",
        "counted 100 lines in out.jsonl",
    )
    # not authorized
    refused = run_dpone(
        (*apply, "--expected-version", str(version)),
        cwd=tmp_path,
        env={"DPONE_PRINCIPAL": "mallory"},
    )
    assert refused.returncode == 1
    assert "DPONE_RECOVERY_UNAUTHORIZED" in refused.stderr
    # stale version
    stale = run_dpone(
        (*apply, "--expected-version", str(version - 1)),
        cwd=tmp_path,
        env={"DPONE_PRINCIPAL": "alice"},
    )
    assert "DPONE_RECOVERY_REFUSED" in stale.stderr
    # mark-not-committed on a none route needs the attestation
    unattested = run_dpone(
        (
            "recovery",
            "target-commit",
            "apply",
            "--operation-id",
            op,
            "-w",
            "w.yaml",
            "--action",
            "mark-not-committed",
            "--reason",
            "r",
            "--expected-version",
            str(version),
        ),
        cwd=tmp_path,
        env={"DPONE_PRINCIPAL": "alice"},
    )
    assert "--attest-no-live-writer" in unattested.stderr
    ok = run_dpone(
        (*apply, "--expected-version", str(version), "--json"),
        cwd=tmp_path,
        env={"DPONE_PRINCIPAL": "alice"},
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["state"] == "TARGET_COMMITTED"
    # the rerun completes without writing
    lines_before = (tmp_path / "out.jsonl").read_text().count("\n")
    done = run_dpone((*RUN, "--json"), cwd=tmp_path)
    assert json.loads(done.stdout)["state"] == "COMPLETE"
    assert (tmp_path / "out.jsonl").read_text().count("\n") == lines_before == 100
    audit = json.loads(
        run_dpone(
            (
                "recovery",
                "target-commit",
                "inspect",
                "--operation-id",
                op,
                "-w",
                "w.yaml",
                "--json",
            ),
            cwd=tmp_path,
        ).stdout
    )["audit"]
    outcomes = [(a["principal"], a["outcome"]) for a in audit]
    assert ("mallory", "refused") in outcomes
    assert ("alice", "applied") in outcomes


CANARY = "CANARYs3cr3t9931"


def test_canary_secrets_never_leak(tmp_path: Path) -> None:
    """A secret in the target URL never reaches journal, audit, fence, logs or errors."""
    write(tmp_path, {**GOOD, "target": {"kind": "sqlite", "url_env": "WH_URL", "table": "orders"}})
    env = {"WH_URL": f"sqlite://dpone:{CANARY}@/warehouse.db", "DPONE_PRINCIPAL": "alice"}
    outputs = []
    crashed = run_dpone(RUN, cwd=tmp_path, env=env, failpoints="after:fence.mutate=kill")
    outputs.append(crashed.stdout + crashed.stderr)
    for args in (
        (*RUN, "--log-format", "json"),
        (*RUN, "--json"),
        ("journal", "list", "-w", "w.yaml", "--json"),
    ):
        proc = run_dpone(args, cwd=tmp_path, env=env)
        outputs.append(proc.stdout + proc.stderr)
    op = json.loads(outputs[-1])[0]["operation_id"]
    for sub in ("inspect", "plan"):
        proc = run_dpone(
            ("recovery", "target-commit", sub, "--operation-id", op, "-w", "w.yaml", "--json"),
            cwd=tmp_path,
            env=env,
        )
        outputs.append(proc.stdout + proc.stderr)
    bad = run_dpone(RUN, cwd=tmp_path, env={"WH_URL": f"sqlite://u:{CANARY}@host/x.db?k={CANARY}"})
    assert bad.returncode == 2
    outputs.append(bad.stdout + bad.stderr)
    assert all(CANARY not in text for text in outputs)
    for f in tmp_path.iterdir():
        if f.suffix in (".db", ".db-wal") or f.name.endswith("-wal"):
            assert CANARY.encode() not in f.read_bytes(), f.name


def _tree(root: Path) -> dict[str, str]:
    """Every file under root with its content hash (-wal and -shm files included)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_looking_never_writes_journal_or_target(tmp_path: Path) -> None:
    """inspect, plan, journal list/history change no byte of journal or target, create no file."""
    write(tmp_path, GOOD)
    assert run_dpone(RUN, cwd=tmp_path, failpoints="after:fence.mutate=kill").returncode == -9
    [entry] = json.loads(
        run_dpone(("journal", "list", "-w", "w.yaml", "--json"), cwd=tmp_path).stdout
    )
    op = entry["operation_id"]
    with closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
        db.execute("PRAGMA journal_mode=DELETE")  # a reader must not turn it back into WAL
    before = _tree(tmp_path)
    for args in (
        ("recovery", "target-commit", "inspect", "--operation-id", op, "-w", "w.yaml"),
        ("recovery", "target-commit", "plan", "--operation-id", op, "-w", "w.yaml", "--json"),
        ("journal", "list", "-w", "w.yaml"),
        ("journal", "history", op, "-w", "w.yaml", "--json"),
    ):
        proc = run_dpone(args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert _tree(tmp_path) == before


def test_looking_at_a_journal_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    """journal list in an empty directory lists nothing and leaves the directory empty."""
    proc = run_dpone(("journal", "list", "--json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["garbage", "sha256:xyz", "x password=hunter2"])
def test_malformed_operation_ids_are_exit_2_and_never_echoed(tmp_path: Path, bad: str) -> None:
    """A malformed --operation-id is a usage error; the value is not printed back."""
    write(tmp_path, GOOD)
    for args in (
        ("recovery", "target-commit", "inspect", "--operation-id", bad, "-w", "w.yaml", "--json"),
        ("journal", "history", bad, "-w", "w.yaml"),
    ):
        proc = run_dpone(args, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "DPONE_CONFIG_INVALID" in proc.stdout + proc.stderr
        assert bad not in proc.stdout + proc.stderr


def test_error_text_with_brackets_is_printed_verbatim(tmp_path: Path) -> None:
    """Brackets in messages are text, not terminal markup: no traceback, nothing lost."""
    # one mistake each: validation reports the first one (ADR 0010); a value of the file
    # is never repeated (a field named [/x] is "an unknown field"), the file's path is
    for mistake, args, text in [
        ({"load": {"strategy": "merge"}}, RUN, "key: [column, ...]"),
        ({"target": {**GOOD["target"], "table": "1x"}}, RUN, "identifier [schema.]name"),
        ({}, ("run", "[/x].yaml", *RUN[2:]), "workload file [/x].yaml does not exist"),
    ]:
        write(tmp_path, {**GOOD, **mistake})
        proc = run_dpone(args, cwd=tmp_path)
        assert proc.returncode == 2
        assert "Traceback" not in proc.stderr
        assert text in proc.stderr


def test_a_directory_as_target_or_journal_is_a_config_error(tmp_path: Path) -> None:
    """Pointing a URL at a directory is a permanent mistake (exit 2), not a retryable one."""
    (tmp_path / "wh").mkdir()
    write(tmp_path, {**GOOD, "target": {"kind": "sqlite", "url": "sqlite:///wh", "table": "t"}})
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    write(tmp_path, {**GOOD, "journal": "sqlite:///wh"})
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr


def test_none_route_source_error_shows_its_cause(tmp_path: Path) -> None:
    """On a route that cannot prove anything the COMMIT_UNKNOWN message names the real cause."""
    write(tmp_path, NONE_ROUTE)
    with (tmp_path / "orders.csv").open("a", encoding="utf-8") as fh:
        fh.write("1,2\n")
    proc = run_dpone(RUN, cwd=tmp_path)
    assert proc.returncode == 3
    assert "DPONE_SOURCE_INVALID" in proc.stderr


def test_looking_after_a_clean_run_creates_no_wal_files(tmp_path: Path) -> None:
    """After a clean run (no -wal files left), looking leaves the directory exactly as it was."""
    write(tmp_path, GOOD)
    done = json.loads(run_dpone((*RUN, "--json"), cwd=tmp_path).stdout)
    before = _tree(tmp_path)
    assert not any(name.endswith(("-wal", "-shm")) for name in before)
    for args in (
        ("journal", "list", "-w", "w.yaml"),
        (
            "recovery",
            "target-commit",
            "inspect",
            "--operation-id",
            done["operation_id"],
            "-w",
            "w.yaml",
        ),
    ):
        assert run_dpone(args, cwd=tmp_path).returncode == 0
    assert _tree(tmp_path) == before


def test_dpone_version_and_the_version_option_print_the_same_version(tmp_path: Path) -> None:
    import dpone

    for args in (("version",), ("--version",)):
        proc = run_dpone(args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == dpone.__version__
    listed = run_dpone(("--help",), cwd=tmp_path)
    assert listed.returncode == 0
    assert "--version" in listed.stdout
    assert "run" in listed.stdout  # the commands are listed as before


def _nothing_written(root: Path) -> bool:
    return sorted(p.name for p in root.iterdir()) == ["orders.csv", "w.yaml"]


def test_check_validates_a_workload_without_touching_anything(tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    cache = tmp_path.parent / f"{tmp_path.name}-cache"
    cache.mkdir()
    proc = run_dpone(("check", "w.yaml"), cwd=tmp_path, env={"DPONE_CACHE_DIR": str(cache)})
    assert list(cache.iterdir()) == []  # not even the parse cache (ADR 0015)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "valid: workload orders (release 2026.11.0, deployment dev): "
        "csv -> sqlite table orders, append"
    )
    as_json = run_dpone(("check", "w.yaml", "--json"), cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout)
    assert summary["valid"] is True
    assert (summary["source"], summary["target"], summary["table"]) == ("csv", "sqlite", "orders")
    assert "warehouse.db" not in as_json.stdout + proc.stdout  # no URL is printed
    assert _nothing_written(tmp_path)  # no journal, no target, no .dpone


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("load.strategy", "upsert", "load.strategy"),
        ("release", _DELETE, "release"),
        ("source.kind", "xml", "source"),
    ],
)
def test_check_reports_a_config_mistake_as_run_does(
    tmp_path: Path, path: str, value: object, named: str
) -> None:
    write(tmp_path, with_(path, value))
    checked = run_dpone(("check", "w.yaml"), cwd=tmp_path)
    ran = run_dpone(RUN, cwd=tmp_path)
    assert checked.returncode == ran.returncode == 2
    assert "DPONE_CONFIG_INVALID" in checked.stderr
    assert named in checked.stderr
    assert checked.stderr == ran.stderr  # the same error, word for word
    assert "Traceback" not in checked.stderr + checked.stdout
    assert _nothing_written(tmp_path)


def test_check_requires_the_environment_variables_the_workload_names(tmp_path: Path) -> None:
    data = with_("target.url", _DELETE)
    data["target"]["url_env"] = "DPONE_TEST_TARGET_URL"  # type: ignore[index]
    data["journal"] = None
    data["journal_env"] = "DPONE_TEST_JOURNAL_URL"
    write(tmp_path, data)
    missing = run_dpone(("check", "w.yaml"), cwd=tmp_path)
    assert missing.returncode == 2
    assert "DPONE_TEST_JOURNAL_URL" in missing.stderr
    env = {"DPONE_TEST_JOURNAL_URL": "sqlite:///journal.db"}
    no_target = run_dpone(("check", "w.yaml"), cwd=tmp_path, env=env)
    assert no_target.returncode == 2
    assert "DPONE_TEST_TARGET_URL" in no_target.stderr
    env["DPONE_TEST_TARGET_URL"] = "sqlite:///warehouse.db"
    ok = run_dpone(("check", "w.yaml", "--json"), cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "sqlite:///" not in ok.stdout
    assert _nothing_written(tmp_path)


def test_check_leaves_a_plugin_targets_options_to_the_plugin(tmp_path: Path) -> None:
    """A plugin's option named url_env is the plugin's, not a URL dpone resolves."""
    data = with_("target", {"kind": "example_append", "path": "out.db", "table": "t"})
    data["target"]["url_env"] = "DPONE_TEST_UNSET_VARIABLE"  # type: ignore[index]
    write(tmp_path, data)
    proc = run_dpone(("check", "w.yaml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "example_append" in proc.stdout
