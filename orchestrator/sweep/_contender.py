"""The runner-up as a contender for deployment (docs/verdict.md, "Near-ties settled by measurement"):
what the search measured of it against the champion, whether it leads and so joins the gate's rounds,
and the verdict's words for a decision that used the search's measurements."""

from __future__ import annotations

import math
from collections.abc import Mapping

from orchestrator.results import contrib, select, sequential
from orchestrator.stats import Contrast
from orchestrator.sweep._context import Context
from orchestrator.sweep._promotion import Arms, Champion


def contending(ctx: Context, values: Mapping[str, Mapping[int, float]], plan: sequential.RoundsPlan,
                search: Contrast | None) -> list[str]:
    """["runner_up"] while it measured better than the champion on all the evidence (contrib.contender_wins)
    and its own gate has not decided: it would be deployed if it passed, so it joins the gate's pair
    (_confirm.run_rounds says in which rounds; a runner-up left out of the rounds the gate's noise needed
    could not pass its own gate, and the champion it beat was deployed: the overnight bench at 4% noise,
    seed 26)."""
    direction = ctx.spec.objective.direction
    if contrib.contender_wins(values, "runner_up", direction=direction, search=search) is None:
        return []
    own = contrib.gate_of(values, "runner_up", plan, direction=direction)
    return [] if own is not None and own.verdict is not None else ["runner_up"]


def search_contrast(ctx: Context, champion: Champion, measuring: Arms) -> Contrast | None:
    """What the search's own measurements say of the runner-up against the champion (None without one)."""
    if not any(a.name == "runner_up" for a in measuring.arms):
        return None
    spec = ctx.spec
    eligible = select.eligible_values(ctx.outcomes, metric=spec.objective.metric, constraints=spec.objective.bounds())
    return select.search_contrast(eligible, champion.trial.params, measuring.params_of("runner_up"),
                                  direction=spec.objective.direction)


def with_search(values: Mapping[str, Mapping[int, float]], search: Contrast | None, direction: select.Direction) -> str:
    """The verdict's "; with the search's measurements of both (...), x% +- y%" when the search's estimate
    took part in the decision, else nothing."""
    both = contrib.settled(values, "runner_up", direction=direction, search=search) if search is not None else None
    if search is None or both is None:
        return ""
    return (f"; with the search's measurements of both (pooled fit {math.expm1(search.diff) * 100:+.1f}%), "
            f"{math.expm1(both.diff) * 100:+.1f}% +- {both.se * 100:.1f}%")
