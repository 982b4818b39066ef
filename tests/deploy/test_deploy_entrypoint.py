"""The worker image's entrypoint, run as a real process: from each way a deployment delivers the export
(docker --env-file, a mounted file, a Kubernetes ConfigMap through envFrom, the shell env file) SGLang's
interpreter (a recorder here) receives the exact argv and environment, with the deploy-time overrides."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from deploy_helpers import (
    DOCKER,
    DRAFT,
    KUBECTL,
    PRODUCTION_ARGS,
    PRODUCTION_ENV,
    REPO,
    docker_env_file_environment,
    kubectl_configmap_data,
    make_config,
    run_entrypoint,
    sglang_argv,
)

from orchestrator.results import export, formats

MODEL = "/models/Kimi K2.5"
# What the container brings besides the configuration: a stray NCCL setting, the image's NVLS guard.
CONTAINER = {"NCCL_ALGO": "Tree", "NCCL_NVLS_ENABLE": "0", "MODEL_PATH": MODEL, "PORT": "30001"}


def _write(tmp_path: Path, fmt: str, **kw: bool) -> Path:
    path = tmp_path / "champion.env"
    path.write_text(formats.render_for(make_config(), fmt, **kw), newline="")
    return path


def _check(proc, record, *, extra: tuple[str, ...] = ()) -> None:
    assert proc.returncode == 0, proc.stderr
    assert record["argv"] == sglang_argv(MODEL, *PRODUCTION_ARGS, *extra, port="30001")
    nccl_and_sglang = {
        k: v for k, v in record["env"].items() if k.startswith(("NCCL_", "SGLANG_")) and k != "SGLANG_PYTHON"
    }
    # Exactly the measured environment: the stray NCCL_ALGO is gone, the NVLS guard stays, no carrier leaks.
    assert nccl_and_sglang == {**PRODUCTION_ENV, "NCCL_NVLS_ENABLE": "0"}
    assert "dropped NCCL variables the configuration does not set: NCCL_ALGO" in proc.stderr


def _docker_environment(env_file: Path) -> dict[str, str]:
    if DOCKER is not None:
        return docker_env_file_environment(env_file)
    pytest.skip("docker's CLI is not installed (it reads --env-file itself)")


def test_docker_run_env_file(tmp_path: Path) -> None:
    """`docker run --env-file champion.env`: docker reads the file, the entrypoint gets an environment."""
    delivered = _docker_environment(_write(tmp_path, "docker-env"))
    proc, record = run_entrypoint(tmp_path, {**CONTAINER, **delivered}, "--log-level", "info")
    _check(proc, record, extra=("--log-level", "info"))
    assert "configuration from the environment" in proc.stderr


def test_mounted_docker_env_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "docker-env")
    proc, record = run_entrypoint(tmp_path, {**CONTAINER, "CHAMPION_ENV": str(path)})
    _check(proc, record)
    assert f"configuration from {path} (docker-env format)" in proc.stderr


def test_mounted_shell_env_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "env")
    proc, record = run_entrypoint(tmp_path, {**CONTAINER, "CHAMPION_ENV": str(path)})
    _check(proc, record)
    assert "(env format)" in proc.stderr


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubernetes_configmap_through_env_from(tmp_path: Path) -> None:
    """`kubectl create configmap --from-env-file` + `envFrom`: the ConfigMap's data becomes the environment."""
    data = kubectl_configmap_data(_write(tmp_path, "docker-env"))
    assert data == formats.parse_k8s(formats.render_for(make_config(), "k8s"))
    proc, record = run_entrypoint(tmp_path, {**CONTAINER, **data})
    _check(proc, record)


def test_overrides_draft_model_host_and_port(tmp_path: Path) -> None:
    path = _write(tmp_path, "docker-env")
    proc, record = run_entrypoint(
        tmp_path,
        {
            **CONTAINER,
            "CHAMPION_ENV": str(path),
            "PORT": "8000",
            "HOST": "127.0.0.1",
            "DRAFT_MODEL_PATH": "/deploy/draft",
        },
    )
    assert proc.returncode == 0, proc.stderr
    args = ["/deploy/draft" if a == DRAFT else a for a in PRODUCTION_ARGS]
    assert record["argv"] == sglang_argv(MODEL, *args, host="127.0.0.1", port="8000")


def test_draft_override_without_a_draft_model_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "champion.env"
    path.write_text(formats.render_for(make_config(args=["--tp-size", "8"]), "docker-env"))
    proc, record = run_entrypoint(
        tmp_path, {"MODEL_PATH": MODEL, "CHAMPION_ENV": str(path), "DRAFT_MODEL_PATH": "/deploy/draft"}
    )
    assert proc.returncode == 0, proc.stderr
    assert record["argv"] == sglang_argv(MODEL, "--tp-size", "8")
    assert "DRAFT_MODEL_PATH ignored: this configuration runs no draft model" in proc.stderr


def test_observation_kept_when_exported_with_keep_observation(tmp_path: Path) -> None:
    path = _write(tmp_path, "docker-env", keep_observation=True)
    proc, record = run_entrypoint(tmp_path, {"MODEL_PATH": MODEL, "CHAMPION_ENV": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert record["env"]["NCCL_DEBUG"] == "INFO" and "--enable-metrics" in record["argv"]


def test_the_shell_shim_execs_the_python_entrypoint(tmp_path: Path) -> None:
    path = _write(tmp_path, "docker-env")
    proc, record = run_entrypoint(
        tmp_path,
        {**CONTAINER, "CHAMPION_ENV": str(path), "SERVE_CHAMPION_PYTHON": sys.executable},
        command=["sh", str(REPO / "docker" / "entrypoint.sh")],
    )
    _check(proc, record)


def _bad(tmp_path: Path, text: str | None, **environ: str) -> str:
    env = {"MODEL_PATH": MODEL, **environ}
    if text is not None:
        path = tmp_path / "champion.env"
        path.write_text(text)
        env.setdefault("CHAMPION_ENV", str(path))
    proc, record = run_entrypoint(tmp_path, env)
    assert (proc.returncode, record) == (2, None), proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve-champion: "), proc.stderr
    return lines[0]


GOOD = formats.render_for(make_config(), "docker-env")


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        (GOOD, {"MODEL_PATH": ""}, "MODEL_PATH is not set: give the target model directory"),
        (GOOD, {"PORT": "http"}, "PORT must be a port number (1-65535), but got 'http'"),
        (GOOD, {"PORT": "70000"}, "PORT must be a port number (1-65535), but got '70000'"),
        (
            None,
            {"CHAMPION_ENV": "/nonexistent/champion.env"},
            "cannot read the champion env file /nonexistent/champion.env (No such file or directory)",
        ),
        (GOOD, {"CHAMPION_FORMAT": "yaml"}, "CHAMPION_FORMAT must be docker-env or env, but got 'yaml'"),
        (
            "NCCL_PROTO=LL\n",
            {},
            "the file sets neither SGLANG_SWEEP_ARGS_JSON (docker-env format) nor SGLANG_SWEEP_ARGS",
        ),
        (GOOD + "NCCL_ALGO=Tree\n", {}, "NCCL_ALGO set but not listed in SGLANG_SWEEP_ENV_NAMES"),
        (
            'SGLANG_SWEEP_ENV_NAMES=\nSGLANG_SWEEP_ARGS_JSON=\'["--tp-size","8"]\'\n',
            {},
            "SGLANG_SWEEP_ARGS_JSON is not JSON",
        ),
        ('SGLANG_SWEEP_ARGS="$(touch pwned)"\n', {}, "would be interpreted by the shell"),
        (
            'SGLANG_SWEEP_ENV_NAMES=\nSGLANG_SWEEP_ARGS_JSON=["--port","1"]\n',
            {},
            "sets --port, which the entrypoint sets from PORT; remove it there",
        ),
        (
            'SGLANG_SWEEP_ENV_NAMES=\nSGLANG_SWEEP_ARGS_JSON=["--model-path=/x"]\n',
            {},
            "sets --model-path, which the entrypoint sets from MODEL_PATH",
        ),
        (
            'SGLANG_SWEEP_ENV_NAMES=\nSGLANG_SWEEP_ARGS_JSON=["--speculative-draft-model-path"]\n',
            {"DRAFT_MODEL_PATH": "/d"},
            "--speculative-draft-model-path has no value",
        ),
        (
            GOOD,
            {"SGLANG_PYTHON": "/nonexistent/python"},
            "cannot start /nonexistent/python (No such file or directory, or not executable)",
        ),
    ],
)
def test_bad_input_gets_one_message_and_exit_2(
    tmp_path: Path, text: str | None, environ: dict[str, str], message: str
) -> None:
    assert message in _bad(tmp_path, text, **environ)


def test_no_configuration_anywhere(tmp_path: Path) -> None:
    # No CHAMPION_ENV, no /config/champion.env in this test machine, no carrier in the environment.
    assert not Path("/config/champion.env").exists()
    line = _bad(tmp_path, None)
    assert "cannot read the champion env file /config/champion.env" in line
    assert "docker run --env-file" in line


def test_shell_env_format_through_docker_env_file_is_explained(tmp_path: Path) -> None:
    """The issue's case: the shell format given to docker --env-file keeps its quotes; say so, run nothing."""
    delivered = _docker_environment(_write(tmp_path, "env"))
    assert delivered["SGLANG_SWEEP_ARGS"].startswith("'")
    line = _bad(tmp_path, None, **delivered)
    assert "the environment carries SGLANG_SWEEP_ARGS, the shell env format" in line
    assert "sweep export --format docker-env" in line


def test_environment_configuration_must_be_whole(tmp_path: Path) -> None:
    delivered = formats.parse_docker_env(GOOD)
    del delivered["NCCL_PROTO"]
    line = _bad(tmp_path, None, **delivered)
    assert "SGLANG_SWEEP_ENV_NAMES names NCCL_PROTO, but it is not set" in line


def test_shell_env_file_keeps_working_as_exported_by_export(tmp_path: Path) -> None:
    """The env format as results.export writes it (observation included) is read with export's parser."""
    path = tmp_path / "champion.env"
    path.write_text(export.render(make_config(), "env"))
    proc, record = run_entrypoint(tmp_path, {"MODEL_PATH": MODEL, "CHAMPION_ENV": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert record["argv"] == sglang_argv(MODEL, *make_config().sglang_args)


HOSTILE = {"PATH": "EVIL", "LD_PRELOAD": "/tmp/evil.so", "PYTHONPATH": "/tmp/evil-site", "NCCL_PROTO": "LL"}


def _hostile_file(tmp_path: Path, fmt: str) -> tuple[Path, Path]:
    """A configuration file that sets PATH to a folder holding a `python3` that leaves a mark when run."""
    evil = tmp_path / "evil"
    evil.mkdir()
    mark = tmp_path / "evil-ran"
    (evil / "python3").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (evil / "python3").chmod(0o755)
    env = {k: str(evil) if v == "EVIL" else v for k, v in HOSTILE.items()}
    path = tmp_path / "champion.env"
    if fmt == "env":
        path.write_text("".join(f"{k}={v}\n" for k, v in env.items()) + "SGLANG_SWEEP_ARGS=--tp-size\n")
    else:
        path.write_text(
            "".join(f"{k}={v}\n" for k, v in env.items())
            + f'{formats.ENV_NAMES_VAR}={",".join(env)}\n{formats.ARGS_JSON_VAR}=["--tp-size"]\n'
        )
    return path, mark


@pytest.mark.parametrize("fmt", ["env", "docker-env"])
def test_names_off_the_allow_list_are_refused_with_one_message(tmp_path: Path, fmt: str) -> None:
    """The issue's file: PATH, LD_PRELOAD and PYTHONPATH never reach SGLang and PATH picks no interpreter."""
    path, mark = _hostile_file(tmp_path, fmt)
    line = _bad(tmp_path, None, CHAMPION_ENV=str(path), SGLANG_PYTHON="python3")
    assert f"{path} ({fmt} format) sets LD_PRELOAD, PATH, PYTHONPATH, which sweep export never writes" in line
    assert "NCCL_PROTO" not in line and "remove those lines" in line
    assert not mark.exists()


def test_names_off_the_allow_list_are_refused_from_the_environment(tmp_path: Path) -> None:
    """docker run --env-file: the listed names are the configuration's, and PATH among them is refused."""
    path, mark = _hostile_file(tmp_path, "docker-env")
    # ld.so itself reads LD_PRELOAD of this process: an empty value keeps its warning out of the output.
    delivered = {**formats.parse_docker_env(path.read_text()), "LD_PRELOAD": ""}
    line = _bad(tmp_path, None, **{**delivered, "PATH": os.environ["PATH"]}, SGLANG_PYTHON="python3")
    assert "the environment (docker-env variables) sets LD_PRELOAD, PATH, PYTHONPATH" in line
    assert not mark.exists()


def test_allow_listed_names_besides_nccl_and_sglang_still_pass(tmp_path: Path) -> None:
    path = tmp_path / "champion.env"
    path.write_text(formats.render_for(make_config(env={"OMP_NUM_THREADS": "4", "NCCL_PROTO": "LL"}), "docker-env"))
    proc, record = run_entrypoint(tmp_path, {"MODEL_PATH": MODEL, "CHAMPION_ENV": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert record["env"]["OMP_NUM_THREADS"] == "4"
