"""``python -m dpone`` runs the command line (see dpone.cli.entry)."""

from dpone.cli.entry import main

main()
