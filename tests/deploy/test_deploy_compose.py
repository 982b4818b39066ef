"""docker/compose.yaml: accepted by a real compose implementation's `config`, consistent with the files it
names, and each service's own command exercised natively (the MLflow server with the compose arguments,
the Ray head's driver script with stand-ins for `ray` and `sweep`)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from deploy_helpers import REPO
from ports import free_port

DOCKER_DIR = REPO / "docker"
COMPOSE = DOCKER_DIR / "compose.yaml"
PODMAN_COMPOSE = shutil.which("podman-compose") or (
    str(Path(sys.executable).parent / "podman-compose")
    if (Path(sys.executable).parent / "podman-compose").exists()
    else None
)


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose's `${NAME:-default}` and `${NAME:?message}` (the only forms the file uses)."""

    def one(m: re.Match[str]) -> str:
        name, op, word = m.group(1), m.group(2), m.group(3)
        if environ.get(name):
            return environ[name]
        if op == ":?":
            raise ValueError(word)
        return word

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-|:\?)([^}]*)\}", one, value)


@pytest.mark.skipif(PODMAN_COMPOSE is None, reason="podman-compose is not installed (pip install podman-compose)")
def test_podman_compose_config_accepts_the_file() -> None:
    env = {**os.environ, "POSTGRES_PASSWORD": "s3cret"}
    proc = subprocess.run(
        [PODMAN_COMPOSE, "--dry-run", "-f", str(COMPOSE), "config"],
        cwd=DOCKER_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert set(resolved["services"]) == {"postgres", "mlflow", "ray-head"}
    assert resolved["services"]["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"] == (
        "postgresql://sweep:s3cret@postgres:5432/mlflow"
    )
    head = resolved["services"]["ray-head"]["environment"]
    assert head["SWEEP_OPTUNA_STORAGE"] == "postgresql://sweep:s3cret@postgres:5432/optuna"
    assert head["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert set(resolved["volumes"]) == {"postgres-data", "mlflow-artifacts", "runs"}


@pytest.mark.skipif(PODMAN_COMPOSE is None, reason="podman-compose is not installed (pip install podman-compose)")
def test_podman_compose_config_asks_for_the_password() -> None:
    env = {k: v for k, v in os.environ.items() if k != "POSTGRES_PASSWORD"}
    proc = subprocess.run(
        [PODMAN_COMPOSE, "--dry-run", "-f", str(COMPOSE), "config"],
        cwd=DOCKER_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "set POSTGRES_PASSWORD" in proc.stderr


def test_every_file_the_stack_names_exists() -> None:
    compose = _compose()
    for name, service in compose["services"].items():
        build = service.get("build")
        if build:
            context = (DOCKER_DIR / build["context"]).resolve()
            assert (context / build["dockerfile"]).is_file(), name
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (DOCKER_DIR / source).exists(), f"{name}: {source}"
            elif not source.startswith("/"):
                assert source in compose["volumes"], f"{name}: named volume {source} is not declared"
        for dependency in service.get("depends_on", {}):
            assert dependency in compose["services"]
    worker = (DOCKER_DIR / "Dockerfile.worker").read_text()
    assert "COPY docker/sweep-on-ray-head.sh ./docker/" in worker
    assert compose["services"]["ray-head"]["entrypoint"] == ["/opt/sglang-sweep/docker/sweep-on-ray-head.sh"]


def test_mlflow_proxies_artifacts_and_allows_its_service_name() -> None:
    command = _compose()["services"]["mlflow"]["command"]
    assert "--serve-artifacts" in command and "--default-artifact-root" not in command
    hosts = command[command.index("--allowed-hosts") + 1].split(",")
    assert "mlflow:5000" in hosts


def test_driver_runs_inside_the_ray_head(tmp_path: Path) -> None:
    """The ray-head service's script with stand-ins for `ray` and `sweep`: the head starts, then the sweep
    joins it with --ray-address auto; run again over the same work directory, it resumes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    for tool in ("ray", "sweep"):
        stub = bin_dir / tool
        stub.write_text(
            textwrap.dedent(f"""\
            #!{sys.executable}
            import json, os, sys
            with open({str(calls)!r}, "a") as f:
                f.write(json.dumps([{tool!r}, *sys.argv[1:]]) + "\\n")
            if {tool!r} == "ray":  # the environment the head's workers (and so the servers) start with
                with open({str(calls)!r} + ".nice", "w") as f:
                    f.write(os.environ.get("RAY_worker_niceness", "unset"))
            """)
        )
        stub.chmod(0o755)
    service_env = _compose()["services"]["ray-head"]["environment"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "POSTGRES_PASSWORD": "x"}
    env.update({k: _interpolate(str(v), env) for k, v in service_env.items()})
    script = str(DOCKER_DIR / "sweep-on-ray-head.sh")

    def run() -> list[list[str]]:
        calls.unlink(missing_ok=True)
        proc = subprocess.run([script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [yaml.safe_load(line) for line in calls.read_text().splitlines()]

    first = run()
    assert first[0] == [
        "ray",
        "start",
        "--head",
        "--port=6379",
        "--num-gpus=8",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    assert Path(f"{calls}.nice").read_text() == "0"  # servers at a deployment's niceness, not Ray's 15
    sweep = [
        "sweep",
        "run",
        "experiments/kimi-k2.5-tp8.yaml",
        "--workdir",
        "runs/kimi-k2.5-tp8",
        "--timeout",
        "8h",
        "--ray-address",
        "auto",
    ]
    assert first[1] == sweep
    (tmp_path / "runs" / "kimi-k2.5-tp8").mkdir(parents=True)
    (tmp_path / "runs" / "kimi-k2.5-tp8" / "sweep.json").write_text("{}")
    assert run()[1] == [*sweep, "--resume"]


@pytest.fixture
def mlflow_from_compose(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`mlflow server` with the compose service's command and environment, but a sqlite backend, loopback
    and a free port (everything else read from the compose file, so it cannot drift)."""
    service = _compose()["services"]["mlflow"]
    command = list(service["command"])
    port = free_port()
    artifacts = tmp_path / "mlartifacts"
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port)), ("--artifacts-destination", str(artifacts))):
        command[command.index(flag) + 1] = value
    assert command[0] == "mlflow"
    command[0] = str(Path(sys.executable).parent / "mlflow")
    env = {
        **os.environ,
        **{k: str(v) for k, v in service["environment"].items()},
        "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(tmp_path / "mlflow.log", "wb")  # closed below, after the server
    proc = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "mlflow.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "mlflow server not ready in 120 s"
            time.sleep(0.5)
        yield url, artifacts
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                continue
        log.close()


LOG_ARTIFACT = """
import mlflow, sys
client = mlflow.MlflowClient(tracking_uri=sys.argv[1])
experiment = client.create_experiment("compose-check")
run = client.create_run(experiment)
with open(sys.argv[2], "w") as f:
    f.write("NCCL_PROTO=LL\\n")
client.log_artifact(run.info.run_id, sys.argv[2], "serving_config")
print(run.info.run_id, client.get_run(run.info.run_id).info.artifact_uri, experiment)
"""

READ_ARTIFACT = """
import mlflow, sys
path = mlflow.artifacts.download_artifacts(run_id=sys.argv[2], artifact_path="serving_config/champion.env",
                                           tracking_uri=sys.argv[1], dst_path=sys.argv[3])
print(open(path).read(), end="")
"""


@pytest.mark.slow
def test_mlflow_service_accepts_its_host_name_and_proxies_artifacts(mlflow_from_compose, tmp_path: Path) -> None:
    url, artifacts = mlflow_from_compose
    search = "/api/2.0/mlflow/experiments/search?max_results=1"
    # The driver container reaches the server as http://mlflow:5000: that Host header must pass.
    assert httpx.get(url + search, headers={"Host": "mlflow:5000"}).status_code == 200
    assert httpx.get(url + search, headers={"Host": "evil.example:5000"}).status_code == 403

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    logged = subprocess.run(
        [sys.executable, "-c", LOG_ARTIFACT, url, str(tmp_path / "champion.env")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert logged.returncode == 0, logged.stderr
    run_id, artifact_uri, experiment_id = logged.stdout.split()
    # Proxied: the run's artifacts live behind the server, not at a path of the logging machine.
    assert artifact_uri.startswith("mlflow-artifacts:/"), artifact_uri
    stored = list(artifacts.rglob("champion.env"))
    assert [p.read_text() for p in stored] == ["NCCL_PROTO=LL\n"]

    # Read back through the proxy, from another process, and over HTTP with the service's host name.
    read = subprocess.run(
        [sys.executable, "-c", READ_ARTIFACT, url, run_id, str(tmp_path / "dl")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout == "NCCL_PROTO=LL\n"
    relative = stored[0].relative_to(artifacts).as_posix()
    assert relative.startswith(f"{experiment_id}/")
    raw = httpx.get(f"{url}/api/2.0/mlflow-artifacts/artifacts/{relative}", headers={"Host": "mlflow:5000"})
    assert raw.status_code == 200 and raw.text == "NCCL_PROTO=LL\n"
