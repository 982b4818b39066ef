"""Experiments for the probe tests: the demo's engine, server and spaces, only the sections a probe reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.experiment import SweepSpec, load

REPO = Path(__file__).resolve().parents[2]


def write_spec(tmp_path: Path, *, space: dict[str, Any] | None = None, **sections: Any) -> SweepSpec:
    """A probe-sized experiment over search_spaces/nccl.yaml + eagle3.yaml (or `space` alone), with
    top-level sections updated (a mapping is merged into the section, anything else replaces it)."""
    data: dict[str, Any] = {
        "name": "probe-test",
        "engine": "simulator",
        "server": {
            "model": "moonshotai/Kimi-K2.5",
            "draft_model": "lightseekorg/kimi-k2.5-eagle3",
            "tp": 8,
            "env": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"},
        },
        "simulator": {"hardware_profile": "pcie-rtxpro6000-x8", "model_profile": "kimi-k2.5", "noise": 0.02},
        "search_space": [str(REPO / "search_spaces" / "nccl.yaml"), str(REPO / "search_spaces" / "eagle3.yaml")],
        "benchmark": {"requests": 3, "concurrency": 1, "input_len": 64, "output_len": 64},
        "sampler": {"seed": 1},
        "promotion": {"model_name": "probe-test"},
    }
    if space is not None:
        (tmp_path / "space.yaml").write_text(yaml.safe_dump({"name": "s", "params": space}))
        data["search_space"] = ["space.yaml"]
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load(path)
