"""`sweep ui`, `sweep dashboard` and `sweep report`: looking at the results."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import typer

from orchestrator.cli._app import (
    WORKDIR,
    app,
    check_output,
    guard,
    open_tracker,
    out,
    publish_report,
    require_free_port,
    resolve_workdir,
)
from orchestrator.errors import UserError
from orchestrator.sweep._workdir import DATABASES, check_databases
from orchestrator.sweep.status import read_state
from orchestrator.tracking.convert import trials_view_path

_HOST = typer.Option("127.0.0.1", "--host", help="keep 127.0.0.1 unless you know who can reach it")


def _installed(command: str) -> str:
    """`command` from this environment's bin folder first, then PATH; one message when missing."""
    found = shutil.which(command, path=str(Path(sys.executable).parent)) or shutil.which(command)
    if found is None:
        raise UserError(f"the `{command}` command is not installed in this environment; run `make install`")
    return found


def _serve(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run a UI server in the foreground until it ends or Ctrl-C; exit with its status (0 on Ctrl-C)."""
    try:
        raise typer.Exit(subprocess.call(argv, env=env))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
@guard
def ui(
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR),
    port: int = typer.Option(5000, "--port", min=1, max=65535),
    host: str = _HOST,
) -> None:
    """Start the MLflow UI on the sweep's tracking store and print its URL."""
    wd = resolve_workdir(workdir).resolve()
    state = read_state(wd)
    uri = state.tracking_uri
    exp_id = open_tracker(uri, state.experiment_in_mlflow, wd).experiment_id()
    view = trials_view_path(exp_id)
    if not uri.startswith("sqlite:"):
        out.print(f"this sweep logs to the MLflow server {uri}: open {uri.rstrip('/')}/{view}")
        return
    require_free_port(host, port)
    mlflow_bin = _installed("mlflow")
    argv = [
        mlflow_bin,
        "server",
        "--backend-store-uri",
        uri,
        "--default-artifact-root",
        (wd / "mlartifacts").as_uri(),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    out.print(f"MLflow UI: [bold]http://{host}:{port}/{view}[/]  (trials ranked; Ctrl-C stops it)")
    _serve(argv, {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})


@app.command()
@guard
def dashboard(
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    host: str = _HOST,
    storage: str | None = typer.Option(
        None,
        "--storage",
        envvar="SWEEP_OPTUNA_STORAGE",
        help="the Optuna RDB URL the sweep used, when not its sqlite file",
    ),
) -> None:
    """Start optuna-dashboard on the sweep's study and print its URL."""
    wd = resolve_workdir(workdir).resolve()
    state = read_state(wd)
    url = storage or state.optuna_storage or f"sqlite:///{wd / 'optuna.db'}"
    if ":***@" in url:
        raise UserError("the sweep's Optuna storage needs a password that is never written down; pass --storage URL")
    binary = _installed("optuna-dashboard")
    require_free_port(host, port)
    out.print(
        f"optuna-dashboard: [bold]http://{host}:{port}/dashboard/[/]  (study {state.experiment}; Ctrl-C stops it)"
    )
    _serve([binary, url, "--host", host, "--port", str(port)])


@app.command()
@guard
def report(
    output: Path | None = typer.Option(None, "-o", "--output", help="default <workdir>/report.html"),
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR, help="the sweep's work directory"),
    storage: str | None = typer.Option(
        None,
        "--storage",
        envvar="SWEEP_OPTUNA_STORAGE",
        help="the Optuna RDB URL the sweep used, when not its sqlite file",
    ),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="also put it on the parent MLflow run"),
    truth: bool = typer.Option(
        False, "--truth", help="simulator: rank the champion against the true optimum (evaluates every feasible point)"
    ),
) -> None:
    """One self-contained HTML page: which configuration won, by how much, and why."""
    from orchestrator.sweep import publish  # deferred: plotly, and MLflow with --mlflow

    if output is not None:
        check_output(output, "report.html")  # a directory or a missing folder: one message before any work
    wd = resolve_workdir(workdir)
    check_databases(wd, DATABASES if mlflow else ("optuna.db",))  # one message, not SQLAlchemy's traceback
    path, _ = publish.write(wd, output, storage, truth=truth)
    if mlflow:
        publish_report(wd, storage)
    out.print(f"wrote {path}")
