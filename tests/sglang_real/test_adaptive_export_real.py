"""The adaptive-config export read by SGLang 0.5.23 itself: `sweep export --format adaptive-config`'s file
loaded with 0.5.23's own loader (sglang/srt/speculative/adaptive_spec_params.py `_load_adaptive_config`,
`resolve_candidate_steps_from_config`, `AdaptiveSpeculativeParams`) in the real-SGLang tier's venv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from orchestrator.results import adaptive_export as ax

LOAD = """
import json, sys
from sglang.srt.speculative.adaptive_spec_params import (
    AdaptiveSpeculativeParams, _load_adaptive_config, resolve_candidate_steps_from_config,
)
path = sys.argv[1]
_, slots = _load_adaptive_config(path)
union = resolve_candidate_steps_from_config(path)
params = AdaptiveSpeculativeParams(initial_steps=union[len(union) // 2], cfg_path=path)
routed = {bs: params._route(bs).candidate_steps for bs in (1, 2, 8, 31, 32, 100)}
print(json.dumps({"slots": {str(k): v["candidate_steps"] for k, v in slots.items()}, "union": union,
                  "routed": {str(k): v for k, v in routed.items()}}))
"""


def test_sglang_0_5_23_loads_the_exported_slots(sglang_python: str, tmp_path: Path) -> None:
    slots = ax.tune(
        [
            ax.LoadMeasurement(1, 0, 60.0, "trials/0001"),
            ax.LoadMeasurement(1, 3, 80.0, "trials/0002"),
            ax.LoadMeasurement(8, 1, 310.0, "trials/0003"),
            ax.LoadMeasurement(8, 0, 300.0, "trials/0004"),
            ax.LoadMeasurement(32, 0, 690.0, "trials/0005"),
            ax.LoadMeasurement(32, 1, 650.0, "trials/0006"),
        ]
    )
    path = tmp_path / "adaptive.json"
    path.write_text(ax.render(slots, source="test"))
    done = subprocess.run(
        [sglang_python, "-c", LOAD, str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["slots"] == {"1": [3], "8": [1], "32": [0]}
    assert got["union"] == [0, 1, 3]
    # 0.5.23 routes a running batch to the largest slot at or below it (no CUDA graphs here).
    assert got["routed"] == {"1": [3], "2": [3], "8": [1], "31": [1], "32": [0], "100": [0]}
