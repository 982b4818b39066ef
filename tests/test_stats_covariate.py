"""stats.covariate_adjusted: a run's TTFT taking the run's own speed out of its decode measurement
(regression adjustment, CUPED: Deng et al., WSDM 2013), as results.select.run_speed uses it (each run's
cell its point, x fitted over the point's prefill groups) and verdict.speed does (cells of arm and round:
tests/verdict/test_speed.py)."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.stats import covariate_adjusted as stats_adjusted
from orchestrator.stats import pooled_contrast

SPEC = {"s1": 0.0, "s2": -0.021, "s3": -0.04}
"""Speculation settings' true log effects: s2 is the 2.1% near-tie of the 4% noise nights."""
COMM = {"c1": 0.0, "c2": -0.01}
PREFILL = {"c1": 5.0, "c2": 5.2}
"""log TTFT of each communication setting at a run's average speed: c2's prefill is 22% slower."""


def _night(seed: int, *, noise: float = 0.04, correlation: float = 1.0, repeats: int = 4):
    """Each (spec, comm) point run `repeats` times; every run draws its speed once, as the simulator's
    engine.run_factors does: decode slower by z, prefill by correlation * z + the rest of its own."""
    rng = random.Random(seed)
    rows, x, groups = [], [], []
    for s, a in SPEC.items():
        for c, b in COMM.items():
            for _ in range(repeats):
                z, own = rng.gauss(0, 1), rng.gauss(0, 1)
                rows.append((s, c, a + b - noise * z))
                x.append(PREFILL[c] + noise * (correlation * z + math.sqrt(1 - correlation**2) * own))
                groups.append((True, c))
    return rows, x, groups


def covariate_adjusted(rows, x, groups):
    """The (a, b, y) rows as results.select.run_speed hands them over: each run's cell its point (a, b)."""
    y, found = stats_adjusted([r[2] for r in rows], x, [((r[0], r[1]),) for r in rows], groups)
    return [(r[0], r[1], v) for r, v in zip(rows, y)], found


def _pure_error(rows) -> float:
    by: dict = {}
    for a, b, y in rows:
        by.setdefault((a, b), []).append(y)
    ss = sum((y - sum(v) / len(v)) ** 2 for v in by.values() for y in v)
    return math.sqrt(ss / sum(len(v) - 1 for v in by.values()))


def test_a_ttft_that_moves_with_the_run_takes_the_runs_speed_out() -> None:
    rows, x, groups = _night(1)
    adjusted, cov = covariate_adjusted(rows, x, groups)
    assert cov is not None and cov.applied
    assert cov.slope == pytest.approx(-1.0, abs=1e-9)  # y falls by what x rises: one speed for the run
    assert _pure_error(rows) > 0.03
    assert _pure_error(adjusted) < 1e-9
    # the near-tie, 2.1% apart, is told apart now: its contrast's error was the 4% noise's
    raw = pooled_contrast(rows, ("s1", "c1"), ("s2", "c1"))
    new = pooled_contrast(adjusted, ("s1", "c1"), ("s2", "c1"))
    assert raw is not None and new is not None
    assert raw.se > 0.01
    assert new.diff == pytest.approx(-0.021, abs=0.002) and new.se < 0.005


def test_a_configuration_whose_prefill_is_slower_gains_nothing_from_it() -> None:
    # c2's prefill is 22% slower by configuration, not by its runs: taken as run speed, it would credit c2
    # with 20% of decode speed it does not have. The adjustment uses x less x's unshrunk fit over its
    # groups, so c2 is estimated without bias (its runs' mean speed stays in it: no TTFT can tell that
    # from the setting's own prefill), while the speculation settings, compared within a setting, are exact.
    comm, spec = [], []
    for seed in range(20):
        rows, x, groups = _night(100 + seed)
        adjusted, cov = covariate_adjusted(rows, x, groups)
        assert cov is not None and cov.applied
        c = pooled_contrast(adjusted, ("s1", "c1"), ("s1", "c2"), shrink=0.0)
        s = pooled_contrast(adjusted, ("s1", "c2"), ("s3", "c2"), shrink=0.0)
        assert c is not None and s is not None
        comm.append(c.diff)
        spec.append(s.diff)
    assert sum(comm) / len(comm) == pytest.approx(COMM["c2"] - COMM["c1"], abs=0.012)  # not +0.19
    assert all(d == pytest.approx(SPEC["s3"] - SPEC["s1"], abs=1e-9) for d in spec)


def test_a_ttft_that_says_nothing_of_decode_leaves_the_rows_as_measured() -> None:
    for seed in range(3, 8):
        rows, x, groups = _night(seed, correlation=0.0)
        adjusted, cov = covariate_adjusted(rows, x, groups)
        assert cov is not None
        assert not cov.applied, (seed, cov)  # the slope's t test does not reject 0 at 1%
        assert adjusted == rows


def test_partly_shared_noise_is_partly_taken_out() -> None:
    rows, x, groups = _night(9, correlation=0.8, repeats=6)
    adjusted, cov = covariate_adjusted(rows, x, groups)
    assert cov is not None and cov.applied
    assert -1.1 < cov.slope < -0.5
    assert _pure_error(adjusted) < 0.8 * _pure_error(rows)  # sqrt(1 - 0.8^2) = 0.6 of it in expectation


def test_nothing_to_estimate_the_slope_from() -> None:
    rows = [("s1", "c1", 0.1), ("s2", "c1", 0.2)]
    assert covariate_adjusted(rows, [5.0, 5.1], [(True, "c1")] * 2) == (rows, None)  # no point run twice
    rows3 = [("s1", "c1", 0.1), ("s1", "c1", 0.12), ("s2", "c1", 0.2)]
    adjusted, cov = covariate_adjusted(rows3, [5.0, 4.9, 5.1], [(True, "c1")] * 3)
    assert adjusted == rows3 and cov is not None and not cov.applied  # no degree of freedom left
    # a perfect slope on 2 degrees of freedom is not tested at all (COVARIATE_MIN_DOF = 3); on 3 it is
    few = [("s1", "c1", -0.01 * i) for i in range(2)] + [("s2", "c1", 0.2 - 0.01 * i) for i in range(3)]
    adjusted, cov = covariate_adjusted(few, [5.0, 5.01] + [5.0, 5.01, 5.02], [(True, "c1")] * 5)
    assert cov is not None and cov.dof == 2 and cov.slope == pytest.approx(-1.0) and not cov.applied
    assert adjusted == few
    six = few + [("s1", "c1", -0.02)]
    adjusted, cov = covariate_adjusted(six, [5.0, 5.01, 5.0, 5.01, 5.02, 5.02], [(True, "c1")] * 6)
    assert cov is not None and cov.dof == 3 and cov.slope == pytest.approx(-1.0) and cov.applied
    assert adjusted != six
    # a run without x (None, or not finite) takes no part and stays as measured; the others are adjusted
    rows, x, groups = _night(1)
    gaps = [None if i % 5 == 0 else v for i, v in enumerate(x)]
    gaps[1] = math.nan
    adjusted, cov = covariate_adjusted(rows, gaps, groups)
    assert cov is not None and cov.applied and cov.slope == pytest.approx(-1.0, abs=1e-9)
    assert all(adjusted[i] == rows[i] for i, v in enumerate(gaps) if v is None or math.isnan(v))
    assert _pure_error([adjusted[i] for i, v in enumerate(gaps) if v is not None and not math.isnan(v)]) < 1e-9
    assert covariate_adjusted(rows, [None] * len(rows), groups) == (list(rows), None)
    with pytest.raises(ValueError, match="one entry per run"):
        covariate_adjusted(rows, [5.0], [(True, "c1")] * 2)
