"""--resume ends only the servers and Ray processes this tool started: a pid record that is empty,
unreadable, hand-written or names a reused pid kills nothing (real processes, the real resume step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.execute.processes import local_processes
from orchestrator.records import LaunchPlan
from orchestrator.sweep._resume import reap_previous_driver
from orchestrator.sweep._workdir import Paths
from orchestrator.trial import procs
from orchestrator.trial.server import ServerProcess

SLEEPER = (sys.executable, "-c", "import time; time.sleep(300)")


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process group the tool did not start (its own session, as a trial server has)."""
    proc = subprocess.Popen([*SLEEPER, "stranger"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _pid_file(wd: Path, n: int, text: str) -> Path:
    path = wd / "trials" / f"{n:04d}" / "server.pid"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _records(pid: int, argv: tuple[str, ...]) -> list[str]:
    start = procs.start_time(pid)
    return [
        f"{pid}\n\n",  # the case: the earlier format with an empty command line
        f"{pid}\n{argv[0]}\n",  # the earlier format: a prefix of the command line any python shares
        f"{pid}\n",
        "",
        "\x00\xff garbage",
        json.dumps({"pid": pid, "start": start, "argv": []}),
        json.dumps({"pid": pid, "start": start, "argv": [""]}),
        json.dumps({"pid": pid, "start": start, "argv": list(argv[:1])}),  # a prefix is not the argv
        json.dumps({"pid": pid, "start": (start or 0) - 5.0, "argv": list(argv)}),  # a reused pid
        json.dumps({"pid": pid, "argv": list(argv)}),
        json.dumps({"pid": str(pid), "start": start, "argv": list(argv)}),
        json.dumps({"pid": True, "start": start, "argv": list(argv)}),
        json.dumps([pid, start, list(argv)]),
        json.dumps({"pid": 0, "start": start, "argv": list(argv)}),
        json.dumps({"pid": -pid, "start": start, "argv": list(argv)}),
    ]


def test_no_record_kills_a_stranger_unless_it_names_that_very_process(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    argv = (*SLEEPER, "stranger")
    texts = _records(stranger.pid, argv)
    for n, text in enumerate(texts):
        _pid_file(tmp_path, n, text)
    (tmp_path / "trials" / "0099" / "server.pid").mkdir(parents=True)
    reap_previous_driver(Paths(tmp_path))
    assert stranger.poll() is None, "a stranger's process group was killed"
    # The unusable records are gone (a stale one must not be read again), the directory is left alone.
    assert sorted(p.parent.name for p in tmp_path.glob("trials/*/server.pid")) == ["0099"]


def test_the_server_a_killed_driver_left_is_reaped(tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    """The record the server writes itself (pid, start time, full argv) still ends the orphan."""
    server = ServerProcess(
        LaunchPlan(argv=(*SLEEPER, "trial-server"), port=1, engine="simulator"),
        tmp_path / "trials" / "0001" / "server.log",
        dict(os.environ),
    )
    server.start()
    assert server.proc is not None
    # The record names the exec'd server's argv: until the child has exec'd (a while on a loaded machine),
    # /proc still shows the parent's command line and no record would match it. A killed driver's server
    # has long exec'd; wait for that here (a hang guard, not a timing assertion).
    wanted = tuple(a for a in (*SLEEPER, "trial-server") if a.strip())
    deadline = time.monotonic() + 120
    while procs.cmdline(server.proc.pid) != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    reap_previous_driver(Paths(tmp_path))
    assert server.proc.wait(timeout=30) != 0
    assert stranger.poll() is None
    assert not (tmp_path / "trials" / "0001" / "server.pid").exists()


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"processes": 7}',
        '{"processes": [1, 2]}',
        '{"processes": [{"pid": "x"}]}',
        "\x00garbage",
        '{"processes": [{"pid": PID, "start": START, "cmd": ""}]}',
        '{"processes": [{"pid": PID, "start": START}]}',
        '{"processes": [{"pid": PID, "start": 1, "cmd": "CMD"}]}',
        '{"processes": [{"pid": PID, "start": START, "cmd": "python -c other"}]}',
    ],
)
def test_a_malformed_or_foreign_ray_record_kills_nothing_and_raises_nothing(
    tmp_path: Path, stranger: subprocess.Popen[bytes], text: str
) -> None:
    mine = [r for r in local_processes() if r["pid"] == stranger.pid][0]
    text = text.replace("PID", str(stranger.pid)).replace("START", str(mine["start"])).replace("CMD", mine["cmd"])
    (tmp_path / "ray-processes.json").write_text(text)
    reap_previous_driver(Paths(tmp_path))
    assert stranger.poll() is None
    assert not (tmp_path / "ray-processes.json").exists()


def test_a_matching_ray_record_ends_that_process(tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    mine = [r for r in local_processes() if r["pid"] == stranger.pid]
    (tmp_path / "ray-processes.json").write_text(json.dumps({"driver_pid": 1, "processes": mine}))
    reap_previous_driver(Paths(tmp_path))
    assert stranger.wait(timeout=30) != 0


def test_a_server_that_is_still_dying_is_seen_exited_within_the_grace(tmp_path: Path) -> None:
    # trial/clients.py: a benchmark whose requests failed gives the server EXIT_GRACE_S to exit before the
    # failure is read as the requests' own (a crash closes its connections a moment before it is gone).
    dying = ServerProcess(
        LaunchPlan(
            argv=(sys.executable, "-c", "import time, sys; time.sleep(5); sys.exit(7)"), port=1, engine="simulator"
        ),
        tmp_path / "a" / "server.log",
        dict(os.environ),
    )
    dying.start()
    assert dying.returncode() is None  # the moment the requests fail: not yet exited
    assert dying.exit_within(30.0) == 7
    alive = ServerProcess(
        LaunchPlan(argv=(*SLEEPER, "trial-server"), port=1, engine="simulator"),
        tmp_path / "b" / "server.log",
        dict(os.environ),
    )
    alive.start()
    try:
        assert alive.exit_within(0.2) is None  # a live server: the failure is the requests' own
    finally:
        alive.stop()
    assert (
        ServerProcess(LaunchPlan(argv=SLEEPER, port=1, engine="simulator"), tmp_path / "c.log", {}).exit_within(0.1)
        is None
    )
