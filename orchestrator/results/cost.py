"""What a night holds: the expected GPU-time of one trial before a sweep, and the remaining trials
estimated from what the trials measured while it runs.

Before a sweep (`sweep plan`): the simulator's cost model (simulator.cost.trial_cost) over the
experiment's model and hardware profiles, at the decode rate the model predicts for the baseline
and for the speculation the profile ships with; an `engine: sglang` experiment uses the model
profile it names, and says the figure is unknown without one. During a sweep (`sweep status`):
each finished trial's outcome carries its server start-up and benchmark seconds (`timings`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.config import eagle
from orchestrator.config.experiment import SweepSpec
from orchestrator.records import ParamValue
from orchestrator.simulator import TrialCost, evaluate, load_hardware, load_model, trial_cost
from orchestrator.simulator.cost import SIMULATED_START_S

__all__ = [
    "PROBE_SETTING_S",
    "PROBE_STARTUP_S",
    "SIMULATED_START_S",
    "CostEstimate",
    "Remaining",
    "TrialCost",
    "expected_cost",
    "probe_seconds",
    "remaining_trials",
]


@dataclass(frozen=True)
class CostEstimate:
    """One trial's expected real-scale seconds and how many fit the wall time."""

    cost: TrialCost | None
    """None when unknown (an engine: sglang experiment without a model profile)."""
    source: str
    """Where the figure comes from (profiles, load-time source), or why it is unknown."""
    wall_time_s: float
    probe_s: float = 0.0
    """Real-scale seconds of the probe stage, counted against the wall time."""

    @property
    def trials_fit(self) -> int | None:
        if self.cost is None or self.cost.total_s <= 0:
            return None
        return max(int((self.wall_time_s - self.probe_s) // self.cost.total_s), 0)


PROBE_SETTING_S = 1.0
"""Real-scale seconds per probed NCCL setting on a GPU host (docs/measurements/h200-probe-worker-cost.json:
about a second each once the rank workers have imported torch)."""
PROBE_STARTUP_S = 10.0
"""Starting the rank workers once (importing torch, the first process group)."""


def probe_seconds(spec: SweepSpec, settings: int) -> float:
    """Real-scale seconds of probing `settings` NCCL settings (0 without the probe stage)."""
    return PROBE_STARTUP_S + PROBE_SETTING_S * settings if settings else 0.0


def _decode_rate(spec: SweepSpec, params: Mapping[str, ParamValue]) -> float | None:
    hw = load_hardware(spec.simulator.hardware_profile)
    model = load_model(spec.simulator.model_profile)
    pred = evaluate(
        {**eagle.effective(dict(params)), "tp": spec.server.tp}, hw, model, concurrency=spec.benchmark.concurrency
    )
    return float(pred.decode_tok_s) if pred.ok and pred.decode_tok_s > 0 else None


def expected_cost(
    spec: SweepSpec, params: Mapping[str, ParamValue], *, profile_named: bool = True, probe_settings: int = 0
) -> CostEstimate:
    """The expected cost of one trial of `params`. `profile_named`: for engine sglang, whether the
    experiment names a model profile (simulator.model_profile set in its file); without one the cost
    is unknown."""
    wall = spec.budget.wall_time
    probe_s = probe_seconds(spec, probe_settings)
    if spec.engine == "sglang" and not profile_named:
        return CostEstimate(
            None,
            "unknown: name a model profile (simulator.model_profile) whose load time "
            "and speed resemble this model to get an estimate",
            wall,
            probe_s,
        )
    rate = _decode_rate(spec, params)
    if rate is None:
        return CostEstimate(None, "unknown: the model predicts no decode rate for this point", wall, probe_s)
    model = load_model(spec.simulator.model_profile)
    hw = load_hardware(spec.simulator.hardware_profile)
    b = spec.benchmark
    cost = trial_cost(
        model,
        hw,
        decode_tok_s=rate,
        requests=b.requests,
        output_len=b.output_len,
        concurrency=b.concurrency,
        repeats=b.repeats,
        warmup_requests=b.warmup_requests,
        input_len=b.input_len,
        tp=spec.server.tp,
        cuda_graph=not spec.server.flags.get("disable-cuda-graph", False),
    )
    source = f"model profile {model.name} on {hw.name} at {rate:.1f} tok/s per stream" + (
        "" if spec.engine == "simulator" else " (engine sglang: the profile stands in for the model)"
    )
    return CostEstimate(cost, source, wall, probe_s)


@dataclass(frozen=True)
class Remaining:
    """The remaining trials `sweep status` shows, from the finished trials' own timings."""

    trials: int
    per_trial_s: float
    startup_s: float
    bench_s: float
    measured: int
    """How many finished trials the figures come from."""


def remaining_trials(timings: Iterable[Mapping[str, float]], *, left_s: float, concurrent: int = 1) -> Remaining | None:
    """How many more trials fit in `left_s` seconds at the median start-up + benchmark seconds of the
    finished trials (`TrialOutcome.timings`: server_start, bench), `concurrent` at a time; None
    before any trial reported both."""
    startups, benches = [], []
    for t in timings:
        if t.get("server_start") is not None and t.get("bench") is not None:
            startups.append(float(t["server_start"]))
            benches.append(float(t["bench"]))
    if not startups:
        return None
    start, bench = statistics.median(startups), statistics.median(benches)
    per = start + bench
    fit = int(max(left_s, 0.0) // per) * max(concurrent, 1) if per > 0 else 0
    return Remaining(trials=fit, per_trial_s=per, startup_s=start, bench_s=bench, measured=len(startups))
