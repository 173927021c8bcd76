"""``python -m batchgrader.cli`` runs ``bgctl``."""

from batchgrader.cli.commands import main

main()
