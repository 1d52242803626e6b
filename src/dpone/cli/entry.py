"""The ``dpone`` command's entry point: the console script and ``python -m dpone``.

``dpone run WORKLOAD ...`` is most of what pipelines start, and on a bulk load its
start-up is the fixed cost dpone adds to the load itself. So, in this order: the
cyclic collector is off while dpone imports (``dpone.cli._run.fast_run`` freezes what
was loaded and turns it back on), the source's identity hash starts beside the imports
(``dpone.cli._early``: a thread, or a forked child that also checks a CSV file bound for
DuckDB), and the run is parsed and executed without the CLI framework
(``dpone.cli._run``). Everything else, and anything the fast path does not read, goes
to the typer app in ``dpone.cli.main``.

When that run has finished, its outcome is durable and every connection and file it
opened is closed (the journal, the connector and the source are context-managed), so
the process ends at once (:func:`_exit_now`): the ``atexit`` handlers run and stdout
and stderr are flushed, as at a normal exit, but the interpreter does not tear down its
modules or run the C libraries' destructors (OpenSSL's under psycopg alone cost about
25 ms). A run that leaves a non-daemon thread behind exits normally, waiting for it.
"""

from __future__ import annotations

import gc
import sys
from typing import NoReturn

__all__ = ["main"]


def main() -> None:
    """Run the ``dpone`` command with ``sys.argv``."""
    gc.disable()
    from dpone.cli._early import prefetch_run_source

    prefetch_run_source(sys.argv[1:])
    from dpone.cli._run import fast_run

    code = fast_run(sys.argv[1:])
    if code is not None:
        _exit_now(code)
    from dpone.cli.main import main as typer_main

    typer_main()


def _exit_now(code: int) -> NoReturn:
    """End the process with ``code``: atexit handlers and flushed output, no teardown."""
    import atexit
    import os
    import threading

    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        sys.exit(code)  # the interpreter's exit waits for them; so do we
    atexit._run_exitfuncs()  # logging.shutdown and any plugin's handlers, as at exit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: as Python's own exit reports it
            code = code or 120
    os._exit(code)
