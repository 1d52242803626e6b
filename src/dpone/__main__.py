"""``python -m dpone`` runs the command line."""

import gc
import sys

gc.disable()  # during start-up only: dpone.cli._run.fast_run and main() turn it back on

from dpone.cli._early import prefetch_run_source  # noqa: E402

# `dpone run ...` starts the source's identity hash, then runs without typer when it
# can (dpone.cli._early, dpone.cli._run); everything else goes to the typer app.
prefetch_run_source(sys.argv[1:])

from dpone.cli._run import fast_run  # noqa: E402

code = fast_run(sys.argv[1:])
if code is not None:
    sys.exit(code)

from dpone.cli.main import main  # noqa: E402

main()
