"""Experiments for the probe tests (helpers; conftest.py holds the fixture): experiments/demo.yaml with its spaces, or a small NCCL-only space."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.experiment import SweepSpec, load

REPO = Path(__file__).resolve().parents[2]


def write_spec(tmp_path: Path, *, space: dict[str, Any] | None = None, **sections: Any) -> SweepSpec:
    """demo.yaml (its two spaces, or `space` as the only one), with top-level sections updated."""
    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    data["search_space"] = [str(REPO / "search_spaces" / "nccl.yaml"), str(REPO / "search_spaces" / "eagle3.yaml")]
    if space is not None:
        (tmp_path / "space.yaml").write_text(yaml.safe_dump({"name": "s", "params": space}))
        data["search_space"] = ["space.yaml"]
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load(path)
