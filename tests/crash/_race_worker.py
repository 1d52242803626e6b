"""A race worker: runs every operation of a partitioned workload, in random order, twice.

Started as a plain OS process by test_crash_postgres; the test SIGKILLs workers at random.
"""

from __future__ import annotations

import random
import sys

from dpone.api import Runner
from dpone.errors import DponeError


def main() -> None:
    workload, ops, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    order = [*range(ops), *range(ops)]
    rng.shuffle(order)
    with Runner(workload) as runner:
        for partition in order:
            try:
                runner.run(interval="2026-11-01/2026-11-02", partition=str(partition))
            except DponeError as exc:
                if exc.code.value == "DPONE_TARGET_COMMIT_UNKNOWN":
                    raise  # never expected on a marker route: fail loudly
                # lease held by another worker, lock bounds, lost leases: move on


if __name__ == "__main__":
    main()
