"""The runner-up as a contender for deployment (docs/verdict.md, "Near-ties settled by measurement"):
what the search measured of it against the champion, whether it leads and so joins the gate's rounds,
and the verdict's words for a decision that used the search's measurements; and the log's line on
whether the search's measurements were adjusted for each run's speed (results.select.run_speed)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from orchestrator.records import TrialRole
from orchestrator.results import contrib, select, sequential
from orchestrator.stats import COVARIATE_MIN_DOF, Contrast
from orchestrator.verdict.port import Port
from orchestrator.verdict.steps import Arms, Champion

log = logging.getLogger("sweep")


def contending(
    port: Port, values: Mapping[str, Mapping[int, float]], plan: sequential.RoundsPlan, search: Contrast | None
) -> list[str]:
    """["runner_up"] while it measured better than the champion on all the evidence (contrib.contender_wins)
    and its own gate has not decided: it would be deployed if it passed, so it joins the gate's pair
    (rounds.run_rounds says in which rounds; a runner-up left out of the rounds the gate's noise needed
    could not pass its own gate, and the champion it beat was deployed: the overnight bench at 4% noise,
    seed 26)."""
    direction = port.spec.objective.direction
    if contrib.contender_wins(values, "runner_up", direction=direction, search=search) is None:
        return []
    own = contrib.gate_of(values, "runner_up", plan, direction=direction)
    return [] if own is not None and own.verdict is not None else ["runner_up"]


def search_contrast(port: Port, champion: Champion, measuring: Arms) -> Contrast | None:
    """What the search's own measurements say of the runner-up against the champion (None without one)."""
    if not any(a.name == "runner_up" for a in measuring.arms):
        return None
    spec = port.spec
    eligible = select.eligible_values(port.outcomes, metric=spec.objective.metric, constraints=spec.objective.bounds())
    return select.search_contrast(
        eligible,
        champion.trial.params,
        measuring.params_of("runner_up"),
        direction=spec.objective.direction,
        adjust=select.run_speed_metric(spec.objective.metric, spec.benchmark.concurrency),
    )


def with_search(values: Mapping[str, Mapping[int, float]], search: Contrast | None, direction: select.Direction) -> str:
    """The verdict's "; with the search's measurements of both (...), x% +- y%" when the search's estimate
    took part in the decision, else nothing."""
    both = contrib.settled(values, "runner_up", direction=direction, search=search) if search is not None else None
    if search is None or both is None:
        return ""
    return (
        f"; with the search's measurements of both (pooled fit {math.expm1(search.diff) * 100:+.1f}%), "
        f"{math.expm1(both.diff) * 100:+.1f}% +- {both.se * 100:.1f}%"
    )


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
    found = select.run_speed_of(eligible, direction=objective.direction, adjust=adjustable)
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
