"""The adaptive-or-fixed figures in words: which wins at each level, read as a user reads them."""

from __future__ import annotations

from orchestrator.results import figures
from orchestrator.verdict import arms, deployed


def _level(c: int, gain: float, low: float, high: float) -> figures.LevelGain:
    base = figures.Interval(gain=0.2, low=0.1, high=0.3, rounds=3, a_median=1.2, b_median=1.0)
    steps = figures.StepsGain(
        fixed="fixed 3 steps",
        interval=figures.Interval(gain=gain, low=low, high=high, rounds=3, a_median=1 + gain, b_median=1.0),
    )
    return figures.LevelGain(concurrency=c, interval=base, steps=steps)


def test_the_sentence_names_the_winner_per_level():
    text = deployed.stops_paying(
        [_level(32, 0.04, 0.01, 0.07), _level(1, -0.03, -0.05, -0.01), _level(8, 0.0, -0.02, 0.02)], "EAGLE-3"
    )
    assert text.endswith(
        "Adaptive steps (--speculative-adaptive) against fixed 3 steps: "
        "x0.97 [x0.95, x0.99] at 1 stream (fixed 3 steps wins), "
        "x1.00 [x0.98, x1.02] at 8 streams (no significant difference), "
        "x1.04 [x1.01, x1.07] at 32 streams (adaptive wins)"
    )


def test_the_counterpart_is_the_other_kind_of_step_control():
    fixed = {
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 5,
        "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 8,
        "NCCL_PROTO": "LL",
    }
    kind, params, words = arms.steps_counterpart(fixed, best_fixed=None) or ("", {}, "")
    assert (kind, words) == ("adaptive", "fixed 5 steps x top-k 2")
    # 5 is a candidate of SGLang 0.5.23's default adaptive slots (union 0, 1, 3, 5, 7): adaptive starts there
    assert params == {
        **fixed,
        "speculative_adaptive": True,
        "speculative_num_steps": 5,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": None,
    }
    four = arms.steps_counterpart({**fixed, "speculative_num_steps": 4}, best_fixed=None)
    assert four is not None and four[1]["speculative_num_steps"] == 3  # nearest candidate, ties low
    adaptive = {
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_adaptive": True,
    }
    kind, params, words = arms.steps_counterpart(adaptive, best_fixed=2) or ("", {}, "")
    assert (kind, words, params["speculative_num_steps"], params["speculative_adaptive"]) == (
        "fixed",
        "fixed 2 steps",
        2,
        None,
    )
    assert arms.steps_counterpart({"speculative_algorithm": None}, best_fixed=3) is None
