"""Issue 9's cost model: the profiles' load figure, the real-scale cost of a trial, and the
simulator's --sim-time-scale start-up sleep."""

from __future__ import annotations

from importlib import resources

import pytest
from sim_helpers import Sim

from orchestrator.simulator import ProfileError, cli, evaluate, load_hardware, load_model, trial_cost

KIMI_BENCH = {"requests": 16, "output_len": 512, "input_len": 512, "concurrency": 1, "repeats": 3, "warmup_requests": 2}


def test_kimi_trial_costs_about_ten_minutes_on_the_field_report_host():
    """Issue 9: loading ~1T parameters, graph capture, 3 x 16 requests x 512 tokens at ~90 tok/s."""
    model, hw = load_model("kimi-k2.5"), load_hardware("pcie-rtxpro6000-x8")
    cost = trial_cost(model, hw, decode_tok_s=90.0, **KIMI_BENCH)
    assert cost.load_s == 330.0
    assert cost.benchmark_s == pytest.approx(3 * 16 * (512 / 90 + 0.020 + 0.09 * 512 / 1e3), rel=1e-9)
    assert 540 <= cost.total_s <= 720
    assert 40 <= 8 * 3600 // cost.total_s <= 54  # "an 8-hour night holds about 45"


def test_cost_follows_the_predicted_rate_concurrency_and_graphs():
    model, hw = load_model(), load_hardware()
    pred = evaluate(
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": 2,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 3,
        },
        hw,
        model,
    )
    slow = trial_cost(model, hw, decode_tok_s=pred.decode_tok_s / 2, **KIMI_BENCH)
    fast = trial_cost(model, hw, decode_tok_s=pred.decode_tok_s, **KIMI_BENCH)
    assert slow.load_s == fast.load_s and slow.benchmark_s > 1.9 * fast.benchmark_s
    waves = trial_cost(model, hw, decode_tok_s=90.0, **{**KIMI_BENCH, "concurrency": 4})
    assert waves.benchmark_s == pytest.approx(trial_cost(model, hw, decode_tok_s=90.0, **KIMI_BENCH).benchmark_s / 4)
    eager = trial_cost(model, hw, decode_tok_s=90.0, cuda_graph=False, **KIMI_BENCH)
    assert eager.load_s == model.load_weights_s


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"decode_tok_s": 0.0}, "decode_tok_s must be > 0, but got 0.0"),
        ({"repeats": 0}, "repeats must be >= 1, but got 0"),
        ({"requests": 0}, "requests must be >= 1, but got 0"),
    ],
)
def test_cost_refuses_what_cannot_be_planned(kwargs, message):
    args = {"decode_tok_s": 90.0, "requests": 16, "output_len": 512, **kwargs}
    with pytest.raises(ValueError, match=message):
        trial_cost(load_model(), load_hardware(), **args)


def _model_file(tmp_path, load_block: str) -> str:
    text = resources.files("orchestrator.simulator").joinpath("profiles/kimi-k2.5.yaml").read_text()
    start, end = text.index("load:\n"), text.index("calibration:")
    path = tmp_path / "model.yaml"
    path.write_text(text[:start] + load_block + text[end:])
    return str(path)


@pytest.mark.parametrize(
    "block,message",
    [
        ("", "missing key load"),
        ("load: {weights_s: 1, graph_capture_s: 1}\n", "load.source must say where"),
        ("load: {weights_s: -1, graph_capture_s: 1, source: x}\n", "load.weights_s must be a number of seconds >= 0"),
        ("load: {weights_s: 1, graph_capture_s: 1, source: x, disk: nvme}\n", "unknown key(s) load.disk"),
    ],
)
def test_load_figures_are_validated_strictly(tmp_path, block, message):
    with pytest.raises(ProfileError) as exc:
        load_model(_model_file(tmp_path, block))
    assert message in str(exc.value)


def test_time_scale_flag_defaults_to_fast_starts_and_is_bounded(capsys):
    _, sim = cli.parse(["--model-path", "m"], {})
    assert sim.time_scale == 0.0
    with pytest.raises(SystemExit):
        cli.parse(["--model-path", "m", "--sim-time-scale", "2"], {})
    assert "--sim-time-scale must be in [0, 1], but got 2.0" in capsys.readouterr().err


def test_simulator_sleeps_the_scaled_load_at_start_up(tmp_path):
    profile = _model_file(tmp_path, "load: {weights_s: 150, graph_capture_s: 50, source: test}\n")
    sim = Sim(tmp_path, "--model-profile", profile, "--sim-time-scale", "0.01", "--sim-noise", "0")
    try:
        seconds = sim.wait_ready(30)
    finally:
        sim.stop()
    assert seconds >= 2.0  # (150 + 50) x 0.01
    log = sim.log()
    assert "Load weight end. elapsed=1.92 s" in log and "Capture cuda graph end. Time elapsed: 0.81 s." in log
