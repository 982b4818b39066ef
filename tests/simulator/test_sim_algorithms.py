"""The simulator's speculative algorithms beside EAGLE-3: SGLang 0.5.23's resolution per algorithm
(arg_groups/speculative_hook.py `_handle_dflash`, `_handle_ngram`) and the performance model held to the
published figures its model profile states (orchestrator/simulator/profiles/kimi-k2.5.yaml, drafters.dflash
and drafters.ngram, each with its source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.records import TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.simulator import cli, evaluate, load_hardware, load_model, params_from_launch
from orchestrator.simulator.model import resolve
from orchestrator.trial.runner import run_trial

PCIE = load_hardware("pcie-rtxpro6000-x8")
KIMI = load_model("kimi-k2.5")
MODEL = ["--model-path", "moonshotai/Kimi-K2.5", "--tp-size", "8"]
DRAFT = ["--speculative-draft-model-path", "z-lab/Kimi-K2.5-DFlash"]


def dflash(block: int | None = None) -> dict:
    return {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": block, "tp": 8}


def speedup(params: dict, concurrency: int) -> float:
    base = evaluate({"tp": 8, "max_running_requests": 256}, PCIE, KIMI, concurrency=concurrency)
    pred = evaluate({**params, "max_running_requests": 256}, PCIE, KIMI, concurrency=concurrency)
    assert pred.ok, pred.failure
    return pred.output_tok_s / base.output_tok_s


def test_dflash_accept_length_at_block_8_is_the_drafter_cards_mt_bench_figure() -> None:
    """z-lab/Kimi-K2.5-DFlash reports 3.7 on MT-Bench at block 8 (chat text)."""
    pred = evaluate(dflash(8), PCIE, KIMI)
    assert pred.accept_length == pytest.approx(3.7, abs=0.02)
    assert pred.steps == 1 and pred.draft_tokens == 8 and len(pred.per_depth_acceptance) == 7


def test_dflash_block_defaults_to_the_drafters_config() -> None:
    cfg = resolve(dflash(), PCIE, KIMI)
    assert not isinstance(cfg, str) and (cfg.steps, cfg.topk, cfg.draft_tokens) == (1, 1, 8)


def test_dflash_wins_at_one_stream_and_loses_to_no_speculation_above_8() -> None:
    """vllm-project/vllm#42505: DFlash slower than no speculation above 8 concurrent requests."""
    assert speedup(dflash(8), 1) > 1.3
    assert speedup(dflash(8), 8) > 1.0
    assert speedup(dflash(8), 16) < 1.0
    assert speedup(dflash(8), 32) < 1.0


def test_which_algorithm_wins_depends_on_the_load() -> None:
    eagle3 = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 2, "speculative_eagle_topk": 1, "tp": 8}
    assert speedup(dflash(8), 1) > speedup(eagle3, 1) > 1.0
    assert speedup(eagle3, 32) > speedup(dflash(8), 32)


def test_ngram_drafts_without_a_model_and_verifies_a_tree() -> None:
    pred = evaluate({"speculative_algorithm": "NGRAM", "tp": 8}, PCIE, KIMI)
    assert pred.ok and pred.draft_extend_ms == 0.0 and pred.draft_tokens == 12
    cfg = resolve({"speculative_algorithm": "NGRAM", "tp": 8}, PCIE, KIMI)
    assert not isinstance(cfg, str) and (cfg.steps, cfg.topk) == (1, 10)  # 12 // 10, top-k = BFS breadth


def _resolved(*flags: str) -> cli.Resolved:
    return cli.resolve(cli.parse([*MODEL, *flags], {})[0])


def test_dflash_resolution_as_0_5_23_handle_dflash() -> None:
    bent = _resolved("--speculative-algorithm", "dflash", *DRAFT, "--speculative-num-steps", "3")
    assert bent.error is None and bent.args["speculative_num_steps"] == 1
    assert (
        "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps=3 to 1." in bent.log_warnings
    )
    differ = _resolved(
        "--speculative-algorithm",
        "DFLASH",
        *DRAFT,
        "--speculative-dflash-block-size",
        "8",
        "--speculative-num-draft-tokens",
        "16",
    )
    assert differ.error is not None and differ.error.startswith(
        "ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ."
    )
    no_drafter = _resolved("--speculative-algorithm", "DFLASH")
    assert no_drafter.error == (
        "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path."
    )
    adaptive = _resolved("--speculative-algorithm", "DFLASH", *DRAFT, "--speculative-adaptive")
    assert adaptive.args["speculative_adaptive"] is False
    assert any(
        w.startswith("speculative_adaptive disabled: speculative_algorithm=DFLASH") for w in adaptive.log_warnings
    )


def test_ngram_resolution_as_0_5_23_handle_ngram() -> None:
    res = _resolved("--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "4")
    assert res.error is None
    assert (res.args["speculative_eagle_topk"], res.args["speculative_num_draft_tokens"]) == (4, 12)
    assert res.args["speculative_num_steps"] == 3 and res.args["max_running_requests"] == 48
    params = params_from_launch(
        [*MODEL, "--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "4"], {}
    )
    assert params["speculative_ngram_max_bfs_breadth"] == 4


def test_an_algorithm_the_profile_does_not_model_fails_with_why() -> None:
    pred = evaluate({"speculative_algorithm": "STANDALONE", "tp": 8}, PCIE, KIMI)
    assert pred.failure is not None and "drafters.standalone" in pred.failure


def test_a_trial_of_each_new_algorithm_runs_on_the_simulator(tmp_path) -> None:
    """The whole trial path (plan, simulator server, benchmark, metrics) for DFLASH and NGRAM."""
    s = spec_mod.load(Path(__file__).resolve().parents[2] / "experiments" / "spec-algorithms.yaml")
    s = s.model_copy(update={"server": s.server.model_copy(update={"tp": 2})})
    points: dict[str, dict[str, str | int]] = {
        "DFLASH": {"speculative_draft_model_path": "z-lab/Kimi-K2.5-DFlash", "speculative_dflash_block_size": 8},
        "NGRAM": {"speculative_ngram_max_bfs_breadth": 4},
    }
    for n, (algo, extra) in enumerate(points.items(), start=1):
        params = {**sp.baseline_params(s.space), "speculative_algorithm": algo, **extra}
        outcome = run_trial(TrialSpec(number=n, params=params, trial_dir=str(tmp_path / algo), experiment=s))
        assert outcome.status is TrialStatus.COMPLETE, (algo, outcome.reason, outcome.log_tail)
        assert outcome.metrics is not None and outcome.metrics.accept_length is not None
        assert outcome.metrics.accept_length > 1.0
        assert outcome.launch is not None and outcome.launch.flags["--speculative-algorithm"] == algo
