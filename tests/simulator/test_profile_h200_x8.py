"""The 8x H200 NVSwitch profile: its derived all-reduce terms, and the EAGLE-3 gain over load it gives
with Kimi-K2.5 (issue 10: published gains shrink from ~2.9x at 2 concurrent requests to ~1.45x at 40).

A gain is the best speculative setting of a grid over the same NCCL defaults without speculation,
both at the same number of concurrent streams. SGLang runs at most 48 requests with speculation
(cli.resolve), so above 48 streams the speculative server decodes 48 and queues the rest.
"""

from __future__ import annotations

import functools

import pytest

from orchestrator.simulator import evaluate, load_hardware, load_model
from orchestrator.simulator.cli import parse, resolve
from orchestrator.simulator.model import NcclSettings, Prediction, all_reduce, nccl_all_reduce

X8, X2, KIMI = load_hardware("h200-nvlink-x8"), load_hardware("h200-nvlink"), load_model("kimi-k2.5")
LEVELS = (1, 2, 8, 16, 32, 40, 48, 64)
TOKEN = KIMI.hidden_size * KIMI.dtype_bytes  # one token's hidden state, bytes


def spec(steps: int, topk: int = 1, ndt: int | None = None, drafter: str = "EAGLE3") -> dict:
    return {"speculative_algorithm": drafter, "speculative_num_steps": steps, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": ndt if ndt is not None else steps + 1}


def grid(drafter: str) -> list[dict]:
    """Steps 1-7; top-k 1, 2, 4; draft tokens up to 16 (SGLang refuses the ones its top-k cannot fill)."""
    chains = [spec(s, 1, None, drafter) for s in range(1, 8)]
    trees = [spec(s, k, n, drafter) for s in range(1, 8) for k in (2, 4) for n in (3, 4, 6, 8, 10, 12, 16)]
    return chains + trees


@functools.cache
def running_cap() -> int:
    """SGLang's max_running_requests for an EAGLE-3 launch without --max-running-requests."""
    ns, _ = parse(["--model-path", "m", "--tp", "8", "--speculative-algorithm", "EAGLE3",
                   "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"], {})
    return int(resolve(ns).args["max_running_requests"])


@functools.cache
def gain_at(concurrency: int, drafter: str) -> tuple[float, float, dict, Prediction]:
    """(per-stream decode gain, total output gain, best setting, its prediction) at `concurrency` streams."""
    base = evaluate({}, X8, KIMI, concurrency=concurrency)
    running = min(concurrency, running_cap())
    ranked = [(evaluate(p, X8, KIMI, concurrency=running), p) for p in grid(drafter)]
    best, params = max(((p, g) for p, g in ranked if p.ok), key=lambda pg: pg[0].decode_tok_s)
    return (best.decode_tok_s / base.decode_tok_s, best.output_tok_s / base.output_tok_s, params, best)


# --------------------------------------------------------------------------------- the profile

def test_eight_ranks_cost_more_than_two_on_both_all_reduce_paths():
    settings = NcclSettings()
    nccl8, nccl2 = (nccl_all_reduce(hw, settings, tp, TOKEN, True).us for hw, tp in ((X8, 8), (X2, 2)))
    assert nccl8 == pytest.approx(36.0, rel=0.1)  # 14 ring steps instead of 2
    assert nccl2 == pytest.approx(10.8, rel=0.1)  # the measured 2-GPU figure, unchanged
    assert all_reduce(X8, settings, 8, TOKEN, True, True).us == pytest.approx(8.6, rel=0.1)
    assert all_reduce(X8, settings, 8, 48 * 4 * TOKEN, True, True).us == pytest.approx(25.0, rel=0.1)
    assert all_reduce(X8, settings, 8, TOKEN, True, True).us > all_reduce(X2, settings, 2, TOKEN, True, True).us


def test_custom_all_reduce_carries_verify_at_tp8_so_nccl_variables_do_not_matter():
    runs = [evaluate({**spec(3), **env}, X8, KIMI, concurrency=48)
            for env in ({}, {"NCCL_PROTO": "Simple"}, {"NCCL_MAX_NCHANNELS": "1"})]
    assert {p.ar_path for p in runs} == {"custom"}
    assert len({round(p.decode_tok_s, 9) for p in runs}) == 1
    nccl = evaluate({**spec(3), "all_reduce_path": "nccl"}, X8, KIMI, concurrency=48)
    assert nccl.ar_path == "nccl" and nccl.decode_tok_s < runs[0].decode_tok_s


# ------------------------------------------------------------------------- batching limits

def test_speculation_runs_at_most_48_requests_so_more_streams_only_queue():
    assert running_cap() == 48
    at_48, at_64 = gain_at(48, "EAGLE3"), gain_at(64, "EAGLE3")
    assert at_64[3].output_tok_s == pytest.approx(at_48[3].output_tok_s)  # same 48 running requests
    assert evaluate({}, X8, KIMI, concurrency=64).output_tok_s > evaluate({}, X8, KIMI, concurrency=48).output_tok_s
    assert at_64[1] < at_48[1]  # the capped speculative server falls behind on total output


def test_cuda_graphs_cover_verify_only_up_to_their_max_batch():
    assert X8.default_cuda_graph_max_bs >= running_cap()  # by default the 48-request cap binds first
    small = {**spec(3), "cuda_graph_max_bs": 32}
    inside, outside = evaluate(small, X8, KIMI, concurrency=32), evaluate(small, X8, KIMI, concurrency=40)
    assert inside.cuda_graph and not outside.cuda_graph
    default = evaluate(spec(3), X8, KIMI, concurrency=40)
    assert default.cuda_graph and outside.decode_tok_s < 0.9 * default.decode_tok_s


def test_verify_cost_grows_with_batch_times_draft_tokens():
    verify = {(c, n): evaluate(spec(n - 1), X8, KIMI, concurrency=c).verify_ms for c in (1, 8, 40) for n in (2, 4, 8)}
    for c in (1, 8, 40):
        assert verify[c, 2] < verify[c, 4] < verify[c, 8]
    for n in (2, 4, 8):
        assert verify[1, n] < verify[8, n] < verify[40, n]


# ----------------------------------------------------------------------------- the gain curve

# The current model's curve (per-stream decode gain at each of LEVELS). The field report's drafter
# (0.6 per position) loses at every load on this host; the published acceptance (3.97 tokens per
# cycle) wins, but the gain dips at 8 and grows again with load instead of shrinking.
CURVE = {
    "EAGLE3": (0.93, 0.82, 0.75, 0.78, 0.87, 0.90, 0.93, 1.06),
    "EAGLE3-PUBLISHED": (2.40, 2.18, 1.93, 2.09, 2.37, 2.43, 2.45, 2.80),
}


@pytest.mark.parametrize("drafter", sorted(CURVE))
def test_gain_curve_numbers(drafter):
    got = tuple(round(gain_at(c, drafter)[0], 2) for c in LEVELS)
    assert got == pytest.approx(CURVE[drafter], abs=0.03), f"{drafter}: {dict(zip(LEVELS, got))}"


def test_published_acceptance_is_3_97_tokens_per_cycle_at_the_published_setting():
    p = evaluate(spec(3, drafter="EAGLE3-PUBLISHED"), X8, KIMI, concurrency=2)
    assert p.accept_length == pytest.approx(3.97, abs=0.005)


@pytest.mark.xfail(strict=True, reason=(
    "model.py gives the published acceptance a gain that dips at 8 streams and grows with load: the "
    "MoE expert term saturates (384 experts) for verify batches long before decode batches, and "
    "verify_overhead_ms does not scale with the GPU. See the issue 10 report for the change needed."))
def test_published_shape_gain_shrinks_with_load():
    gains = [gain_at(c, "EAGLE3-PUBLISHED")[0] for c in LEVELS if 2 <= c <= 48]
    assert all(later <= earlier + 0.01 for earlier, later in zip(gains, gains[1:]))
    assert 2.0 <= gain_at(2, "EAGLE3-PUBLISHED")[0] <= 3.2
    assert 1.3 <= gain_at(40, "EAGLE3-PUBLISHED")[0] <= 1.6
