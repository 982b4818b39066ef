"""Statistics shared by a trial's repeats (trial.metrics) and the champion's verdict (results.select)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np


def as_array(samples: Sequence[float], what: str) -> np.ndarray:
    """`samples` as a 1-d float array; ValueError (naming `what`) when empty or not all finite."""
    values = np.asarray(list(samples), dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{what} needs at least one sample, but got {len(values)}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{what} must be finite numbers, but got {list(samples)!r}")
    return values


def _apply_rows(stat: Callable[..., float], boot: np.ndarray) -> np.ndarray:
    try:
        out = np.asarray(stat(boot, axis=1), dtype=float)
        if out.shape == (boot.shape[0],):
            return out
    except TypeError:
        pass
    return np.asarray([stat(row) for row in boot], dtype=float)


def bootstrap_ci(
    samples: Sequence[float],
    *,
    stat: Callable[..., float] = np.median,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` over `samples` (same seed -> same interval).

    With a single sample the interval collapses to that sample.
    """
    values = as_array(samples, "bootstrap_ci")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), but got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, but got {n_boot}")
    if values.size == 1:
        v = float(stat(values))
        return v, v
    rng = np.random.default_rng(seed)
    boot = values[rng.integers(0, values.size, size=(n_boot, values.size))]
    stats = _apply_rows(stat, boot)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(low), float(high)


@dataclass(frozen=True)
class Pooled:
    """One measured point's pooled estimate (on the log scale the rows were given in)."""

    fitted: float
    se: float
    score: float
    """fitted - z x se: the lower confidence bound the pick ranks by."""
    n_a: int
    """Measurements of the point's first group (its speculation settings) the estimate pools."""


DEFAULT_NOISE = 0.02
"""Run-to-run noise (log scale) assumed until the residuals have 3 degrees of freedom."""


def _residual_noise(resid: np.ndarray, params: int, floor: float) -> float:
    """The additive fit's run-to-run noise: the residuals' root mean square over their degrees of freedom
    (rows less the `params` the fit estimates), at least `floor`; DEFAULT_NOISE under 3 of them."""
    dof = resid.size - params
    return max(floor, float(np.sqrt(np.sum(resid**2) / dof))) if dof >= 3 else DEFAULT_NOISE


def pooled_scores(
    rows: Sequence[tuple[Hashable, Hashable, float]],
    *,
    z: float = 1.0,
    shrink: float = 1.0,
    floor: float = 0.005,
    sweeps: int = 60,
) -> list[Pooled]:
    """Pool noisy measurements of points made of two nearly independent parts.

    `rows` are (group_a, group_b, y) with y = log(value), higher better: in a sweep, group a is a
    point's speculation settings and group b its communication settings (NCCL variables, all-reduce
    path). The two-way additive model y = a[group_a] + b[group_b] is fitted by backfitting, the b
    effects shrunk towards 0 by `shrink` pseudo-observations (a setting seen once says little on its
    own). Each row's score is its fitted value minus `z` standard errors, with the noise taken from
    the residuals (or DEFAULT_NOISE while they have under 3 degrees of freedom): a point measured
    once, lucky by 2 sigma, no longer beats one measured four times in its neighbourhood.
    """
    if not rows:
        return []
    ga = [r[0] for r in rows]
    gb = [r[1] for r in rows]
    y = np.asarray([r[2] for r in rows], dtype=float)
    a_keys, b_keys = list(dict.fromkeys(ga)), list(dict.fromkeys(gb))
    ia = np.asarray([a_keys.index(k) for k in ga])
    ib = np.asarray([b_keys.index(k) for k in gb])
    na = np.bincount(ia, minlength=len(a_keys)).astype(float)
    nb = np.bincount(ib, minlength=len(b_keys)).astype(float)
    a = np.zeros(len(a_keys))
    b = np.zeros(len(b_keys))
    for _ in range(sweeps):
        a = np.bincount(ia, weights=y - b[ib], minlength=len(a_keys)) / na
        b = np.bincount(ib, weights=y - a[ia], minlength=len(b_keys)) / (nb + shrink)
    fitted = a[ia] + b[ib]
    sigma = _residual_noise(y - fitted, len(a_keys) + len(b_keys) - 1, floor)
    se = sigma * np.sqrt(1.0 / na[ia] + 1.0 / (nb[ib] + shrink))
    return [Pooled(float(f), float(s), float(f - z * s), int(na[i])) for f, s, i in zip(fitted, se, ia)]


@dataclass(frozen=True)
class Contrast:
    """An additive fit's estimate of one point minus another (log scale), with its standard error."""

    diff: float
    se: float


def pooled_contrast(
    rows: Sequence[tuple[Hashable, Hashable, float]],
    first: tuple[Hashable, Hashable],
    second: tuple[Hashable, Hashable],
    *,
    shrink: float = 1.0,
    floor: float = 0.005,
) -> Contrast | None:
    """`second` minus `first` under the additive model of pooled_scores (the same rows, the b effects
    shrunk by `shrink` pseudo-observations), with its standard error: the ridge solution's posterior
    spread, sigma^2 c'(X'X + shrink I_b)^-1 c, the noise taken from the residuals as pooled_scores takes it.
    Solved directly rather than by backfitting, because the error of a difference needs the estimates'
    covariance (two points that share their b group differ by their a effects alone). None when either
    point's groups were not measured."""
    if not rows:
        return None
    a_keys = list(dict.fromkeys(r[0] for r in rows))
    b_keys = list(dict.fromkeys(r[1] for r in rows))
    if any(p[0] not in a_keys or p[1] not in b_keys for p in (first, second)):
        return None
    na = len(a_keys)
    x = np.zeros((len(rows), na + len(b_keys)))
    for i, r in enumerate(rows):
        x[i, a_keys.index(r[0])] = 1.0
        x[i, na + b_keys.index(r[1])] = 1.0
    y = np.asarray([r[2] for r in rows], dtype=float)
    gram = x.T @ x + np.diag([0.0] * na + [shrink] * len(b_keys))
    inv = np.linalg.pinv(gram)
    theta = inv @ (x.T @ y)
    sigma = _residual_noise(y - x @ theta, na + len(b_keys) - 1, floor)
    c = np.zeros(x.shape[1])
    c[a_keys.index(second[0])] += 1.0
    c[na + b_keys.index(second[1])] += 1.0
    c[a_keys.index(first[0])] -= 1.0
    c[na + b_keys.index(first[1])] -= 1.0
    return Contrast(float(c @ theta), float(sigma * np.sqrt(max(float(c @ inv @ c), 0.0))))


@dataclass(frozen=True)
class Covariate:
    """A concomitant measurement's slope in the rows it adjusted (covariate_adjusted)."""

    slope: float
    se: float
    dof: int
    applied: bool
    """The slope passed the test (COVARIATE_ALPHA) on at least COVARIATE_MIN_DOF degrees of freedom."""


COVARIATE_ALPHA = 0.01
"""Two-sided level of the test the within-point slope must pass (Student's t on its degrees of freedom)
before the covariate adjusts anything: where the covariate does not track the run's noise, the rows stay
as measured. A slope wrongly taken for real adds its own noise to every row; a 2-standard-error rule did
so on 4 degrees of freedom (bench/overnight.py --prefill-correlation 0, seed 104: slope -1.29 +- 0.28)."""
COVARIATE_MIN_DOF = 3
"""Degrees of freedom the slope needs before it is tested at all. 5 (tried) left the slope untested at
most nights' pick, where 3-4 degrees of freedom are what the repeated points give: the 4% noise nights
fell back to their unadjusted count (bench/overnight.py, docs/benchmarks.md)."""


def _within_point_deviations(
    rows: Sequence[tuple[Hashable, Hashable, float]], xs: np.ndarray, ys: np.ndarray, timed: Sequence[int]
) -> tuple[list[float], list[float], int]:
    """(x's and y's deviations from their point's mean, over the points measured more than once; how many
    such points): the within-point variation the slope is fitted on."""
    points: dict[tuple[Hashable, Hashable], list[int]] = {}
    for i in timed:
        points.setdefault((rows[i][0], rows[i][1]), []).append(i)
    dx: list[float] = []
    dy: list[float] = []
    for idx in points.values():
        if len(idx) > 1:
            dx += list(xs[idx] - xs[idx].mean())
            dy += list(ys[idx] - ys[idx].mean())
    return dx, dy, sum(1 for idx in points.values() if len(idx) > 1)


def slope_test(dx: list[float], dy: list[float], dof: int, sxx: float, alpha: float) -> Covariate:
    """y's slope on x within points, its standard error, and whether it passes the t test (applied)."""
    slope = float(np.dot(dx, dy)) / sxx
    resid = np.asarray(dy) - slope * np.asarray(dx)
    se = math.sqrt(float(np.dot(resid, resid)) / dof / sxx)
    from scipy import stats as sps  # deferred, as in verdict.gate: only a sweep's pick needs it

    applied = dof >= COVARIATE_MIN_DOF and abs(slope) >= float(sps.t.ppf(1.0 - alpha / 2.0, dof)) * se
    return Covariate(slope, se, dof, applied)


def covariate_adjusted(
    rows: Sequence[tuple[Hashable, Hashable, float]],
    x: Sequence[float | None],
    x_groups: Sequence[tuple[Hashable, Hashable]],
    *,
    alpha: float = COVARIATE_ALPHA,
) -> tuple[list[tuple[Hashable, Hashable, float]], Covariate | None]:
    """The rows (a, b, y) with the part of y that a concomitant per-run measurement x predicts taken out:
    regression adjustment (analysis of covariance; in A/B testing, CUPED: Deng et al., WSDM 2013).

    x is expected to move with the configuration too, so what adjusts y is the run's deviation u = x
    less x's additive fit over `x_groups` (pooled_scores' model, the groups x depends on, unshrunk: a
    shrunk effect would leave part of a configuration's own x in u and credit it to y; a group run once
    has u = 0, so its run stays as measured). The slope is
    y's regression on x within the points measured more than once (the same (a, b): no configuration
    effect between them, so no bias from one), with its standard error; y' = y - slope * u where the
    slope is told from 0 (COVARIATE_ALPHA, COVARIATE_MIN_DOF), the rows unchanged otherwise. A run whose x
    is None or not finite (a trial recorded before its TTFT was kept) takes no part and stays as measured.
    None when no point is repeated."""
    if len(rows) != len(x) or len(rows) != len(x_groups):
        raise ValueError(
            f"rows, x and x_groups must have one entry per run, but got {len(rows)}, {len(x)}, {len(x_groups)}"
        )
    timed = [i for i, v in enumerate(x) if v is not None and math.isfinite(v)]
    xs = np.full(len(rows), math.nan)
    xs[timed] = [x[i] for i in timed]
    ys = np.asarray([r[2] for r in rows], dtype=float)
    dx, dy, repeated = _within_point_deviations(rows, xs, ys, timed)
    if not dx:
        return list(rows), None
    dof = len(dx) - repeated - 1
    sxx = float(np.dot(dx, dx))
    if dof < 1 or sxx <= 0:
        return list(rows), Covariate(0.0, math.inf, max(dof, 0), False)
    covariate = slope_test(dx, dy, dof, sxx, alpha)
    if not covariate.applied:
        return list(rows), covariate
    expected = pooled_scores([(x_groups[i][0], x_groups[i][1], float(xs[i])) for i in timed], z=0.0, shrink=0.0)
    u = np.zeros(len(rows))
    u[timed] = xs[timed] - np.asarray([p.fitted for p in expected])
    return [(r[0], r[1], r[2] - covariate.slope * ui) for r, ui in zip(rows, u)], covariate
