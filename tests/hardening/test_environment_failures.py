"""Failures of the environment end in one message and a defined exit code, and leave a state the same
command recovers from: Ray that does not start, a Ray Client address, damaged databases (real Ray, real
Optuna and MLflow sqlite files, the CLI as a process)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import demo_experiment, sweep, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import ClusterUnreachable, RayStartError, StorageError, StorageWriteError, UserError
from orchestrator.execute.inline import InlineExecutor
from orchestrator.search.study import Study, read_only
from orchestrator.sweep.driver import Sweep


def _one_message(proc, code: int) -> str:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode == code, out
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, out
    return " ".join(proc.stderr.split())


@pytest.mark.parametrize("address", ["ray://10.0.0.1:10001", "http://127.0.0.1:8265", "head-node", "h:0"])
def test_a_ray_address_the_driver_cannot_join_is_refused_before_anything_starts(tmp_path: Path, address: str) -> None:
    exp = write_experiment(tmp_path, demo_experiment(name="addr"))
    proc = sweep("run", str(exp), "--workdir", str(tmp_path / "wd"), "--ray-address", address)
    assert f"--ray-address {address}" in _one_message(proc, UserError.exit_code).replace("'", "")
    assert not (tmp_path / "wd").exists()


def test_ray_that_does_not_start_leaves_a_failed_start_and_the_same_command_works(tmp_path: Path) -> None:
    """A real start-up failure (Ray's temporary folder is a file): sweep.json says failed, not running, and
    the same command is not refused with "already holds a sweep"."""
    exp = write_experiment(tmp_path, demo_experiment(name="raystart"))
    wd = tmp_path / "wd"
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    proc = sweep("run", str(exp), "--workdir", str(wd), env={"RAY_TMPDIR": str(blocker)})
    text = _one_message(proc, RayStartError.exit_code)
    assert "the private Ray instance on 127.0.0.2 did not start" in text and "run the same command again" in text
    state = json.loads((wd / "sweep.json").read_text())
    assert state["status"] == "failed" and state["stop_kind"] == "start_failed"
    spec = spec_mod.load(exp)
    Sweep(spec, wd, executor=InlineExecutor(1)).open()  # the same command starts: nothing ran
    assert read_only(f"sqlite:///{wd / 'optuna.db'}", "raystart") is not None
    assert issubclass(RayStartError, ClusterUnreachable)


def _study(wd: Path) -> Study:
    spec = spec_mod.load(write_experiment(wd.parent, demo_experiment(name="db")))
    return Study(f"sqlite:///{wd / 'optuna.db'}", spec.name, spec.space, spec.sampler, ("maximize",))


def test_a_write_the_storage_refuses_mid_sweep_is_one_message_saying_resume(tmp_path: Path, monkeypatch) -> None:
    """What a full disk does to Optuna (StorageInternalError from SQLAlchemy's OperationalError), here
    from a database another connection holds locked, is one StorageWriteError (exit code 1)."""
    from orchestrator.search import study as study_mod

    monkeypatch.setattr(study_mod, "SQLITE_BUSY_S", 1.0)  # the lock is never released: wait 1 s, not 30
    wd = tmp_path / "wd"
    wd.mkdir()
    study = _study(wd)
    study.open()
    holder = sqlite3.connect(wd / "optuna.db", timeout=0)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StorageWriteError) as err:
            study.set_attr("probe", 1)  # what the loop's tell does to the same storage
    finally:
        holder.rollback()
        holder.close()
    assert err.value.exit_code == 1
    assert "is locked by another process" in str(err.value) and "--resume" in str(err.value)


@pytest.mark.parametrize("content", [b"SQLite format 3\x00" + b"\x00" * 50, b"\x00\xffnot a database" * 300])
def test_a_damaged_optuna_db_is_one_message(tmp_path: Path, content: bytes) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "optuna.db").write_bytes(content)
    with pytest.raises(StorageError) as err:
        read_only(f"sqlite:///{wd / 'optuna.db'}", "db")
    assert f"{wd / 'optuna.db'} is not a readable SQLite database" in str(err.value)


def _open_at_once(url: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        read_only(url, "race")
        results.put("ok")
    except StorageError as exc:
        results.put(str(exc))


def test_processes_opening_a_new_optuna_db_at_once_all_open_it(tmp_path: Path) -> None:
    """`sweep status` beside a sweep that is creating its optuna.db: Optuna's RDBStorage creates its tables
    on open (look, then CREATE TABLE), and the slower of two openers met 'table studies already exists',
    reported as a damaged database (CI at 1793e41, tests/hardening/test_disk_full.py's status read). Six
    real processes open each new file at one barrier, six files: before the retry in
    search/study._open_rdb, 8 of 10 files had a refused opener here (six files miss that with odds 0.2^6)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    refused = []
    for i in range(6):
        url = f"sqlite:///{tmp_path / f'optuna-{i}.db'}"
        barrier, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(url, barrier, results)) for _ in range(6)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        refused += [o for o in outcomes if o != "ok"]
    assert refused == []
