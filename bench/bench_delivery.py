"""Worker time of a resumable delivery whose remote job runs for minutes.

The issue's criterion (scaled from the seed's 30 minutes): for a receiver job of 3
minutes, the worker process spends at most 5 s of CPU and of wall time after the
initial submission. Measured with the reference receiver on loopback and the SQLite
control plane, two shapes side by side on two jobs of the same length:

- deferred (the shape of the Airflow operator, ``DponeDeliveryOperator``, without
  Airflow; ``bench/bench_delivery_airflow.py`` measures it in a real Airflow): a
  worker process submits and returns ``DeliveryPending`` at once; nobody runs in the
  worker while the job runs (there the trigger observes; here the benchmark just
  sleeps); after the job ended a second worker process runs ``dpone delivery
  resume`` (the ``execute_complete`` step).
  Worker time after submission = the rest of the first process after its submit
  returned + the whole second process.
- blocking: one worker process polls every 5 s until the job ends (CLI without a
  trigger), for comparison.

Usage: python bench/bench_delivery.py [--job-seconds 180]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpone.testing.rest_receiver import ReceiverProcess

TOKEN = "bench-token"  # a throwaway token for the loopback receiver

WORKER = r"""
import json, sys, time
from pathlib import Path
from dpone.adapters.delivery.rest import RestDeliverySink
from dpone.adapters.delivery.sqlite_store import SqliteDeliveryStore
from dpone.runtime.delivery import (DeliveryPolicy, DeliveryRequest,
    ResumableDeliveryProcessor, delivery_intent_digest, stage_payload)

journal, url, payload_path, op, poll_budget = sys.argv[1:6]
marks = {}

class Timed(RestDeliverySink):
    def submit(self, **kw):
        out = super().submit(**kw)
        marks["wall"], marks["cpu"] = time.time(), time.process_time()
        return out

store = SqliteDeliveryStore(Path(journal))
payload = stage_payload(Path(payload_path))
proc = ResumableDeliveryProcessor(
    store=store,
    sink_factory=lambda u, r: Timed(u, credential_ref=r),
    policy=DeliveryPolicy(poll_interval_s=5.0, poll_budget_s=float(poll_budget)),
)
result = proc.deliver(DeliveryRequest(
    operation_id=op,
    intent_digest=delivery_intent_digest(payload=payload, receiver=url, pack_fingerprint="b"),
    payload=payload, receiver_url=url, credential_ref="env:BENCH_TOKEN"))
proc.close(); store.close()
print(json.dumps({"result": type(result).__name__, "submit_wall": marks["wall"],
    "submit_cpu": marks["cpu"], "end_wall": time.time(), "end_cpu": time.process_time()}))
"""


def _op(name: str) -> str:
    return "sha256:" + hashlib.sha256(f"bench-{name}-{time.time_ns()}".encode()).hexdigest()


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-seconds", type=float, default=180.0)
    args = parser.parse_args()
    env = {**os.environ, "BENCH_TOKEN": TOKEN}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        payload = tmp / "payload.jsonl"
        payload.write_text("".join(f'{{"id": {i}}}\n' for i in range(10_000)))
        journal = tmp / "journal.sqlite"
        with ReceiverProcess(tmp / "rx", token=TOKEN) as rx:
            rx.set_faults(job_duration_s=args.job_seconds)
            deferred_op, blocking_op = _op("deferred"), _op("blocking")
            argv = [sys.executable, "-c", WORKER, str(journal), rx.url, str(payload)]
            blocking = subprocess.Popen(
                [*argv, blocking_op, str(args.job_seconds + 60)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            first = json.loads(
                subprocess.run(
                    [*argv, deferred_op, "0"], env=env, capture_output=True, text=True, check=True
                ).stdout
            )
            assert first["result"] == "DeliveryPending", first
            time.sleep(args.job_seconds + 1)  # the trigger's part; no worker runs
            cpu_before = _child_cpu()
            start = time.time()
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dpone",
                    "delivery",
                    "resume",
                    "--operation-id",
                    deferred_op,
                    "--journal",
                    f"sqlite:///{journal}",
                    "--json",
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            resume_wall = time.time() - start
            resume_cpu = _child_cpu() - cpu_before
            assert json.loads(done.stdout)["outcome"] == "completed", done.stdout
            out, _ = blocking.communicate(timeout=args.job_seconds + 120)
            second = json.loads(out)
            assert second["result"] == "DeliveryCompleted", second
            jobs = rx.stats()["jobs_by_key"]
            assert jobs[deferred_op] == 1
            assert jobs[blocking_op] == 1
    deferred_wall = first["end_wall"] - first["submit_wall"] + resume_wall
    deferred_cpu = first["end_cpu"] - first["submit_cpu"] + resume_cpu
    print(
        json.dumps(
            {
                "job_seconds": args.job_seconds,
                "deferred": {
                    "after_submit_first_process_wall_s": round(
                        first["end_wall"] - first["submit_wall"], 3
                    ),
                    "after_submit_first_process_cpu_s": round(
                        first["end_cpu"] - first["submit_cpu"], 3
                    ),
                    "resume_process_wall_s": round(resume_wall, 3),
                    "resume_process_cpu_s": round(resume_cpu, 3),
                    "worker_wall_after_submit_s": round(deferred_wall, 3),
                    "worker_cpu_after_submit_s": round(deferred_cpu, 3),
                },
                "blocking": {
                    "worker_wall_after_submit_s": round(
                        second["end_wall"] - second["submit_wall"], 3
                    ),
                    "worker_cpu_after_submit_s": round(second["end_cpu"] - second["submit_cpu"], 3),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
