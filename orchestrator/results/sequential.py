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
from collections.abc import Sequence
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
