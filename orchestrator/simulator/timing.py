"""What scales the simulator's modelled time for one server run: the run's noise factors (decode and prefill),
the cycle-to-cycle jitter and the host's drift."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """What scales modelled time for one server run."""

    run_factor: float
    jitter: float
    drift_per_hour: float
    drift_epoch: float
    prefill_factor: float | None = None
    """The run's factor on prefill time (run_factors' second); None: run_factor, one speed for the run."""

    def factor(self, rng: random.Random, *, prefill: bool = False) -> float:
        hours = max(0.0, time.time() - self.drift_epoch) / 3600.0
        jitter = 1.0 + self.jitter * rng.gauss(0.0, 1.0) if self.jitter else 1.0
        run = self.prefill_factor if prefill and self.prefill_factor is not None else self.run_factor
        return run * (1.0 + self.drift_per_hour * hours) * max(jitter, 0.5)


def run_factors(seed: int | None, noise: float, prefill_correlation: float = 1.0) -> tuple[float, float]:
    """One server run's multiplicative noise on (decode cycle time, prefill time), drawn once from the run's
    seed. The decode factor is the run's own draw; the prefill factor shares it by `prefill_correlation`
    (1: one speed for the whole run, what a slower GPU clock gives; 0: prefill's own draw, so a run's
    TTFT says nothing of its decode speed), the rest drawn after it, so the decode factor of a seed is
    the same at every correlation."""
    if noise <= 0:
        return 1.0, 1.0
    rng = random.Random(None if seed is None else seed * 7919 + 1)
    shared = rng.gauss(0.0, 1.0)
    own = rng.gauss(0.0, 1.0)
    c = max(-1.0, min(1.0, prefill_correlation))
    prefill = c * shared + math.sqrt(1.0 - c * c) * own

    def factor(z: float) -> float:
        return max(0.5, 1.0 + noise * max(-3.0, min(3.0, z)))

    return factor(shared), factor(prefill)


def run_factor(seed: int | None, noise: float) -> float:
    """The per-server-run multiplicative noise on cycle time (run_factors' first)."""
    return run_factors(seed, noise)[0]


def per_cycle_jitter(noise: float) -> float:
    """Cycle-to-cycle jitter: a quarter of the run-to-run noise."""
    return noise / 4.0 if noise > 0 else 0.0
