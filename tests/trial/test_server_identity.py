"""Readiness counts only our own server: on a shared host another process can hold the port the trial
picked (taken between the free-port check and the bind) and answer GET /health itself."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.records import LaunchPlan
from orchestrator.trial import procs
from orchestrator.trial.failures import classify_exit
from orchestrator.trial.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign_server() -> Iterator[int]:
    """Someone else's HTTP server on 127.0.0.1 answering every GET with 200."""
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _plan(port: int) -> LaunchPlan:
    argv = (
        sys.executable,
        "-m",
        "orchestrator.simulator",
        "--model-path",
        "kimi-k2.5",
        "--tp-size",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    )
    return LaunchPlan(argv=argv, port=port, engine="simulator")


def test_a_foreign_health_answer_is_not_our_server_being_ready(tmp_path: Path, foreign_server: int) -> None:
    server = ServerProcess(_plan(foreign_server), tmp_path / "server.log", {"PYTHONPATH": str(REPO)})
    server.start()
    try:
        ready = server.wait_ready(60.0)
    finally:
        server.stop()
    assert not ready.ready and ready.exited  # ours could not bind and exited: the runner picks another port
    failure = classify_exit((tmp_path / "server.log").read_text(), ready.returncode)
    assert failure.kind.value == "port_in_use"


def test_our_own_server_is_ready(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ServerProcess(_plan(port), tmp_path / "server.log", {"PYTHONPATH": str(REPO)})
    server.start()
    try:
        assert server.wait_ready(60.0).ready
        assert server.pid is not None and procs.listens_on(server.pid, port) is True
    finally:
        server.stop()


def test_listens_on_says_no_for_a_port_the_process_does_not_hold(foreign_server: int) -> None:
    assert procs.listens_on(os.getpid(), foreign_server) is True  # the fixture's thread is this process
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unused = s.getsockname()[1]
    assert procs.listens_on(os.getpid(), unused) is False
    assert procs.listens_on(2**22 + 12345, unused) is None  # no such process
