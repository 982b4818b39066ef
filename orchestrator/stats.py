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
    x = _design([(r[0], r[1]) for r in rows])  # a's levels, then b's, each in order of first appearance
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
"""Two-sided level of the test the slope must pass (Student's t on its degrees of freedom)
before the covariate adjusts anything: where the covariate does not track the run's noise, the rows stay
as measured. A slope wrongly taken for real adds its own noise to every row; a 2-standard-error rule did
so on 4 degrees of freedom (bench/overnight.py --prefill-correlation 0, seed 104: slope -1.29 +- 0.28)."""
COVARIATE_MIN_DOF = 3
"""Degrees of freedom the slope needs before it is tested at all. 5 (tried) left the slope untested at
most nights' pick, where 3-4 degrees of freedom are what the repeated points give: the 4% noise nights
fell back to their unadjusted count (bench/overnight.py, docs/benchmarks.md)."""


def slope_test(dx: list[float], dy: list[float], dof: int, sxx: float, alpha: float) -> Covariate:
    """y's slope on x (both as residuals of the same fit), its standard error, and whether it passes the t
    test (applied)."""
    slope = float(np.dot(dx, dy)) / sxx
    resid = np.asarray(dy) - slope * np.asarray(dx)
    se = math.sqrt(float(np.dot(resid, resid)) / dof / sxx)
    from scipy import stats as sps  # deferred, as in verdict.gate: only a sweep's pick needs it

    applied = dof >= COVARIATE_MIN_DOF and abs(slope) >= float(sps.t.ppf(1.0 - alpha / 2.0, dof)) * se
    return Covariate(slope, se, dof, applied)


def covariate_adjusted(
    y: Sequence[float],
    x: Sequence[float | None],
    cells: Sequence[tuple[Hashable, ...]],
    x_cells: Sequence[tuple[Hashable, ...]],
    *,
    alpha: float = COVARIATE_ALPHA,
) -> tuple[list[float], Covariate | None]:
    """y less the part a concomitant per-run measurement x predicts: regression adjustment (analysis of
    covariance; in A/B testing, CUPED: Deng et al., WSDM 2013). Each run is described by its `cells`, its
    labels of the factors y's own additive fit takes out: the configuration (the search's points), or the
    configuration and the round (the confirmation's arms; the round carries the host's drift, which moves x
    and y alike).

    The slope is y's regression on x in what that fit leaves of both (with the configuration as the only
    factor: within the configurations measured more than once, so no configuration effect can bias it),
    with its standard error, and it is used only where it is told from 0 (COVARIATE_ALPHA on at least
    COVARIATE_MIN_DOF degrees of freedom). Then y' = y - slope * u, where u is x's deviation from its own
    additive fit over `x_cells` (the factors x depends on), unshrunk: a shrunk effect would leave part of a
    configuration's own x in u and credit it to y. u sums to 0 over the runs at each level of each x factor:
    a run alone at a level (a prefill group run once) has u = 0 and stays as measured, and a configuration
    alone in its x level keeps its mean, so only configurations that share one move against each other. x's
    fit is solved exactly (least squares), not by pooled_scores' backfitting sweeps. A run whose x is None or
    not finite (a trial recorded before its TTFT was kept) takes no part and stays as measured. y unchanged
    where the slope is not used; None for the covariate when the fit over `cells` leaves nothing of the timed
    runs (as many independent columns as runs: with the point as the cell, no point measured twice)."""
    if len({len(y), len(x), len(cells), len(x_cells)}) > 1:
        raise ValueError(
            f"y, x, cells and x_cells must have one entry per run, but got {len(y)}, {len(x)}, {len(cells)}, "
            f"{len(x_cells)}"
        )
    timed = [i for i, v in enumerate(x) if v is not None and math.isfinite(v)]
    ys = np.asarray(y, dtype=float)
    xs = np.asarray([x[i] for i in timed], dtype=float)
    covariate = _fitted_slope(ys[timed], xs, [cells[i] for i in timed], alpha)
    if covariate is None or not covariate.applied:
        return [float(v) for v in ys], covariate
    out = ys.copy()
    out[timed] -= covariate.slope * _residual(_design([x_cells[i] for i in timed]), xs)
    return [float(v) for v in out], covariate


def _fitted_slope(
    y: np.ndarray, x: np.ndarray, cells: Sequence[tuple[Hashable, ...]], alpha: float
) -> Covariate | None:
    """y's slope on x in what the cells' additive fit leaves of both, tested (slope_test); None when the fit
    leaves nothing (its rank is the number of runs)."""
    design = _design(cells)
    rank = int(np.linalg.matrix_rank(design)) if cells else 0
    if rank == len(cells):
        return None
    dof = len(cells) - rank - 1
    rx, ry = _residual(design, x), _residual(design, y)
    sxx = float(rx @ rx)
    if dof < 1 or sxx <= 0:
        return Covariate(0.0, math.inf, max(dof, 0), False)
    return slope_test(list(rx), list(ry), dof, sxx, alpha)


def _design(labels: Sequence[tuple[Hashable, ...]]) -> np.ndarray:
    """The additive fit's design over runs labelled by factors (one label per factor): a column per level
    of each factor."""
    levels = [list(dict.fromkeys(run[j] for run in labels)) for j in range(len(labels[0]) if labels else 0)]
    offsets = np.cumsum([0] + [len(f) for f in levels])
    d = np.zeros((len(labels), int(offsets[-1])))
    for k, run in enumerate(labels):
        for j, label in enumerate(run):
            d[k, offsets[j] + levels[j].index(label)] = 1.0
    return d


def _residual(design: np.ndarray, v: np.ndarray) -> np.ndarray:
    """What the design's least-squares fit leaves of v."""
    return v - design @ np.linalg.lstsq(design, v, rcond=None)[0]
