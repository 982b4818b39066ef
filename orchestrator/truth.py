"""The simulator's noise-free truth over an experiment's space: the true optimum and any point's rank.

Used by `sweep truth` and by the search-efficiency benchmark (bench/search_efficiency.py): with the
truth known, "trials needed to reach 98% of the optimum" is a measurement, not an opinion.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator import space as sp
from orchestrator.simulator import model as sim_model
from orchestrator.simulator import profiles
from orchestrator.spec import SweepSpec


@dataclass(frozen=True)
class Truth:
    """Noise-free objective of every feasible point, best first."""

    values: tuple[float, ...]
    points: tuple[dict[str, Any], ...]
    metric: str

    @property
    def optimum(self) -> float:
        return self.values[0]

    def rank_of_value(self, value: float) -> int:
        """1-based rank a configuration with this true value would have (1 = optimum)."""
        ascending = [-v for v in self.values]
        return bisect.bisect_left(ascending, -value) + 1


def evaluator(spec: SweepSpec):
    """A function params -> noise-free objective value for the experiment's simulator profiles."""
    hw = profiles.load_hardware(spec.simulator.hardware_profile)
    model = profiles.load_model(spec.simulator.model_profile)
    metric = spec.objective.metric
    concurrency = spec.benchmark.concurrency

    def value(params: Mapping[str, Any]) -> float:
        pred = sim_model.evaluate({**sp.effective(params), "tp": spec.server.tp}, hw, model,
                                  concurrency=concurrency)
        if not pred.ok:
            return 0.0
        return float(getattr(pred, metric, pred.decode_tok_s) or 0.0)

    return value


def feasible_points(spec: SweepSpec) -> Iterable[dict[str, Any]]:
    return (p for p in sp.points(spec.space) if sp.infeasible_reason(p) is None)


def compute(spec: SweepSpec, points: Iterable[Mapping[str, Any]] | None = None) -> Truth:
    """Evaluate every feasible point (or the given ones); only meaningful for maximized tok/s metrics."""
    value = evaluator(spec)
    scored = sorted(((value(p), dict(p)) for p in (points if points is not None else feasible_points(spec))),
                    key=lambda vp: -vp[0])
    return Truth(tuple(v for v, _ in scored), tuple(p for _, p in scored), spec.objective.metric)


def rank_space(spec: SweepSpec) -> list[tuple[float, dict[str, Any]]]:
    t = compute(spec)
    return list(zip(t.values, t.points))
