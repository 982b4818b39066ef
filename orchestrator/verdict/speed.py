"""Each run's own speed taken out of the confirmation's rounds, for the one question two near-tied
configurations put to the run-to-run noise: which of the search's pick and its runner-up (or rival) is
better (gate.contending, rounds.still_open, choose.choose). The gate against the baseline takes the values
as measured.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from orchestrator.records import ParamValue, prefill_group, prefill_x
from orchestrator.stats import COVARIATE_ALPHA, Covariate, slope_test
from orchestrator.verdict.gate import Direction


def run_speed_adjusted(
    values: Mapping[str, Mapping[int, float]],
    ttft: Mapping[tuple[str, int], float],
    params: Mapping[str, Mapping[str, ParamValue]],
    *,
    direction: Direction,
) -> tuple[dict[str, dict[int, float]], Covariate | None]:
    """The rounds' values (arm -> round -> objective) less what each run's TTFT (`ttft`: (arm, round) -> ms)
    says of the run's own speed, for the arms `params` names (steps.Arms.adjustable); with the covariate
    the rounds gave (its slope on the objective oriented so higher is better; None: too few runs). The
    values as they are unless the slope was applied; a run without a TTFT stays as measured.

    Why: a server run that came up slow (clocks, a neighbour on the host) is slow at prefill and at decode
    alike, and at one stream a run's TTFT is its prefill. Two configurations that prefill alike
    (records.prefill_group: the same communication settings, both speculating, other steps, top-k or draft
    tokens) should show the same TTFT, so a difference in their runs' TTFT is a difference in the runs'
    speed, not in the configurations. blocked_adjustment fits the slope within arms and rounds (the
    host's drift is the round's) and moves only arms that share a prefill group against each other; it is
    used only where the slope is told from 0. It decides the runner-up against the champion (`contending`,
    rounds.still_open, choose.choose); the gate against the baseline takes the values as measured. The
    slope's own uncertainty is not carried into the rounds' standard error."""
    out = {name: dict(row) for name, row in values.items()}
    sign = 1.0 if direction == "maximize" else -1.0
    cells = _timed_runs(values, ttft, params, sign)
    found, covariate = blocked_adjustment(
        [c[2] for c in cells],
        [c[3] for c in cells],
        [c[0] for c in cells],
        [c[1] for c in cells],
        [prefill_group(params[c[0]]) for c in cells],
    )
    if covariate is not None and covariate.applied:
        for (name, i, _, _), y in zip(cells, found):
            out[name][i] = math.exp(sign * y)
    return out, covariate


def _timed_runs(
    values: Mapping[str, Mapping[int, float]],
    ttft: Mapping[tuple[str, int], float],
    params: Mapping[str, Mapping[str, ParamValue]],
    sign: float,
) -> list[tuple[str, int, float, float]]:
    """(arm, round, oriented log value, log TTFT) of each run of the arms `params` names that has both."""
    runs = [(name, i, v, prefill_x(ttft.get((name, i)))) for name, row in values.items() for i, v in row.items()]
    return [(name, i, sign * math.log(v), x) for name, i, v, x in runs if name in params and v > 0 and x is not None]


def blocked_adjustment(
    y: Sequence[float],
    x: Sequence[float],
    cells: Sequence[Hashable],
    blocks: Sequence[Hashable],
    x_cells: Sequence[Hashable],
    *,
    alpha: float = COVARIATE_ALPHA,
) -> tuple[list[float], Covariate | None]:
    """Regression adjustment of runs measured in blocks (analysis of covariance with a block effect): y's
    slope on x fitted on what is left of both once each cell's effect (a configuration's) and each block's
    (a round's: the host's drift, which moves x and y alike) are taken out, tested as stats.covariate_adjusted's;
    where it passes, y less slope x u, u being x's deviation from its own fit over `x_cells` (what x depends
    on: several cells may share one) and the blocks. A run's u averages out over its cell only where the cell
    has an x_cell of its own, so only cells that share an x_cell move against each other. The rows as they
    are, with None, when no degree of freedom is left."""
    n = len(y)
    fit = _block_design(cells, blocks)
    dof = n - int(np.linalg.matrix_rank(fit)) - 1
    if dof < 1:
        return list(y), None
    ys, xs = np.asarray(y, dtype=float), np.asarray(x, dtype=float)
    rx, ry = _residual(fit, xs), _residual(fit, ys)
    sxx = float(rx @ rx)
    if sxx <= 0:
        return list(y), Covariate(0.0, math.inf, dof, False)
    covariate = slope_test(list(rx), list(ry), dof, sxx, alpha)
    if not covariate.applied:
        return list(y), covariate
    u = _residual(_block_design(x_cells, blocks), xs)
    return [float(v) for v in ys - covariate.slope * u], covariate


def _block_design(cells: Sequence[Hashable], blocks: Sequence[Hashable]) -> np.ndarray:
    """The additive fit's design: one column per cell, one per block."""
    a, b = list(dict.fromkeys(cells)), list(dict.fromkeys(blocks))
    d = np.zeros((len(cells), len(a) + len(b)))
    for k, (c, r) in enumerate(zip(cells, blocks)):
        d[k, a.index(c)] = 1.0
        d[k, len(a) + b.index(r)] = 1.0
    return d


def _residual(design: np.ndarray, v: np.ndarray) -> np.ndarray:
    return v - design @ np.linalg.lstsq(design, v, rcond=None)[0]
