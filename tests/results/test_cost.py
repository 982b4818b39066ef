"""What a night holds: one trial's expected GPU-time before a sweep, the remaining trials during one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.results import cost
from orchestrator.search import space as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
from probe_helpers import write_spec  # noqa: E402


def test_expected_cost_is_load_warmup_and_benchmark_and_fits_the_wall_time(tmp_path):
    spec = write_spec(
        tmp_path,
        benchmark={"requests": 16, "input_len": 512, "output_len": 512, "repeats": 3, "warmup_requests": 2},
        budget={"wall_time": "8h"},
    )
    est = cost.expected_cost(spec, sp.baseline_params(spec.space))
    assert est.cost is not None
    assert est.cost.load_s == 330  # kimi-k2.5's weights (270 s) + graph capture (60 s)
    # 3 x 16 requests of 512 tokens at the baseline's ~60 tok/s: about 7 minutes.
    assert 6 * 60 < est.cost.benchmark_s < 8 * 60 and est.cost.warmup_s < est.cost.benchmark_s
    assert est.trials_fit == int(8 * 3600 // est.cost.total_s)
    with_probe = cost.expected_cost(spec, sp.baseline_params(spec.space), probe_settings=48)
    assert with_probe.probe_s == 58 and with_probe.trials_fit == int((8 * 3600 - 58) // est.cost.total_s)


def test_an_sglang_experiment_without_a_model_profile_has_no_estimate(tmp_path):
    spec = write_spec(tmp_path, engine="sglang")
    est = cost.expected_cost(spec, sp.baseline_params(spec.space), profile_named=False)
    assert est.cost is None and est.trials_fit is None and "model profile" in est.source


def test_remaining_trials_from_the_trials_own_timings():
    timings = [
        {"server_start": 300.0, "bench": 280.0},
        {"server_start": 320.0, "bench": 260.0, "observe": 1.0},
        {"server_start": 340.0},
    ]  # a failed start has no bench: not counted
    left = cost.remaining_trials(timings, left_s=3600.0, concurrent=2)
    assert left is not None and left.measured == 2 and left.per_trial_s == pytest.approx(580.0)
    assert left.trials == 6 * 2
    assert cost.remaining_trials([], left_s=3600.0) is None
