"""`python -m orchestrator.cli`: the `sweep` command."""

from orchestrator.cli import main

main()
