"""Choosing and confirming the champion: what a user sees in the final report."""

from __future__ import annotations

import numpy as np
import pytest
from outcome_helpers import searched

from orchestrator.records import (
    FailureKind,
    Metrics,
    TrialOutcome,
    TrialRole,
    TrialStatus,
    prefill_x,
    split_point,
)
from orchestrator.results.select import (
    NEAR_TIE_MAX,
    drift,
    near_tie,
    nearest_baseline,
    pareto_front,
    pick_champion,
    remeasure_interval,
    replicate_noise,
    run_speed,
    run_speed_metric,
    speedup,
    speedup_pct,
)
from orchestrator.search.sampler import adjusted
from orchestrator.stats import bootstrap_ci
from orchestrator.verdict.pick import run_speed_of, search_contrast

# --- bootstrap_ci ---------------------------------------------------------------------------


def test_bootstrap_ci_of_one_sample_is_that_sample():
    assert bootstrap_ci([88.8]) == (88.8, 88.8)


def test_bootstrap_ci_is_reproducible_and_brackets_the_median():
    samples = [82.0, 83.1, 88.8, 84.0, 85.5, 83.9, 86.2]
    low, high = bootstrap_ci(samples, seed=7)
    assert (low, high) == bootstrap_ci(samples, seed=7)
    assert low <= np.median(samples) <= high
    assert min(samples) <= low < high <= max(samples)


def test_bootstrap_ci_accepts_any_statistic():
    low, high = bootstrap_ci([1.0, 2.0, 3.0, 4.0], stat=lambda xs: max(xs))
    assert 2.0 <= low <= high == 4.0


@pytest.mark.parametrize("samples", [[], [1.0, float("nan")]])
def test_bootstrap_ci_rejects_empty_or_non_finite(samples):
    with pytest.raises(ValueError):
        bootstrap_ci(samples)


# --- speedup, nearest baseline, drift ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "baseline", "direction", "expected"),
    [
        (94.0, 88.8, "maximize", 94.0 / 88.8),  # field report row 9 over row 1: +5.9%
        (21.7, 28.7, "minimize", 28.7 / 21.7),  # verify ms: lower is better
        (88.8, 88.8, "maximize", 1.0),
    ],
)
def test_speedup(value, baseline, direction, expected):
    assert speedup(value, baseline, direction=direction) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("ratio", "shown"), [(94.0 / 88.8, 5.9), (1.549, 54.9), (1.0, 0.0), (0.8, -20.0), (13.345, 1234.5), (1.0004, 0.0)]
)
def test_the_speedup_every_view_shows(ratio, shown):
    assert speedup_pct(ratio) == shown


@pytest.mark.parametrize("baseline", [0.0, -1.0, float("inf")])
def test_speedup_rejects_a_meaningless_baseline(baseline):
    with pytest.raises(ValueError, match="baseline"):
        speedup(90.0, baseline)


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0.0, 89.0),
        (40.0, 89.0),  # closer to the first
        (60.0, 83.0),
        (50.0, 89.0),  # tie: the earlier one
        (1000.0, 82.5),
    ],
)
def test_nearest_baseline_in_time(t, expected):
    baselines = [(100.0, 83.0), (0.0, 89.0), (200.0, 82.5)]
    assert nearest_baseline(t, baselines) == expected


def test_no_baseline_yet():
    assert nearest_baseline(1.0, []) is None


@pytest.mark.parametrize(
    ("baselines", "threshold", "change", "flagged"),
    [
        ([], 0.05, 0.0, False),
        ([(0, 89.0)], 0.05, 0.0, False),
        ([(0, 89.0), (1, 88.0), (2, 89.5)], 0.05, 1.0 / 89.0, False),
        ([(0, 89.0), (1, 86.0), (2, 82.5)], 0.05, 6.5 / 89.0, True),  # the field report's drift
        ([(2, 82.5), (0, 89.0)], 0.10, 6.5 / 89.0, False),  # order by time, looser threshold
    ],
)
def test_drift(baselines, threshold, change, flagged):
    got_change, got_flagged = drift(baselines, threshold=threshold)
    assert got_change == pytest.approx(change)
    assert got_flagged is flagged


# --- pick_champion --------------------------------------------------------------------------


def outcome(
    number, decode, *, status=TrialStatus.COMPLETE, role=TrialRole.search, env_ok=True, itl_p99=10.0, failure=None
):
    metrics = Metrics(decode_tok_s=decode, output_tok_s=decode, itl_ms_p99=itl_p99) if decode else None
    return TrialOutcome(
        number=number,
        params={"NCCL_PROTO": "LL"},
        role=role,
        status=status,
        failure_kind=failure,
        metrics=metrics,
        effective_env={"ok": env_ok} if env_ok is not None else {},
    )


CHAMPION_CASES = [
    ("best complete trial wins", [outcome(1, 90.0), outcome(2, 95.0), outcome(3, 92.0)], {}, 2),
    (
        "failed trial never wins",
        [outcome(1, 90.0), outcome(2, 99.0, status=TrialStatus.FAILED, failure=FailureKind.bench_error)],
        {},
        1,
    ),
    ("baseline never wins", [outcome(0, 120.0, role=TrialRole.baseline), outcome(1, 90.0)], {}, 1),
    (
        "env not proven applied never wins",
        [outcome(1, 90.0), outcome(2, 99.0, env_ok=False), outcome(3, 98.0, env_ok=None)],
        {},
        1,
    ),
    (
        "constraint itl_ms_p99 <= 12 excludes the fastest",
        [outcome(1, 90.0, itl_p99=11.0), outcome(2, 99.0, itl_p99=30.0)],
        {"itl_ms_p99": (None, 12.0)},
        1,
    ),
    (
        "constraint on a metric the trial lacks excludes it",
        [outcome(1, 90.0, itl_p99=None), outcome(2, 80.0, itl_p99=5.0)],
        {"itl_ms_p99": (None, 12.0)},
        2,
    ),
    ("tie goes to the lower trial number", [outcome(5, 95.0), outcome(3, 95.0)], {}, 3),
    ("nothing eligible", [outcome(1, 90.0, env_ok=False)], {}, None),
]


@pytest.mark.parametrize(
    ("outcomes", "constraints", "winner"), [c[1:] for c in CHAMPION_CASES], ids=[c[0] for c in CHAMPION_CASES]
)
def test_pick_champion(outcomes, constraints, winner):
    best = pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1, constraints=constraints)
    assert (best.number if best else None) == winner


def test_pick_champion_minimize():
    outcomes = [outcome(1, 90.0, itl_p99=9.0), outcome(2, 95.0, itl_p99=7.5)]
    assert pick_champion(outcomes, metric="itl_ms_p99", direction="minimize", concurrency=1, constraints={}).number == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metric": "tokens_per_second", "direction": "maximize"}, "not a measured metric"),
        ({"metric": "decode_tok_s", "direction": "up"}, "direction"),
        ({"metric": "decode_tok_s", "direction": "maximize", "constraints": {"ttft_ms_p99": (5, 1)}}, "low <= high"),
    ],
)
def test_pick_champion_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pick_champion([outcome(1, 90.0)], concurrency=1, **kwargs)


# --- promotion gate -------------------------------------------------------------------------


# --- pareto front ---------------------------------------------------------------------------

PARETO_CASES = [
    (
        "trade-off keeps both ends",
        [{"tok": 100, "ttft": 50}, {"tok": 120, "ttft": 80}, {"tok": 90, "ttft": 90}],
        [0, 1],
    ),
    ("dominated point dropped", [{"tok": 100, "ttft": 50}, {"tok": 100, "ttft": 60}], [0]),
    ("duplicates both kept", [{"tok": 100, "ttft": 50}, {"tok": 100, "ttft": 50}], [0, 1]),
    ("missing objective excluded", [{"tok": 200, "ttft": None}, {"tok": 100}, {"tok": 90, "ttft": 70}], [2]),
    ("empty", [], []),
]


@pytest.mark.parametrize(("points", "front"), [c[1:] for c in PARETO_CASES], ids=[c[0] for c in PARETO_CASES])
def test_pareto_front(points, front):
    assert pareto_front(points, [("tok", "maximize"), ("ttft", "minimize")]) == front


SPEC_A = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1}
SPEC_B = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 2,
    "speculative_num_draft_tokens": 6,
}


def test_the_pooled_pick_prefers_settings_confirmed_by_their_neighbours():
    """A measured once lucky (100.2) and three times ordinary under other NCCL channel counts; B
    measured 98.5-99.2 under the same four: the best single number is A's, the pooled pick is B's."""
    outcomes = [
        searched(n, v, {**SPEC_A, "NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": ch})
        for n, v, ch in ((1, 100.2, 2), (2, 96.2, 4), (3, 95.8, 8), (4, 96.5, 16))
    ]
    outcomes += [
        searched(n, v, {**SPEC_B, "NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": ch})
        for n, v, ch in ((5, 99.2, 2), (6, 98.5, 4), (7, 98.9, 8), (8, 99.1, 16))
    ]
    raw = pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1, pooled=False)
    pooled = pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1)
    assert raw.number == 1
    assert pooled.params["speculative_eagle_topk"] == 2


def test_the_pooled_pick_falls_back_to_the_best_value_when_a_value_is_not_positive():
    outcomes = [searched(1, 0.0, {**SPEC_A}), searched(2, 5.0, {**SPEC_B})]
    assert pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1).number == 2


# --- near_tie: the best point or its rival measured again (sampler.remeasure_every) ----------------

POINT_A = {**SPEC_A, "NCCL_PROTO": "LL"}
POINT_B = {**SPEC_B, "NCCL_PROTO": "LL"}


def _eligible(outcomes):
    return [(o, o.metrics.decode_tok_s) for o in outcomes]


def _measured(params, values, first):
    return [searched(first + i, v, params) for i, v in enumerate(values)]


def test_near_tie_measures_the_rival_the_fit_knows_less():
    """A measured four times near 100, B once at 99.5: B's upper bound (2 standard errors up) reaches
    A's lower bound, and B, known less, is the one to measure again."""
    outcomes = _measured(POINT_A, (100.0, 100.4, 99.6, 100.1), 1) + _measured(POINT_B, (99.5,), 5)
    again = near_tie(_eligible(outcomes), direction="maximize")
    assert again is not None and again.number == 5


def test_near_tie_measures_the_best_point_when_it_is_the_less_known():
    """The pick's best point is B's single measurement, 2.6% above the mean of A's four, which spread by
    2% (the run-to-run noise the fit measures): a lucky number is what a second measurement settles, so
    B is measured again, not A."""
    outcomes = _measured(POINT_A, (93.0, 97.0, 94.0, 96.0), 1) + _measured(POINT_B, (97.5,), 5)
    assert pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1).number == 5
    again = near_tie(_eligible(outcomes), direction="maximize")
    assert again is not None and again.number == 5


def test_near_tie_leaves_points_told_apart_alone():
    """B 30% below A, both measured four times: told apart, nothing is measured again."""
    outcomes = _measured(POINT_A, (100.0, 100.4, 99.6, 100.1), 1) + _measured(POINT_B, (70.0, 70.3, 69.8, 70.1), 5)
    assert near_tie(_eligible(outcomes), direction="maximize") is None


def test_near_tie_stops_at_the_measurement_cap():
    """The point to measure again already has NEAR_TIE_MAX measurements: nothing is queued."""
    outcomes = _measured(POINT_A, (100.0, 100.4, 99.6, 100.1), 1) + _measured(POINT_B, [99.5] * (NEAR_TIE_MAX - 1), 10)
    assert near_tie(_eligible(outcomes), direction="maximize").number == 10  # one short of the cap
    outcomes.append(searched(20, 99.5, POINT_B))
    assert near_tie(_eligible(outcomes), direction="maximize") is None


def test_near_tie_needs_two_points_and_positive_values():
    assert near_tie(_eligible(_measured(POINT_A, (100.0, 101.0), 1)), direction="maximize") is None  # one point
    assert near_tie([], direction="maximize") is None
    assert near_tie(_eligible([searched(1, 0.0, POINT_A), searched(2, 90.0, POINT_B)]), direction="maximize") is None


def test_near_tie_for_a_latency_objective_measures_the_close_second():
    """Minimised: A's 20 ms four times is the best; B at 20.2 ms is its rival, C at 40 ms is not."""
    outcomes = (
        _measured(POINT_A, (20.0, 20.1, 19.9, 20.0), 1)
        + _measured(POINT_B, (20.2,), 5)
        + _measured({**POINT_B, "NCCL_ALGO": "Tree"}, (40.0,), 6)
    )
    again = near_tie(_eligible(outcomes), direction="minimize")
    assert again is not None and again.number == 5


# --- what the search says of two points; the noise it measured (issue 20, 4% noise) --------------------


def test_search_contrast_is_the_pooled_fit_of_the_second_against_the_first():
    """B's four measurements 3% above A's four, each under the same two NCCL settings: the search says B
    is about 3% better, and a latency objective reads the same numbers the other way round."""
    outcomes = [
        searched(n, v, {**SPEC_A, "NCCL_PROTO": p})
        for n, v, p in ((1, 96.0, "LL"), (2, 97.0, "Simple"), (3, 97.5, "LL"), (4, 96.5, "Simple"))
    ]
    outcomes += [
        searched(n, v, {**SPEC_B, "NCCL_PROTO": p})
        for n, v, p in ((5, 99.0, "LL"), (6, 100.0, "Simple"), (7, 100.4, "LL"), (8, 99.4, "Simple"))
    ]
    a, b = outcomes[0].params, outcomes[4].params
    found = search_contrast(_eligible(outcomes), a, b, direction="maximize")
    assert found is not None and 0.02 < found.diff < 0.04 and 0.0 < found.se < 0.02
    latency = search_contrast(_eligible(outcomes), a, b, direction="minimize")
    assert latency is not None and latency.diff == pytest.approx(-found.diff)
    assert search_contrast(_eligible(outcomes), a, {**SPEC_B, "NCCL_PROTO": "LL128"}, direction="maximize") is None
    assert search_contrast(_eligible([searched(1, 0.0, a), searched(2, 9.0, b)]), a, b, direction="maximize") is None


def test_replicate_noise_counts_only_repeats_of_the_very_same_point():
    """Pure error: A measured 100 and 104 (and 96 and 100) is noise; B 20% below A is not, however
    badly an additive model would fit it."""
    outcomes = _measured(POINT_A, (100.0, 104.0), 1) + _measured({**POINT_A, "NCCL_ALGO": "Ring"}, (96.0, 100.0), 3)
    outcomes += _measured(POINT_B, (80.0,), 5)
    assert replicate_noise(_eligible(outcomes)) is None  # 2 degrees of freedom
    outcomes += _measured(POINT_B, (80.0,), 6)
    sigma, dof = replicate_noise(_eligible(outcomes))
    assert dof == 3
    expected = np.sqrt(((np.log(104 / 100) / 2) ** 2 * 2 + (np.log(100 / 96) / 2) ** 2 * 2) / 3)
    assert sigma == pytest.approx(expected)


def test_a_noisier_night_re_measures_its_near_ties_more_often():
    """sampler.remeasure_every 4 was chosen at 2% noise: at 4% it is every 2nd trial, never more often,
    and unchanged where the noise is 2% or less or not known yet."""

    def night(spread):
        rows = []
        for i, point in enumerate((POINT_A, POINT_B, {**POINT_A, "NCCL_ALGO": "Ring"})):
            rows += _measured(point, (100.0 * np.exp(spread), 100.0 * np.exp(-spread)), 10 * i)
        return _eligible(rows)

    # Two measurements +-s of their mean: sigma = s * sqrt(2).
    assert remeasure_interval(4, night(0.04 / np.sqrt(2))) == 2
    assert remeasure_interval(4, night(0.08 / np.sqrt(2))) == 2
    assert remeasure_interval(4, night(0.03 / np.sqrt(2))) == 3
    assert remeasure_interval(4, night(0.01 / np.sqrt(2))) == 4
    assert remeasure_interval(4, night(0.0)[:3]) == 4  # under 3 degrees of freedom: not known
    assert remeasure_interval(0, night(0.04 / np.sqrt(2))) == 0  # off stays off


# --- run_speed: a run's TTFT takes its own speed out of the decode objective ------------------------


def _timed(number, params, true_decode, z, ttft_ms=40.0, noise=0.04):
    """A run whose server came up slower by z standard deviations of 4% noise, at decode and at prefill
    alike (the simulator's engine.run_factors at its default correlation 1)."""
    f = 1.0 + noise * z
    return TrialOutcome(
        number=number,
        params=params,
        role=TrialRole.search,
        status=TrialStatus.COMPLETE,
        metrics=Metrics(decode_tok_s=true_decode / f, output_tok_s=true_decode / f, ttft_ms_p50=ttft_ms * f),
        effective_env={"ok": True},
    )


RUNS_A = (1.2, 0.9, 1.5, 1.1)
"""A's four runs came up slow..."""
RUNS_B = (-1.1, -1.4, -0.8, -1.2)
"""...and B's fast: B, truly 2% slower, measures 8% faster."""


def test_the_pick_takes_each_runs_speed_out_of_the_decode_objective():
    outcomes = [_timed(i, POINT_A, 100.0, z) for i, z in enumerate(RUNS_A, 1)]
    outcomes += [_timed(i, POINT_B, 98.0, z) for i, z in enumerate(RUNS_B, 5)]
    eligible = _eligible(outcomes)
    assert max(outcomes, key=lambda o: o.metrics.decode_tok_s).params == POINT_B
    assert pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1).params == POINT_A
    found = search_contrast(eligible, POINT_A, POINT_B, direction="maximize", adjust="decode_tok_s")
    assert found is not None and found.diff == pytest.approx(np.log(0.98), abs=1e-6) and found.se < 0.006
    raw = search_contrast(eligible, POINT_A, POINT_B, direction="maximize")  # no metric named: as measured
    assert raw is not None and raw.diff > 0.05
    cov = run_speed_of(eligible, direction="maximize", adjust="decode_tok_s")
    assert cov is not None and cov.applied and cov.slope == pytest.approx(-1.0, abs=0.05)
    noise = replicate_noise(eligible, adjust="decode_tok_s")
    assert noise is not None and noise[0] < 1e-3 and noise[1] == 6  # 8 runs of 2 points: the runs' spread is gone
    assert near_tie(eligible, direction="maximize", adjust="decode_tok_s") is None  # told apart


def test_above_one_stream_the_pick_does_not_take_the_runs_speed_out():
    # At 32 streams a request's TTFT holds the wait for the running batch's cycle, which the speculation
    # settings set: read as the run's speed, a slower cycle would be credited with a faster decode.
    assert run_speed_metric("decode_tok_s", 1) == "decode_tok_s"
    assert run_speed_metric("output_tok_s", 32) is None
    assert run_speed_metric("ttft_ms_p50", 1) is None  # TTFT is not its own covariate
    outcomes = [_timed(i, POINT_A, 100.0, z) for i, z in enumerate(RUNS_A, 1)]
    outcomes += [_timed(i, POINT_B, 98.0, z) for i, z in enumerate(RUNS_B, 5)]
    assert pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=32).params == POINT_B
    assert pick_champion(outcomes, metric="decode_tok_s", direction="maximize", concurrency=1).params == POINT_A


def test_run_speed_leaves_other_objectives_and_untimed_runs_as_measured():
    outcomes = [_timed(i, POINT_A, 100.0, z) for i, z in enumerate(RUNS_A, 1)]
    outcomes += [_timed(i, POINT_B, 98.0, z) for i, z in enumerate(RUNS_B, 5)]
    ttft = [(o, o.metrics.ttft_ms_p50) for o in outcomes]
    assert run_speed_of(ttft, direction="minimize", adjust="ttft_ms_p50") is None  # TTFT is not its own covariate
    # A run without TTFT (SGLang's client recorded none, or a trial from before the TTFT was kept) stays as
    # measured; the timed runs are adjusted all the same (stats.covariate_adjusted: x None takes no part).
    untimed = outcomes + [searched(9, 99.0, POINT_A)]
    rows = [(*split_point(o.params), float(np.log(v))) for o, v in _eligible(untimed)]
    adjusted, cov = run_speed(_eligible(untimed), rows, "decode_tok_s")
    assert cov is not None and cov.applied and cov.dof == 5
    assert adjusted[-1] == rows[-1]
    a_runs = [np.exp(y) for _, _, y in adjusted[:4]]  # A's runs at one speed: its runs' spread is gone
    assert max(a_runs) - min(a_runs) < 1e-9 and a_runs[0] == pytest.approx(100.0, rel=2e-4)
    assert pick_champion(untimed, metric="decode_tok_s", direction="maximize", concurrency=1).params == POINT_A
    none_timed = [searched(i, v, p) for i, (v, p) in enumerate(((99.0, POINT_A), (98.0, POINT_A), (97.0, POINT_B)), 1)]
    assert run_speed_of(_eligible(none_timed), direction="maximize", adjust="decode_tok_s") is None


def test_the_search_and_the_pick_take_the_runs_speed_out_by_one_rule():
    """search/sampler.adjusted (the refinement's ranking, from the study's RUN_TTFT_ATTR) and run_speed (the
    pick's, from the trials' metrics) turn a TTFT into the covariate by one rule (records.prefill_x) and
    adjust alike: the same runs, the same values, a run without a usable TTFT as measured in both."""
    outcomes = [_timed(i, POINT_A, 100.0, z) for i, z in enumerate(RUNS_A, 1)]
    outcomes += [_timed(i, POINT_B, 98.0, z) for i, z in enumerate(RUNS_B, 5)]
    outcomes[2] = outcomes[2].model_copy(
        update={"metrics": outcomes[2].metrics.model_copy(update={"ttft_ms_p50": 0.0})}
    )  # a TTFT not usable (SGLang's client recorded 0)
    outcomes.append(searched(9, 99.0, POINT_B))  # none at all
    eligible = _eligible(outcomes)
    rows = [(*split_point(o.params), float(np.log(v))) for o, v in eligible]
    by_pick, cov = run_speed(eligible, rows, "decode_tok_s")
    assert cov is not None and cov.applied
    by_search = adjusted([(v, dict(o.params)) for o, v in eligible], [o.metrics.ttft_ms_p50 for o in outcomes])
    assert [v for v, _ in by_search] == pytest.approx([float(np.exp(y)) for _, _, y in by_pick], rel=1e-12)
    assert by_search[2][0] == eligible[2][1] and by_search[-1][0] == 99.0  # as measured, both
    assert by_search[0][0] != eligible[0][1]


def test_a_runs_ttft_as_the_covariate():
    assert prefill_x(40.0) == pytest.approx(np.log(40.0)) and prefill_x(7) == pytest.approx(np.log(7))
    for unusable in (None, 0.0, -3.0, float("nan"), float("inf"), "40", True):
        assert prefill_x(unusable) is None
