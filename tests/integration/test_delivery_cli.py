"""`dpone delivery send|resume|status` as a user runs them (real processes, real receiver)."""

from __future__ import annotations

import json
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
