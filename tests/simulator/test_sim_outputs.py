"""Greedy outputs of the simulated model (simulator/tokens.py) through a real simulator's /generate, as the
correctness gate reads them (trial/outputs.py): deterministic in the prompt and --model-path, the same as
the model-backed executor's, changed by the modelled faults (LL128 forced on PCIe, a broken draft wiring).
The corruption is MODELLED after NCCL's documentation of NCCL_PROTO, not measured."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from orchestrator.records import OutputsRecord, OutputsRequest, ScoreRequest
from orchestrator.results import correctness
from orchestrator.simulator import tokens
from orchestrator.simulator.model import resolve
from orchestrator.simulator.profiles import load_hardware, load_model
from orchestrator.testing.model_executor import model_outputs
from orchestrator.trial import outputs

SPEC = (
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)
ASK = OutputsRequest(prompts=4, max_new_tokens=64)
LONG = OutputsRequest(prompts=8, max_new_tokens=160)
"""Long enough for the modelled corruption rates (1% of tokens with LL128 on PCIe) to show."""


def _capture(url: str, request: OutputsRequest = ASK) -> OutputsRecord:
    record = outputs.collect(request, outputs.http_post(url), lambda: 60.0)
    assert record.error == ""
    return record


def _captures(*asks: tuple[str, OutputsRequest]) -> list[OutputsRecord]:
    """Each (url, request) captured at the same time, one thread each: the servers are separate processes
    that decode in real time, so one after another only added up their waits."""
    with ThreadPoolExecutor(len(asks)) as pool:
        return list(pool.map(lambda ask: _capture(*ask), asks))


def _scored_by(url: str, arm: str, other: OutputsRecord, own: OutputsRecord) -> OutputsRecord:
    """`url`'s server scoring `other`'s outputs that differ from `own`'s."""
    base = {p.prompt: p for p in own.prompts}
    score = tuple(
        ScoreRequest(arm=arm, prompt=p.prompt, input_ids=(*p.prompt_ids, *p.output_ids), continuation=len(p.output_ids))
        for p in other.prompts
        if p.output_ids != base[p.prompt].output_ids
    )
    return _capture(url, OutputsRequest(prompts=0, max_new_tokens=1, score=score))


def _verdict(arm: str, other: OutputsRecord, own: OutputsRecord, scored: OutputsRecord) -> correctness.Correctness:
    return correctness.compare(arm, other, own, scored.scored, prompts=len(own.prompts), tolerance_nats=0.5)


def test_outputs_depend_on_prompt_and_model_only_and_match_the_model_backed_executor(sim_factory):
    a = sim_factory("--tp-size", "2", "--sim-seed", "1", "--sim-noise", "0.05")
    b = sim_factory("--tp-size", "2", "--sim-seed", "7", "--sim-noise", "0")
    a.wait_ready()
    b.wait_ready()
    first, second = _captures((a.url, ASK), (b.url, ASK))
    assert [p.output_ids for p in first.prompts] == [p.output_ids for p in second.prompts]
    assert all(len(p.output_ids) == 64 and len(p.output_logprobs) == 64 for p in first.prompts)
    assert [p.prompt_ids for p in first.prompts] == [tuple(tokens.tokenize(t)) for t in outputs.PROMPTS[:4]]
    # the model-backed executor answers the same capture with the same token function
    hw, md = load_hardware("pcie-rtxpro6000-x8"), load_model("kimi-k2.5")
    cfg = resolve({"tp": 2}, hw, md)
    assert not isinstance(cfg, str)
    modelled = model_outputs(ASK, model_path="kimi-k2.5", numerics=tokens.launch_numerics(hw, md, cfg))
    assert [p.output_ids for p in modelled.prompts] == [p.output_ids for p in first.prompts]
    assert all(m.output_logprobs == pytest.approx(f.output_logprobs) for m, f in zip(modelled.prompts, first.prompts))


def test_speculation_keeps_the_outputs_up_to_near_ties(sim_factory):
    base = sim_factory("--tp-size", "2")
    spec = sim_factory("--tp-size", "2", *SPEC)
    base.wait_ready()
    spec.wait_ready()
    own, other = _captures((base.url, ASK), (spec.url, ASK))
    verdict = _verdict("champion", other, own, _scored_by(base.url, "champion", other, own))
    assert verdict.passed, verdict.text()
    assert verdict.worst_nats is None or verdict.worst_nats < tokens.NEAR_TIE_NATS


def test_forced_ll128_on_pcie_changes_the_outputs_and_the_baseline_scores_them_far_below(sim_factory):
    base = sim_factory("--tp-size", "2")
    ll128 = sim_factory("--tp-size", "2", env={"NCCL_PROTO": "LL128"})
    base.wait_ready()
    ll128.wait_ready()
    own, other = _captures((base.url, LONG), (ll128.url, LONG))
    assert any(p.output_ids != q.output_ids for p, q in zip(own.prompts, other.prompts))
    verdict = _verdict("champion", other, own, _scored_by(base.url, "champion", other, own))
    assert not verdict.passed and verdict.check == correctness.SCORED
    assert verdict.worst_nats is not None and verdict.worst_nats > tokens.OTHER_WORD_NATS[0] - 1
    assert "nats below its own top choice (tolerance 0.5 nats)" in verdict.figure


def test_a_broken_draft_wiring_collapses_acceptance_and_changes_the_outputs(sim_factory):
    base = sim_factory("--tp-size", "2", *SPEC)
    broken = sim_factory("--tp-size", "2", *SPEC, faults=("draft_wiring_broken",))
    base.wait_ready()
    broken.wait_ready()
    body = {"text": outputs.PROMPTS[0], "sampling_params": {"temperature": 0, "max_new_tokens": 64}}
    healthy = httpx.post(base.url + "/generate", json=body, timeout=60).json()["meta_info"]
    collapsed = httpx.post(broken.url + "/generate", json=body, timeout=60).json()["meta_info"]
    assert healthy["spec_accept_length"] > 2.0
    assert collapsed["spec_accept_length"] < 1.2  # ~1: the draft is never right
    own, other = _captures((base.url, LONG), (broken.url, LONG))
    verdict = _verdict("champion", other, own, _scored_by(base.url, "champion", other, own))
    assert not verdict.passed and verdict.differing >= 1


def test_logprob_fields_have_sglangs_shapes(sim_factory):
    sim = sim_factory("--tp-size", "2")
    sim.wait_ready()
    prompt = "the model of the ring"
    meta = httpx.post(
        sim.url + "/generate",
        json={
            "text": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": 5},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 1,
        },
        timeout=30,
    ).json()["meta_info"]
    ins, outs = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert [e[1] for e in ins] == tokens.tokenize(prompt) and ins[0][0] is None and ins[0][2] is None
    assert len(outs) == meta["output_token_logprobs_length"] == 5 and all(e[0] <= 0 for e in outs)
    assert len(meta["input_top_logprobs"]) == len(ins) and len(meta["output_top_logprobs"]) == 5
    assert all(top[0][0] >= e[0] for top, e in zip(meta["output_top_logprobs"], outs))  # greedy: the top one
    no_logprobs = httpx.post(
        sim.url + "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 2}}, timeout=30
    ).json()["meta_info"]
    assert "input_token_logprobs" not in no_logprobs
    bad = httpx.post(
        sim.url + "/generate", json={"text": prompt, "return_logprob": True, "logprob_start_len": -5}, timeout=30
    )
    assert bad.status_code == 400 and "logprob_start_len" in bad.json()["error"]["message"]


def test_deterministic_inference_gives_one_stream_whatever_the_reduction_order():
    """Near ties fall with the reduction order (another NCCL algorithm here); with
    --enable-deterministic-inference every launch decodes alike (an ASSUMPTION of the simulator: SGLang
    claims batch invariance)."""
    hw, md = load_hardware("pcie-rtxpro6000-x8"), load_model("kimi-k2.5")
    ring, tree = resolve({"tp": 8}, hw, md), resolve({"tp": 8, "NCCL_ALGO": "Tree"}, hw, md)
    assert not isinstance(ring, str) and not isinstance(tree, str)
    ask = OutputsRequest(prompts=16, max_new_tokens=256)

    def streams(cfg, deterministic):
        numerics = tokens.launch_numerics(hw, md, cfg, deterministic=deterministic)
        return [p.output_ids for p in model_outputs(ask, model_path="kimi-k2.5", numerics=numerics).prompts]

    assert streams(ring, False) != streams(tree, False)
    assert streams(ring, True) == streams(tree, True)


def test_the_baselines_top_tokens_let_the_search_screen_refuse_ll128_and_keep_speculation(sim_factory):
    """top_logprobs_num 5 through the simulator's /generate (SGLang's output_top_logprobs: per position a
    list of [logprob, token_id, text], best first), the same lists from the model-backed executor, and
    the search's screen (results/correctness.screen) on them: speculation passes, forced LL128 is refused."""
    base = sim_factory("--tp-size", "2")
    spec = sim_factory("--tp-size", "2", *SPEC)
    ll128 = sim_factory("--tp-size", "2", env={"NCCL_PROTO": "LL128"})
    for s in (base, spec, ll128):
        s.wait_ready()
    ask = OutputsRequest(prompts=8, max_new_tokens=160, top_logprobs=5)
    own, spec_long, ll128_long = _captures((base.url, ask), (spec.url, LONG), (ll128.url, LONG))
    assert all(len(p.output_top) == 160 and all(len(top) == 5 for top in p.output_top) for p in own.prompts)
    # best first; greedy: the output token is the top one, or at a near tie the launch's numerics flipped
    # (simulator/tokens.py next_token) the second, within NEAR_TIE_NATS of it
    assert all(
        [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        and top[0][1] - dict(top).get(t, -99.0) < tokens.NEAR_TIE_NATS
        for p in own.prompts
        for top, t in zip(p.output_top, p.output_ids)
    )
    hw, md = load_hardware("pcie-rtxpro6000-x8"), load_model("kimi-k2.5")
    cfg = resolve({"tp": 2}, hw, md)
    assert not isinstance(cfg, str)
    modelled = model_outputs(ask, model_path="kimi-k2.5", numerics=tokens.launch_numerics(hw, md, cfg))
    assert [p.output_top for p in modelled.prompts] == [p.output_top for p in own.prompts]
    kept = correctness.screen(spec_long, own, prompts=8, tolerance_nats=0.5)
    assert kept.passed, kept.text()
    refused = correctness.screen(ll128_long, own, prompts=8, tolerance_nats=0.5)
    assert not refused.passed and refused.worst_nats is not None and refused.worst_nats > 5.0, refused.text()
