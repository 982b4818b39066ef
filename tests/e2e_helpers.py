"""Shared set-up for the end-to-end tests: small experiments derived from the demo, the CLI as a subprocess."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SWEEP = [sys.executable, "-m", "orchestrator.cli"]


def demo_experiment(**overrides: Any) -> dict[str, Any]:
    """experiments/demo.yaml as a dict, made small and fast, with nested `overrides` merged in."""
    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    data["search_space"] = [str(REPO / "search_spaces" / "nccl.yaml"), str(REPO / "search_spaces" / "eagle3.yaml")]
    data["benchmark"].update(requests=2, output_len=32, input_len=16, warmup_requests=1, stall_timeout_s=5)
    data["budget"].update(trials=6, concurrent_trials=2, trial_timeout_s=60)
    data["promotion"].update(confirm_repeats=2, min_gain=0.0)
    data["server"]["startup_timeout_s"] = 15
    return _merge(data, overrides)


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def write_experiment(tmp_path: Path, data: dict[str, Any], name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
          ) -> subprocess.CompletedProcess:
    """Run the `sweep` CLI as a real process (argv list, output captured)."""
    return subprocess.run([*SWEEP, *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {}), "COLUMNS": "200"})
