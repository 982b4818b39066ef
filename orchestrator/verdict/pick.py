"""The promotion's first step, everything it reads of the search's trials: the search's pick with its
baseline and MLflow run (or why there is none), its runner-up from another region (with promotion.explain;
without it, the rival the search can least rule out) and what the search's own measurements say of the two
(the near-tie the rounds may settle), the log's line on whether the pick
took each run's own speed out of the search's measurements (results.select.run_speed), and the verdict
without a gate (`ungated`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialStatus, split_point
from orchestrator.results import select
from orchestrator.results.figures import Confirmed, streams
from orchestrator.stats import COVARIATE_MIN_DOF, Contrast, Covariate, pooled_contrast
from orchestrator.verdict.port import Port
from orchestrator.verdict.steps import Champion, Choice, Promotion
from orchestrator.verdict.value import Outcome

log = logging.getLogger("sweep")

RUNNER_UP_DISTANCE = 2
"""A runner-up is from another region when at least this many knobs differ from the champion's."""


def pick(port: Port) -> Champion | Promotion:
    """The champion of the search, with the baseline, its MLflow run and its runner-up (from another
    region with promotion.explain, else its rival); or why there is none to promote."""
    spec = port.spec
    objective, level = spec.objective, spec.benchmark.concurrency
    feasible = [o for o in port.outcomes if o.role is TrialRole.search]
    champion = select.pick_champion(
        feasible,
        metric=objective.metric,
        direction=objective.direction,
        constraints=objective.bounds(),
        concurrency=level,
    )
    baseline = next(
        (o for o in reversed(port.outcomes) if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE), None
    )
    if champion is None or baseline is None:
        return Promotion(Outcome.no_champion, _no_champion(feasible) if champion is None else "no baseline measured")
    eligible = select.eligible_values(port.outcomes, metric=objective.metric, constraints=objective.bounds())
    adjust = select.run_speed_metric(objective.metric, level)
    note_run_speed(port)
    if not spec.promotion.explain:  # the one arm beside the pair: the rival the search can least rule out
        other, search = rival(eligible, champion, direction=objective.direction, adjust=adjust) or (None, None)
    else:
        other = runner_up(
            port.outcomes,
            champion,
            metric=objective.metric,
            direction=objective.direction,
            constraints=objective.bounds(),
            concurrency=level,
        )
        # What the search's own measurements say of the runner-up against the champion (gate.contender_wins).
        search = (
            None
            if other is None
            else search_contrast(eligible, champion.params, other.params, direction=objective.direction, adjust=adjust)
        )
    run_id = port.run_id_of(champion)  # the port sends the outbox first: its run may be created there
    if run_id is None:
        return Promotion(
            Outcome.no_champion,
            f"not promoted: trial {champion.number} is not in MLflow yet ({port.pending()} "
            f"result(s) wait in the outbox); when MLflow is reachable run `sweep sync` and "
            f"{port.resume_hint} to promote",
        )
    return Champion(
        trial=champion, baseline=baseline, run_id=run_id, metric=objective.metric, runner_up=other, search=search
    )


def _no_champion(searched: list[TrialOutcome]) -> str:
    """Why no search trial can be promoted, counted: none ran, all failed, or the measured ones broke a
    constraint (the baseline's own success is not the search's)."""
    complete = sum(o.status is TrialStatus.COMPLETE for o in searched)
    failed = len(searched) - complete
    if not searched:
        what = "no search trial was measured (only the baseline ran)"
    elif not complete:
        what = f"every search trial failed ({failed} of {len(searched)})"
    else:
        changed = sum(bool(o.outputs_changed) for o in searched)
        what = (
            f"{complete} search trial(s) measured, each breaking an objective constraint"
            + (f" or changing the outputs ({changed}, promotion.correctness.screen)" if changed else "")
            + (f", {failed} failed" if failed else "")
        )
    return (
        f"no feasible trial to promote: {what}; see `sweep status` and widen the space, raise the budget "
        f"or relax objective.constraints"
    )


def rival(
    eligible: Sequence[tuple[TrialOutcome, float]],
    champion: TrialOutcome,
    *,
    direction: select.Direction,
    adjust: str | None = None,
) -> tuple[TrialOutcome, Contrast] | None:
    """The searched trial the search can least rule out as better than the pick, with what the search says
    of it against the pick (search_contrast: positive when it is the better): at least one knob away, the
    highest upper bound (pooled estimate credited select.RIVAL_Z standard errors); None when even that does
    not reach the pick's. The fit's rows are built once; each configuration is contrasted once (its first
    trial stands for its repeats). With
    promotion.explain off it is the one arm the confirmation measures beside the gate's pair (verdict.arms),
    where the step control sat before.

    On a short night the pick and the optimum are often a near-tie measured once each, the pick's own value
    inflated by being the highest of several noisy ones; the rounds settle it. Why the bound and not the
    pick's own ranking (the runner-up's): a point measured once beside the pick has the widest interval,
    and that is the near-tie worth measuring again (bench/short_night.py, docs/benchmarks.md)."""
    rows = select.log_rows(eligible, direction, adjust)  # search_contrast's rows, for every candidate
    if rows is None:
        return None
    best: tuple[float, TrialOutcome, Contrast] | None = None
    seen: set[tuple[tuple[str, str], ...]] = set()
    for outcome, _ in eligible:
        point = tuple(sorted((k, repr(v)) for k, v in outcome.params.items()))
        if outcome.role is not TrialRole.search or point in seen or distance(outcome.params, champion.params) < 1:
            continue
        seen.add(point)
        found = pooled_contrast(rows, split_point(champion.params), split_point(outcome.params))
        if found is None:
            continue
        bound = found.diff + select.RIVAL_Z * found.se
        if bound > 0.0 and (best is None or bound > best[0]):
            best = (bound, outcome, found)
    return None if best is None else (best[1], best[2])


def distance(a: Mapping[str, ParamValue], b: Mapping[str, ParamValue]) -> int:
    return sum(1 for k in set(a) | set(b) if a.get(k) != b.get(k))


def runner_up(
    outcomes: Sequence[TrialOutcome],
    champion: TrialOutcome,
    *,
    metric: str,
    direction: select.Direction,
    constraints: Mapping[str, tuple[float | None, float | None]],
    concurrency: int,
) -> TrialOutcome | None:
    """The best eligible searched trial at least RUNNER_UP_DISTANCE knobs away from the champion, ranked
    as the champion pick ranks (select.PICK_Z below its pooled estimate) in the fit over every eligible
    searched trial: a point of another region is estimated from its parts as measured anywhere, as the
    champion was, not from the other region's trials alone (which left a point with a part measured
    mostly beside the champion barely known, and the runner-up a near-copy of the champion's family).
    `concurrency`: the trials' benchmark load (select.run_speed_metric)."""
    far = {
        o.number
        for o in outcomes
        if o.role is TrialRole.search
        and o.status is TrialStatus.COMPLETE
        and o.number != champion.number
        and distance(o.params, champion.params) >= RUNNER_UP_DISTANCE
    }
    eligible = select.eligible_values(
        [o for o in outcomes if o.role is TrialRole.search], metric=metric, constraints=constraints
    )
    fit = select.pooled_fit(eligible, direction=direction, adjust=select.run_speed_metric(metric, concurrency))
    if fit is None:
        return select.pick_champion(
            [o for o, _ in eligible if o.number in far],
            metric=metric,
            direction=direction,
            constraints=constraints,
            concurrency=concurrency,
            pooled=False,
        )
    sign = 1.0 if direction == "maximize" else -1.0
    scored = [(p.score, sign * value, -o.number, o) for (o, value), p in zip(eligible, fit) if o.number in far]
    return max(scored, key=lambda t: t[:3])[3] if scored else None


def note_run_speed(port: Port) -> None:
    """Say in the log whether the pick took each run's own speed out of its measurements (select.run_speed)."""
    objective, level = port.spec.objective, port.spec.benchmark.concurrency
    eligible = select.eligible_values(
        [o for o in port.outcomes if o.role is TrialRole.search],
        metric=objective.metric,
        constraints=objective.bounds(),
    )
    adjustable = select.run_speed_metric(objective.metric, level)
    if adjustable is None and objective.metric in select.RUN_SPEED_METRICS:
        log.info(
            "the pick uses %s as measured: at %d streams a request's TTFT also waits for the running batch's "
            "decode cycle, which the configuration sets, so it cannot tell a run's own speed",
            objective.metric,
            level,
        )
        return
    found = run_speed_of(eligible, direction=objective.direction, adjust=adjustable)
    if found is None:
        if adjustable is not None and eligible:
            log.info(
                "the pick uses %s as measured: no point was run more than once with its TTFT recorded, so "
                "nothing tells a run's own speed from its configuration",
                objective.metric,
            )
        return
    slope = f"slope {found.slope:+.2f} +- {found.se:.2f}, {found.dof} degrees of freedom among the repeated points"
    if found.applied:
        log.info(
            "the pick takes each run's own speed out of %s: a run's TTFT moves with it (%s)", objective.metric, slope
        )
    elif found.dof < COVARIATE_MIN_DOF:
        log.info(
            "the pick uses %s as measured: too few points run more than once to tell whether a run's TTFT "
            "moves with it (%d degrees of freedom, %d needed)",
            objective.metric,
            found.dof,
            COVARIATE_MIN_DOF,
        )
    elif not math.isfinite(found.se):
        log.info(
            "the pick uses %s as measured: the TTFT of the points run more than once did not vary "
            "(%d degrees of freedom)",
            objective.metric,
            found.dof,
        )
    else:
        log.info("the pick uses %s as measured: the runs' TTFT does not move with it (%s)", objective.metric, slope)


def run_speed_of(
    eligible: Sequence[tuple[TrialOutcome, float]], *, direction: select.Direction, adjust: str | None
) -> Covariate | None:
    """What run_speed found in these trials (its slope, and whether it adjusted them), None where it
    does not apply or no point was run twice."""
    found = select.adjusted_rows(eligible, direction, adjust)
    return found[1] if found is not None else None


def search_contrast(
    eligible: Sequence[tuple[TrialOutcome, float]],
    first: Mapping[str, ParamValue],
    second: Mapping[str, ParamValue],
    *,
    direction: select.Direction,
    adjust: str | None = None,
) -> Contrast | None:
    """What the search's measurements say of `second` against `first`: the pooled fit's (select.pooled_fit's
    model over every eligible trial, rows adjusted as `adjust` says) log-scale difference, oriented so that positive
    means `second` is better, with its standard error (stats.pooled_contrast); None when either point's
    parts were not measured or a value is not positive.

    Tried and not kept (docs/benchmarks.md): the baselines' measurements in the fit (no speculation at
    default NCCL is where the additive model fits worst - NCCL tuning pays more without speculation -
    so the residual noise, and every standard error, doubled) and a linear drift term (no night changed)."""
    rows = select.log_rows(eligible, direction, adjust)
    return pooled_contrast(rows, split_point(first), split_point(second)) if rows is not None else None


def ungated(port: Port, champion: Champion) -> Choice | Promotion:
    """Without a gate (promotion.max_rounds: 0): the champion on its one search-phase measurement against
    the baseline's, promoted as unconfirmed when that shows promotion.min_gain, refused otherwise."""
    spec = port.spec
    named = gate_level_named(port)
    metric, level = champion.metric, spec.benchmark.concurrency
    value, base_value = champion.search_value, float(getattr(champion.baseline.metrics, metric))
    figures = unconfirmed(value, base_value, metric, spec.objective.direction, concurrency=level)
    at = f" at {streams(level)}" if named is not None else ""
    measured = (
        f"{value:.2f} vs baseline {base_value:.2f} {metric}, {figures.gain * 100:+.1f}% from one measurement each{at}"
    )
    if figures.gain < spec.promotion.min_gain:
        verdict = (
            f"not better: promotion.max_rounds is 0, so the search-phase champion is judged without a gate: "
            f"{measured}, below the required {spec.promotion.min_gain * 100:+.1f}% (promotion.min_gain); "
            f"not promoted; set promotion.max_rounds (e.g. 12) to confirm it in interleaved rounds"
        )
        log.warning("no promotion: %s", verdict)
        return Promotion(Outcome.not_better, verdict, champion, confirmed=figures)
    verdict = (
        f"UNCONFIRMED: promotion.max_rounds is 0, so the search-phase champion is promoted without a "
        f"gate: {measured}, the best of many (optimistic); set promotion.max_rounds (e.g. 12) to confirm"
    )
    log.warning(verdict)
    return Choice(
        "champion", dict(champion.trial.params), figures, verdict, Outcome.unconfirmed, number=champion.trial.number
    )


def unconfirmed(
    champion: float, baseline: float, metric: str, direction: select.Direction, concurrency: int | None = None
) -> Confirmed:
    gain = champion / baseline - 1.0 if direction == "maximize" else baseline / champion - 1.0
    return Confirmed(
        label="unconfirmed",
        metric=metric,
        champion_median=champion,
        baseline_median=baseline,
        rounds=0,
        gain=gain,
        concurrency=concurrency,
    )


def gate_level_named(port: Port) -> int | None:
    """The level the gate decides at, when the verdict must name it (not one stream, or other levels
    reported beside it); None otherwise."""
    spec = port.spec
    level = spec.benchmark.concurrency
    return level if level != 1 or spec.promotion.concurrency else None
