"""The 8x H200 NVSwitch profile: its derived all-reduce terms, and the EAGLE-3 gain over load it gives
with Kimi-K2.5 (issue 10: published gains shrink from ~2.9x at 2 concurrent requests to ~1.45x at 40).

A gain is a speculative setting over the same NCCL defaults without speculation, both at the same
number of concurrent streams: the published setting (3 steps, top-k 1, 4 draft tokens) or the best of
a grid. SGLang runs at most 48 requests with speculation, so above 48 streams the speculative server
decodes 48 and queues the rest; `evaluate` applies that cap itself.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources

import pytest

from orchestrator.simulator import ProfileError, evaluate, load_hardware, load_model
from orchestrator.simulator.cli import parse, resolve
from orchestrator.simulator.model import (
    SPECULATIVE_MAX_RUNNING_REQUESTS,
    NcclSettings,
    Prediction,
    all_reduce,
    nccl_all_reduce,
)

X8, X2, KIMI = load_hardware("h200-nvlink-x8"), load_hardware("h200-nvlink"), load_model("kimi-k2.5")
PCIE = load_hardware("pcie-rtxpro6000-x8")
LEVELS = (1, 2, 8, 16, 32, 40, 48, 64)
TOKEN = KIMI.hidden_size * KIMI.dtype_bytes  # one token's hidden state, bytes


def spec(steps: int, topk: int = 1, ndt: int | None = None, drafter: str = "EAGLE3") -> dict:
    return {
        "speculative_algorithm": drafter,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": ndt if ndt is not None else steps + 1,
    }


def grid(drafter: str) -> list[dict]:
    """Steps 1-7; top-k 1, 2, 4; draft tokens up to 16 (SGLang refuses the ones its top-k cannot fill)."""
    chains = [spec(s, 1, None, drafter) for s in range(1, 8)]
    trees = [spec(s, k, n, drafter) for s in range(1, 8) for k in (2, 4) for n in (3, 4, 6, 8, 10, 12, 16)]
    return chains + trees


@functools.cache
def running_cap() -> int:
    """SGLang's max_running_requests for an EAGLE-3 launch without --max-running-requests."""
    ns, _ = parse(
        [
            "--model-path",
            "m",
            "--tp",
            "8",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
        ],
        {},
    )
    return int(resolve(ns).args["max_running_requests"])


@functools.cache
def gain_at(concurrency: int, drafter: str) -> tuple[float, float, dict, Prediction]:
    """(per-stream decode gain, total output gain, best setting, its prediction) at `concurrency` streams."""
    base = evaluate({}, X8, KIMI, concurrency=concurrency)
    ranked = [(evaluate(p, X8, KIMI, concurrency=concurrency), p) for p in grid(drafter)]
    best, params = max(((p, g) for p, g in ranked if p.ok), key=lambda pg: pg[0].decode_tok_s)
    return (best.decode_tok_s / base.decode_tok_s, best.output_tok_s / base.output_tok_s, params, best)


@functools.cache
def published_gain_at(concurrency: int) -> tuple[float, float]:
    """(per-stream decode gain, total output gain) of the published setting (3 steps, top-k 1, 4 draft tokens)."""
    base = evaluate({}, X8, KIMI, concurrency=concurrency)
    pub = evaluate(spec(3, drafter="EAGLE3-PUBLISHED"), X8, KIMI, concurrency=concurrency)
    return pub.decode_tok_s / base.decode_tok_s, pub.output_tok_s / base.output_tok_s


# --------------------------------------------------------------------------------- the profile


def test_eight_ranks_cost_more_than_two_on_both_all_reduce_paths():
    settings = NcclSettings()
    nccl8, nccl2 = (nccl_all_reduce(hw, settings, tp, TOKEN, True).us for hw, tp in ((X8, 8), (X2, 2)))
    assert nccl8 == pytest.approx(36.0, rel=0.1)  # 14 ring steps instead of 2
    assert nccl2 == pytest.approx(10.8, rel=0.1)  # the measured 2-GPU figure, unchanged
    assert all_reduce(X8, settings, 8, TOKEN, True, True).us == pytest.approx(8.6, rel=0.1)
    assert all_reduce(X8, settings, 8, 48 * 4 * TOKEN, True, True).us == pytest.approx(25.0, rel=0.1)
    assert all_reduce(X8, settings, 8, TOKEN, True, True).us > all_reduce(X2, settings, 2, TOKEN, True, True).us


def test_flashinfer_fusion_carries_verify_at_tp8_so_nccl_variables_do_not_matter():
    """SGLang 0.5.23 arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable turns the fusion on for
    KimiK25ForConditionalGeneration on SM90 at TP 8; --disable-custom-all-reduce (all_reduce_path nccl) does
    not turn it off, only all_reduce_backend nccl (--enforce-disable-flashinfer-allreduce-fusion) does."""
    runs = [
        evaluate({**spec(3), **env}, X8, KIMI, concurrency=48)
        for env in ({}, {"NCCL_PROTO": "Simple"}, {"NCCL_MAX_NCHANNELS": "1"}, {"all_reduce_path": "nccl"})
    ]
    assert {p.ar_path for p in runs} == {"flashinfer_fusion"}
    assert len({round(p.decode_tok_s, 9) for p in runs}) == 1
    custom = evaluate({**spec(3), "all_reduce_backend": "custom"}, X8, KIMI, concurrency=48)
    assert custom.ar_path == "custom"
    nccl = evaluate({**spec(3), "all_reduce_backend": "nccl"}, X8, KIMI, concurrency=48)
    assert nccl.ar_path == "nccl" and nccl.decode_tok_s < runs[0].decode_tok_s


# ------------------------------------------------------------------------- batching limits


def test_speculation_runs_at_most_48_requests_so_more_streams_only_queue():
    assert running_cap() == SPECULATIVE_MAX_RUNNING_REQUESTS == 48  # the server's cap is the model's
    at_48, at_64 = evaluate(spec(3), X8, KIMI, concurrency=48), evaluate(spec(3), X8, KIMI, concurrency=64)
    assert (at_48.running, at_64.running) == (48, 48)
    assert at_64.output_tok_s == pytest.approx(at_48.output_tok_s)  # same 48 running requests
    assert evaluate({}, X8, KIMI, concurrency=64).running == 64  # no cap without speculation
    assert evaluate({}, X8, KIMI, concurrency=64).output_tok_s > evaluate({}, X8, KIMI, concurrency=48).output_tok_s
    assert gain_at(64, "EAGLE3")[1] < gain_at(48, "EAGLE3")[1]  # the capped speculative server falls behind


def test_max_running_requests_given_replaces_the_speculative_default_on_every_profile():
    for hw in (X8, X2, PCIE):
        raised = evaluate({**spec(3), "max_running_requests": 64}, hw, KIMI, concurrency=64)
        assert raised.running == 64
        assert raised.output_tok_s > evaluate(spec(3), hw, KIMI, concurrency=64).output_tok_s
        assert evaluate({"max_running_requests": 8}, hw, KIMI, concurrency=64).running == 8


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


def test_verify_keeps_growing_per_token_after_the_experts_saturate():
    """160 verify tokens (40 x 4) touch all but ~1 of 384 experts; verify still costs more per extra stream."""
    v = {c: evaluate(spec(3), X8, KIMI, concurrency=c).verify_ms for c in (32, 40, 48)}
    assert v[40] - v[32] == pytest.approx(v[48] - v[40], rel=0.15)
    assert v[48] - v[40] > 0.05 * v[40]


# ------------------------------------------------------------------------- the hardware weights


def _x8_file(tmp_path, old: str, new: str) -> str:
    text = resources.files("orchestrator.simulator").joinpath("profiles/h200-nvlink-x8.yaml").read_text()
    assert old in text
    path = tmp_path / "hw.yaml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize(
    "old,new,message",
    [
        (
            "verify_overhead_gpu_share: 1.0",
            "verify_overhead_gpu_share: 1.5",
            "0 <= verify_overhead_gpu_share <= 1.0 must hold, but got verify_overhead_gpu_share=1.5",
        ),
        (
            "per_token_factor: 2.5",
            "per_token_factor: -1",
            "per_token_factor >= 0 must hold, but got per_token_factor=-1",
        ),
        (
            "per_unique_expert_factor: 0.2",
            "per_unique_expert_factor: fast",
            "per_unique_expert_factor >= 0 must hold, but got per_unique_expert_factor='fast'",
        ),
    ],
)
def test_hardware_weights_are_validated(tmp_path, old, new, message):
    with pytest.raises(ProfileError) as exc:
        load_hardware(_x8_file(tmp_path, old, new))
    assert message in str(exc.value)


def test_hardware_weights_need_a_calibration_text(tmp_path):
    text = resources.files("orchestrator.simulator").joinpath("profiles/h200-nvlink-x8.yaml").read_text()
    path = tmp_path / "hw.yaml"
    path.write_text(text[: text.index("calibration: >")])  # calibration is the profile's last key
    with pytest.raises(ProfileError) as exc:
        load_hardware(str(path))
    assert (
        "per_unique_expert_factor, per_token_factor, verify_overhead_gpu_share re-weigh the model's fitted "
        "terms; calibration must say what they are fitted to"
    ) in str(exc.value)


def test_the_verify_overhead_split_changes_nothing_on_the_reference_gpu_at_reference_tp():
    split = dataclasses.replace(PCIE, verify_overhead_gpu_share=1.0)
    for c in (1, 16):
        assert evaluate(spec(3), split, KIMI, concurrency=c).decode_tok_s == pytest.approx(
            evaluate(spec(3), PCIE, KIMI, concurrency=c).decode_tok_s, rel=1e-12
        )


# ----------------------------------------------------------------------------- the gain curve

# The model's curve on this profile (per-stream decode gain, best of the grid, at each of LEVELS).
# The field report's drafter (0.6 per position) gains 1.4x at one stream and loses from 8 streams on.
# The published acceptance (0.995 per position) rewards the deepest chain (7 steps) at every load:
# ~3x at 2 streams, ~1.5x at 40. Past 48 streams the speculative server runs 48 requests, so its
# per-stream gain rises again while its total gain falls (1.28x at 64 for the best, 1.11x published).
CURVE = {
    "EAGLE3": (1.41, 1.20, 0.94, 0.87, 0.83, 0.82, 0.81, 0.94),
    "EAGLE3-PUBLISHED": (3.41, 3.11, 2.31, 1.96, 1.66, 1.56, 1.49, 1.71),
}
# The published setting (3 steps, top-k 1, 4 draft tokens) with the published acceptance; published
# on MI325X: 2.88x at 2 streams, 1.45x at 40 (see the profile's calibration for why 2 streams is lower).
PUBLISHED_SETTING_CURVE = (2.11, 2.01, 1.68, 1.51, 1.36, 1.32, 1.28, 1.47)


@pytest.mark.parametrize("drafter", sorted(CURVE))
def test_gain_curve_numbers(drafter):
    got = tuple(round(gain_at(c, drafter)[0], 2) for c in LEVELS)
    assert got == pytest.approx(CURVE[drafter], abs=0.03), f"{drafter}: {dict(zip(LEVELS, got))}"


def test_published_setting_curve_numbers():
    got = tuple(round(published_gain_at(c)[0], 2) for c in LEVELS)
    assert got == pytest.approx(PUBLISHED_SETTING_CURVE, abs=0.03), dict(zip(LEVELS, got))


def test_published_acceptance_is_3_97_tokens_per_cycle_at_the_published_setting():
    p = evaluate(spec(3, drafter="EAGLE3-PUBLISHED"), X8, KIMI, concurrency=2)
    assert p.accept_length == pytest.approx(3.97, abs=0.005)


def _shrinks(gains: list[float]) -> bool:
    return all(later <= earlier + 0.01 for earlier, later in zip(gains, gains[1:]))


@pytest.mark.parametrize("which", ["best of the grid", "published setting"])
def test_published_shape_gain_shrinks_with_load(which):
    """Published (MI325X): 2.88x at 2 streams, 1.45x at 40. The profile's weights are fitted to this shape."""
    at = (lambda c: gain_at(c, "EAGLE3-PUBLISHED")[:2]) if which == "best of the grid" else published_gain_at
    per_stream = [at(c)[0] for c in LEVELS if c <= 48]
    total = [at(c)[1] for c in LEVELS if c <= 48]
    assert _shrinks(per_stream) and total == pytest.approx(per_stream)  # all streams run up to 48
    low = 2.0 if which == "best of the grid" else 1.95  # the published setting's ceiling here is ~2.1x
    assert low <= at(2)[0] <= 3.2
    assert 1.3 <= at(40)[0] <= 1.6
    assert at(64)[1] < at(48)[1]  # 64 streams: 48 speculate, 64 run without
