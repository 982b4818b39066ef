"""Issue 22, defects 1, 2 and 5: an SGLang server on CPU can be described by an experiment, the SGLang
variables a user needs reach it, secrets are still refused, and what cannot run on CPU is refused with
the reason before any launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.config import render
from orchestrator.errors import SpecError
from orchestrator.search import space as sp


def cpu_experiment(tmp_path: Path, **server: Any) -> dict[str, Any]:
    """The real tier's shape: engine sglang, device cpu, TP 1, a space with only NCCL knobs."""
    space = tmp_path / "nccl-proto.yaml"
    space.write_text("name: nccl-proto\nparams:\n  NCCL_PROTO: {choices: [null, LL]}\n")
    env = {"SGLANG_USE_CPU_ENGINE": "1", **server.pop("env", {})}
    data = demo_experiment(
        name="cpu",
        engine="sglang",
        search_space=[str(space)],
        server={"model": "/models/tiny-llama", "draft_model": None, "tp": 1, "device": "cpu", **server},
        promotion={"explain": False},
    )
    data["server"]["env"] = env  # not the demo's (its device timer is the GPU's)
    return data


@pytest.mark.parametrize(
    "name, value",
    [
        ("SGLANG_USE_CPU_ENGINE", "1"),
        ("SGLANG_CPU_OMP_THREADS_BIND", "0-1"),
        ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "1"),
        ("SGLANG_PCIE_IPC_MAX_NUMEL", 4194304),
        ("SGLANG_NCCL_SO_PATH", "/opt/nccl/lib/libnccl.so.2"),
    ],
)
def test_the_sglang_settings_a_user_needs_reach_the_server(tmp_path: Path, name: str, value: str | int) -> None:
    spec = spec_mod.load(write_experiment(tmp_path, cpu_experiment(tmp_path, env={name: value})))
    plan_env = render.tuned_env(spec, sp.baseline_params(spec.space))
    assert plan_env[name] == str(value)


@pytest.mark.parametrize("name", ["SGLANG_API_KEY", "HF_TOKEN", "SGLANG_ADMIN_API_KEY"])
def test_secrets_are_still_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(SpecError, match=f"server.env.{name}: looks like a secret"):
        spec_mod.load(write_experiment(tmp_path, cpu_experiment(tmp_path, env={name: "s3cr3t-value-123"})))


def test_a_cpu_server_is_launched_with_sglangs_cpu_device(tmp_path: Path) -> None:
    spec = spec_mod.load(write_experiment(tmp_path, cpu_experiment(tmp_path)))
    flags = render.launch_flags(spec, sp.baseline_params(spec.space), port=30000)
    assert flags["--device"] == "cpu" and flags["--tp-size"] == "1"


CPU_MISTAKES = [
    (
        "the CPU engine's switch is missing",
        dict(env={"SGLANG_USE_CPU_ENGINE": "0"}),
        "server.device: cpu: SGLang 0.5.23 takes its CPU paths only with SGLANG_USE_CPU_ENGINE=1 "
        '(sglang/srt/utils/common.py::is_cpu); add server.env.SGLANG_USE_CPU_ENGINE: "1"',
    ),
    (
        "the device timer needs CUDA",
        dict(env={"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}),
        "server.device: cpu: SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 (server.env) times forward passes with CUDA "
        'events, and SGLang exits at start-up without a GPU ("Found no NVIDIA driver"); remove it (verify_ms then '
        "comes from the log and the request timings)",
    ),
    (
        "--device is the sweep's own",
        dict(flags={"device": "cuda"}),
        "server.flags.device: set by the sweep itself from server.device; remove it from server.flags",
    ),
]


@pytest.mark.parametrize("server, message", [c[1:] for c in CPU_MISTAKES], ids=[c[0] for c in CPU_MISTAKES])
def test_what_cannot_run_on_cpu_is_refused_before_any_launch(tmp_path: Path, server: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_mod.load(write_experiment(tmp_path, cpu_experiment(tmp_path, **server)))
    assert str(err.value).endswith(message), str(err.value)


def test_the_simulator_models_gpu_hosts_only(tmp_path: Path) -> None:
    data = demo_experiment(name="simcpu", server={"device": "cpu"})
    with pytest.raises(SpecError, match="server.device: cpu: the simulator models GPU hosts only"):
        spec_mod.load(write_experiment(tmp_path, data))
