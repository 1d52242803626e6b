"""The ``dpone`` command's entry point: the console script and ``python -m dpone``.

``dpone run WORKLOAD ...`` is most of what pipelines start, and on a bulk load its
start-up is the fixed cost dpone adds to the load itself. So, in this order: the
cyclic collector is off while dpone imports (``dpone.cli._run.fast_run`` freezes what
was loaded and turns it back on), the source's identity hash starts in a thread
(``dpone.cli._early``), and the run is parsed and executed without the CLI framework
(``dpone.cli._run``). Everything else, and anything the fast path does not read, goes
to the typer app in ``dpone.cli.main``.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["main"]


def main() -> None:
    """Run the ``dpone`` command with ``sys.argv``."""
    gc.disable()
    from dpone.cli._early import prefetch_run_source

    prefetch_run_source(sys.argv[1:])
    from dpone.cli._run import fast_run

    code = fast_run(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from dpone.cli.main import main as typer_main

    typer_main()
