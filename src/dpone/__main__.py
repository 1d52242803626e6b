"""``python -m dpone`` runs the command line."""

from dpone.cli.main import main

main()
