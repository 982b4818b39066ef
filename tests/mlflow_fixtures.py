"""A real, lean `mlflow server` for tests, which can be stopped and started again on its port.

Import explicitly where needed (`from mlflow_fixtures import MlflowServer, mlflow_server`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

READY_TIMEOUT_S = 60.0


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with a sqlite store and proxied artifacts under `root`.

    Started in its own session so that `stop` ends the server and the uvicorn worker it spawns.
    """

    def __init__(self, root: Path, port: int | None = None, store_template: Path | None = None):
        self.root = root
        self.store_template = store_template
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Start the server and wait until /health answers."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the server process without waiting for it (boot it while other work runs)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.store_template is not None and not (self.root / "mlflow.db").exists():
            copy_store(self.store_template, self.root)  # skips the schema migration (seconds)
        argv = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.root / "mlartifacts"),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.starts += 1
        log = open(self.root / f"server-{self.starts}.log", "wb")  # noqa: SIM115 (owned by Popen)
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            log.close()

    def wait_ready(self) -> None:
        if self.proc is None:
            raise RuntimeError("mlflow server was not launched")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"mlflow server not ready after {READY_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the group we started: server + worker
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        # The worker may outlive its parent for a moment; wait until the port is free again.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _port_open(self.host, self.port):
            time.sleep(0.1)

    def log_tail(self, chars: int = 3000) -> str:
        logs = sorted(self.root.glob("server-*.log"))
        return logs[-1].read_text(errors="replace")[-chars:] if logs else ""


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


@pytest.fixture
def mlflow_server(tmp_path: Path, sqlite_store_template: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path / "mlflow-server", store_template=sqlite_store_template)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sqlite_store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, fully migrated MLflow sqlite database (creating one costs seconds; copying, ms)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def copy_store(template: Path, workdir: Path) -> str:
    """A fresh store at `<workdir>/mlflow.db` (a copy of the template); returns its URI."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, workdir / "mlflow.db")
    return f"sqlite:///{workdir / 'mlflow.db'}"
