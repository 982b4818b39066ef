"""The simulator's noise-free truth over an experiment's space: the true optimum and any point's rank.

Used by `sweep truth` and by the search-efficiency benchmark (bench/search_efficiency.py): with the
truth known, "trials needed to reach 98% of the optimum" is a measurement, not an opinion.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.config import eagle
from orchestrator.config.experiment import SweepSpec
from orchestrator.config.space import points
from orchestrator.simulator import model as sim_model
from orchestrator.simulator import profiles, tokens


@dataclass(frozen=True)
class Truth:
    """Noise-free objective of every feasible point, best first."""

    values: tuple[float, ...]
    points: tuple[dict[str, Any], ...]
    metric: str
    maximize: bool = True

    @property
    def optimum(self) -> float:
        return self.values[0]

    def rank_of_value(self, value: float) -> int:
        """1-based rank a configuration with this true value would have (1 = optimum)."""
        sign = -1.0 if self.maximize else 1.0
        return bisect.bisect_left([sign * v for v in self.values], sign * value) + 1


MODELLED = ("decode_tok_s", "output_tok_s", "cycle_ms")
"""Objectives the simulator's model predicts for every point (latency percentiles come from queueing
and noise, which the noise-free model does not have)."""


def evaluator(spec: SweepSpec) -> Callable[[Mapping[str, Any]], float]:
    """A function params -> noise-free objective value for the experiment's simulator profiles.

    A point SGLang would refuse scores worst (0 tok/s, or infinite time for a minimized metric).
    """
    metric = spec.objective.metric
    if metric not in MODELLED:
        raise ValueError(f"the simulator's model predicts {', '.join(MODELLED)}, not {metric}")
    hw = profiles.load_hardware(spec.simulator.hardware_profile)
    model = profiles.load_model(spec.simulator.model_profile)
    concurrency = spec.benchmark.concurrency
    worst = 0.0 if spec.objective.direction == "maximize" else float("inf")

    def value(params: Mapping[str, Any]) -> float:
        pred = sim_model.evaluate({**eagle.effective(params), "tp": spec.server.tp}, hw, model, concurrency=concurrency)
        return float(getattr(pred, metric)) if pred.ok else worst

    return value


def changes_outputs(spec: SweepSpec) -> Callable[[Mapping[str, Any]], str]:
    """A function params -> why the simulated server's greedy outputs are not the model's ('' when they are):
    the simulator's modelled corruptions (simulator/tokens.py launch_numerics: NCCL_PROTO forcing LL128 on a
    PCIe host). The correctness gate refuses such a point, so an optimum a tool may deploy leaves it out."""
    hw = profiles.load_hardware(spec.simulator.hardware_profile)
    model = profiles.load_model(spec.simulator.model_profile)

    def why(params: Mapping[str, Any]) -> str:
        cfg = sim_model.resolve({**eagle.effective(params), "tp": spec.server.tp}, hw, model)
        if isinstance(cfg, str):
            return ""
        numerics = tokens.launch_numerics(hw, model, cfg)
        return numerics.why if numerics.corrupt_rate else ""

    return why


def feasible_points(spec: SweepSpec) -> Iterable[dict[str, Any]]:
    """Every point of the space SGLang would run as asked."""
    return (p for p in points(spec.space) if eagle.infeasible(p) is None)


def compute(spec: SweepSpec, points: Iterable[Mapping[str, Any]] | None = None) -> Truth:
    """Evaluate every feasible point (or the given ones), best first for the objective's direction."""
    value = evaluator(spec)
    maximize = spec.objective.direction == "maximize"
    scored = sorted(
        ((value(p), dict(p)) for p in (points if points is not None else feasible_points(spec))),
        key=lambda vp: -vp[0] if maximize else vp[0],
    )
    return Truth(tuple(v for v, _ in scored), tuple(p for _, p in scored), spec.objective.metric, maximize)
