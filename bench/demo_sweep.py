"""The experiment the orchestration benchmarks run: the demo, with a given name and trial budget,
2 trials at a time, no promotion gate (it measures the search phase only)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def write_demo_experiment(path: Path, name: str, trials: int) -> Path:
    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    data["name"] = name
    data["search_space"] = [str(REPO / "search_spaces" / "nccl.yaml"), str(REPO / "search_spaces" / "eagle3.yaml")]
    data["budget"].update(trials=trials, concurrent_trials=2)
    data["promotion"]["max_rounds"] = 0
    path.write_text(yaml.safe_dump(data))
    return path
