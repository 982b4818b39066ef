"""Issue 10's last two knobs of the load you will serve: `speculative_adaptive` (SGLang 0.5.23's
--speculative-adaptive) checked before launch, and an objective that names the concurrency it is judged at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from demo_variants import DEMO, ROOT, changed_demo, validate

from orchestrator.config import eagle, render
from orchestrator.config import experiment as spec_mod
from orchestrator.search import space as sp
from orchestrator.simulator import params_from_launch

# ------------------------------------------------------------------ speculative_adaptive: the rules


def _point(steps: int | None, topk: int | None, ndt: int | None, algo: str | None = "EAGLE3") -> dict[str, Any]:
    return {
        "speculative_algorithm": algo,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": ndt,
        "speculative_adaptive": True,
    }


@pytest.mark.parametrize(
    "point,why",
    [
        (_point(3, 1, None), None),
        (_point(1, 1, 2), None),
        (_point(3, 1, 4), None),
        # sglang/srt/arg_groups/speculative_hook.py `_init_adaptive_speculative_params`: steps in the union of
        # adaptive_spec_params.py DEFAULT_ADAPTIVE_CONFIG's slots (0, 1, 3, 5, 7), unset -> its middle, top-k -> 1
        (_point(5, 1, None), None),
        (_point(0, 1, None), None),
        (_point(7, 1, 8), None),
        (_point(None, None, None), None),
        (_point(2, 1, None), "--speculative-num-steps=2 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]"),
        (_point(6, 1, 7), "--speculative-num-steps=6 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]"),
        (_point(3, 2, 4), "runs a chain (top-k 1, draft tokens = steps + 1), but got speculative_eagle_topk 2"),
        (_point(3, 1, 8), "top-k 1 forces draft tokens = steps + 1 = 4, but got 8"),
        (_point(None, None, None, algo=None), "speculative_adaptive set without speculative_algorithm"),
    ],
)
def test_adaptive_points_sglang_refuses_are_infeasible(point, why):
    problem = eagle.infeasible(point)
    if why is None:
        assert problem is None
    else:
        assert problem is not None and why in problem.detail


def test_every_adaptive_point_the_rules_let_through_the_simulator_runs():
    """The same rule on both sides: what the orchestrator launches, the simulator's SGLang resolves."""
    spec = spec_mod.load(DEMO)
    for steps in range(1, 8):
        params = {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": steps,
            "speculative_eagle_topk": 1,
            "speculative_adaptive": True,
        }
        argv = render.flag_args(render.launch_flags(spec, params, port=31000))
        if eagle.infeasible(params) is None:
            assert params_from_launch(argv, {})["speculative_adaptive"] is True
        else:
            with pytest.raises(ValueError, match="candidate_steps"):
                params_from_launch(argv, {})


def test_adaptive_renders_the_switch_and_a_chain():
    spec = spec_mod.load(DEMO)
    flags = render.tuned_flags(
        spec,
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_adaptive": True,
        },
    )
    assert flags["--speculative-adaptive"] is True
    assert (
        flags["--speculative-num-steps"],
        flags["--speculative-eagle-topk"],
        flags["--speculative-num-draft-tokens"],
    ) == ("3", "1", "4")
    plain = render.tuned_flags(
        spec,
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_adaptive": None,
        },
    )
    assert "--speculative-adaptive" not in plain


def test_the_shipped_space_only_offers_adaptive_where_sglang_runs_it():
    spec = spec_mod.load(DEMO)
    total, feasible, reasons = sp.census(spec.space)
    assert not any("adaptive" in r for r in reasons)
    adaptive = spec.space.params["speculative_adaptive"]
    assert adaptive.when == {"speculative_eagle_topk": 1, "speculative_num_steps": [1, 3]}


# ------------------------------------------------------------------ speculative_adaptive: validation


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"server": {"flags": {"speculative-adaptive": True}}},
            "{exp}: server.flags.speculative-adaptive: set by the sweep itself from the speculative_adaptive knob (its "
            "rules are checked before each launch); remove it from server.flags",
        ),
        (
            {"server": {"flags": {"speculative-adaptive-config": "/etc/adaptive.json"}}},
            "{exp}: server.flags.speculative-adaptive-config: set by the sweep itself from the "
            "speculative_adaptive_config knob (a JSON file checked at load as SGLang 0.5.23 checks it; steps are "
            "checked against its slots' union); remove it from server.flags",
        ),
        (
            {"sglang_version": "0.5.16"},
            "{spaces}/eagle3.yaml: params.speculative_adaptive: --speculative-adaptive is known in sglang 0.5.23, not in "
            'sglang_version 0.5.16 of {exp}; remove the knob or set sglang_version: "0.5.23"',
        ),
    ],
)
def test_adaptive_mistakes_get_one_clear_message(tmp_path: Path, change, message):
    exp = changed_demo(tmp_path, change)
    code, err = validate(exp)
    expected = message.format(exp=exp, spaces=tmp_path / "search_spaces")
    assert (code, err) == (2, f"error: {expected}\n")


def test_adaptive_as_a_plain_bool_outside_the_eagle_space_needs_its_rules(tmp_path: Path):
    """A space may offer the knob on its own: points without speculation are then infeasible, not launched."""
    exp = changed_demo(
        tmp_path,
        {},
        space={
            "name": "x",
            "params": {
                "speculative_algorithm": {"choices": [None, "EAGLE3"]},
                "speculative_num_steps": {"choices": [2, 3], "when": {"speculative_algorithm": "EAGLE3"}},
                "speculative_eagle_topk": {"choices": [1], "when": {"speculative_algorithm": "EAGLE3"}},
                "speculative_adaptive": {"choices": [None, True]},
            },
        },
    )
    total, feasible, reasons = sp.census(spec_mod.load(exp).space)
    assert reasons == {
        "EAGLE knobs set without speculative_algorithm": 1,
        "speculative_adaptive needs steps in the adaptive slots' union (0, 1, 3, 5, 7 by default)": 1,
    }
    assert (total, feasible) == (6, 4)


# ------------------------------------------------------------------ objective.concurrency


def test_the_objective_level_is_where_the_search_benchmarks(tmp_path: Path):
    exp = changed_demo(tmp_path, {"objective": {"metric": "output_tok_s", "concurrency": 32}})
    spec = spec_mod.load(exp)
    assert spec.objective.concurrency == 32
    assert spec.benchmark.concurrency == 32
    assert spec.benchmark.requests == 32  # at least one request per stream, or the level is never reached


def test_the_same_level_in_both_places_is_accepted(tmp_path: Path):
    exp = changed_demo(tmp_path, {"objective": {"concurrency": 8}, "benchmark": {"concurrency": 8, "requests": 40}})
    spec = spec_mod.load(exp)
    assert (spec.benchmark.concurrency, spec.benchmark.requests) == (8, 40)


def test_without_an_objective_level_the_benchmark_level_stands(tmp_path: Path):
    exp = changed_demo(tmp_path, {"objective": {"concurrency": None}, "benchmark": {"concurrency": 4}})
    spec = spec_mod.load(exp)
    assert (spec.objective.concurrency, spec.benchmark.concurrency) == (None, 4)


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"objective": {"concurrency": 32}, "benchmark": {"concurrency": 1}},
            "{exp}: benchmark.concurrency: 1 conflicts with objective.concurrency: 32, the load the objective is judged "
            "at (the search trials and the promotion gate run there); remove benchmark.concurrency, or set "
            "objective.concurrency to 1",
        ),
        ({"objective": {"concurrency": 0}}, "{exp}: objective.concurrency: must be >= 1, but got 0"),
    ],
)
def test_objective_level_mistakes_get_one_clear_message(tmp_path: Path, change, message):
    exp = changed_demo(tmp_path, change)
    code, err = validate(exp)
    assert code == 2
    assert err.startswith(f"error: {message.format(exp=exp)}"), err


def test_the_shipped_experiments_name_their_level():
    assert spec_mod.load(DEMO).objective.concurrency == 1
    kimi = spec_mod.load(ROOT / "experiments" / "kimi-k2.5-tp8.yaml")
    assert (kimi.objective.metric, kimi.objective.concurrency, kimi.benchmark.concurrency) == ("decode_tok_s", 1, 1)
    assert kimi.promotion.concurrency == (1, 8, 32)  # the load comparison says where speculation stops paying
