"""Bad command lines: each exits 2 (1 where the environment failed) with one message naming what and
the fix, and never a traceback. Table-driven over the real CLI (typer's runner, in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "experiments" / "demo.yaml"


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """A file, a folder with a corrupt sweep.json and one with a valid sweep.json (no study)."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "sweep.json").write_text("{bad")
    valid = tmp_path / "valid"
    valid.mkdir()
    (valid / "sweep.json").write_text(
        json.dumps({"experiment": "demo", "tracking_uri": f"sqlite:///{valid / 'mlflow.db'}"})
    )
    outdir = tmp_path / "out"
    outdir.mkdir()
    return {"T": tmp_path, "F": afile, "C": corrupt, "V": valid, "O": outdir}


def _fill(text: str, places: dict[str, Path]) -> str:
    for key, path in places.items():
        text = text.replace("{" + key + "}", str(path))
    return text.replace("{DEMO}", str(DEMO))


CASES = [
    (
        "status: workdir is a file",
        "status --workdir {F}",
        2,
        "error: --workdir {F}: is a file, not a sweep's work directory; pass the --workdir `sweep run` used",
    ),
    (
        "status: workdir under a file",
        "status --workdir {F}/x",
        2,
        "error: --workdir {F}/x: does not exist, not a sweep's work directory; pass the --workdir `sweep run` used",
    ),
    (
        "status: /proc",
        "status --workdir /proc",
        2,
        "error: /proc: no sweep here (sweep.json missing); pass the --workdir `sweep run` used",
    ),
    (
        "status: corrupt sweep.json",
        "status --workdir {C}",
        2,
        "error: {C}/sweep.json is not a sweep state file (Invalid JSON: key must be a string at line 1 column 2); it "
        "was cut short or overwritten: `sweep run --resume` with the same experiment writes it again",
    ),
    (
        "sync: corrupt sweep.json",
        "sync --workdir {C}",
        2,
        "error: {C}/sweep.json is not a sweep state file (Invalid JSON: key must be a string at line 1 column 2); it "
        "was cut short or overwritten: `sweep run --resume` with the same experiment writes it again",
    ),
    (
        "status: unknown storage scheme",
        "status --workdir {V} --storage foo://bar",
        2,
        "error: Optuna storage foo://bar cannot be opened: NoSuchModuleError: Can't load plugin: "
        "sqlalchemy.dialects:foo; pass a URL such as sqlite:////abs/path/optuna.db or postgresql://user@host/db",
    ),
    (
        "status: sqlite in a missing folder",
        "status --workdir {V} --storage sqlite:///{T}/nope/optuna.db",
        2,
        "error: Optuna storage sqlite:///{T}/nope/optuna.db: the folder {T}/nope does not exist; create it, or "
        "leave --storage out (the work directory's optuna.db)",
    ),
    (
        "export: -o a directory",
        "export -o {O} --workdir {V}",
        2,
        "error: -o {O}: is a directory; name the file to write, e.g. -o {O}/champion.env",
    ),
    (
        "export: -o in a missing folder",
        "export -o {T}/nope/champion.env --workdir {V}",
        2,
        "error: -o {T}/nope/champion.env: the folder {T}/nope does not exist; create it or write elsewhere",
    ),
    (
        "export: -o under /proc",
        "export -o /proc/x/champion.env --workdir {V}",
        2,
        "error: -o /proc/x/champion.env: the folder /proc/x does not exist; create it or write elsewhere",
    ),
    (
        "export: workdir is a file",
        "export -o {O}/c.env --workdir {F}",
        2,
        "error: --workdir {F}: is a file, not a sweep's work directory; pass the --workdir `sweep run` used",
    ),
    (
        "run: workdir is a file",
        "run {DEMO} --workdir {F}",
        2,
        "error: --workdir {F}: {F} is a file, not a directory; pass a directory path, e.g. --workdir runs/demo",
    ),
    (
        "run: workdir under a file",
        "run {DEMO} --workdir {F}/x/y",
        2,
        "error: --workdir {F}/x/y: {F} is a file, not a directory; pass a directory path, e.g. --workdir runs/demo",
    ),
    (
        "run: bad --timeout",
        "run {DEMO} --timeout nan --workdir {T}/w",
        2,
        "error: --timeout: a duration looks like 8h, 30m, 90s or a number of seconds, but got 'nan'",
    ),
    (
        "export: unknown tracking scheme",
        "export --tracking-uri foo://bar --model m -o {O}/c.env",
        2,
        "error: --tracking-uri must be an MLflow tracking URI (http://..., https://..., file://..., sqlite://..., a "
        "database URL), but got 'foo://bar'; e.g. http://127.0.0.1:5000, or leave it out for the work directory's "
        "sqlite store",
    ),
    (
        "validate: /dev/zero",
        "validate /dev/zero",
        2,
        "error: /dev/zero: is a device, FIFO or socket, not a YAML file; name the experiment file",
    ),
    (
        "validate: a directory",
        "validate {T}",
        2,
        "error: {T}: is a directory, not a experiment file; name the YAML file",
    ),
]


@pytest.mark.parametrize(("case", "argv", "code", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_command_line(places: dict[str, Path], case: str, argv: str, code: int, message: str) -> None:
    result = CliRunner().invoke(app, _fill(argv, places).split())
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.exit_code == code, result.output
    assert result.stderr == _fill(message, places) + "\n"


@pytest.mark.parametrize(
    "argv", ["ui --port -1", "ui --port 70000", "plan {DEMO} --limit -1", "run {DEMO} --n-trials 0"]
)
def test_out_of_range_options_are_refused_by_the_parser(places: dict[str, Path], argv: str) -> None:
    result = CliRunner().invoke(app, _fill(argv, places).split())
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "Invalid value for" in result.output and "than or equal to" in result.output


def test_run_refuses_a_workdir_it_cannot_create(places: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["run", str(DEMO), "--workdir", "/proc/sweep-x"])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: --workdir /proc/sweep-x: cannot be the work directory (no such file or "
        "directory); pass a directory you can write to, e.g. --workdir runs/NAME\n"
    )


def test_run_refuses_sqlite_storage_in_a_missing_folder(places: dict[str, Path]) -> None:
    wd, missing = places["T"] / "w", places["T"] / "nope"
    result = CliRunner().invoke(
        app, ["run", str(DEMO), "--workdir", str(wd), "--storage", f"sqlite:///{missing}/optuna.db"]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: Optuna storage sqlite:///{missing}/optuna.db: the folder {missing} does not "
        f"exist; create it, or leave --storage out (the work directory's optuna.db)\n"
    )
