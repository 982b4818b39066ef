"""Shared pieces of the deployment tests: a serving config, the entrypoint run as a real process with a
recorder standing in for SGLang's interpreter, and the real readers of env files (docker's CLI against a
recording fake daemon on a unix socket, kubectl's client-side dry run)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.records import ServingConfig

REPO = Path(__file__).resolve().parents[2]
DOCKER = shutil.which("docker")
KUBECTL = shutil.which("kubectl")

RECORDER = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, open(os.environ["RECORD_TO"], "w"))
"""

# Python sets LC_CTYPE itself when the locale is C (PEP 538); it is not part of what was passed.
_ADDED_BY_PYTHON = {"LC_CTYPE"}

DRAFT = "/models/draft with space"
ARGS = [
    "--tp-size",
    "8",
    "--enable-metrics",
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    DRAFT,
    "--speculative-num-steps",
    "2",
    "--disable-custom-all-reduce",
]
PRODUCTION_ARGS = [a for a in ARGS if a != "--enable-metrics"]
ENV = {
    "NCCL_PROTO": "LL",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_MIN_NCHANNELS": "0",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,ENV",
    "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1",
}
PRODUCTION_ENV = {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "16777216", "NCCL_MIN_NCHANNELS": "0"}


def make_config(env: dict[str, str] | None = None, args: list[str] | None = None) -> ServingConfig:
    return ServingConfig(
        experiment="demo",
        trial_number=7,
        run_id="abc123",
        model_version="3",
        engine="sglang",
        sglang_version="0.5.23",
        params={},
        env=ENV if env is None else env,
        sglang_args=tuple(ARGS if args is None else args),
        metrics={"decode_tok_s": 94.0},
        fingerprint_hash="f00d",
        created_at="2026-11-29T00:00:00+00:00",
    )


def recorder(tmp_path: Path) -> Path:
    path = tmp_path / "python-recorder"
    path.write_text(RECORDER.format(python=sys.executable))
    path.chmod(0o755)
    return path


def run_entrypoint(
    tmp_path: Path,
    environ: dict[str, str],
    *extra: str,
    command: list[str] | None = None,
    image: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """Run the entrypoint as a process with exactly `environ` (plus PATH, the recorder and where it writes).

    `image` stands for the worker image's record of its own variables that name code (by default this
    machine's PATH and the recorder as SGLANG_PYTHON); the entrypoint reads it with --image-env."""
    record = tmp_path / "record.json"
    record.unlink(missing_ok=True)
    base = {"PATH": os.environ["PATH"], "SGLANG_PYTHON": str(recorder(tmp_path))}
    image_env = tmp_path / "image-env.json"
    image_env.write_text(json.dumps(base if image is None else image))
    env = {**base, "RECORD_TO": str(record), **environ}
    cmd = command or [sys.executable, "-m", "orchestrator.results.entrypoint"]
    proc = subprocess.run(
        [*cmd, "--image-env", str(image_env), *extra], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    if not record.exists():
        return proc, None
    data = json.loads(record.read_text())
    data["env"] = {k: v for k, v in data["env"].items() if k not in _ADDED_BY_PYTHON}
    return proc, data


def sglang_argv(model: str, *args: str, host: str = "0.0.0.0", port: str = "30000") -> list[str]:
    return ["-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", port, *args]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Docker's engine API, as far as `docker run` needs it: answer the ping, record the create request,
    then refuse it so the CLI stops there."""

    server: _DaemonServer

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Api-Version", "1.45")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._reply(200, b"OK")

    def do_GET(self) -> None:
        self._reply(200, b"OK")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/containers/create"):
            self.server.created.append(json.loads(body))
        self._reply(500, json.dumps({"message": "recorded by the test daemon"}).encode())

    def address_string(self) -> str:
        return "unix-socket"

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _DaemonServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    created: list[dict[str, Any]]


@contextlib.contextmanager
def fake_docker_daemon() -> Iterator[tuple[dict[str, str], list[dict[str, Any]]]]:
    """(environment for the docker CLI, the container-create requests it sends) on a private unix socket."""
    folder = tempfile.mkdtemp(prefix="dkr", dir="/tmp")  # a socket path must stay under ~100 characters
    sock = os.path.join(folder, "d.sock")
    server = _DaemonServer(sock, _Recorder)
    server.created = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield (
            {
                "PATH": os.environ["PATH"],
                "HOME": folder,
                "DOCKER_HOST": f"unix://{sock}",
                "DOCKER_CONFIG": os.path.join(folder, "config"),
            },
            server.created,
        )
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(folder, ignore_errors=True)


def docker_env_file_environment(env_file: Path) -> dict[str, str]:
    """The environment `docker run --env-file env_file` gives a container, as docker's own CLI reads it."""
    assert DOCKER is not None
    with fake_docker_daemon() as (env, created):
        proc = subprocess.run(
            [DOCKER, "run", "--rm", "--env-file", str(env_file), "sglang-sweep-worker"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert created, f"docker sent no create request: {proc.stderr}"
    pairs = [item.split("=", 1) for item in created[0]["Env"]]
    return dict((k, v) for k, v in pairs)


def docker_env_file_error(env_file: Path) -> str | None:
    """docker's own complaint about an env file, or None when it reads it."""
    assert DOCKER is not None
    with fake_docker_daemon() as (env, created):
        proc = subprocess.run(
            [DOCKER, "run", "--rm", "--env-file", str(env_file), "img"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    return None if created else proc.stderr.strip()


def kubectl_configmap_data(env_file: Path, name: str = "sglang-champion") -> dict[str, str]:
    """The data of `kubectl create configmap NAME --from-env-file=FILE` (client-side dry run, no cluster)."""
    assert KUBECTL is not None
    proc = subprocess.run(
        [KUBECTL, "create", "configmap", name, f"--from-env-file={env_file}", "--dry-run=client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(env_file.parent)},
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout).get("data", {}))
