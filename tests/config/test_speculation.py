"""The speculative algorithm as a dimension: SGLang 0.5.23's rules per algorithm (each case names the file
and function of 0.5.23 it comes from), the registry's launch per algorithm, and SGLang's own parser (the
0.5.23 `sglang serve` parser rebuilt from its --help dump, orchestrator/simulator/cli.py `sglang_parser`)
accepting every planned argv of an experiment that searches EAGLE3, DFLASH and NGRAM."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.config import knobs, speculation
from orchestrator.config.eagle import RULE_KNOBS, Rule, infeasible
from orchestrator.config.speculation import DraftModel
from orchestrator.search import space as sp
from orchestrator.simulator.cli import resolve, sglang_parser
from orchestrator.trial import plan as planner

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "experiments" / "spec-algorithms.yaml"

# (case, point, the rule broken or None, 0.5.23 source of the rule)
CASES = [
    ("EAGLE3 SGLang's defaults", {"speculative_algorithm": "EAGLE3"}, None, "_handle_eagle_family"),
    (
        "EAGLE3 partial set",
        {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 2},
        Rule.all_or_none,
        "speculative_hook.py _handle_eagle_family (assert)",
    ),
    (
        "STANDALONE tree too small",
        {
            "speculative_algorithm": "STANDALONE",
            "speculative_num_steps": 2,
            "speculative_eagle_topk": 2,
            "speculative_num_draft_tokens": 12,
        },
        Rule.tree_capacity,
        "speculative_hook.py _handle_eagle_family (STANDALONE takes the EAGLE path)",
    ),
    (
        "STANDALONE adaptive",
        {"speculative_algorithm": "STANDALONE", "speculative_adaptive": True},
        Rule.adaptive_algorithm,
        "adaptive_spec_params.py adaptive_unsupported_reason",
    ),
    (
        "DFLASH block only",
        {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8},
        None,
        "_handle_dflash",
    ),
    (
        "DFLASH steps 3",
        {"speculative_algorithm": "DFLASH", "speculative_num_steps": 3},
        Rule.dflash_single_pass,
        "speculative_hook.py _handle_dflash (overrides steps to 1 with a warning)",
    ),
    (
        "DFLASH top-k 4",
        {"speculative_algorithm": "DFLASH", "speculative_eagle_topk": 4},
        Rule.dflash_single_pass,
        "speculative_hook.py _handle_dflash (overrides top-k to 1 with a warning)",
    ),
    (
        "DFLASH block and draft tokens differ",
        {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8, "speculative_num_draft_tokens": 16},
        Rule.dflash_block,
        "speculative_hook.py _handle_dflash (ValueError)",
    ),
    (
        "DFLASH block and draft tokens equal",
        {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8, "speculative_num_draft_tokens": 8},
        None,
        "_handle_dflash",
    ),
    (
        "DFLASH adaptive",
        {"speculative_algorithm": "DFLASH", "speculative_adaptive": True},
        Rule.adaptive_algorithm,
        "adaptive_spec_params.py adaptive_unsupported_reason",
    ),
    (
        "NGRAM breadth and window",
        {"speculative_algorithm": "NGRAM", "speculative_ngram_max_bfs_breadth": 4, "speculative_num_draft_tokens": 8},
        None,
        "_handle_ngram",
    ),
    (
        "NGRAM top-k",
        {"speculative_algorithm": "NGRAM", "speculative_eagle_topk": 2},
        Rule.ngram_topk,
        "speculative_hook.py _handle_ngram (top-k = speculative_ngram_max_bfs_breadth)",
    ),
    (
        "NGRAM with a drafter path",
        {"speculative_algorithm": "NGRAM", "speculative_draft_model_path": "/models/d"},
        Rule.foreign_knob,
        "speculative_hook.py _handle_ngram (reads no draft model)",
    ),
    (
        "EAGLE3 with a DFLASH block",
        {"speculative_algorithm": "EAGLE3", "speculative_dflash_block_size": 8},
        Rule.foreign_knob,
        "speculative_hook.py _handle_eagle_family (never reads speculative_dflash_block_size)",
    ),
    (
        "NGRAM knob without an algorithm",
        {"speculative_ngram_max_bfs_breadth": 4},
        Rule.without_algorithm,
        "speculative_hook.py handle_speculative_decoding (no algorithm: nothing speculative is read)",
    ),
]


@pytest.mark.parametrize(("params", "rule"), [c[1:3] for c in CASES], ids=[f"{c[0]} [{c[3]}]" for c in CASES])
def test_rules_per_algorithm(params, rule) -> None:
    why = infeasible(params)
    assert (why.rule if why is not None else None) is rule
    if why is not None:
        assert why.detail and str(why) == why.detail


def test_registry_covers_the_knob_and_each_draft_model() -> None:
    assert knobs.KNOBS["speculative_algorithm"].choices == tuple(speculation.ALGORITHMS)
    assert {a.draft_model for a in speculation.ALGORITHMS.values()} == set(DraftModel)
    assert speculation.ALGORITHMS["NGRAM"].draft_model is DraftModel.none
    assert speculation.ALGORITHMS["STANDALONE"].draft_model is DraftModel.small_model
    assert speculation.get(None) is None
    for algo in speculation.ALGORITHMS.values():
        assert algo.name in speculation.ALGORITHMS and algo.sim_drafter and algo.acceptance
        assert set(algo.own) <= set(RULE_KNOBS), algo.name  # every algorithm knob is walked by `sweep plan`
        assert all(k in knobs.KNOBS for k in algo.own), algo.name
    with pytest.raises(KeyError, match="EAGLE3, EAGLE, STANDALONE, DFLASH, NGRAM"):
        speculation.get("MEDUSA")


def test_model_default_comes_from_the_registry_and_the_profiles_drafters() -> None:
    from orchestrator.simulator import load_model

    kimi = load_model("kimi-k2.5").drafters  # eagle3, eagle, dflash, ngram, ...
    assert speculation.model_default(kimi) is speculation.ALGORITHMS["EAGLE3"]
    assert speculation.model_default({"eagle": 0, "dflash": 0}) is speculation.ALGORITHMS["EAGLE"]
    # DFLASH and NGRAM take no steps SGLang chooses for the model: no default speculation from them alone
    assert speculation.model_default({"dflash": 0, "ngram": 0}) is None


def test_drafter_missing_only_for_algorithms_with_a_draft_model() -> None:
    assert speculation.drafter_missing([None, "NGRAM"], drafter=False) is False
    assert speculation.drafter_missing([None, "DFLASH"], drafter=False) is True
    assert speculation.drafter_missing(["EAGLE3"], drafter=True) is False


def _planned() -> list[tuple[dict, list[str]]]:
    """Every algorithm's launches of the experiment: SGLang's own combinations, a random sample beside."""
    s = spec_mod.load(SPEC).model_copy(update={"engine": "sglang"})
    spec_only = sp.SearchSpace(params={k: v for k, v in s.space.params.items() if k.startswith("speculative_")})
    rng = random.Random(0)
    out = []
    for e in sp.points(spec_only):
        p = {**sp.random_point(s.space, rng), **e}
        if sp.infeasible_reason(p) is None:
            out.append((p, list(planner.make(s, p, port=30000).argv)))
    return out


def test_sglang_0_5_23_parser_accepts_every_planned_argv() -> None:
    planned = _planned()
    parser = sglang_parser()
    seen = set()
    for params, argv in planned:
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        ns = parser.parse_args(argv[3:])  # SystemExit (exit code 2) on anything `sglang serve` refuses
        seen.add(ns.speculative_algorithm)
        resolved = resolve(ns)  # and SGLang's resolution runs it as asked: no error, no override warning
        assert resolved.error is None and resolved.unsupported is None, (params, resolved)
        assert not [w for w in resolved.log_warnings if "overriding" in w or "adjusted" in w], (params, resolved)
    assert seen == {None, "EAGLE3", "DFLASH", "NGRAM"}


def test_each_algorithm_launches_with_its_own_flags() -> None:
    by_algo = {p["speculative_algorithm"]: argv for p, argv in _planned()}
    dflash, ngram, eagle3 = by_algo["DFLASH"], by_algo["NGRAM"], by_algo["EAGLE3"]
    assert dflash[dflash.index("--speculative-draft-model-path") + 1] == "z-lab/Kimi-K2.5-DFlash"
    assert "--speculative-dflash-block-size" in dflash and "--speculative-num-steps" not in dflash
    assert "--speculative-draft-model-path" not in ngram and "--speculative-ngram-max-bfs-breadth" in ngram
    assert eagle3[eagle3.index("--speculative-draft-model-path") + 1] == "lightseekorg/kimi-k2.5-eagle3"


def test_sweep_plan_prints_each_algorithms_launch_and_counts_refusals(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", str(SPEC)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=True,
    ).stdout
    for algo in ("EAGLE3", "DFLASH", "NGRAM"):
        assert f"speculative_algorithm={algo}" in out
    assert "--speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Kimi-K2.5-DFlash" in out
    assert "infeasible: draft tokens - 1 <= topk + (steps - 1) * topk^2" in out


def test_plan_counts_what_0_5_23_refuses_per_algorithm() -> None:
    """A space that sets EAGLE's knobs for every algorithm (no `when`): `sweep plan`'s census counts the
    DFLASH and NGRAM points SGLang would override or refuse under their own rules."""
    space = sp.SearchSpace(
        params={
            "speculative_algorithm": sp.ParamSpec(choices=(None, "EAGLE3", "DFLASH", "NGRAM")),
            "speculative_num_steps": sp.ParamSpec(choices=(None, 1, 3)),
            "speculative_eagle_topk": sp.ParamSpec(choices=(None, 1)),
            "speculative_dflash_block_size": sp.ParamSpec(choices=(None, 8)),
        }
    )
    total, feasible, reasons = sp.census(space)
    assert total == 4 * 3 * 2 * 2 and feasible < total
    assert reasons[Rule.dflash_single_pass.value] > 0  # DFLASH with 3 steps (_handle_dflash overrides)
    assert reasons[Rule.ngram_topk.value] > 0  # NGRAM with a top-k (_handle_ngram overwrites it)
    assert reasons[Rule.foreign_knob.value] > 0  # a DFLASH block beside EAGLE3 or NGRAM
    assert reasons[Rule.without_algorithm.value] > 0
