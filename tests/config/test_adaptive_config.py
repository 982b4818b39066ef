"""SGLang 0.5.23's adaptive speculation config as the sweep reads it (config/adaptive.py), pinned against
0.5.23's source (read, never run on a GPU): `sglang/srt/speculative/adaptive_spec_params.py`
DEFAULT_ADAPTIVE_CONFIG, `_load_adaptive_config`, `resolve_candidate_steps_from_config`,
`AdaptiveSpeculativeParams._route` / `_find_closest_bs` / `_pad_to_cuda_graph_bs`; and
`sglang/srt/arg_groups/speculative_hook.py` `_init_adaptive_speculative_params` (steps in the union, unset:
its middle). The speculative_adaptive_config knob is checked at load, rendered as
--speculative-adaptive-config, and its union decides which steps the rules let through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from demo_variants import changed_demo, validate

from orchestrator.config import adaptive, eagle, render
from orchestrator.config import experiment as spec_mod
from orchestrator.search import space as sp


def test_the_default_is_0_5_23s_slots_and_their_union():
    assert {s.batch_size: s.candidate_steps for s in adaptive.DEFAULT.slots} == {
        1: (1, 3, 5, 7),
        8: (0, 1, 3),
        32: (0, 1),
        64: (0,),
    }
    assert adaptive.DEFAULT.candidate_steps == (0, 1, 3, 5, 7)
    assert adaptive.DEFAULT.initial_steps == 3  # candidate_steps[len // 2]
    assert adaptive.DEFAULT.slots[0].down_hysteresis == -0.25  # AdaptiveStepSlot.__init__'s default


@pytest.mark.parametrize(
    "batch,graphs,slot",
    [
        (1, None, 1),
        (7, None, 1),
        (8, None, 8),
        (31, None, 8),
        (32, None, 32),
        (63, None, 32),
        (64, None, 64),
        (500, None, 64),
        (31, (1, 2, 4, 8, 16, 32, 48), 32),
        (9, (1, 2, 4, 8, 16, 32), 8),
        (33, (8, 16, 32), 32),
    ],
)
def test_a_running_batch_is_padded_then_served_by_the_slot_at_or_below(batch, graphs, slot):
    assert adaptive.DEFAULT.slot_for(batch, graphs).batch_size == slot


def test_a_slot_below_the_smallest_key_goes_to_the_smallest():
    config = adaptive.parse({"4": {"candidate_steps": [1, 3]}, "16": {"candidate_steps": [0, 1]}})
    assert config.slot_for(1).batch_size == 4  # _find_closest_bs: max(0, bisect_right - 1)


def test_shared_knobs_apply_to_every_slot_and_a_slots_own_entry_wins():
    config = adaptive.parse(
        {
            "ema_alpha": 0.5,
            "1": {"candidate_steps": [3, 1, 3]},
            "8": {"candidate_steps": [0, 1], "ema_alpha": 0.1},
            "comment": "skipped",
        }
    )
    assert [(s.batch_size, s.candidate_steps, s.ema_alpha) for s in config.slots] == [
        (1, (1, 3), 0.5),
        (8, (0, 1), 0.1),
    ]


@pytest.mark.parametrize(
    "data,message",
    [
        ({"candidate_steps": [1, 3, 7]}, "speculative_adaptive_config must contain at least one integer-string BS key"),
        ({"1": {"candidate_steps": []}}, "BS 1: candidate_steps must be a list of non-negative ints, got []"),
        ({"1": {"candidate_steps": [1, -1]}}, "BS 1: candidate_steps must be a list of non-negative ints, got [1, -1]"),
        ({"1": {"candidate_steps": [1.5]}}, "BS 1: candidate_steps must be a list of non-negative ints, got [1.5]"),
        ({"1": {}}, "BS 1: candidate_steps must be a list of non-negative ints, got None"),
        ([1, 3], "the adaptive config must be a JSON object of batch-size slots"),
    ],
)
def test_what_0_5_23_refuses_is_refused_with_its_message(data, message):
    with pytest.raises(ValueError) as caught:
        adaptive.parse(data)
    assert message in str(caught.value)


def _custom_space(tmp_path: Path, config: str) -> dict:
    return {
        "name": "adaptive",
        "params": {
            "speculative_algorithm": {"choices": [None, "EAGLE3"]},
            "speculative_num_steps": {"choices": [2, 3], "when": {"speculative_algorithm": "EAGLE3"}},
            "speculative_eagle_topk": {"choices": [1], "when": {"speculative_algorithm": "EAGLE3"}},
            "speculative_adaptive": {"choices": [None, True], "when": {"speculative_algorithm": "EAGLE3"}},
            "speculative_adaptive_config": {"choices": [None, config], "when": {"speculative_adaptive": True}},
        },
    }


def test_a_custom_config_decides_the_steps_and_is_passed_to_sglang(tmp_path: Path):
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [2, 4]}, "8": {"candidate_steps": [0, 2]}}))
    spec = spec_mod.load(changed_demo(tmp_path, {}, space=_custom_space(tmp_path, str(config))))
    total, feasible, reasons = sp.census(spec.space)
    # steps 2 runs only with the custom config (union 0, 2, 4), steps 3 only with the default (0, 1, 3, 5, 7)
    assert (total, feasible) == (7, 5)  # no speculation, 2 fixed chains, 2 of the 4 adaptive points
    assert list(reasons) == ["speculative_adaptive needs steps in the adaptive slots' union (0, 1, 3, 5, 7 by default)"]
    point = {
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 2,
        "speculative_eagle_topk": 1,
        "speculative_adaptive": True,
        "speculative_adaptive_config": str(config),
    }
    assert eagle.infeasible(point) is None
    refused = eagle.infeasible({**point, "speculative_num_steps": 3})
    assert (
        refused is not None
        and "--speculative-num-steps=3 is not in the adaptive config candidate_steps [0, 2, 4]" in refused.detail
    )
    flags = render.tuned_flags(spec, point)
    assert flags["--speculative-adaptive-config"] == str(config) and flags["--speculative-adaptive"] is True
    alone = eagle.infeasible({**point, "speculative_adaptive": None})
    assert alone is not None and alone.rule is eagle.Rule.adaptive_config_alone


def test_a_broken_config_file_is_one_message_at_load(tmp_path: Path):
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"candidate_steps": [1, 3, 7]}))  # the pre-0.5.23 flat shape
    code, err = validate(changed_demo(tmp_path, {}, space=_custom_space(tmp_path, str(config))))
    assert code == 2
    assert "speculative_adaptive_config" in err and "must contain at least one integer-string BS key" in err
    assert "Traceback" not in err
    missing = tmp_path / "nope.json"
    code, err = validate(changed_demo(tmp_path, {}, space=_custom_space(tmp_path, str(missing))))
    assert code == 2 and f"cannot read the adaptive config {missing}" in err
