"""Sequential confirmation: interleaved champion/baseline rounds until the evidence decides.

Each round measures the champion and the baseline back to back (A B, then B A next round, so that
a host drifting during the night hits both alike); its evidence is one log ratio
`d = log(champion / baseline)` (sign flipped for metrics where lower is better). After every round
from `min_rounds` on, a one-sided Student-t bound on the mean log ratio is compared with the required
gain `log(1 + min_gain)`:

- lower bound above it: **promoted**;
- upper bound below it: **not better** (the champion cannot show the required gain);
- neither after `max_rounds`: **undecided**, with what to change.

Looking after every round would inflate the error rates of a fixed-n test, so each look spends an
equal share of the error budget (Bonferroni over the looks that can happen: `alpha / looks` per side).
That is conservative, and `bench/gate_power.py` measures what it costs: the false promotions of a
no-better configuration and the misses of a true +5% gain at 2% noise with drift.

Pure: numbers in, a decision out. The driver owns the measuring.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Direction = Literal["maximize", "minimize"]

ALPHA = 0.05
"""Total one-sided error budget of each of the two decisions over all looks."""


class Verdict(str, enum.Enum):
    promoted = "promoted"
    not_better = "not_better"
    undecided = "undecided"


@dataclass(frozen=True)
class RoundsPlan:
    """How many interleaved rounds a confirmation may take, and the gain it must show."""

    min_rounds: int
    max_rounds: int
    min_gain: float
    """Relative gain over the baseline the champion must show (0.02 = 2%)."""

    def __post_init__(self) -> None:
        if self.min_rounds < 3:
            raise ValueError(f"min_rounds >= 3 must hold (an interval needs 2 degrees of freedom), "
                             f"but got min_rounds={self.min_rounds}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"min_rounds <= max_rounds must hold, but got (min_rounds={self.min_rounds}, "
                             f"max_rounds={self.max_rounds})")
        if not (0.0 <= self.min_gain < 10.0):
            raise ValueError(f"0 <= min_gain < 10 must hold, but got min_gain={self.min_gain}")

    @property
    def looks(self) -> int:
        return self.max_rounds - self.min_rounds + 1

    @property
    def level(self) -> float:
        """One-sided confidence of each look's bound."""
        return 1.0 - ALPHA / self.looks


@dataclass(frozen=True)
class Evidence:
    """What the rounds so far say about the champion's gain over the baseline."""

    rounds: int
    gain: float
    """exp(mean log ratio) - 1: the champion's typical relative gain (positive = better)."""
    low: float
    """Lower bound of the gain at this look's level (the interval the decision used)."""
    high: float
    champion_median: float
    baseline_median: float


@dataclass(frozen=True)
class Decision:
    verdict: Verdict | None
    """None while the evidence cannot decide yet and rounds remain."""
    evidence: Evidence | None
    """None before the first look (fewer than min_rounds rounds)."""
    message: str


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def log_ratios(champion: Sequence[float], baseline: Sequence[float], direction: Direction) -> np.ndarray:
    c = np.asarray(champion, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if c.shape != b.shape:
        raise ValueError(f"one champion and one baseline measurement per round, but got {c.size} and {b.size}")
    if c.size and (not np.all(np.isfinite(c)) or not np.all(np.isfinite(b)) or np.any(c <= 0) or np.any(b <= 0)):
        raise ValueError("sequential confirmation needs positive, finite measurements (tok/s or ms)")
    d = np.log(c) - np.log(b)
    return d if direction == "maximize" else -d


def evidence(champion: Sequence[float], baseline: Sequence[float], *, direction: Direction,
             level: float) -> Evidence:
    """The mean log ratio and its one-sided bounds at `level` (each side), as relative gains."""
    from scipy import stats  # deferred: scipy costs ~0.3 s to import and only the confirmation needs it

    d = log_ratios(champion, baseline, direction)
    n = d.size
    if n < 2:
        raise ValueError(f"an interval needs at least 2 rounds, but got {n}")
    mean = float(d.mean())
    se = float(d.std(ddof=1)) / math.sqrt(n)
    half = float(stats.t.ppf(level, n - 1)) * se
    return Evidence(rounds=n, gain=math.exp(mean) - 1.0, low=math.exp(mean - half) - 1.0,
                    high=math.exp(mean + half) - 1.0, champion_median=float(np.median(champion)),
                    baseline_median=float(np.median(baseline)))


def decide(champion: Sequence[float], baseline: Sequence[float], plan: RoundsPlan, *,
           direction: Direction = "maximize") -> Decision:
    """The verdict after the rounds measured so far, or `verdict=None` to measure another round."""
    n = len(champion)
    if n < plan.min_rounds:
        return Decision(None, None, f"{n} of at least {plan.min_rounds} rounds measured")
    ev = evidence(champion, baseline, direction=direction, level=plan.level)
    need = plan.min_gain
    # The gate's bounds are wider than a plain 95% interval: each look spends only its share of the budget.
    figure = f"{_pct(ev.gain)} [{_pct(ev.low)}, {_pct(ev.high)}] (gate bounds, {plan.level:.1%} each side) after {n} rounds"
    if ev.low > need:
        return Decision(Verdict.promoted, ev, f"promoted: {figure}, above the required {_pct(need)}")
    if ev.high < need:
        return Decision(Verdict.not_better, ev,
                        f"not better: {figure}, below the required {_pct(need)}; the champion does not beat "
                        f"the baseline by promotion.min_gain")
    if n >= plan.max_rounds:
        return Decision(Verdict.undecided, ev,
                        f"undecided after {n} rounds: {figure} straddles the required {_pct(need)}; raise "
                        f"promotion.max_rounds or benchmark.requests (less noise per round), or lower "
                        f"promotion.min_gain")
    return Decision(None, ev, f"{figure}: not decided yet, round {n + 1} of at most {plan.max_rounds} next")


def round_order(i: int) -> tuple[str, str]:
    """Who is measured first in round `i` (0-based): A B, B A, A B, ... so drift cancels in pairs."""
    return ("champion", "baseline") if i % 2 == 0 else ("baseline", "champion")


POWER = 0.99
"""The chance of a verdict the confirmation plans its gate's rounds for (`rounds_needed`)."""


@dataclass(frozen=True)
class RoundNoise:
    """The run-to-run noise the confirmation's rounds measured: the residual spread of log values once
    each arm's level and each round's (the host's drift) are taken out, pooled over the arms."""

    sigma: float
    """Standard deviation of one run's log value (0.04 = about 4% run to run)."""
    df: int
    """Degrees of freedom behind it: (arms - 1) x (rounds - 1)."""


def round_noise(values: Mapping[str, Mapping[int, float]], rounds: Sequence[int]) -> RoundNoise | None:
    """The pooled run-to-run noise of the arms measured in each of `rounds` (arm name -> round -> value;
    a two-way table arm x round on log values, additive fit, residual mean square); None with fewer
    than 2 such arms or 2 rounds."""
    arms = [k for k, v in values.items() if all(v.get(r, 0.0) > 0 for r in rounds)]
    if len(rounds) < 2 or len(arms) < 2:
        return None
    table = np.log(np.array([[values[a][r] for r in rounds] for a in arms], dtype=float))
    resid = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + table.mean()
    df = (len(arms) - 1) * (len(rounds) - 1)
    return RoundNoise(sigma=math.sqrt(float((resid ** 2).sum()) / df), df=df)


def rounds_needed(gain: float, noise: RoundNoise, plan: RoundsPlan, *, power: float = POWER) -> int:
    """The fewest rounds (min_rounds to max_rounds) at which the gate reaches a verdict with chance
    `power`, were the pair's true gain `gain` (relative, as Evidence.gain) and one run's noise `noise`:
    the one-sided t test each look makes, its power from the noncentral t (the sample spread of a
    few rounds is itself uncertain, which is why 3 rounds at 4% noise miss a +60% gain about one time
    in ten: t(2) at 99.5% is 9.9). max_rounds when none reaches it."""
    from scipy import stats  # deferred, as in evidence()

    margin = abs(math.log1p(gain) - math.log1p(plan.min_gain))
    sigma_d = max(noise.sigma, 1e-9) * math.sqrt(2.0)  # one round's log ratio: two runs
    for n in range(plan.min_rounds, plan.max_rounds + 1):
        crit = float(stats.t.ppf(plan.level, n - 1))
        if float(stats.nct.sf(crit, n - 1, margin * math.sqrt(n) / sigma_d)) >= power:
            return n
    return plan.max_rounds
