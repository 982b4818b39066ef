"""Issue 22, defect 1: `sweep run` refused `engine: sglang` on a host without GPUs ("the Ray cluster has
0 GPUs ... lower server.tp", impossible at tp 1). A server on CPU (server.device cpu) holds no GPUs."""

from __future__ import annotations

from pathlib import Path

import ray
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.execute.ray_actor import RayExecutor


def test_a_cpu_server_runs_on_a_ray_cluster_without_gpus(tmp_path: Path) -> None:
    space = tmp_path / "nccl-proto.yaml"
    space.write_text("name: nccl-proto\nparams:\n  NCCL_PROTO: {choices: [null, LL]}\n")
    data = demo_experiment(
        name="cpu",
        engine="sglang",
        search_space=[str(space)],
        promotion={"explain": False},
        server={"model": "/models/tiny-llama", "draft_model": None, "tp": 2, "device": "cpu"},
    )
    data["server"]["env"] = {"SGLANG_USE_CPU_ENGINE": "1"}
    spec = spec_mod.load(write_experiment(tmp_path, data))
    executor = RayExecutor.for_sweep(spec, None)
    try:
        info = executor.start()
        assert ray.cluster_resources().get("GPU", 0.0) == 0.0
        assert (info.gpus, info.slots, executor.idle()) == (0.0, spec.budget.concurrent_trials, 2)
    finally:
        executor.close()
