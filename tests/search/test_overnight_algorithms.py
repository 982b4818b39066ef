"""bench/overnight.py with the speculative algorithm in the space (--space algorithms, issue 35): the night's
experiment searches search_spaces/speculation.yaml, and a two-stage night at one stream on the PCIe profile
deploys DFLASH, the algorithm whose best point is the optimum there (docs/benchmarks.md, "Speculation
algorithms in the night"; tuning seed 0)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import overnight  # noqa: E402

ALGORITHMS = overnight.World("pcie-rtxpro6000-x8", space="algorithms")


def test_the_algorithms_space_searches_each_algorithm_with_its_own_knobs(tmp_path: Path) -> None:
    spec = overnight.experiment(ALGORITHMS, "two-stage", 0, "plain", tmp_path)
    params = spec.space.params
    assert params["speculative_algorithm"].choices == (None, "EAGLE3", "DFLASH", "NGRAM")
    assert params["speculative_dflash_block_size"].when == {"speculative_algorithm": "DFLASH"}
    assert "speculative_ngram_max_bfs_breadth" in params
    eagle3_only = overnight.experiment(overnight.World("pcie-rtxpro6000-x8"), "two-stage", 0, "plain", tmp_path)
    assert eagle3_only.space.params["speculative_algorithm"].choices == (None, "EAGLE3")
    assert overnight.world_name(ALGORITHMS).endswith(", space algorithms")


def test_a_two_stage_night_at_one_stream_deploys_dflash() -> None:
    night = overnight.night(ALGORITHMS, "two-stage", 0, "plain", optimum=122.16)
    assert night.verdict == "promoted", night.verdict_text
    assert night.deployed_algorithm == "DFLASH"
    assert night.champion_true >= 0.98 * 122.16  # the simulator's truth: DFLASH at block 8 is the optimum
