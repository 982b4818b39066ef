"""`sweep ui`, `sweep dashboard` and `sweep report`: looking at the results."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from orchestrator.cli._app import (
    WORKDIR,
    app,
    check_output,
    err,
    guard,
    open_tracker,
    out,
    publish_report,
    require_free_port,
    resolve_workdir,
)
from orchestrator.errors import SweepToolError, UserError
from orchestrator.search.study import name_objectives
from orchestrator.sweep._workdir import DATABASES, check_databases
from orchestrator.sweep.status import read_state
from orchestrator.tracking.convert import trials_view_path
from orchestrator.trial.server import kill_group

_HOST = typer.Option("127.0.0.1", "--host", help="keep 127.0.0.1 unless you know who can reach it")


def _installed(command: str) -> str:
    """`command` from this environment's bin folder first, then PATH; one message when missing."""
    found = shutil.which(command, path=str(Path(sys.executable).parent)) or shutil.which(command)
    if found is None:
        raise UserError(f"the `{command}` command is not installed in this environment; run `make install`")
    return found


class _Stopped(Exception):
    """SIGTERM or SIGHUP reached `sweep ui` / `sweep dashboard`."""


def _stop(signum: int, _frame: object) -> None:
    raise _Stopped(signum)


STOP_GRACE_S = 10.0
"""How long the server's process group has to exit after SIGTERM before it is killed."""


def _serve(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run a UI server in its own process group until it ends, Ctrl-C, SIGTERM (`kill`) or SIGHUP (the
    terminal closed); on the way out the whole group stops, the server and the workers it forked, so no
    server is left answering on the port. Exit with its status (0 when stopped)."""
    # A signal already ignored stays ignored (`nohup sweep ui` must outlive its terminal).
    old = {
        sig: signal.signal(sig, _stop)
        for sig in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    proc: subprocess.Popen[bytes] | None = None
    code = 0
    try:
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        code = proc.wait()
    except (KeyboardInterrupt, _Stopped):
        code = 0
    finally:
        problems = kill_group(proc.pid, STOP_GRACE_S, wait=proc.wait) if proc is not None else []
        for problem in problems:
            err.print(f"[yellow]warning:[/] {escape(problem)}", soft_wrap=True)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    raise typer.Exit(code)


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
    out.print(f"MLflow UI: [bold]http://{host}:{port}/{view}[/]  (trials ranked; Ctrl-C or kill stops it)")
    out.print(
        "[dim]This link opens MLflow's training view; opened another way, MLflow may start in its GenAI view: "
        "click [bold]Machine learning[/] at the top of the sidebar (MLflow keeps that choice).[/]"
    )
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
    _name_objectives(wd, url, state.experiment)
    out.print(
        f"optuna-dashboard: [bold]http://{host}:{port}/dashboard/[/]  (study {state.experiment}; Ctrl-C or kill "
        f"stops it)"
    )
    _serve([binary, url, "--host", host, "--port", str(port)])


def _name_objectives(wd: Path, url: str, study: str) -> None:
    """Name the study's objectives after the experiment's metrics before the dashboard reads them, so it
    shows `decode_tok_s` where it would say "Objective 0"; a study that cannot be named is served as it is."""
    try:
        objective = json.loads((wd / "experiment.json").read_bytes())["objective"]
        metrics = [objective["metric"]] + ([objective["secondary"]] if objective.get("secondary") else [])
    except (OSError, ValueError, KeyError, TypeError):
        return  # the dashboard still works, with Optuna's own names
    try:
        name_objectives(url, study, metrics)
    except SweepToolError as exc:
        err.print(f"[yellow]warning:[/] objectives not named ({escape(str(exc))})", soft_wrap=True)


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
    mlflow: bool = typer.Option(
        True, "--mlflow/--no-mlflow", help="also put it on the parent MLflow run (not with -o: -o writes only there)"
    ),
    truth: bool = typer.Option(
        False, "--truth", help="simulator: rank the champion against the true optimum (evaluates every feasible point)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print what the page says as JSON (the page is written too)"),
) -> None:
    """One self-contained HTML page: which configuration won, by how much, and why."""
    from orchestrator.sweep import publish  # deferred: plotly, and MLflow with --mlflow

    if output is not None:
        check_output(output, "report.html")  # a directory or a missing folder: one message before any work
    wd = resolve_workdir(workdir)
    publishing = mlflow and output is None  # -o writes that file alone: the work directory and MLflow keep theirs
    check_databases(wd, DATABASES if publishing else ("optuna.db",))  # one message, not SQLAlchemy's traceback
    path, r = publish.write(wd, output, storage, truth=truth)
    if publishing:
        publish_report(wd, storage)
    if as_json:
        print(json.dumps(report_json(path, r.content, published=publishing), default=str))
    else:
        out.print(f"wrote {path}")


def report_json(path: Path, content: Any, *, published: bool) -> dict[str, Any]:
    """`sweep report --json`: the page's path and every value it shows but the tables and plots."""
    skip = {"table", "plots", "figures"}
    values = {f.name: getattr(content, f.name) for f in dataclasses.fields(content) if f.name not in skip}
    return {"path": str(path), "published": published, **_plain(values)}


def _plain(value: Any) -> Any:
    """`value` as JSON's types: dataclasses and mappings as objects, sequences as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
