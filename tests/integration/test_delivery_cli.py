"""`dpone delivery send|resume|status` as a user runs them (real processes, real receiver)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time

from dpone.testing.crash import run_dpone
from tests.fixtures.receiver import RECEIVER_TOKEN


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_dpone(
        ["delivery", *args, "--json"],
        cwd=tmp_path,
        env={"RECEIVER_TOKEN": RECEIVER_TOKEN},
        timeout=60,
    )


def test_send_is_safe_to_run_again_and_resume_completes(receiver, tmp_path):
    """send -> pending; other content under the same identity -> exit 4; same again ->
    the same operation, no second job; resume -> completed."""
    receiver.set_faults(job_duration_s=0.5)
    payload = tmp_path / "orders.jsonl"
    original = "".join(f'{{"id": {i}}}\n' for i in range(30))
    payload.write_text(original)
    send = [
        *("send", "--payload", str(payload), "--receiver", receiver.url),
        *("--credential", "env:RECEIVER_TOKEN", "--workload-id", "orders"),
        *("--interval", "2026-11-01/2026-11-02", "--capacity", "2"),
    ]
    first = _cli(tmp_path, *send)
    assert first.returncode == 0, first.stderr
    body = json.loads(first.stdout)
    assert body["outcome"] == "pending"
    op = body["operation_id"]
    payload.write_text('{"id": "edited"}\n')
    conflict = _cli(tmp_path, *send)
    assert conflict.returncode == 4, conflict.stdout
    assert json.loads(conflict.stdout)["error"]["code"] == "DPONE_TARGET_COMMIT_INTENT_CONFLICT"
    payload.write_text(original)
    again = _cli(tmp_path, *send)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["operation_id"] == op
    time.sleep(0.5)
    done = _cli(tmp_path, "resume", "--operation-id", op)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "completed"
    assert receiver.jobs_created(op) == 1
    assert RECEIVER_TOKEN not in first.stdout + again.stdout + done.stdout


def test_status_reads_only_and_never_creates_a_control_plane(receiver, tmp_path):
    """status on a mistyped journal creates nothing; on a real one it reads without writing."""
    typo = tmp_path / "typo" / "x.db"
    missing = _cli(
        tmp_path, "status", "--operation-id", "sha256:" + "0" * 64, "--journal", f"sqlite:///{typo}"
    )
    assert missing.returncode != 0
    error = json.loads(missing.stdout)["error"]
    assert error["code"] == "DPONE_CONFIG_INVALID"
    assert "no control plane at" in error["message"]
    assert not (tmp_path / "typo").exists()
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE unrelated (x)").connection.close()
    before = other.read_bytes()
    foreign = _cli(
        tmp_path,
        "status",
        "--operation-id",
        "sha256:" + "0" * 64,
        "--journal",
        f"sqlite:///{other}",
    )
    assert "no control plane at" in json.loads(foreign.stdout)["error"]["message"]
    assert other.read_bytes() == before
    payload = tmp_path / "orders.jsonl"
    payload.write_text('{"id": 1}\n')
    sent = _cli(
        tmp_path,
        *("send", "--payload", str(payload), "--receiver", receiver.url),
        *("--credential", "env:RECEIVER_TOKEN", "--workload-id", "status-check"),
        *("--interval", "2026-11-01/2026-11-02"),
    )
    assert sent.returncode == 0, sent.stderr
    op = json.loads(sent.stdout)["operation_id"]
    journal = tmp_path / ".dpone" / "journal.db"
    assert journal.is_file()
    before = journal.read_bytes()
    seen = _cli(tmp_path, "status", "--operation-id", op)
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout)["operation_id"] == op
    # mode=ro: SQLite may keep its -wal/-shm side files, the database itself is untouched
    assert journal.read_bytes() == before
