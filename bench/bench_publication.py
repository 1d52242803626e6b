"""Publishing partitions into the local store against writing the same Parquet files plainly.

64 tenant partitions of 100k CSV rows each (issue 7 budget: ratio at most 1.10).

- publication: `dpone publication run` as a whole process: pin the source manifest, each
  partition its own operation (SQLite journal, staging_generation writer, fsync'd object
  + checksum record), reconcile (every object re-read and hashed, footers checked), write
  the manifest, move `current`.
- plain: one process reading the same CSV files with the same parser and writing the same
  Parquet files (same encoder) into a directory, no journal, no fsync, no checks; with the
  same `gc.freeze()` after imports that the dpone CLI does (without it, plain is the
  slower of the two: the cyclic collector re-walks every imported object during row churn).
- plain durable: the same, with each file and the directory fsync'd (what any writer that
  must survive a power loss pays).

Both alternate, best of N, wall and CPU (user + sys) time of each whole process: on a
shared machine the wall ratio measures the load as much as dpone, the CPU ratio does not.

Usage: python bench/bench_publication.py [--partitions 64] [--rows 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = r"""
import os, sys
from pathlib import Path
from dpone.adapters.objectstores.formats import ParquetFormat
from dpone.adapters.sources.csv import CsvSource
fmt = ParquetFormat()
root, out, durable = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "durable"
import gc
gc.freeze()  # the same GC tuning as the dpone CLI, so the ratio measures the protocol
columns = {"id": "text", "tenant": "text", "amount": "real"}
out.mkdir(parents=True, exist_ok=True)
for path in sorted((root / "in").glob("*.csv")):
    source = CsvSource(path, columns=columns)
    batches = source.batches(batch_size=10_000, expected_identity=source.snapshot_identity())
    data, _rows = fmt.encode(source.columns(), batches)
    with (out / (path.stem + ".parquet")).open("wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    if durable:
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
"""


def write_sources(root: Path, partitions: int, rows: int) -> None:
    (root / "in").mkdir(parents=True)
    for p in range(partitions):
        tenant = f"t{p:03d}"
        with (root / "in" / f"{tenant}.csv").open("w", encoding="utf-8") as fh:
            fh.write("id,tenant,amount\n")
            fh.writelines(f"{tenant}-{n},{tenant},{n % 997}.25\n" for n in range(rows))


def workload(root: Path, lake: Path, journal: Path) -> Path:
    data = {
        "workload": "bench_report",
        "release": "bench",
        "deployment": "bench",
        "journal": f"sqlite:///{journal}",
        "source": {
            "kind": "csv",
            "path": "in/{partition}.csv",
            "columns": {"id": "text", "tenant": "text", "amount": "real"},
        },
        "publication": {
            "dataset": "bench_report",
            "interval": "2026-11-01/2026-11-02",
            "store": {"kind": "local", "path": str(lake)},
            "format": "parquet",
            "partitions_from_source": True,
            "audits": {"min_rows": 1, "not_null": ["id"]},
        },
    }
    path = root / "pub.yaml"
    path.write_text(json.dumps(data))
    return path


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + sys) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dpone-bench-pub-"))
    try:
        write_sources(root, args.partitions, args.rows)
        pub, plain, durable = [], [], []
        for i in range(args.repeat):
            lake, journal, out = root / f"lake{i}", root / f"journal{i}.db", root / f"plain{i}"
            path = workload(root, lake, journal)
            plain.append(timed([sys.executable, "-c", PLAIN, str(root), str(out), "-"], root))
            shutil.rmtree(out)
            durable.append(
                timed([sys.executable, "-c", PLAIN, str(root), str(out), "durable"], root)
            )
            pub.append(
                timed([sys.executable, "-m", "dpone", "publication", "run", str(path)], root)
            )
            shutil.rmtree(lake)
            shutil.rmtree(out)
        wall_pub, wall_plain = min(w for w, _ in pub), min(w for w, _ in plain)
        cpu_pub, cpu_plain = min(c for _, c in pub), min(c for _, c in plain)
        wall_durable = min(w for w, _ in durable)
        rows = args.partitions * args.rows
        print(
            json.dumps(
                {
                    "partitions": args.partitions,
                    "rows": rows,
                    "publication_wall_s": round(wall_pub, 3),
                    "plain_wall_s": round(wall_plain, 3),
                    "wall_ratio": round(wall_pub / wall_plain, 3),
                    "publication_cpu_s": round(cpu_pub, 3),
                    "plain_cpu_s": round(cpu_plain, 3),
                    "cpu_ratio": round(cpu_pub / cpu_plain, 3),
                    "plain_durable_wall_s": round(wall_durable, 3),
                    "wall_ratio_vs_durable": round(wall_pub / wall_durable, 3),
                    "publication_all": [[round(w, 2), round(c, 2)] for w, c in pub],
                    "plain_all": [[round(w, 2), round(c, 2)] for w, c in plain],
                    "plain_durable_all": [[round(w, 2), round(c, 2)] for w, c in durable],
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
