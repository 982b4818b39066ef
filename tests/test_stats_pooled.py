"""stats.pooled_scores: the pooled estimate the champion pick and the refinement rank by."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.stats import DEFAULT_NOISE, pooled_contrast, pooled_scores


def test_nothing_measured() -> None:
    assert pooled_scores([]) == []


def test_noise_free_additive_data_is_recovered_exactly() -> None:
    spec = {"s1": 0.0, "s2": 0.05, "s3": -0.10}
    comm = {"c1": 0.0, "c2": 0.02}
    rows = [(s, c, spec[s] + comm[c]) for s in spec for c in comm]
    fit = pooled_scores(rows, shrink=0.0, floor=0.0)
    for (_, _, y), f in zip(rows, fit):
        assert f.fitted == pytest.approx(y, abs=1e-9)
        assert f.n_a == 2


def test_a_lucky_measurement_loses_to_the_spec_its_neighbours_support() -> None:
    # The overnight bench's failure: spec A once lucky (+4%) and three times ordinary under other NCCL
    # settings; spec B (truly 3% better) measured under four settings.
    rows = [("A", c, math.log(v)) for c, v in (("c1", 1.002), ("c2", 0.962), ("c3", 0.958), ("c4", 0.965))]
    rows += [("B", c, math.log(v)) for c, v in (("c1", 0.992), ("c2", 0.985), ("c3", 0.989), ("c4", 0.991))]
    fit = pooled_scores(rows)
    best_single = max(range(len(rows)), key=lambda i: rows[i][2])
    best_pooled = max(range(len(rows)), key=lambda i: fit[i].score)
    assert rows[best_single][0] == "A"
    assert rows[best_pooled][0] == "B"
    assert fit[0].fitted < rows[0][2]  # the lucky number is pulled towards what its spec showed elsewhere


def test_noise_comes_from_the_residuals_once_they_have_three_degrees_of_freedom() -> None:
    rng = random.Random(3)
    rows = [(s, c, rng.gauss(0.0, 0.05)) for s in ("a", "b") for c in ("x", "y") for _ in range(3)]
    fit = pooled_scores(rows, z=0.0)
    assert all(f.score == f.fitted for f in fit)
    sigma = fit[0].se / math.sqrt(1 / 6 + 1 / 7)
    assert 0.02 < sigma < 0.1 and sigma != pytest.approx(DEFAULT_NOISE)
    few = pooled_scores([("a", "x", 0.0), ("b", "x", 0.1)])
    assert few[0].se == pytest.approx(DEFAULT_NOISE * math.sqrt(1 + 1 / 3))


# --- stats.pooled_contrast: one point against another, with the error of the difference ---------------


def test_the_contrast_of_two_points_sharing_their_communication_is_their_speculation_gap() -> None:
    """Two speculation settings measured under the same NCCL settings: the difference is the gap of their
    means and its error sigma * sqrt(1/n_a + 1/n_b) - the shared b effect cancels, which adding the two
    points' own standard errors (pooled_scores') would not see."""
    rows = [("A", c, math.log(v)) for c, v in (("c1", 1.00), ("c2", 1.02), ("c1", 0.98), ("c2", 1.00))]
    rows += [("B", c, math.log(v)) for c, v in (("c1", 1.05), ("c2", 1.07))]
    found = pooled_contrast(rows, ("A", "c1"), ("B", "c1"), shrink=0.0, floor=0.0)
    assert found is not None
    mean_a = sum(r[2] for r in rows[:4]) / 4
    mean_b = sum(r[2] for r in rows[4:]) / 2
    assert found.diff == pytest.approx(mean_b - mean_a, abs=1e-9)
    fit = pooled_scores(rows, shrink=0.0, floor=0.0)
    resid = sum((r[2] - f.fitted) ** 2 for r, f in zip(rows, fit))  # 6 rows, 2 + 2 - 1 groups: 3 degrees of freedom
    sigma = math.sqrt(resid / 3)
    assert found.se == pytest.approx(sigma * math.sqrt(1 / 4 + 1 / 2), rel=1e-6)
    flipped = pooled_contrast(rows, ("B", "c1"), ("A", "c1"), shrink=0.0, floor=0.0)
    assert flipped is not None and flipped.diff == pytest.approx(-found.diff) and flipped.se == pytest.approx(found.se)


def test_the_contrast_error_shrinks_as_the_points_are_measured_again() -> None:
    rng = random.Random(5)

    def rows(n: int) -> list[tuple[str, str, float]]:
        out = []
        for _ in range(n):
            out.append(("A", "c1", math.log(1.00) + rng.gauss(0.0, 0.04)))
            out.append(("B", "c2", math.log(1.04) + rng.gauss(0.0, 0.04)))
            out.append(("A", "c2", math.log(1.01) + rng.gauss(0.0, 0.04)))
        return out

    few, many = pooled_contrast(rows(2), ("A", "c1"), ("B", "c2")), pooled_contrast(rows(40), ("A", "c1"), ("B", "c2"))
    assert few is not None and many is not None
    assert many.se < few.se / 3
    assert many.diff == pytest.approx(math.log(1.04), abs=3 * many.se)


def test_no_contrast_for_a_point_whose_parts_were_not_measured() -> None:
    rows = [("A", "c1", 0.0), ("B", "c1", 0.01)]
    assert pooled_contrast(rows, ("A", "c1"), ("C", "c1")) is None
    assert pooled_contrast(rows, ("A", "c1"), ("B", "c9")) is None
    assert pooled_contrast([], ("A", "c1"), ("B", "c1")) is None
