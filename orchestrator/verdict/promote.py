"""The promotion as one pipeline of values, each step a function returning a frozen one, each step's module
entered once, in this order:

    pick -> Champion           the trial to confirm, the baseline, its MLflow run, its runner-up (verdict.pick)
    arms -> Arms               what the rounds measure, fitted to the night's time left (verdict.arms)
    rounds -> Measured         verdict.rounds.run_rounds: the values and the rows of every run; after each round
                               the gate (verdict.gate) and the questions still open (rounds.still_open)
    decide -> Gate             the main pair's decision, the figures, the contributions (verdict.choose)
    choose -> Choice           the configuration to deploy (the champion, the runner-up or a simpler one),
                               then the correctness gate (verdict.correctness_gate)
    conclude -> Promotion      it at each load, the verdict in words, the registry version and champion.env
                               (verdict.deployed, verdict.register)

Without a gate (promotion.max_rounds: 0) the pick is judged on its search-phase measurement (pick.ungated)
and registered. Any step may end the promotion instead: it then returns the Promotion saying why.
Everything the pipeline needs of the night it ends comes through the Port (verdict.port).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.stats import Covariate
from orchestrator.verdict import correctness_gate
from orchestrator.verdict.arms import arms, fitted
from orchestrator.verdict.choose import choose, decide
from orchestrator.verdict.deployed import conclude
from orchestrator.verdict.gate import RoundsPlan, contending
from orchestrator.verdict.pick import pick, ungated
from orchestrator.verdict.port import Port
from orchestrator.verdict.register import register
from orchestrator.verdict.rounds import Values, held_for, run_rounds, still_open
from orchestrator.verdict.speed import run_speed_adjusted
from orchestrator.verdict.steps import Promotion


def promote(port: Port) -> Promotion:
    """Champion -> sequential interleaved confirmation against the baseline (with the arms that say
    why it won) -> the configuration to deploy -> it at each load -> verdict -> registry alias -> env file."""
    plan = _plan(port)
    picked = pick(port)
    if isinstance(picked, Promotion):
        return picked
    if plan is None:
        chosen = ungated(port, picked)
        return chosen if isinstance(chosen, Promotion) else register(port, picked, chosen)
    measuring = fitted(port, picked, arms(port, picked))
    if isinstance(measuring, Promotion):
        return measuring
    # What the search's measurements say of the runner-up, while the night measures it.
    search = picked.search if any(a.name == "runner_up" for a in measuring.arms) else None
    direction, level = port.spec.objective.direction, port.spec.benchmark.concurrency

    adjustable = measuring.adjustable(port.spec.objective.metric, level)

    def judge(values: Values, ttft: Mapping[tuple[str, int], float]) -> tuple[Values | None, Covariate | None]:
        # Which of the two is better is asked of the values less each run's own speed (verdict.speed).
        found, covariate = run_speed_adjusted(values, ttft, adjustable, direction=direction)
        return (found if covariate is not None and covariate.applied else None), covariate

    def contends(values: Values, fair: Values | None) -> list[str]:
        return contending(values, plan, search, direction=direction, fair=fair)

    def more(values: Values, fair: Values | None) -> list[str]:
        return still_open(port, picked.trial.params, values, plan, fair)

    measured = run_rounds(
        port,
        [a for a in measuring.arms if a.concurrency == level],
        plan,
        more=more,
        contends=contends,
        judge=judge,
        hold_s=held_for(port, [a for a in measuring.arms if a.concurrency != level]),
    )
    gate = decide(port, picked, measuring, measured, plan)
    if isinstance(gate, Promotion):
        return gate
    choice = choose(port, picked, measuring, measured, gate, plan, search)
    # The correctness gate's slot: after the choice and before the loads measure it, so that what it
    # settles on is what the loads measure and the registry holds (its note stays in choice.verdict).
    if choice is not None:
        checked = correctness_gate.gate(port, picked, measuring, measured, gate, plan, choice)  # outputs unchanged?
        if isinstance(checked, Promotion):
            return checked
        choice = checked
    return conclude(port, picked, measuring, measured, gate, choice)


def _plan(port: Port) -> RoundsPlan | None:
    """The rounds the confirmation may take; None without a gate (promotion.max_rounds: 0)."""
    p = port.spec.promotion
    return RoundsPlan(p.min_rounds, p.max_rounds, p.min_gain) if p.max_rounds else None
