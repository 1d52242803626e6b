"""``python -m dpone`` runs the command line."""

import sys

from dpone.cli._early import prefetch_run_source

prefetch_run_source(sys.argv[1:])  # before the CLI's imports: see dpone.cli._early

from dpone.cli.main import main  # noqa: E402

main()
