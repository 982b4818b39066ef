"""The search space: SGLang's EAGLE feasibility rules, enumeration with `when`, the census, the baseline."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from orchestrator.config import experiment as spec_mod
from orchestrator.config.experiment import SearchSpace
from orchestrator.search import space as sp

ROOT = Path(__file__).resolve().parents[2]
EAGLE = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def eagle(steps: int | None, topk: int | None, ndt: int | None, algo: str | None = "EAGLE3") -> dict[str, Any]:
    return {
        "speculative_algorithm": algo,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": ndt,
        "NCCL_PROTO": "LL",
    }


# (steps, topk, draft tokens, algorithm) -> None when SGLang runs it as asked, else a part of the reason
RULES = [
    # 1. all three or none
    ((None, None, None, None), None),
    ((None, None, None, "EAGLE3"), None),  # SGLang picks its per-model defaults
    ((3, None, None, "EAGLE3"), "missing speculative_eagle_topk, speculative_num_draft_tokens"),
    ((None, 2, 4, "EAGLE3"), "missing speculative_num_steps"),
    ((3, 2, None, "EAGLE3"), "missing speculative_num_draft_tokens"),
    ((3, 1, 4, None), "set without speculative_algorithm"),
    # 2. top-k 1 forces draft tokens = steps + 1
    ((1, 1, 2, "EAGLE3"), None),
    ((3, 1, 4, "EAGLE3"), None),
    ((6, 1, 7, "EAGLE3"), None),
    ((3, 1, 8, "EAGLE3"), "top-k 1 forces draft tokens = steps + 1 = 4, but got 8"),
    ((3, 1, 3, "EAGLE3"), "top-k 1 forces draft tokens = steps + 1 = 4, but got 3"),
    ((1, 1, 3, "EAGLE3"), "top-k 1 forces draft tokens = steps + 1 = 2, but got 3"),
    # 3. draft tokens - 1 <= topk + (steps - 1) * topk^2, at and just past the boundary
    ((1, 2, 3, "EAGLE3"), None),  # 2 <= 2
    ((1, 2, 4, "EAGLE3"), "4 - 1 > 2 + 0*2^2 = 2"),
    ((3, 2, 11, "EAGLE3"), None),  # 10 <= 2 + 2*4
    ((3, 2, 12, "EAGLE3"), "12 - 1 > 2 + 2*2^2 = 10"),
    ((2, 4, 21, "EAGLE3"), None),  # 20 <= 4 + 16
    ((2, 4, 22, "EAGLE3"), "22 - 1 > 4 + 1*4^2 = 20"),
    ((1, 4, 5, "EAGLE3"), None),
    ((1, 4, 6, "EAGLE3"), "6 - 1 > 4 + 0*4^2 = 4"),
    ((3, 2, 64, "EAGLE3"), "64 - 1 > 2 + 2*2^2 = 10"),  # resolves in SGLang, then crashes (INTERFACE 1.2)
    ((5, 4, 8, "EAGLE3"), None),  # SGLang's own Llama default
    ((3, 2, 2, "EAGLE3"), None),  # fewer draft tokens than the tree is fine
]


@pytest.mark.parametrize(("point", "why"), RULES, ids=[f"{p}" for p, _ in RULES])
def test_eagle_rules(point: tuple, why: str | None) -> None:
    reason = sp.infeasible_reason(eagle(*point))
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason


def test_rule_reason_says_what_sglang_would_do() -> None:
    assert sp.infeasible_reason(eagle(3, 1, 8)) == (
        "top-k 1 forces draft tokens = steps + 1 = 4, but got 8 (SGLang would silently run 4)"
    )
    assert sp.infeasible_reason(eagle(3, 2, 12)) == (
        "draft tokens - 1 <= topk + (steps - 1) * topk^2 must hold, but got 12 - 1 > 2 + 2*2^2 = 10"
    )


def _space(params: dict[str, Any]) -> SearchSpace:
    return SearchSpace.model_validate({"params": params})


SMALL = {
    "NCCL_PROTO": {"choices": [None, "LL", "Simple"]},
    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
    "speculative_num_steps": {"low": 1, "high": 3, "when": {"speculative_algorithm": "EAGLE3"}},
    "speculative_eagle_topk": {"choices": [1, 2], "when": {"speculative_algorithm": "EAGLE3"}},
    "speculative_num_draft_tokens": {"choices": [2, 3, 4, 8], "when": {"speculative_algorithm": "EAGLE3"}},
    "all_reduce_path": {"choices": [None, "nccl"]},
}
# EAGLE knobs without `when`, null allowed: every all-or-none case occurs.
LOOSE = {
    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
    "speculative_num_steps": {"choices": [None, 1, 2]},
    "speculative_eagle_topk": {"choices": [None, 1, 2]},
    "speculative_num_draft_tokens": {"choices": [None, 2, 3, 5]},
    "NCCL_ALGO": {"choices": [None, "Ring"]},
}


def brute_force(space: SearchSpace) -> list[dict[str, Any]]:
    """Every distinct point: the full product, inactive knobs forced to None, duplicates dropped."""
    names = list(space.params)
    seen: dict[tuple, dict[str, Any]] = {}
    for combo in itertools.product(*(space.params[n].values() for n in names)):
        point = dict(zip(names, combo))
        for n in names:
            for dep, wanted in space.params[n].when.items():
                if point[dep] not in (wanted if isinstance(wanted, list) else [wanted]):
                    point[n] = None
        seen.setdefault(tuple(point.items()), point)
    return list(seen.values())


def rule_broken(p: dict[str, Any]) -> str | None:
    """The rules of INTERFACE.md 1.2, written out independently of space.py."""
    p = dict(p)
    if (
        p.get("speculative_algorithm") is not None
        and p.get("speculative_eagle_topk") == 1
        and p.get("speculative_num_steps") is not None
        and p.get("speculative_num_draft_tokens") is None
    ):
        p["speculative_num_draft_tokens"] = p["speculative_num_steps"] + 1  # SGLang's forced value
    given = [p.get(k) is not None for k in EAGLE]
    if p.get("speculative_algorithm") is None:
        return "EAGLE knobs set without speculative_algorithm" if any(given) else None
    if not any(given):
        return None
    if not all(given):
        return "EAGLE needs steps, top-k and draft tokens all together or none"
    steps, topk, ndt = (p[k] for k in EAGLE)
    if topk == 1 and ndt != steps + 1:
        return "top-k 1 forces draft tokens = steps + 1"
    if ndt - 1 > topk + (steps - 1) * topk**2:
        return "draft tokens - 1 <= topk + (steps - 1) * topk^2"
    return None


@pytest.mark.parametrize("params", [SMALL, LOOSE], ids=["with-when", "all-or-none"])
def test_census_equals_brute_force(params: dict[str, Any]) -> None:
    space = _space(params)
    expected = brute_force(space)
    total, feasible, reasons = sp.census(space)
    assert total == len(expected)
    assert feasible == sum(sp.infeasible_reason(p) is None for p in expected)
    assert sum(reasons.values()) == total - feasible
    assert reasons == Counter(r for p in expected if (r := rule_broken(p)) is not None)
    assert sorted(map(sp.key, sp.points(space))) == sorted(map(sp.key, expected))


def test_census_names_each_rule() -> None:
    _, _, reasons = sp.census(_space(LOOSE))
    assert set(reasons) == {
        "EAGLE needs steps, top-k and draft tokens all together or none",
        "EAGLE knobs set without speculative_algorithm",
        "top-k 1 forces draft tokens = steps + 1",
        "draft tokens - 1 <= topk + (steps - 1) * topk^2",
    }


def test_demo_census_is_consistent() -> None:
    s = spec_mod.load(ROOT / "experiments" / "demo.yaml")
    total, feasible, reasons = sp.census(s.space)
    eagle_params = {
        n: p for n, p in s.space.params.items() if n in ("speculative_algorithm", "speculative_adaptive") or n in EAGLE
    }
    eagle_points = brute_force(_space({n: p.model_dump() for n, p in eagle_params.items()}))
    others = 1
    for n, p in s.space.params.items():
        if n not in eagle_params:
            others *= len(p.values())
    assert total == others * len(eagle_points)
    assert feasible == others * sum(sp.infeasible_reason(p) is None for p in eagle_points)
    assert sum(reasons.values()) == total - feasible
    assert 0 < feasible < total <= math.prod(len(p.values()) for p in s.space.params.values())
    # top-k 1 takes no draft-token knob (SGLang forces steps + 1), so that rule never fires here
    assert s.space.params["speculative_num_draft_tokens"].when == {"speculative_eagle_topk": [2, 4]}
    assert reasons["top-k 1 forces draft tokens = steps + 1"] == 0


def test_points_respect_when() -> None:
    space = _space(SMALL)
    pts = list(sp.points(space))
    assert len({sp.key(p) for p in pts}) == len(pts)
    for p in pts:
        assert list(p) == list(space.params)
        if p["speculative_algorithm"] is None:
            assert all(p[k] is None for k in EAGLE)
        else:
            assert all(p[k] is not None for k in EAGLE)
    # without speculation the EAGLE knobs collapse to one point per NCCL/all-reduce choice
    assert sum(p["speculative_algorithm"] is None for p in pts) == 3 * 2


def test_when_accepts_a_list_of_values() -> None:
    space = _space(
        {
            "all_reduce_path": {"choices": [None, "custom", "nccl"]},
            "NCCL_PROTO": {"choices": ["LL", "Simple"], "when": {"all_reduce_path": ["nccl", "custom"]}},
        }
    )
    assert sorted(map(sp.key, sp.points(space))) == sorted(
        map(
            sp.key,
            [
                {"all_reduce_path": None, "NCCL_PROTO": None},
                {"all_reduce_path": "custom", "NCCL_PROTO": "LL"},
                {"all_reduce_path": "custom", "NCCL_PROTO": "Simple"},
                {"all_reduce_path": "nccl", "NCCL_PROTO": "LL"},
                {"all_reduce_path": "nccl", "NCCL_PROTO": "Simple"},
            ],
        )
    )


def test_random_points_respect_when_and_values() -> None:
    space = _space(SMALL)
    rng = random.Random(7)
    keys = {sp.key(p) for p in sp.points(space)}
    for _ in range(300):
        p = sp.random_point(space, rng)
        assert sp.key(p) in keys


def test_baseline_is_all_none_and_a_feasible_point() -> None:
    for path in ("demo.yaml", "kimi-k2.5-tp8.yaml"):
        s = spec_mod.load(ROOT / "experiments" / path)
        base = sp.baseline_params(s.space)
        assert base == {n: None for n in s.space.params}
        assert sp.infeasible_reason(base) is None
    space = _space(SMALL)
    assert sp.key(sp.baseline_params(space)) in {sp.key(p) for p in sp.points(space)}


def test_distributions() -> None:
    space = _space(SMALL)
    dists = {name: sp.distribution(p) for name, p in space.params.items()}
    assert dists["NCCL_PROTO"] == CategoricalDistribution((None, "LL", "Simple"))
    assert dists["speculative_num_steps"] == IntDistribution(1, 3)


def test_key_ignores_order() -> None:
    a = {"NCCL_PROTO": "LL", "speculative_algorithm": None}
    assert sp.key(a) == sp.key(dict(reversed(list(a.items()))))
    assert sp.key(a) != sp.key({**a, "NCCL_PROTO": "Simple"})
