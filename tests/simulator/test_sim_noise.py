"""The simulator's run-to-run noise: one draw a server run for decode and, correlated with it by
simulator.noise_prefill_correlation, one for prefill (what a run's TTFT shows). The default (1) is the
noise the simulator always had: one speed for the whole run, as a slower GPU clock gives; at 0 a run's
TTFT says nothing of its decode speed, the world bench/overnight.py --prefill-correlation 0 measures."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.records import TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.simulator import cli
from orchestrator.simulator.engine import Timing, run_factor, run_factors
from orchestrator.simulator.model import prefill_ms, resolve
from orchestrator.simulator.profiles import load_hardware, load_model
from orchestrator.testing import ModelExecutor
from orchestrator.trial import plan as planner


def test_the_decode_factor_is_the_same_at_every_correlation() -> None:
    for seed in range(40):
        decode = run_factor(seed, 0.04)
        for c in (0.0, 0.5, 1.0):
            assert run_factors(seed, 0.04, c)[0] == decode
        assert run_factors(seed, 0.04, 1.0)[1] == decode  # one speed for the run
    assert run_factors(3, 0.0, 0.0) == (1.0, 1.0)


def test_the_prefill_factor_is_correlated_as_asked() -> None:
    def correlation(c: float) -> float:
        pairs = [run_factors(seed, 0.04, c) for seed in range(600)]
        return statistics.correlation([d for d, _ in pairs], [p for _, p in pairs])

    assert correlation(1.0) == pytest.approx(1.0)
    assert abs(correlation(0.0)) < 0.12
    assert 0.4 < correlation(0.6) < 0.8


def test_the_engine_times_prefill_with_the_prefill_factor() -> None:
    rng = random.Random(0)
    timing = Timing(run_factor=1.1, jitter=0.0, drift_per_hour=0.0, drift_epoch=0.0, prefill_factor=0.95)
    assert timing.factor(rng) == 1.1 and timing.factor(rng, prefill=True) == 0.95
    one_speed = Timing(run_factor=1.1, jitter=0.0, drift_per_hour=0.0, drift_epoch=0.0)
    assert one_speed.factor(rng, prefill=True) == 1.1


def test_the_flag_is_parsed_and_checked() -> None:
    _, sim = cli.parse(["--model-path", "m", "--sim-noise-prefill-correlation", "0.3"], {})
    assert sim.prefill_correlation == 0.3
    assert cli.parse(["--model-path", "m"], {})[1].prefill_correlation == 1.0
    with pytest.raises(SystemExit) as exc:
        cli.parse(["--model-path", "m", "--sim-noise-prefill-correlation", "1.5"], {})
    assert exc.value.code == 2


def _spec(tmp_path, correlation: float) -> spec_mod.SweepSpec:  # type: ignore[no-untyped-def]
    data = demo_experiment(
        name=f"noise{int(correlation * 10)}", simulator={"noise": 0.2, "noise_prefill_correlation": correlation}
    )
    data["benchmark"]["input_len"] = 1024  # long enough for the prefill's all-reduces to show
    return spec_mod.load(write_experiment(tmp_path, data, name=f"noise-{correlation}.yaml"))


def test_the_launch_plan_passes_the_correlation_only_when_set(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for correlation, expected in ((1.0, False), (0.3, True)):
        spec = _spec(tmp_path, correlation)
        argv = planner.make(spec, sp.baseline_params(spec.space), port=30000, seed=1).argv
        assert ("--sim-noise-prefill-correlation" in argv) is expected
        if expected:
            assert argv[argv.index("--sim-noise-prefill-correlation") + 1] == "0.3"


def _ttft_and_decode(tmp_path, correlation: float, params: dict) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path, correlation)
    ex = ModelExecutor(1)
    out = []
    for seed in range(6):
        number = len(list(tmp_path.glob("t*")))
        trial = TrialSpec(
            number=number,
            params={**sp.baseline_params(spec.space), **params},
            seed=seed,
            trial_dir=str(tmp_path / f"t{number}"),
            experiment=spec,
        )
        outcome = ex.answer(trial, started_at=0.0).outcome
        assert outcome.status is TrialStatus.COMPLETE and outcome.metrics is not None
        assert outcome.metrics.ttft_ms_p50 is not None
        out.append((outcome.metrics.ttft_ms_p50, outcome.metrics.decode_tok_s))
    return out


def test_the_model_backed_executor_times_ttft_as_the_engine_prefills(tmp_path) -> None:  # type: ignore[no-untyped-def]
    one_speed = _ttft_and_decode(tmp_path, 1.0, {})
    products = [math.log(t * d) for t, d in one_speed]
    assert max(t for t, _ in one_speed) > 1.2 * min(t for t, _ in one_speed)  # 20% noise shows
    apart = [math.log(t * d) for t, d in _ttft_and_decode(tmp_path, 0.0, {})]
    assert max(apart) - min(apart) > math.log(1.2)
    # slower run, slower at both: TTFT x decode rate keeps only the repeats' own jitter (noise / 8, drawn apart
    # for decode and prefill), against the whole 20% of two runs' draws where prefill draws its own
    assert statistics.stdev(products) < 0.4 * statistics.stdev(apart)
    # TTFT is the prefill of one prompt as the engine times it: its all-reduces follow the NCCL settings
    spec = _spec(tmp_path, 1.0)
    hw, model = load_hardware(spec.simulator.hardware_profile), load_model(spec.simulator.model_profile)
    expected = {}
    for name, params in (("default", {}), ("LL", {"NCCL_PROTO": "LL"})):
        cfg = resolve({**sp.baseline_params(spec.space), **params}, hw, model)
        assert not isinstance(cfg, str)
        expected[name] = prefill_ms(hw, model, cfg, spec.benchmark.input_len)
        got = statistics.median(t for t, _ in _ttft_and_decode(tmp_path, 1.0, params))
        assert got == pytest.approx(expected[name], rel=0.15)
    assert expected["LL"] > 1.3 * expected["default"]  # LL on 1024 tokens' messages: the prefill is slower
