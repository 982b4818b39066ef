"""The deployment side: docker/entrypoint.sh loads an exported env file and starts SGLang with exactly
the measured environment and flags (a stand-in interpreter records what it was given)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.records import ServingConfig
from orchestrator.results import export

ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh"

RECORDER = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items()
          if k.startswith(("NCCL_", "SGLANG_")) and k != "SGLANG_PYTHON"}}}}, open(os.environ["RECORD_TO"], "w"))
"""


def _config(env: dict[str, str], args: list[str]) -> ServingConfig:
    return ServingConfig(
        experiment="demo",
        trial_number=7,
        run_id="abc123",
        model_version="3",
        engine="sglang",
        sglang_version="0.5.23",
        params={},
        env=env,
        sglang_args=tuple(args),
        metrics={"decode_tok_s": 94.0},
        fingerprint_hash="f00d",
        created_at="2026-11-29T00:00:00+00:00",
    )


def _run(tmp_path: Path, config: ServingConfig, extra_env: dict[str, str] | None = None, *extra_args: str):
    env_file = tmp_path / "champion.env"
    env_file.write_text(export.render(config, "env"))
    recorder = tmp_path / "python"
    recorder.write_text(RECORDER.format(python=sys.executable))
    recorder.chmod(0o755)
    record = tmp_path / "record.json"
    env = {
        "PATH": os.environ["PATH"],
        "SERVE_CHAMPION_PYTHON": sys.executable,  # the image's python3 -I: this one has the package
        "CHAMPION_ENV": str(env_file),
        "MODEL_PATH": "/models/Kimi K2.5",
        "SGLANG_PYTHON": str(recorder),
        "RECORD_TO": str(record),
        "PORT": "30001",
        **(extra_env or {}),
    }
    proc = subprocess.run(["bash", str(ENTRYPOINT), *extra_args], env=env, capture_output=True, text=True, timeout=30)
    return proc, (json.loads(record.read_text()) if record.exists() else None)


def test_entrypoint_starts_sglang_with_the_exported_env_and_flags(tmp_path):
    args = [
        "--tp-size",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/models/draft with space",
        "--speculative-num-steps",
        "2",
        "--disable-custom-all-reduce",
    ]
    config = _config({"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "16777216", "NCCL_MIN_NCHANNELS": "0"}, args)
    proc, record = _run(tmp_path, config, {"NCCL_ALGO": "Tree"}, "--enable-metrics")
    assert proc.returncode == 0, proc.stderr
    assert record["argv"] == [
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/Kimi K2.5",
        "--host",
        "0.0.0.0",
        "--port",
        "30001",
        *args,
        "--enable-metrics",
    ]
    # Exactly the measured NCCL environment: the stray NCCL_ALGO from the container is gone.
    assert record["env"] == {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "16777216", "NCCL_MIN_NCHANNELS": "0"}


def test_entrypoint_refuses_a_missing_env_file(tmp_path):
    proc = subprocess.run(
        ["bash", str(ENTRYPOINT)],
        env={
            "PATH": os.environ["PATH"],
            "SERVE_CHAMPION_PYTHON": sys.executable,
            "CHAMPION_ENV": str(tmp_path / "missing.env"),
            "MODEL_PATH": "/m",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "cannot read the champion env file" in proc.stderr


def test_entrypoint_refuses_path_ld_preload_and_pythonpath_from_the_file(tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "python3").write_text(f"#!/bin/sh\ntouch {tmp_path / 'evil-ran'}\n")
    (evil / "python3").chmod(0o755)
    env_file = tmp_path / "champion.env"
    env_file.write_text(f"PATH={evil}\nLD_PRELOAD=/x.so\nPYTHONPATH=/x\nNCCL_PROTO=LL\nSGLANG_SWEEP_ARGS=--tp-size\n")
    proc = subprocess.run(
        ["bash", str(ENTRYPOINT)],
        env={
            "PATH": os.environ["PATH"],
            "SERVE_CHAMPION_PYTHON": sys.executable,
            "CHAMPION_ENV": str(env_file),
            "MODEL_PATH": "/m",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.count("\n") == 1
        and "sets LD_PRELOAD, PATH, PYTHONPATH, which sweep export never writes" in proc.stderr
    )
    assert not (tmp_path / "evil-ran").exists()
