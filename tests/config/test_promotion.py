"""promotion: settings that can never decide are refused at load, with the fix; the old
`confirm_repeats` names what replaced it."""

from __future__ import annotations

import pytest
from e2e_helpers import REPO, demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SpecError


@pytest.mark.parametrize(
    "promotion, message",
    [
        (
            {"confirm_repeats": 2},
            "promotion: `confirm_repeats` was replaced by sequential confirmation: interleaved rounds "
            "until the evidence decides. Write `min_rounds: 3` and `max_rounds: 12` (at most that "
            "many rounds) instead, or `max_rounds: 0` to promote the search-phase champion unconfirmed",
        ),
        ({"min_rounds": 2}, "promotion.min_rounds: must be >= 3, but got 2"),
        (
            {"min_rounds": 5, "max_rounds": 4},
            "promotion: `min_rounds <= max_rounds` must hold (or max_rounds: 0 for no "
            "gate), but got (min_rounds=5, max_rounds=4)",
        ),
        ({"concurrency": [1, 8, 8]}, "promotion: `concurrency` lists a level twice: [1, 8, 8]"),
        ({"concurrency": [0]}, "promotion.concurrency.0: must be >= 1, but got 0"),
    ],
)
def test_settings_that_cannot_decide_are_refused(tmp_path, promotion, message):
    data = demo_experiment(name="promo")
    data["promotion"] = {"model_name": "m", **promotion}
    with pytest.raises(SpecError) as exc:
        spec_mod.load(write_experiment(tmp_path, data))
    assert str(exc.value).endswith(message)


def test_the_shipped_experiments_confirm_at_their_loads():
    demo = spec_mod.load(REPO / "experiments" / "demo.yaml").promotion
    assert (demo.min_rounds, demo.max_rounds, demo.concurrency, demo.explain) == (3, 12, (1, 8), True)
    kimi = spec_mod.load(REPO / "experiments" / "kimi-k2.5-tp8.yaml").promotion
    assert kimi.concurrency == (1, 8, 32) and kimi.min_gain == 0.02
