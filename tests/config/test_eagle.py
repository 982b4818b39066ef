"""SGLang's EAGLE rules as values: which rule a point breaks, and the sentence a user reads."""

from __future__ import annotations

import pytest

from orchestrator.config.eagle import Infeasible, Rule, effective, infeasible


def point(
    algo: str | None = "EAGLE3", steps: int | None = None, topk: int | None = None, ndt: int | None = None
) -> dict[str, str | int | None]:
    return {
        "speculative_algorithm": algo,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": ndt,
    }


CASES = [
    ("no speculation", point(None), None),
    ("SGLang's own defaults", point(), None),
    ("a full, feasible tree", point(steps=3, topk=2, ndt=6), None),
    ("top-k 1 with draft tokens left out is filled in", point(steps=3, topk=1), None),
    (
        "knobs without an algorithm",
        point(None, steps=3),
        Infeasible(Rule.without_algorithm, "speculative_num_steps set without speculative_algorithm"),
    ),
    (
        "a partial set",
        point(steps=3, topk=2),
        Infeasible(
            Rule.all_or_none,
            "EAGLE needs steps, top-k and draft tokens all together or none (SGLang "
            "asserts); missing speculative_num_draft_tokens",
        ),
    ),
    (
        "top-k 1 with other draft tokens",
        point(steps=3, topk=1, ndt=8),
        Infeasible(
            Rule.topk_one, "top-k 1 forces draft tokens = steps + 1 = 4, but got 8 (SGLang would silently run 4)"
        ),
    ),
    (
        "more draft tokens than the tree holds",
        point(steps=3, topk=2, ndt=12),
        Infeasible(
            Rule.tree_capacity,
            "draft tokens - 1 <= topk + (steps - 1) * topk^2 must hold, but got 12 - 1 > 2 + 2*2^2 = 10",
        ),
    ),
]


@pytest.mark.parametrize(("params", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_infeasible(params, expected):
    assert infeasible(params) == expected
    if expected is not None:
        assert str(expected) == expected.detail


def test_effective_fills_draft_tokens_only_at_top_k_1():
    assert effective(point(steps=3, topk=1))["speculative_num_draft_tokens"] == 4
    assert effective(point(steps=3, topk=2))["speculative_num_draft_tokens"] is None
    assert effective(point(None, steps=3, topk=1))["speculative_num_draft_tokens"] is None
