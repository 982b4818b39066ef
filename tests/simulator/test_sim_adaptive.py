"""--speculative-adaptive in the simulator, as SGLang 0.5.23 does it (read from its source, never run on a
GPU): `speculative/adaptive_spec_params.py` DEFAULT_ADAPTIVE_CONFIG's batch-size slots {1: [1,3,5,7],
8: [0,1,3], 32: [0,1], 64: [0]} (`_load_adaptive_config` for a config file), the running batch routed to a
slot by `AdaptiveSpeculativeParams._route` (padded to the captured CUDA-graph batch size, then the closest
slot at or below), one EMA per slot (`AdaptiveStepSlot`); `arg_groups/speculative_hook.py`
`_init_adaptive_speculative_params`: steps in the slots' union {0,1,3,5,7} (unset: its middle, 3). The
model's assumption: the best fixed chain among the slot's candidates at each load, ADAPTIVE_SWITCH_COST
slower; SGLang's log line when a slot's step count changes."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from orchestrator.config import flags
from orchestrator.simulator import cli, evaluate, load_hardware, load_model, model, params_from_launch

H200, PCIE, KIMI = load_hardware("h200-nvlink"), load_hardware("pcie-rtxpro6000-x8"), load_model("kimi-k2.5")
EAGLE = ["--model-path", "m", "--speculative-algorithm", "EAGLE3"]


def test_the_help_dump_declares_both_adaptive_flags():
    known = flags.known_flags("0.5.23")
    assert known is not None and {"--speculative-adaptive", "--speculative-adaptive-config"} <= known


@pytest.mark.parametrize(
    "given,resolved",
    [
        (["--speculative-num-steps", "3"], (3, 1, 4)),  # a chain: top-k 1, steps + 1
        (["--speculative-num-steps", "1", "--speculative-eagle-topk", "1"], (1, 1, 2)),
        (
            ["--speculative-num-steps", "7", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"],
            (7, 1, 8),
        ),  # draft tokens forced to steps + 1
        (["--speculative-num-steps", "5"], (5, 1, 6)),  # 5 and 0 are in 0.5.23's union
        (["--speculative-num-steps", "0"], (0, 1, 1)),
        ([], (3, 1, 4)),  # unset: the union's middle, top-k 1
    ],
)
def test_adaptive_resolves_to_a_chain_starting_at_a_candidate(given, resolved):
    res = cli.resolve(cli.parse(EAGLE + ["--tp", "8", "--speculative-adaptive", *given], {})[0])
    assert (res.error, res.unsupported) == (None, None)
    assert (
        res.args["speculative_num_steps"],
        res.args["speculative_eagle_topk"],
        res.args["speculative_num_draft_tokens"],
    ) == resolved
    assert params_from_launch(EAGLE + ["--tp", "8", "--speculative-adaptive", *given], {})["speculative_adaptive"]


@pytest.mark.parametrize("steps", ["2", "6", "8"])
def test_adaptive_refuses_steps_that_are_not_candidates(steps):
    res = cli.resolve(cli.parse(EAGLE + ["--speculative-adaptive", "--speculative-num-steps", steps], {})[0])
    assert res.error == (
        f"ValueError: --speculative-num-steps={steps} is not in the adaptive config candidate_steps "
        f"[0, 1, 3, 5, 7]. Pass one of those values."
    )
    with pytest.raises(ValueError, match="candidate_steps"):
        params_from_launch(EAGLE + ["--speculative-adaptive", "--speculative-num-steps", steps], {})


def test_a_config_file_sets_the_candidates(tmp_path: Path):
    config = tmp_path / "adaptive.json"
    config.write_text(
        json.dumps({"1": {"candidate_steps": [4, 2]}, "16": {"candidate_steps": [0, 2]}, "ema_alpha": 0.5})
    )
    base = EAGLE + ["--tp", "8", "--speculative-adaptive", "--speculative-adaptive-config", str(config)]
    assert cli.resolve(cli.parse(base + ["--speculative-num-steps", "2"], {})[0]).error is None
    assert "candidate_steps [0, 2, 4]" in str(
        cli.resolve(cli.parse(base + ["--speculative-num-steps", "3"], {})[0]).error
    )
    params = params_from_launch(base + ["--speculative-num-steps", "4"], {})
    assert params["speculative_adaptive_slots"] == ((1, (2, 4)), (16, (0, 2)))
    assert evaluate(params, PCIE, KIMI, concurrency=1).steps in (2, 4)
    assert evaluate(params, PCIE, KIMI, concurrency=16).adaptive_slot == 16
    for data, error in [
        ({"candidate_steps": [2, 4]}, "must contain at least one integer-string BS key"),
        ({"1": {"candidate_steps": [-1]}}, "BS 1: candidate_steps must be a list of non-negative ints"),
        ({"1": {"candidate_steps": []}}, "BS 1: candidate_steps must be a list of non-negative ints"),
    ]:
        config.write_text(json.dumps(data))
        refused = cli.resolve(cli.parse(base + ["--speculative-num-steps", "3"], {})[0]).error
        assert refused is not None and refused.startswith("ValueError") and error in refused
    missing = cli.resolve(
        cli.parse(
            EAGLE
            + [
                "--speculative-adaptive",
                "--speculative-num-steps",
                "3",
                "--speculative-adaptive-config",
                str(tmp_path / "nope.json"),
            ],
            {},
        )[0]
    )
    assert missing.error is not None and missing.error.startswith("FileNotFoundError")


def _chain(steps: int, **extra) -> dict:
    return {
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": steps,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": steps + 1,
        **extra,
    }


@pytest.mark.parametrize("concurrency,slot", [(1, 1), (7, 1), (8, 8), (30, 8), (31, 32), (32, 32), (48, 32)])
def test_the_running_batch_goes_to_the_slot_at_or_below_its_padded_size(concurrency, slot):
    """31 running requests are padded to the captured 32 (cuda_graph_hook.py, the speculative sizes) and so
    served by slot 32; without CUDA graphs no padding: slot 8."""
    assert evaluate(_chain(3, speculative_adaptive=True), H200, KIMI, concurrency=concurrency).adaptive_slot == slot
    eager = evaluate(_chain(3, speculative_adaptive=True, cuda_graph=False), H200, KIMI, concurrency=31)
    assert eager.adaptive_slot == 8


@pytest.mark.parametrize("hw", [H200, PCIE], ids=["h200", "pcie"])
@pytest.mark.parametrize("concurrency", [1, 2, 8, 16, 32, 48])
def test_adaptive_runs_the_best_candidate_of_its_slot_minus_the_switching_cost(hw, concurrency):
    adaptive = evaluate(_chain(3, speculative_adaptive=True), hw, KIMI, concurrency=concurrency)
    candidates = dict(model.ADAPTIVE_SLOTS)[adaptive.adaptive_slot]
    fixed = {
        s: evaluate(
            _chain(s)
            if s
            else {
                **_chain(1),
                "speculative_algorithm": None,
                "speculative_num_steps": None,
                "speculative_eagle_topk": None,
                "speculative_num_draft_tokens": None,
                "max_running_requests": 48,
            },
            hw,
            KIMI,
            concurrency=concurrency,
        )
        for s in candidates
    }
    best = max(fixed, key=lambda s: fixed[s].output_tok_s)
    assert adaptive.steps == best
    assert adaptive.output_tok_s == pytest.approx(fixed[best].output_tok_s / (1 + model.ADAPTIVE_SWITCH_COST))
    assert adaptive.accept_length == fixed[best].accept_length


def test_adaptive_beats_a_fixed_count_where_the_load_moves_the_best_count():
    """The field question: on H200 one fixed count (3 steps, best at 1 stream) loses to adaptive at 8
    streams, where the default slot 8 stops drafting (0 steps), and wins at 1 stream, where adaptive only
    pays its cost."""

    def ratio(c: int) -> float:
        return (
            evaluate(_chain(3, speculative_adaptive=True), H200, KIMI, concurrency=c).output_tok_s
            / evaluate(_chain(3), H200, KIMI, concurrency=c).output_tok_s
        )

    assert ratio(1) == pytest.approx(1 / 1.03)
    assert ratio(8) > 1.03


def test_the_server_logs_sglangs_line_when_the_steps_change(sim_factory):
    sim = sim_factory(
        "--tp",
        "2",
        "--hardware-profile",
        "h200-nvlink",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
        "--speculative-adaptive",
        "--sim-noise",
        "0",
    )
    sim.wait_ready()
    body = {"text": "the model", "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}
    with httpx.Client(timeout=30) as client:
        # 8 streams: slot 8 ([0, 1, 3]) starts at the initial 3 steps and drops to 0 (no drafting is best there).
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: client.post(sim.url + "/generate", json=body), range(8)))
    assert all(a.status_code == 200 for a in answers)
    meta = answers[0].json()["meta_info"]
    assert meta["spec_verify_ct"] >= 20  # 0-step cycles give one token each: 24 tokens take ~23 cycles, not ~7
    assert "Adaptive spec params updated: steps 3 -> 0 (ema_accept_len=" in sim.log()


def test_a_refused_adaptive_launch_exits_1_with_sglangs_error(tmp_path: Path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.simulator",
            "--model-path",
            "m",
            "--tp",
            "8",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-adaptive",
            "--speculative-num-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 1
    assert (
        "ValueError: --speculative-num-steps=2 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]"
        in proc.stdout + proc.stderr
    )
