"""The `sweep` command: thin commands that turn errors into one message and an exit code.

Exit codes: 0 promoted or success, 3 a sweep finished without a champion, 2 user error (bad experiment,
bad arguments, nothing to resume), 1 failure.

Pieces:
    _app.py      the typer application, the consoles, one message per error (`guard`), the work directory
    check.py     validate, plan, truth: what an experiment means, before anything runs
    running.py   probe, run, status, sync: the night itself and how it is going
    browse.py    ui, dashboard, report: looking at the results
    export.py    export: the champion in the form the place that loads it reads
    __main__.py  `python -m orchestrator.cli`: the same commands without the console script
"""

# isort: skip_file
# Importing a command module registers its commands on `app`, in this order in `sweep --help`.
from orchestrator.cli import check, running, browse, export
from orchestrator.cli._app import app

__all__ = ["app", "browse", "check", "export", "main", "running"]


def main() -> None:
    app()
