"""Property-based fuzz (hypothesis) of a work directory's state: each state file of a finished sweep
(sweep.json, summary.json, experiment.json, outcome.json, ray-processes.json, server.pid, optuna.db,
mlflow.db) cut short, emptied, replaced with garbage or the wrong JSON type, or made a directory, then
`sweep status`, `report`, `export`, `sync` (in process, typer's CliRunner) and `--resume` (the real driver,
inline executor, simulator servers). Each ends with at most one error message and an exit code of
orchestrator/errors.py, never a traceback; a process the tool did not start, named in the records,
survives; --resume never registers a second model version.

Derandomized with a fixed number of examples: the same cases on every machine. Run time on the
two-core development machine: see docs/reliability.md."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import served_experiment, write_experiment
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SweepToolError
from orchestrator.execute.inline import InlineExecutor
from orchestrator.sweep.driver import Sweep

FUZZ = settings(
    derandomize=True, database=None, deadline=None, print_blob=False, suppress_health_check=list(HealthCheck)
)
EXIT_CODES = {0, 1, 2, 3}
"""0 success, 1 failure (the environment), 2 user error, 3 no champion (orchestrator/errors.py)."""
STATE_FILES = [
    "sweep.json",
    "summary.json",
    "experiment.json",
    "trials/0001/outcome.json",
    "ray-processes.json",
    "trials/0001/server.pid",
    "optuna.db",
    "mlflow.db",
]
DAMAGES = ["truncate", "empty", "garbage", "wrong_type", "directory"]
COMMANDS = ["status", "report", "export", "sync"]


@pytest.fixture(scope="module")
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process group the tool did not start; the damaged records may name it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, sqlite_store_template: Path) -> tuple[Path, spec_mod.SweepSpec]:
    """A finished three-trial sweep on the simulator (inline executor), promoted, with its records."""
    tmp = tmp_path_factory.mktemp("fuzz-template")
    spec = spec_mod.load(
        write_experiment(
            tmp,
            served_experiment(
                name="wdfuzz",
                budget={"trials": 3, "concurrent_trials": 1},
                promotion={"min_rounds": 3, "max_rounds": 3, "min_gain": 0.0, "explain": False, "concurrency": [1]},
            ),
        )
    )
    wd = tmp / "wd"
    copy_store(sqlite_store_template, wd)  # an MLflow store already migrated
    Sweep(spec, wd, executor=InlineExecutor(1)).run()
    return wd, spec


def _damage(path: Path, how: str, garbage: bytes, stranger_pid: int) -> None:
    """Damage one state file (created if the finished sweep has none, as server.pid and ray-processes.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.rmtree(path)
    data = (
        path.read_bytes()
        if path.exists()
        else json.dumps(
            {"pid": stranger_pid, "start": 0, "argv": [], "processes": [{"pid": stranger_pid, "start": 0, "cmd": ""}]}
        ).encode()
    )
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(garbage)
    elif how == "wrong_type":
        path.write_text(json.dumps([stranger_pid, "x", {"pid": stranger_pid}]))
    elif how == "directory":
        path.unlink(missing_ok=True)
        (path / "inside").mkdir(parents=True)


_COPIES = iter(range(1 << 30))


def _copy(template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the work directory under a new name: MLflow keeps one engine per database path in
    this process, so a path reused after damage would read the damaged file's open connection."""
    dst = tmp_path / f"wd{next(_COPIES)}"
    shutil.copytree(template, dst)
    return dst


def _check_cli(argv: list[str]) -> int:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    result = CliRunner().invoke(app, argv)
    where = f"{argv}: {result.output[-2000:]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{where} raised {type(result.exception).__name__}: {result.exception}"
    )
    assert "Traceback" not in result.output, where
    assert result.exit_code in EXIT_CODES, where
    assert sum(line.startswith("error:") for line in result.output.splitlines()) <= 1, where
    if result.exit_code not in (0, 3):
        assert "error:" in result.output, where
    return result.exit_code


def test_damaged_state_through_status_report_export_and_sync(finished, stranger, tmp_path: Path) -> None:
    template, _ = finished
    seen: dict[str, set[int]] = {}

    @settings(FUZZ, max_examples=24)
    @given(
        st.sampled_from(STATE_FILES),
        st.sampled_from(DAMAGES),
        st.sampled_from(COMMANDS),
        st.binary(min_size=1, max_size=2048),
    )
    def prop(name: str, how: str, command: str, garbage: bytes) -> None:
        wd = _copy(template, tmp_path)
        _damage(wd / name, how, garbage, stranger.pid)
        argv = {
            "status": ["status"],
            "report": ["report", "--no-mlflow"],
            "sync": ["sync"],
            "export": ["export", "-o", str(tmp_path / "champion.env")],
        }[command]
        code = _check_cli([*argv, "--workdir", str(wd)])
        seen.setdefault(command, set()).add(code)
        assert stranger.poll() is None

    prop()
    assert set(seen) == set(COMMANDS), seen
    assert any(codes - {0} for codes in seen.values()), seen  # the damage reaches the refusals too


def _versions(wd: Path) -> int:
    with sqlite3.connect(wd / "mlflow.db") as db:
        return int(db.execute("select count(*) from model_versions").fetchone()[0])


def test_damaged_state_through_resume(finished, stranger, tmp_path: Path) -> None:
    template, spec = finished
    before = _versions(template)
    outcomes: list[str] = []

    @settings(FUZZ, max_examples=10)
    @given(st.sampled_from(STATE_FILES), st.sampled_from(DAMAGES), st.binary(min_size=1, max_size=2048))
    def prop(name: str, how: str, garbage: bytes) -> None:
        wd = _copy(template, tmp_path)
        _damage(wd / name, how, garbage, stranger.pid)
        try:
            Sweep(spec, wd, executor=InlineExecutor(1), resume=True).run()
            outcomes.append(f"{name} {how}: resumed")
        except SweepToolError as exc:  # the CLI prints it as its one message, with exc.exit_code
            assert exc.exit_code in EXIT_CODES
            assert "\n" not in str(exc).strip() and "Traceback" not in str(exc)
            outcomes.append(f"{name} {how}: {type(exc).__name__}")
        assert stranger.poll() is None
        if name != "mlflow.db":
            assert _versions(wd) == before, f"{name} {how}: a second registration"

    prop()
    assert any(o.endswith("resumed") for o in outcomes), outcomes


def _artifact_locations(wd: Path) -> set[str]:
    with sqlite3.connect(wd / "mlflow.db") as db:
        rows = db.execute("select artifact_location from experiments union select artifact_uri from runs").fetchall()
    return {str(r[0]) for r in rows if str(r[0]).startswith("file:")}


def test_a_moved_or_copied_work_directory_reads_and_writes_only_itself(finished, tmp_path: Path) -> None:
    """`mv` and `cp -r`: status, export and --resume use the directory's own databases and artifacts, say
    where it came from, and never touch the original (or recreate the old path after a move)."""
    from typer.testing import CliRunner

    from orchestrator.cli import app

    template, spec = finished
    original = _artifact_locations(template)
    moved_from, moved = tmp_path / "before-move", tmp_path / "after-move"
    shutil.copytree(template, moved_from)
    # A sweep that ran in moved_from: its sweep.json names moved_from's databases, its runs its artifacts.
    state = moved_from / "sweep.json"
    state.write_text(state.read_text().replace(str(template), str(moved_from)))
    with sqlite3.connect(moved_from / "mlflow.db") as db:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            db.execute(
                f"update {table} set {column} = replace({column}, ?, ?)",  # noqa: S608 - fixed names
                (template.as_uri(), moved_from.as_uri()),
            )
    moved_from.rename(moved)
    status = CliRunner().invoke(app, ["status", "--workdir", str(moved)])
    assert status.exit_code == 0 and f"was moved from {moved_from}" in status.output, status.output
    export = CliRunner().invoke(app, ["export", "-o", str(tmp_path / "c.env"), "--workdir", str(moved)])
    assert export.exit_code in (0, 3) and "Traceback" not in export.output, export.output  # 3: no champion
    assert all(loc.startswith(moved.as_uri()) for loc in _artifact_locations(moved))
    Sweep(spec, moved, executor=InlineExecutor(1), resume=True).run()
    assert not moved_from.exists()  # nothing written to the old path
    assert all(loc.startswith(moved.as_uri()) for loc in _artifact_locations(moved))

    copied = tmp_path / "copy"
    shutil.copytree(template, copied)
    status = CliRunner().invoke(app, ["status", "--workdir", str(copied)])
    assert f"was copied from {template}" in status.output, status.output
    assert all(loc.startswith(copied.as_uri()) for loc in _artifact_locations(copied))
    assert _artifact_locations(template) == original  # the original is left as it was


def test_a_report_that_does_not_fit_on_the_disk_is_a_warning(finished, tmp_path: Path, capsys) -> None:
    """The issue's case: a promoted sweep exited 1 when report.html did not fit on the disk. The page is
    written last; now its failure is a warning naming the fix (the finished sweep on a real full tmpfs)."""
    from disk_helpers import fill

    from orchestrator.cli._app import publish_report
    from orchestrator.sweep.status import read_state

    template, _ = finished
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(small)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); needs root and mount permission")
    try:
        wd = small / "wd"
        shutil.copytree(template, wd)
        (wd / "report.html").unlink(missing_ok=True)
        read_state(wd)  # the copy adopts its new place while there is room (status, export do the same)
        fill(small)
        publish_report(wd, None)  # returns: no OSError reaches the CLI, whose exit code would be 1
        assert "report not written" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
