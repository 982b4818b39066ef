"""The gate: the statistics of the confirmation's rounds, the one place every later step reads them from.

The rounds (verdict.rounds) ask it for each look's decision; the questions still open, the choice and the
deployed configuration's loads ask it for their intervals; the same bound and the same noise serve all.

Sequential confirmation: interleaved champion/baseline rounds until the evidence decides. Each round
measures the champion and the baseline back to back (A B, then B A next round, so that a host drifting
during the night hits both alike); its evidence is one log ratio `d = log(champion / baseline)` (sign
flipped for metrics where lower is better). After every round from `min_rounds` on, a one-sided Student-t bound on the mean log ratio is compared with the required
gain `log(1 + min_gain)`:

- lower bound above it: **promoted**;
- upper bound below it: **not better** (the champion cannot show the required gain);
- neither after `max_rounds`: **undecided**, with what to change.

Looking after every round would inflate the error rates of a fixed-n test, so each look spends an
equal share of the error budget (Bonferroni over the looks that can happen: `alpha / looks` per side).
That is conservative, and `bench/gate_power.py` measures what it costs: the false promotions of a
no-better configuration and the misses of a true +5% gain at 2% noise with drift.

The bound's noise: the pair's own rounds say little of it (3 rounds: 2 degrees of freedom, and t(2) at
99.5% is 9.9, so a +60% gain at 4% noise went undecided about one night in ten). The other arms the
confirmation measures in the same rounds (the ablations, the runner-up, other loads) carry the same
run-to-run noise, so the bound takes the noise of every arm in the pair's rounds (`round_noise`: arm and
round effects taken out) with its degrees of freedom, but never less than the pair's own spread, so a
pair noisier than the rest is not judged by the quieter arms' noise (`evidence`).

Beside the decision, the figures every later step reads from the same rounds: the rounds that measured two
arms (`paired`), the noise of every arm in a pair's rounds (`pair_noise`), an arm's own gate against the
baseline (`gate_of`), a two-sided interval of one arm over another (`compare`, `interval_of`); and whether
the runner-up leads the champion on all the evidence, the rounds and the search's own contrast of the two
together (`contender_wins`, `settled`), so that it joins the gate's pair (`contending`), asked of the values
less each run's own speed where verdict.speed took it out.

Pure: numbers in, a decision out. The rounds own the measuring.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from orchestrator.results.figures import LEVEL, Interval
from orchestrator.stats import Contrast

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
            raise ValueError(
                f"min_rounds >= 3 must hold (an interval needs 2 degrees of freedom), "
                f"but got min_rounds={self.min_rounds}"
            )
        if self.max_rounds < self.min_rounds:
            raise ValueError(
                f"min_rounds <= max_rounds must hold, but got (min_rounds={self.min_rounds}, "
                f"max_rounds={self.max_rounds})"
            )
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
class BoundNoise:
    """One run's noise (log scale) a bound on a pair's mean log ratio rests on, and its degrees of freedom."""

    sigma: float
    df: int
    arms: int
    own_larger: bool

    @classmethod
    def of(cls, d: np.ndarray, noise: RoundNoise | None) -> BoundNoise:
        """From the pair's log ratios `d` (one per round, at least 2) and, where given, round_noise over every
        arm in those rounds: the pooled noise on its degrees of freedom when they are more than the pair's
        own, never below the pair's own spread (its log ratios' spread / sqrt 2); the pair's own otherwise."""
        own = float(d.std(ddof=1)) / math.sqrt(2.0)
        if noise is None or noise.df <= d.size - 1:
            return cls(own, d.size - 1, 2, False)
        return cls(max(noise.sigma, own), noise.df, noise.arms, own > noise.sigma)


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
    bound: BoundNoise
    """The noise the bounds rest on, with its degrees of freedom."""

    @property
    def df(self) -> int:
        """Degrees of freedom of the bound's t: rounds - 1 from the pair alone, more with other arms' noise."""
        return self.bound.df

    @property
    def arms(self) -> int:
        """How many arms' runs the bound's noise was measured on (2: the pair's own rounds)."""
        return self.bound.arms

    @property
    def own_larger(self) -> bool:
        """The pair's own spread was larger than the pooled noise, and the bound took it."""
        return self.bound.own_larger

    @property
    def noise_source(self) -> str:
        """Where the bound's noise came from, in words."""
        if self.arms <= 2:
            return f"the pair's own noise, t on {self.df} df"
        if self.own_larger:
            return f"the pair's own spread, above the noise of {self.arms} arms in these rounds, t on {self.df} df"
        return f"noise of {self.arms} arms in these rounds, t on {self.df} df"


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


def evidence(
    champion: Sequence[float],
    baseline: Sequence[float],
    *,
    direction: Direction,
    level: float,
    noise: RoundNoise | None = None,
) -> Evidence:
    """The mean log ratio and its one-sided bounds at `level` (each side), as relative gains.

    Without `noise` the bound is the paired t on the pair's own rounds. With it (round_noise over every
    arm measured in the pair's rounds, these two included) and more degrees of freedom than the pair's
    own, one run's noise is the larger of the pooled sigma and the pair's own (its rounds' spread of log
    ratios / sqrt 2), on the pooled degrees of freedom: the larger noise keeps a pair noisier than the
    other arms from a bound too narrow (bench/gate_power.py --arms measures the error rates)."""
    from scipy import stats  # deferred: scipy costs ~0.3 s to import and only the confirmation needs it

    d = log_ratios(champion, baseline, direction)
    n = d.size
    if n < 2:
        raise ValueError(f"an interval needs at least 2 rounds, but got {n}")
    mean = float(d.mean())
    bound = BoundNoise.of(d, noise)
    half = float(stats.t.ppf(level, bound.df)) * bound.sigma * math.sqrt(2.0 / n)
    return Evidence(
        rounds=n,
        gain=math.exp(mean) - 1.0,
        low=math.exp(mean - half) - 1.0,
        high=math.exp(mean + half) - 1.0,
        champion_median=float(np.median(champion)),
        baseline_median=float(np.median(baseline)),
        bound=bound,
    )


def decide(
    champion: Sequence[float],
    baseline: Sequence[float],
    plan: RoundsPlan,
    *,
    direction: Direction = "maximize",
    noise: RoundNoise | None = None,
) -> Decision:
    """The verdict after the rounds measured so far, or `verdict=None` to measure another round;
    `noise`: round_noise of the arms measured in the pair's rounds (evidence)."""
    n = len(champion)
    if n < plan.min_rounds:
        return Decision(None, None, f"{n} of at least {plan.min_rounds} rounds measured")
    ev = evidence(champion, baseline, direction=direction, level=plan.level, noise=noise)
    need = plan.min_gain
    # The gate's bounds are wider than a plain 95% interval: each look spends only its share of the budget.
    pooled = f", {ev.noise_source}" if ev.arms > 2 else ""
    figure = (
        f"{_pct(ev.gain)} [{_pct(ev.low)}, {_pct(ev.high)}] (gate bounds, {plan.level:.1%} each side{pooled}) "
        f"after {n} rounds"
    )
    if ev.low > need:
        return Decision(Verdict.promoted, ev, f"promoted: {figure}, above the required {_pct(need)}")
    if ev.high < need:
        return Decision(
            Verdict.not_better,
            ev,
            f"not better: {figure}, below the required {_pct(need)}; the champion does not beat "
            f"the baseline by promotion.min_gain",
        )
    if n >= plan.max_rounds:
        return Decision(
            Verdict.undecided,
            ev,
            f"undecided after {n} rounds: {figure} straddles the required {_pct(need)}; raise "
            f"promotion.max_rounds or benchmark.requests (less noise per round), or lower "
            f"promotion.min_gain",
        )
    return Decision(None, ev, f"{figure}: not decided yet, round {n + 1} of at most {plan.max_rounds} next")


def round_order(i: int) -> tuple[str, str]:
    """Who is measured first in round `i` (0-based): A B, B A, A B, ... so drift cancels in pairs."""
    return ("champion", "baseline") if i % 2 == 0 else ("baseline", "champion")


@dataclass(frozen=True)
class RoundNoise:
    """The run-to-run noise the confirmation's rounds measured: the residual spread of log values once
    each arm's level and each round's (the host's drift) are taken out, pooled over the arms."""

    sigma: float
    """Standard deviation of one run's log value (0.04 = about 4% run to run)."""
    df: int
    """Degrees of freedom behind it: runs - arms - rounds + 1 ((arms - 1) x (rounds - 1) when every arm
    was measured in every round)."""
    arms: int = 2
    """How many arms were measured in these rounds."""
    rounds: int = 0
    """How many rounds (0: not said)."""


def round_noise(values: Mapping[str, Mapping[int, float]], rounds: Sequence[int]) -> RoundNoise | None:
    """The pooled run-to-run noise of the arms measured in `rounds` (arm name -> round -> value): an
    additive fit of arm and round on the log values of every run in those rounds (least squares, so an
    arm measured in some of the rounds only - the ablations stop at min_rounds while the gate's pair goes
    on - still counts), its residual mean square; None with fewer than 2 arms measured twice, 2 rounds,
    or no degree of freedom left."""
    cells = _cells(values, set(rounds))
    used = sorted({r for row in cells.values() for r in row})
    if len(cells) < 2 or len(used) < 2:
        return None
    arm_at = {a: i for i, a in enumerate(cells)}
    x, y = _design(cells, arm_at, {r: i for i, r in enumerate(used)})
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - int(np.linalg.matrix_rank(x))
    if df < 1:
        return None
    resid = y - x @ coef
    return RoundNoise(sigma=math.sqrt(float(resid @ resid) / df), df=df, arms=len(arm_at), rounds=len(used))


def _cells(values: Mapping[str, Mapping[int, float]], wanted: set[int]) -> dict[str, dict[int, float]]:
    """The positive values of each arm in the wanted rounds, for the arms measured in two of them or more."""
    cells = {a: {r: v for r, v in row.items() if r in wanted and v > 0} for a, row in values.items()}
    return {a: row for a, row in cells.items() if len(row) >= 2}


def _design(
    cells: Mapping[str, Mapping[int, float]], arm_at: Mapping[str, int], round_at: Mapping[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The additive fit's design matrix (one column per arm, one per round but the first) and the log values."""
    runs = [(arm_at[a], round_at[r], math.log(v)) for a, row in cells.items() for r, v in row.items()]
    x = np.zeros((len(runs), len(arm_at) + len(round_at) - 1))
    for k, (a, r, _) in enumerate(runs):
        x[k, a] = 1.0
        if r:
            x[k, len(arm_at) + r - 1] = 1.0
    return x, np.array([v for _, _, v in runs])


# ------------------------------------------------------------------------------ the figures of the rounds


def common_rounds(a: Mapping[int, float], b: Mapping[int, float]) -> list[int]:
    """The rounds that measured both arms, in order."""
    return sorted(set(a) & set(b))


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[float], list[float]]:
    """The values of the rounds that measured both arms, in round order."""
    rounds = common_rounds(a, b)
    return [a[i] for i in rounds], [b[i] for i in rounds]


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    direction: Direction,
    level: float = LEVEL,
    noise: RoundNoise | None = None,
) -> Interval | None:
    """A's gain over B with its two-sided interval (on `noise`, the noise of every arm in their rounds,
    where given: evidence); None with fewer than 2 paired rounds."""
    if len(a) < 2 or len(a) != len(b):
        return None
    return interval_of(evidence(a, b, direction=direction, level=1.0 - (1.0 - level) / 2.0, noise=noise))


def interval_of(ev: Evidence) -> Interval:
    """The gate's evidence as an Interval (its bounds: the gate's level, each side)."""
    return Interval(
        gain=ev.gain,
        low=ev.low,
        high=ev.high,
        rounds=ev.rounds,
        a_median=ev.champion_median,
        b_median=ev.baseline_median,
    )


def gate_of(
    values: Mapping[str, Mapping[int, float]], arm: str, plan: RoundsPlan, *, direction: Direction
) -> Decision | None:
    """The gate's decision on `arm` against the baseline, from the rounds that measured both (None
    with fewer than min_rounds of them), its bound on the noise of every arm in those rounds (pair_noise)."""
    if arm not in values or "baseline" not in values:
        return None
    a, b = paired(values[arm], values["baseline"])
    if len(a) < plan.min_rounds:
        return None
    return decide(a, b, plan, direction=direction, noise=pair_noise(values, arm))


def pair_noise(
    values: Mapping[str, Mapping[int, float]], arm: str = "champion", against: str = "baseline"
) -> RoundNoise | None:
    """The run-to-run noise of every arm measured at the pair's load in the rounds that measured both `arm`
    and `against` (round_noise; arms at another load, `name@level`, left out: their noise need
    not be the pair's): what the gate's bound on that pair takes (evidence)."""
    load = arm.partition("@")[2]
    same = {k: v for k, v in values.items() if k.partition("@")[2] == load}
    return round_noise(same, common_rounds(values.get(arm, {}), values.get(against, {})))


# ------------------------------------------------------------------------------ the runner-up as a contender


def contending(
    values: Mapping[str, Mapping[int, float]],
    plan: RoundsPlan,
    search: Contrast | None,
    *,
    direction: Direction,
    fair: Mapping[str, Mapping[int, float]] | None = None,
) -> list[str]:
    """["runner_up"] while it measured better than the champion on all the evidence (contender_wins)
    and its own gate has not decided: it would be deployed if it passed, so it joins the gate's pair
    (rounds.run_rounds says in which rounds; a runner-up left out of the rounds the gate's noise needed
    could not pass its own gate, and the champion it beat was deployed: the overnight bench at 4% noise,
    seed 26). `fair`: the values the two are compared on (each run's own speed taken out:
    verdict.speed), `values` where not given; the runner-up's own gate takes `values`."""
    if contender_wins(values if fair is None else fair, "runner_up", direction=direction, search=search) is None:
        return []
    own = gate_of(values, "runner_up", plan, direction=direction)
    return [] if own is not None and own.verdict is not None else ["runner_up"]


def contender_wins(
    values: Mapping[str, Mapping[int, float]], contender: str, *, direction: Direction, search: Contrast | None = None
) -> Interval | None:
    """The contender's gain over the champion in the same rounds when, on all the evidence, it is the
    better of the two; None when it is not, or was not measured twice beside it.

    All the evidence (`settled`): the rounds' paired mean log ratio, combined by inverse variance with
    `search`, the search's own pooled estimate of the same difference (select.search_contrast: positive
    when the contender is better). A few rounds at several percent of noise alone flip a near-tie often
    (3 rounds at 4%: a 3.7% gap read the wrong way about one time in eight); the search measured the two
    points' parts several times more. Without `search` the rounds alone decide."""
    interval = compare(
        *paired(values.get(contender, {}), values.get("champion", {})),
        direction=direction,
        noise=pair_noise(values, contender, "champion"),
    )
    if interval is None:
        return None
    both = settled(values, contender, direction=direction, search=search)
    return interval if both is not None and both.diff > 0.0 else None


def settled(
    values: Mapping[str, Mapping[int, float]], contender: str, *, direction: Direction, search: Contrast | None
) -> Contrast | None:
    """The contender's log gain over the champion from the paired rounds and, when given, the search's
    contrast, weighted by inverse variance. The rounds' standard error rests on the noise the gate's
    bound takes (BoundNoise over pair_noise: every arm at the pair's load in those rounds,
    never below the pair's own spread). None with fewer than 2 paired rounds."""
    a, b = paired(values.get(contender, {}), values.get("champion", {}))
    if len(a) < 2:
        return None
    d = log_ratios(a, b, direction)
    bound = BoundNoise.of(d, pair_noise(values, contender, "champion"))
    own = Contrast(float(d.mean()), max(bound.sigma * math.sqrt(2.0 / d.size), 1e-9))
    if search is None or not search.se > 0:
        return own
    w_own, w_search = 1.0 / own.se**2, 1.0 / search.se**2
    return Contrast(
        (own.diff * w_own + search.diff * w_search) / (w_own + w_search), math.sqrt(1.0 / (w_own + w_search))
    )
