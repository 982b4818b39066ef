"""The `sweep` application and what its commands share: the consoles, one message per error, the work directory.

Exit codes: 0 success, 2 user error (bad experiment, bad arguments, nothing to resume), 1 failure.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SpecError, SweepToolError, UserError
from orchestrator.sweep._workdir import check_databases

if TYPE_CHECKING:  # the tracker imports MLflow: `status`, `validate` and `plan` must start without it
    from orchestrator.tracking.tracker import Tracker

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: typer's rich help labels every flag `<bool>`
    # Help as wide as a terminal allows up to 120 columns, and 120 where it goes to a file or a pipe (click
    # would take 80 and cut each command's summary short).
    context_settings={"max_content_width": 120, **({} if sys.stdout.isatty() else {"terminal_width": 120})},
    help="Find the fastest way to serve a model with SGLang: NCCL and speculative-decoding sweeps.",
)

UNWRAPPED_WIDTH = 10_000
"""The console's width where the output is no terminal: wide enough that rich never breaks a line."""


def console(*, stderr: bool = False) -> Console:
    """Rich's console on stdout or stderr: at a terminal, the terminal's width; elsewhere (a file, a pipe,
    a CI log) lines are never wrapped, so each message stays one line for grep and scripts, and tables
    keep their natural width instead of rich's 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    if stream is not None and stream.isatty():
        return Console(stderr=stderr, highlight=False)
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=UNWRAPPED_WIDTH)


out = console()
err = console(stderr=True)


def workdir_path(value: str | Path) -> Path:
    """--workdir as a Path, refusing an empty one: Path('') is Path('.'), the current directory, which a
    mistyped `--workdir "$WD"` with WD unset would silently make a sweep's work directory."""
    if isinstance(value, Path):
        return value
    if not value.strip():
        raise ValueError(
            "an empty path, which would mean the current directory; pass --workdir . for "
            "that, or the directory `sweep run` used"
        )
    return Path(value)


WORKDIR = workdir_path
"""The parser of every --workdir option."""


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def guard(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a command body; a SweepToolError becomes one message and its exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except SweepToolError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
        except OSError as exc:  # the environment (disk full, permissions, a path in the way), not a bug of ours
            where = f"{exc.filename}: " if exc.filename else ""
            fix = (
                (
                    "; free space on that disk and run the command again (`sweep run` with --resume: "
                    "what was measured is kept)"
                )
                if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else ""
            )
            raise fail(f"{where}{exc.strerror or exc}{fix}", 1) from None

    return wrapper


def load_experiment(path: Path, *, here: bool = False) -> spec_mod.SweepSpec:
    """The experiment at `path`; with `here`, also what only this machine can tell (the commands whose
    trials or probe run on it): the interpreters exist and server.host is one of its addresses."""
    spec = spec_mod.load(path)
    if here:
        check_on_this_machine(spec, str(path))
    return spec


def check_on_this_machine(spec: spec_mod.SweepSpec, where: str) -> None:
    """SpecError when server.python or benchmark.client_python is no executable here, or when the trial
    servers could not listen on server.host here (not an address of this machine)."""
    for field, python in (
        ("server.python", spec.server.python),
        ("benchmark.client_python", spec.benchmark.client_python),
    ):
        if python is not None and shutil.which(python) is None:
            what = "is not executable" if Path(python).exists() else "does not exist"
            raise SpecError(
                f"{where}: {field}: {python} {what} on this machine; give the interpreter that has "
                f"SGLang installed (e.g. /opt/venv/bin/python), at the same path on every GPU host"
            )
    if problem := _host_problem(spec.server.host):
        raise SpecError(
            f"{where}: server.host: {spec.server.host} {problem}; keep 127.0.0.1 (the benchmark "
            f"runs beside the server), or give 0.0.0.0 or one of this machine's interface addresses"
        )


def _host_problem(host: str) -> str | None:
    """Why a server could not listen on `host` here, or None (binds a socket to an ephemeral port)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError):
        return "is not an address, and no name this machine resolves"
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return "is not an address of this machine, so every trial server would fail to listen on it"
            return f"cannot be listened on here ({exc.strerror})"
    return None


def resolve_workdir(workdir: Path | None, experiment: spec_mod.SweepSpec | None = None) -> Path:
    """The work directory: --workdir (it must hold a sweep unless `experiment` is about to start one),
    else runs/<experiment name>, else the one sweep under ./runs; UserError naming the fix otherwise."""
    if workdir is not None:
        return _given_workdir(workdir, experiment)
    if experiment is not None:
        return Path("runs") / experiment.name
    return _the_only_sweep(Path("runs"))


def _given_workdir(workdir: Path, experiment: spec_mod.SweepSpec | None) -> Path:
    if workdir.is_dir():
        return workdir
    if experiment is None:  # status, sync, ui, export: the sweep must be there
        what = "is a file" if workdir.is_file() else "does not exist"
        raise UserError(
            f"--workdir {workdir}: {what}, not a sweep's work directory; pass the --workdir `sweep run` used"
        )
    existing = next(p for p in (workdir, *workdir.parents) if p.exists() or p == p.parent)
    if existing.exists() and not existing.is_dir():
        raise UserError(
            f"--workdir {workdir}: {existing} is a file, not a directory; pass a directory "
            f"path, e.g. --workdir runs/{experiment.name}"
        )
    return workdir


def _the_only_sweep(runs: Path) -> Path:
    candidates = sorted(p for p in runs.iterdir() if (p / "sweep.json").exists()) if runs.is_dir() else []
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise UserError("no sweep found under ./runs; pass --workdir DIR (the directory `sweep run` used)")
    names = ", ".join(str(c) for c in candidates)
    raise UserError(f"several sweeps under ./runs ({names}); pass --workdir DIR to choose one")


def open_tracker(uri: str, experiment: str, outbox_dir: Path) -> Tracker:
    # MLflow is imported by the commands that talk to it only.
    from orchestrator.tracking.tracker import Tracker

    if uri.startswith("sqlite:///"):  # a damaged store: one message instead of SQLAlchemy's traceback
        db = Path(uri.removeprefix("sqlite:///"))
        check_databases(db.parent, (db.name,))
    return Tracker(uri, experiment, outbox_dir=outbox_dir)


# ---------------------------------------------------------------------------- validate / plan


def require_free_port(host: str, port: int) -> None:
    """UserError when `host:port` is taken: a URL printed for it would show another server."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except (socket.gaierror, UnicodeError):
            raise UserError(
                f"--host {host}: not an address of this machine; keep 127.0.0.1, or give one of its interface addresses"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserError(
                    f"--host {host}: not an address of this machine; keep 127.0.0.1, or give one of "
                    f"its interface addresses"
                ) from None
            raise UserError(
                f"--port {port}: {host}:{port} is not free ({exc.strerror}); another server (an earlier "
                f"`sweep ui`?) listens there. Fix: stop it, or pass --port with a free port"
            ) from None


def check_output(output: Path, example: str = "champion.env") -> None:
    """UserError unless `output` names a file that can be written in an existing folder (checked first,
    so a mistyped -o fails before MLflow is asked)."""
    if output.is_dir():
        raise UserError(f"-o {output}: is a directory; name the file to write, e.g. -o {output / example}")
    folder = output.parent
    if not folder.is_dir():
        above = next((p for p in folder.parents if p.exists()), None) if not folder.exists() else folder
        if above is not None and above.exists() and not above.is_dir():
            raise UserError(
                f"-o {output}: {above} is a file, not a folder; name a file in a folder, e.g. "
                f"-o {above.parent / output.name}"
            )
        raise UserError(f"-o {output}: the folder {folder} does not exist; create it or write elsewhere")
    if not os.access(folder, os.W_OK) or (output.exists() and not output.is_file()):
        raise UserError(f"-o {output}: cannot write there; name a regular file in a folder you can write to")


def publish_report(wd: Path, storage: str | None) -> None:
    """report.html in the work directory and on the parent MLflow run; a failure to publish is a warning."""
    from orchestrator.sweep import publish  # deferred: plotly and MLflow

    try:
        path = publish.publish(wd, storage)
    except SweepToolError as exc:
        err.print(f"[yellow]warning:[/] report not published: {escape(str(exc))}", soft_wrap=True)
        return
    except OSError as exc:  # a full disk: the sweep's result stands, only its page is missing
        where = f"{exc.filename}: " if exc.filename else ""
        err.print(
            f"[yellow]warning:[/] report not written ({where}{exc.strerror or exc}); free space and run "
            f"`sweep report --workdir {wd}`",
            soft_wrap=True,
        )
        return
    out.print(f"report: [bold]{path}[/]  (also on the parent MLflow run)")
