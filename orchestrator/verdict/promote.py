"""The promotion as one pipeline of values, each step a function returning a frozen one:

    pick -> Champion           the trial to confirm, the baseline, its MLflow run (verdict.pick)
    arms -> Arms               what the rounds measure (the main pair, ablations, levels, steps)
    rounds -> Measured         verdict.rounds.run_rounds: the values and the rows of every run
    decide -> Gate             the main pair's decision, the figures, the contributions (verdict.choose)
    choose -> Choice           the configuration to register (the champion, the runner-up or a simpler one)
    register -> Promotion      the registry version and champion.env, or why not (verdict.register)

Any step may end the promotion instead: it then returns the Promotion saying why. Everything the
pipeline needs of the night it ends comes through the Port (verdict.port).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from orchestrator.results import contrib, sequential
from orchestrator.verdict import contender, correctness_gate, rounds, schedule
from orchestrator.verdict.arm import Arm
from orchestrator.verdict.choose import choose, decide, explain, load_arms, open_parts
from orchestrator.verdict.pick import arms, pick, ungated
from orchestrator.verdict.port import Port
from orchestrator.verdict.register import register
from orchestrator.verdict.steps import Arms, Champion, Choice, Promotion
from orchestrator.verdict.value import Outcome

log = logging.getLogger("sweep")


def promote(port: Port) -> Promotion:
    """Champion -> sequential interleaved confirmation against the baseline (with the arms that say
    why it won) -> the configuration to deploy -> it at each load -> verdict -> registry alias -> env file."""
    picked = pick(port)
    if isinstance(picked, Promotion):
        return picked
    plan = _plan(port)
    if plan is None:
        chosen = ungated(port, picked)
        return chosen if isinstance(chosen, Promotion) else register(port, picked, chosen)
    measuring = fitted(port, arms(port, picked))
    if not any(a.main for a in measuring.arms):
        why = "; ".join(measuring.dropped)
        return Promotion(
            Outcome.undecided,
            f"undecided: the night left no time for the confirmation ({why}); "
            f"{port.resume_hint} with a longer --timeout confirms it",
            picked,
            not_measured=measuring.dropped,
        )
    return _confirmed(port, picked, measuring, plan)


def _confirmed(port: Port, picked: Champion, measuring: Arms, plan: sequential.RoundsPlan) -> Promotion:
    """The rounds, the gate's decision, the configuration to deploy (checked for correctness), it at each
    load, and its registration."""
    level = port.spec.benchmark.concurrency
    at_gate = [a for a in measuring.arms if a.concurrency == level]
    later = _later_s(port, [a for a in measuring.arms if a.concurrency != level])
    search = contender.search_contrast(port, picked, measuring)
    measured = rounds.run_rounds(
        port,
        at_gate,
        plan,
        more=lambda values: open_parts(port, picked, values, plan),
        contends=lambda values: contender.contending(port, values, plan, search),
        hold_s=later,
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
    # The loads measure what is deployed; with nothing to deploy, the champion the verdict is about.
    subject = choice or Choice(
        "champion",
        measuring.params_of("champion"),
        gate.figures,
        "",
        gate.outcome,
        number=picked.trial.number,
        decision=gate.decision,
    )
    stale = [n for n in measured.values if subject.name != "champion" and n.split("@")[0] in contrib.STEPS_ARMS]
    measured = rounds.run_more(port, *load_arms(port, picked, measuring, subject), measured, fresh=stale)
    gate = explain(port, picked, measuring, measured, gate, subject)
    if choice is None:
        log.warning("no promotion: %s", gate.verdict)
        return Promotion(
            gate.outcome, gate.verdict, picked, measured.rows, gate, gate.figures, not_measured=measuring.dropped
        )
    note = choice.verdict.strip(". ")
    choice = replace(choice, verdict=f"{gate.verdict}. {note}" if note else gate.verdict, figures=gate.figures)
    promoted = register(port, picked, choice, measured.rows, gate)
    return Promotion(
        promoted.outcome,
        promoted.verdict,
        picked,
        measured.rows,
        gate,
        promoted.confirmed,
        promoted.registered,
        not_measured=measuring.dropped,
        choice=choice,
    )


def _later_s(port: Port, later: list[Arm]) -> float:
    """Seconds the arms measured after the deployed configuration is decided are expected to take (their
    min_rounds rounds, as the night planned them): the gate's extra rounds leave them that."""
    seconds = schedule.run_seconds(port.spec, port.outcomes)
    return sum(seconds(a.concurrency) for a in later) * port.spec.promotion.min_rounds / max(port.slots(), 1)


def fitted(port: Port, measuring: Arms) -> Arms:
    """The arms that fit the time left of the night (verdict.schedule.plan: the gate's pair first, then by
    value), each one left out said in a line; the step comparison dropped with its arms."""
    spec = port.spec
    planned = schedule.plan(
        [(a.name, a.concurrency, a.main) for a in measuring.arms],
        seconds=schedule.run_seconds(spec, port.outcomes),
        left_s=port.remaining(),
        share_s=port.remaining(),
        min_rounds=spec.promotion.min_rounds,
        gate_level=spec.benchmark.concurrency,
        slots=max(port.slots(), 1),
    )
    kept = {a.name for a in planned.arms}
    for d in planned.dropped:
        log.warning("confirmation: %s not measured: %s", d.name, d.why)
        port.dropped(d.name, d.why)
    out = tuple(a for a in measuring.arms if a.name in kept)
    steps_left = any(a.name.split("@")[0] == measuring.counterpart for a in out)
    return Arms(
        arms=out,
        counterpart=measuring.counterpart if steps_left else "",
        fixed=measuring.fixed if steps_left else "",
        dropped=tuple(f"{d.name}: {d.why}" for d in planned.dropped),
    )


def _plan(port: Port) -> sequential.RoundsPlan | None:
    """The rounds the confirmation may take; None without a gate (promotion.max_rounds: 0)."""
    p = port.spec.promotion
    return sequential.RoundsPlan(p.min_rounds, p.max_rounds, p.min_gain) if p.max_rounds else None
