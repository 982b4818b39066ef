"""Choose and confirm the champion: feasibility, speed-up against the baseline, and the statistics
that decide whether a gain is real.

Everything here is pure: numbers and outcomes in, a decision (with its reason in words) out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

from orchestrator.records import (
    Metrics,
    TrialOutcome,
    TrialRole,
    TrialStatus,
    prefill_group,
    prefill_x,
    split_point,
)
from orchestrator.stats import (
    DEFAULT_NOISE,
    Covariate,
    Pooled,
    covariate_adjusted,
    pooled_scores,
)

Direction = Literal["maximize", "minimize"]

PICK_Z = 0.5
"""Standard errors below its pooled estimate a trial is ranked at by the champion pick (a one-sided 69%
bound). Chosen on bench/overnight.py: nights ending >= 98% of the optimum over 240, z = 0 / 0.5 / 1 / 2:
229 / 231 / 229 / 223 (docs/benchmarks.md)."""

METRIC_NAMES: tuple[str, ...] = tuple(name for name, field in Metrics.model_fields.items() if name != "sources")
"""Fields of Metrics that an objective or a constraint may name."""


def _check_direction(direction: str) -> None:
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', but got {direction!r}")


def speedup(value: float, baseline: float, *, direction: Direction = "maximize") -> float:
    """How many times better than the baseline: value/baseline for throughput, baseline/value for latency."""
    _check_direction(direction)
    if not (math.isfinite(baseline) and baseline > 0):
        raise ValueError(f"baseline must be a positive number, but got {baseline!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"value must be a positive number, but got {value!r}")
    return value / baseline if direction == "maximize" else baseline / value


def speedup_pct(ratio: float) -> float:
    """A speed-up ratio (`speedup`) as every view shows it - MLflow's `speedup_pct`, results.csv,
    results.html, report.html and `sweep status`: percent over the baseline, one decimal (1.549 -> 54.9).

    Each trial's ratio is computed once, when the driver tells the study (against the baseline measured
    nearest in time among those measured by then), and kept in the study (`speedup_vs_baseline`); the
    views read that kept ratio rather than choosing a baseline again from a later, longer list."""
    return round((ratio - 1.0) * 100.0, 1)


def nearest_baseline(t: float, baselines: Sequence[tuple[float, float]]) -> float | None:
    """The value of the baseline measured closest in time to `t` (on a tie, the earlier one), or
    None when no baseline has been measured yet."""
    if not baselines:
        return None
    return min(baselines, key=lambda tv: (abs(tv[0] - t), tv[0]))[1]


def drift(baselines: Sequence[tuple[float, float]], *, threshold: float = 0.05) -> tuple[float, bool]:
    """Largest relative change of any baseline against the first one measured, and whether it
    exceeds `threshold` (0.05 = 5%). Fewer than two baselines cannot drift: (0.0, False)."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, but got {threshold}")
    if len(baselines) < 2:
        return 0.0, False
    ordered = sorted(baselines, key=lambda tv: tv[0])
    first = ordered[0][1]
    if not first > 0:
        raise ValueError(f"the first baseline must be positive, but got {first!r}")
    change = max(abs(v - first) / first for _, v in ordered)
    return float(change), bool(change > threshold)


def env_applied(outcome: TrialOutcome) -> bool:
    """Whether the trial proves its environment reached the workers.

    Only an observation that says ok counts (observe.EnvObservation dumped into effective_env);
    a trial without an observation proves nothing and is not eligible.
    """
    return bool(outcome.effective_env.get("ok") is True) and (
        outcome.failure_kind is None or outcome.failure_kind.value != "env_not_applied"
    )


def _metric(outcome: TrialOutcome, name: str) -> float | None:
    if outcome.metrics is None:
        return None
    value = getattr(outcome.metrics, name)
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value)


def _check_metric_name(name: str, what: str) -> None:
    if name not in METRIC_NAMES:
        raise ValueError(f"{what} {name!r} is not a measured metric; choose one of: {', '.join(METRIC_NAMES)}")


def feasible(outcome: TrialOutcome, constraints: Mapping[str, tuple[float | None, float | None]]) -> bool:
    """Whether every constrained metric is present and within its [low, high] bounds (None = open), and
    the search's correctness screen did not find the trial's outputs changed (outcome.outputs_changed)."""
    if outcome.outputs_changed:
        return False
    for name, (low, high) in constraints.items():
        value = _metric(outcome, name)
        if value is None:
            return False
        if low is not None and value < low:
            return False
        if high is not None and value > high:
            return False
    return True


def eligible_values(
    outcomes: Sequence[TrialOutcome], *, metric: str, constraints: Mapping[str, tuple[float | None, float | None]]
) -> list[tuple[TrialOutcome, float]]:
    """The trials a pick may choose, with their objective values: complete, not a baseline, environment
    proven applied, the metric present, every constraint satisfied."""
    eligible: list[tuple[TrialOutcome, float]] = []
    for outcome in outcomes:
        if outcome.status is not TrialStatus.COMPLETE or outcome.role is TrialRole.baseline:
            continue
        if not env_applied(outcome) or not feasible(outcome, constraints):
            continue
        value = _metric(outcome, metric)
        if value is not None:
            eligible.append((outcome, value))
    return eligible


def pooled_fit(
    eligible: Sequence[tuple[TrialOutcome, float]],
    *,
    direction: Direction,
    z: float = PICK_Z,
    adjust: str | None = None,
) -> list[Pooled] | None:
    """stats.pooled_scores over the eligible trials (log of the objective, oriented so higher is better,
    adjusted for each run's speed where `adjust` names the objective and it is one run_speed may adjust
    (run_speed_metric: the caller's say, from the benchmark load), or None when a value is not positive."""
    rows = log_rows(eligible, direction, adjust)
    return pooled_scores(rows, z=z) if rows is not None else None


RUN_SPEED_METRICS = frozenset({"decode_tok_s", "output_tok_s", "itl_ms_p50", "itl_ms_p99", "tpot_ms_p50", "cycle_ms"})
"""Objectives set by the decode cycle's time, which a run's TTFT may say something of (run_speed)."""


def run_speed_metric(metric: str, concurrency: int) -> str | None:
    """The metric run_speed may adjust when trials are benchmarked at `concurrency`: `metric` at one stream,
    where a request's TTFT is its prefill; None above, where a new request also waits for the running
    batch's decode cycle to end (SGLang's scheduler prefills between decode batches), a wait the
    speculation settings set, which run_speed's TTFT fit (records.prefill_group) does not separate from
    the run's speed: a configuration with a slower cycle would be credited with a faster decode."""
    return metric if metric in RUN_SPEED_METRICS and concurrency <= 1 else None


def log_rows(
    eligible: Sequence[tuple[TrialOutcome, float]], direction: Direction, adjust: str | None = None
) -> list[tuple[Hashable, Hashable, float]] | None:
    """The pooled fit's rows: (speculation part, communication part, log value oriented so higher is
    better), adjusted by run_speed for an `adjust` in RUN_SPEED_METRICS; None when nothing is eligible or
    a value is not positive."""
    found = adjusted_rows(eligible, direction, adjust)
    return found[0] if found is not None else None


def adjusted_rows(
    eligible: Sequence[tuple[TrialOutcome, float]], direction: Direction, adjust: str | None
) -> tuple[list[tuple[Hashable, Hashable, float]], Covariate | None] | None:
    """run_speed over the eligible trials' log rows (oriented so higher is better): the rows and what it
    found; None when nothing is eligible or a value is not positive."""
    if not eligible or not all(value > 0 and math.isfinite(value) for _, value in eligible):
        return None
    sign = 1.0 if direction == "maximize" else -1.0
    return run_speed(eligible, [(*split_point(o.params), sign * math.log(v)) for o, v in eligible], adjust)


def run_speed(
    eligible: Sequence[tuple[TrialOutcome, float]], rows: Sequence[tuple[Hashable, Hashable, float]], adjust: str | None
) -> tuple[list[tuple[Hashable, Hashable, float]], Covariate | None]:
    """`rows` (one per eligible trial) less what each run's own speed explains: a server run that came up
    slow (clocks, a neighbour on the host) is slow at prefill and at decode alike, so its TTFT, less what
    its configuration makes of TTFT (an additive fit over speculation on/off and the communication
    settings: the prefill's all-reduces), tells the decode objective's noise apart from the configuration
    (stats.covariate_adjusted; the slope is measured on the points run more than once and used only where
    it is told from 0, so on a host whose TTFT does not move with decode nothing changes). The rows as
    they are where `adjust` is None or another metric; a trial without a TTFT stays as measured."""
    if adjust not in RUN_SPEED_METRICS:
        return list(rows), None
    x = [prefill_x(o.metrics.ttft_ms_p50 if o.metrics is not None else None) for o, _ in eligible]
    x_cells = [prefill_group(o.params) for o, _ in eligible]  # what a run's TTFT depends on
    y, found = covariate_adjusted([r[2] for r in rows], x, [((r[0], r[1]),) for r in rows], x_cells)
    return [(r[0], r[1], v) for r, v in zip(rows, y)], found


RIVAL_Z = 2.0
"""Standard errors above its pooled estimate a rival of the best point is credited with (near_tie).
Chosen on bench/overnight.py's tuning seeds (docs/benchmarks.md): z = 1 re-measured so often that the
H200 search, which needs its trials to reach a far corner, lost nights; z = 2 kept them."""

NEAR_TIE_MAX = 4
"""Measurements of one point after which near_tie measures it no more."""


def replicate_noise(
    eligible: Sequence[tuple[TrialOutcome, float]], *, direction: Direction = "maximize", adjust: str | None = None
) -> tuple[float, int] | None:
    """The run-to-run noise (log scale) the search measured, from the points it measured more than once
    with the very same parameters (pure error: no model between them, so a misfit of the pooled fit does
    not count as noise), on rows adjusted as `adjust` says (log_rows: what the runs' speed explains taken out), with its
    degrees of freedom; None under 3 of them or when a value is not positive."""
    rows = log_rows(eligible, direction, adjust)
    if rows is None:
        return None
    groups: dict[tuple[Hashable, Hashable], list[float]] = {}
    for a, b, y in rows:
        groups.setdefault((a, b), []).append(y)
    ss, dof = 0.0, 0
    for ys in groups.values():
        if len(ys) > 1:
            mean = sum(ys) / len(ys)
            ss += sum((y - mean) ** 2 for y in ys)
            dof += len(ys) - 1
    return (math.sqrt(ss / dof), dof) if dof >= 3 else None


def remeasure_interval(
    every: int,
    eligible: Sequence[tuple[TrialOutcome, float]],
    *,
    direction: Direction = "maximize",
    adjust: str | None = None,
) -> int:
    """sampler.remeasure_every scaled by the noise the search measured (replicate_noise) against the
    DEFAULT_NOISE it was chosen at: a night twice as noisy re-measures its near-ties twice as often, never
    more often than every 2nd trial; `every` itself until the noise is known or where it is lower."""
    found = replicate_noise(eligible, direction=direction, adjust=adjust)
    if not every or found is None or found[0] <= DEFAULT_NOISE:
        return every
    return max(2, min(every, round(every * DEFAULT_NOISE / found[0])))


def near_tie(
    eligible: Sequence[tuple[TrialOutcome, float]], *, direction: Direction, adjust: str | None = None
) -> TrialOutcome | None:
    """The point to measure again (a trial of it), or None: the best point (the pick's own order, a
    lower bound PICK_Z standard errors below its pooled estimate) against its rival, the other point with
    the highest upper bound (RIVAL_Z above). While the rival's upper bound reaches the best one's lower
    bound the two are not told apart, and the one the fit knows less (the larger standard error) is
    measured again - the LUCB rule of best-arm identification (Kalyanakrishnan et al., ICML 2012). None
    with fewer than two points, when they are told apart, or when that point has NEAR_TIE_MAX
    measurements."""
    fit = pooled_fit(eligible, direction=direction, z=0.0, adjust=adjust)
    if fit is None:
        return None
    points: dict[Hashable, tuple[TrialOutcome, Pooled]] = {}
    count: Counter[Hashable] = Counter()
    for (outcome, _), pooled in zip(eligible, fit):
        key = split_point(outcome.params)
        points.setdefault(key, (outcome, pooled))
        count[key] += 1
    if len(points) < 2:
        return None
    best = max(points, key=lambda k: (points[k][1].fitted - PICK_Z * points[k][1].se, -points[k][0].number))
    rival = max(
        (k for k in points if k != best),
        key=lambda k: (points[k][1].fitted + RIVAL_Z * points[k][1].se, -points[k][0].number),
    )
    b, r = points[best][1], points[rival][1]
    if r.fitted + RIVAL_Z * r.se <= b.fitted - PICK_Z * b.se:
        return None
    target = best if b.se >= r.se else rival
    return points[target][0] if count[target] < NEAR_TIE_MAX else None


def pick_champion(
    outcomes: Sequence[TrialOutcome],
    *,
    metric: str,
    direction: Direction,
    constraints: Mapping[str, tuple[float | None, float | None]] | None = None,
    concurrency: int,
    pooled: bool = True,
) -> TrialOutcome | None:
    """The best eligible trial by `metric`, or None when no trial is eligible.

    Eligible: status COMPLETE, not a baseline, environment proven applied (env_applied), the metric
    present, and every constraint satisfied.

    `pooled` (the sweep's pick): the trials are ranked by stats.pooled_scores, a lower confidence
    bound (PICK_Z) of an additive fit over (speculation settings, communication settings) on the log
    scale, so a point measured once and lucky by two sigma does not beat one whose neighbours measured it four
    times over (the winner's curse of a best-of-40 pick at 2% noise). Trials with the same score (the
    same settings) go by their own measurement; ties to the lower trial number. Without `pooled`, or
    when a value is not positive, the best single measurement wins. `concurrency`: the search trials'
    benchmark load, which says whether each run's own speed is taken out (run_speed_metric).
    """
    _check_direction(direction)
    _check_metric_name(metric, "objective metric")
    constraints = dict(constraints or {})
    for name, bounds in constraints.items():
        _check_metric_name(name, "constraint")
        if len(bounds) != 2:
            raise ValueError(f"constraint {name!r} must be (low, high), but got {bounds!r}")
        low, high = bounds
        if low is not None and high is not None and low > high:
            raise ValueError(f"constraint {name!r}: low <= high must hold, but got ({low}, {high})")

    sign = 1.0 if direction == "maximize" else -1.0
    eligible = eligible_values(outcomes, metric=metric, constraints=constraints)
    if not eligible:
        return None
    adjust = run_speed_metric(metric, concurrency)
    fit = pooled_fit(eligible, direction=direction, adjust=adjust) if pooled else None
    scores = [f.score for f in fit] if fit is not None else [0.0] * len(eligible)
    best = max(range(len(eligible)), key=lambda i: (scores[i], sign * eligible[i][1], -eligible[i][0].number))
    return eligible[best][0]


def pareto_front(
    points: Sequence[Mapping[str, float | None]], objectives: Sequence[tuple[str, Direction]]
) -> list[int]:
    """Indices (ascending) of the points no other point dominates on `objectives`.

    A point missing any objective (absent or None) is not on the front. Equal points do not
    dominate each other, so duplicates are all kept.
    """
    if not objectives:
        raise ValueError("pareto_front needs at least one (name, direction) objective")
    for _, direction in objectives:
        _check_direction(direction)
    rows = [(i, row) for i, point in enumerate(points) if (row := _oriented(point, objectives)) is not None]
    return [i for i, vi in rows if not any(_dominates(vj, vi) for j, vj in rows if j != i)]


def _oriented(
    point: Mapping[str, float | None], objectives: Sequence[tuple[str, Direction]]
) -> tuple[float, ...] | None:
    """The point's objectives oriented so that larger is better; None when one is missing or not finite."""
    values = [point.get(name) for name, _ in objectives]
    numbers = [float(v) for v in values if v is not None]
    if len(numbers) < len(values) or not all(math.isfinite(v) for v in numbers):
        return None
    return tuple(v if d == "maximize" else -v for v, (_, d) in zip(numbers, objectives))


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """`a` is at least as good as `b` on every objective and better on one."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))
