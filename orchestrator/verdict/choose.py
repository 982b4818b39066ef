"""The gate's decision and what follows from it: the parts' contributions, the configuration to
deploy (the runner-up, a simpler arm or the champion), it at each load, and the verdict in words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from orchestrator.records import ParamValue, speculation_knob
from orchestrator.results import contrib, sequential
from orchestrator.search import space as sp
from orchestrator.stats import Contrast
from orchestrator.verdict import contender, rounds
from orchestrator.verdict.arm import Arm
from orchestrator.verdict.port import Port
from orchestrator.verdict.register import constraints, gate_level_named
from orchestrator.verdict.steps import Arms, Champion, Choice, Gate, Promotion
from orchestrator.verdict.value import Outcome


def decide(
    port: Port, champion: Champion, measuring: Arms, measured: rounds.Measured, plan: sequential.RoundsPlan
) -> Gate | Promotion:
    """The gate's decision on the main pair with the contributions of the champion's parts and the
    equivalence test of each; or, interrupted or without an interval, the Promotion that says so. The
    figures, levels and verdict become the deployed configuration's in `explain`, once it is known."""
    spec = port.spec
    metric, direction = champion.metric, spec.objective.direction
    named = gate_level_named(port)
    if port.interrupted():
        port.stop_for_interrupt()
        return Promotion(
            None,
            f"not promoted: interrupted during the confirmation rounds; {port.resume_hint} measures them again",
            champion,
            measured.rows,
        )
    decision = measured.decision
    if decision is None or decision.evidence is None:
        return Promotion(
            Outcome.undecided,
            contrib.at_level(
                f"undecided: {measured.failed()} of {len(measured.rows)} confirmation runs failed, too few rounds "
                f"for an interval; see {port.workdir / 'confirm'}",
                named,
                metric,
            ),
            champion,
            measured.rows,
        )
    speculation = _speculation(champion)
    parts = contrib.contributions(
        measured.values, speculation=speculation, sole_part=_sole_part(port, champion), direction=direction
    )
    checks = contrib.part_checks(
        measured.values,
        speculation=speculation,
        margin=spec.promotion.equivalence_margin,
        level=plan.level,
        direction=direction,
    )
    return Gate(
        decision=decision,
        evidence=decision.evidence,
        min_gain=plan.min_gain,
        figures=contrib.confirmed(decision.evidence, metric, concurrency=spec.benchmark.concurrency),
        contributions=tuple(parts),
        levels=(),
        by_load="",
        verdict=decision.message,
        checks=tuple(checks),
    )


def _sole_part(port: Port, champion: Champion) -> str:
    """What the champion's whole gain is credited to when its parts were not measured apart."""
    base = sp.baseline_params(port.spec.space)
    params = champion.trial.params
    communication = sum(1 for k, v in params.items() if not speculation_knob(k) and v != base.get(k))
    if not contrib.speculates(params):
        return "NCCL settings"
    if not communication:
        return _speculation(champion)
    return (
        f"{_speculation(champion)} with {communication} communication setting(s) (not measured apart: "
        f"promotion.explain is false)"
    )


def open_parts(
    port: Port, champion: Champion, values: Mapping[str, Mapping[int, float]], plan: sequential.RoundsPlan
) -> list[str]:
    """The arms whose question is still open, for which the rounds go on (beside the main pair) while
    the night allows: the ablations whose part is neither shown to add less than
    promotion.equivalence_margin nor significant, and the runner-up while its near-tie with the
    champion is neither settled nor shown equivalent (which of the two is deployed depends on it)."""
    margin, direction = port.spec.promotion.equivalence_margin, port.spec.objective.direction
    checks = contrib.part_checks(
        values, speculation=_speculation(champion), margin=margin, level=plan.level, direction=direction
    )
    runner = ["runner_up"] if contrib.contender_open(values, "runner_up", margin=margin, direction=direction) else []
    return runner + contrib.open_parts(checks)


def choose(
    port: Port,
    champion: Champion,
    measuring: Arms,
    measured: rounds.Measured,
    gate: Gate,
    plan: sequential.RoundsPlan,
    search: Contrast | None,
) -> Choice | None:
    """The configuration to deploy, before it is measured at the other loads: the runner-up when it
    measured better than the champion on the rounds and the search's contrast of the two (`search`,
    contender.search_contrast) and passes the gate itself (a near-tie settled
    by measurement); else, when the champion passed, the simpler arm whose left-out part is shown to add
    less than promotion.equivalence_margin and which passes the gate too, or the champion. None: nothing passes."""
    spec = port.spec
    direction, metric, level = spec.objective.direction, champion.metric, spec.benchmark.concurrency
    values = measured.values
    won = contrib.contender_wins(values, "runner_up", direction=direction, search=search)
    runner = contrib.gate_of(values, "runner_up", plan, direction=direction) if won is not None else None
    if (
        won is not None
        and runner is not None
        and runner.verdict is sequential.Verdict.promoted
        and runner.evidence is not None
    ):
        number = next(a.number for a in measuring.arms if a.name == "runner_up")
        return Choice(
            "runner_up",
            measuring.params_of("runner_up"),
            contrib.confirmed(runner.evidence, metric, concurrency=level),
            "",
            Outcome.promoted,
            number=number,
            decision=runner,
            why=f"trial {number} (the runner-up) measured {won.text()} over trial {champion.trial.number} "
            f"(the search's pick) in the same rounds{contender.with_search(values, search, direction)}, and "
            f"passes the gate itself",
        )
    if not gate.passed:
        return None
    simpler = contrib.simpler_choice(values, gate.checks, plan, direction=direction)
    if simpler is None:
        return Choice(
            "champion",
            measuring.params_of("champion"),
            gate.figures,
            "",
            Outcome.promoted,
            number=champion.trial.number,
            decision=gate.decision,
        )
    name, decision = simpler
    check = next(c for c in gate.checks if c.arm == name)
    derivation = "without speculation" if name == "no_speculation" else "with NCCL at defaults"
    figures = (
        gate.figures if decision.evidence is None else contrib.confirmed(decision.evidence, metric, concurrency=level)
    )
    return Choice(
        name,
        measuring.params_of(name),
        figures,
        "",
        Outcome.promoted,
        number=champion.trial.number,
        derivation=derivation,
        decision=decision,
        why=check.text(),
    )


def load_arms(port: Port, champion: Champion, measuring: Arms, choice: Choice) -> tuple[list[Arm], int]:
    """What is measured of the deployed configuration once it is known, with the rounds: it and the
    baseline at each other promotion.concurrency level the night kept, and its adaptive-or-fixed
    counterpart (at the gate's level too when it is not the champion, whose counterpart ran beside it)."""
    spec = port.spec
    level = spec.benchmark.concurrency
    base = sp.baseline_params(spec.space)
    levels = sorted({a.concurrency for a in measuring.arms if a.name.split("@")[0] == "champion"} - {level})
    out: list[Arm] = []
    for c in levels:
        out += [
            Arm(f"{choice.name}@{c}", dict(choice.params), choice.number, c),
            Arm(f"baseline@{c}", base, -1, c),
        ]
    steps_levels = sorted({a.concurrency for a in measuring.arms if a.name.split("@")[0] in contrib.STEPS_ARMS})
    if choice.name != "champion" and level in steps_levels and contrib.speculates(choice.params):
        out.append(Arm(choice.name, dict(choice.params), choice.number, level))
    else:
        steps_levels = [c for c in steps_levels if c != level]
    steps, _, _ = rounds.steps_arms(spec, choice.params, choice.number, port.outcomes, constraints(port), steps_levels)
    return out + steps, spec.promotion.min_rounds


def explain(
    port: Port, champion: Champion, measuring: Arms, measured: rounds.Measured, gate: Gate, who: Choice
) -> Gate:
    """The gate with the figures of `who` (the deployed configuration; the champion when nothing
    passes), its gain per load and the verdict in words, all about it."""
    spec = port.spec
    metric, level = champion.metric, spec.benchmark.concurrency
    named = gate_level_named(port)
    name, params = who.name, who.params
    decision = who.decision or gate.decision
    evidence = decision.evidence or gate.evidence
    levels, by_load, after = _by_load(port, champion, measured, name, params, evidence, who.label)
    others = [lv for lv in levels if lv.concurrency != level]
    message = decision.message
    if message.startswith("promoted: "):
        message = f"promoted {who.label}: {message.removeprefix('promoted: ')}"
    head = contrib.at_level(message, named, metric)
    why = "; ".join(p.text() for p in gate.contributions)
    if why and who.name == "runner_up":  # the parts measured are the search's pick's, not the deployed one's
        why = f"trial {champion.trial.number}'s parts (the search's pick): {why}"
    if gate.checks:  # the equivalence test: what decides between the champion and a simpler configuration
        why += ". Simpler only when shown equivalent: " + "; ".join(c.text() for c in gate.checks)
    verdict = contrib.verdict_text(head, concurrency=None, metric=metric, others=others, why=why, after=after)
    if who.why:
        verdict = f"{verdict}. Promoted {who.label} and not trial {champion.trial.number} as searched: {who.why}"
    return replace(
        gate,
        decision=decision,
        evidence=evidence,
        levels=tuple(levels),
        by_load=by_load,
        verdict=verdict,
        figures=contrib.confirmed(evidence, metric, concurrency=level),
    )


def _by_load(
    port: Port,
    champion: Champion,
    measured: rounds.Measured,
    name: str,
    params: Mapping[str, ParamValue],
    evidence: sequential.Evidence,
    label: str,
) -> tuple[list[contrib.LevelGain], str, str]:
    """The deployed configuration's gain at each promotion.concurrency level (at the gate's level: the
    gate's own figures, so "promoted" and "stops paying" cannot disagree; without levels listed, the
    gate's own level when adaptive and fixed steps were compared there), the sentence about them, and
    what the verdict ends with."""
    spec = port.spec
    direction, level = spec.objective.direction, spec.benchmark.concurrency
    found = contrib.steps_counterpart(
        params,
        contrib.best_fixed_steps(
            port.outcomes,
            metric=spec.objective.metric,
            direction=direction,
            constraints=constraints(port),
            concurrency=level,
        ),
    )
    kind, fixed = (found[0], found[2]) if found is not None else ("", "")
    listed = sorted(spec.promotion.concurrency) or [level]
    levels = []
    for c in listed:
        iv = contrib.interval_of(evidence) if c == level else _level(port, measured, f"{name}@{c}", f"baseline@{c}")
        if iv is None:
            continue
        steps = (
            contrib.steps_gain(
                measured.values, c, level, counterpart=kind, fixed=fixed, direction=direction, deployed=name
            )
            if kind
            else None
        )
        levels.append(contrib.LevelGain(concurrency=c, interval=iv, steps=steps))
    if not spec.promotion.concurrency:
        levels = [lv for lv in levels if lv.steps is not None]  # the gate's level is there for the steps alone
        said = contrib.steps_sentence(levels)
        return levels, said, said
    what = (
        f"{_speculation(champion)} (with its NCCL settings)"
        if name == "champion" and contrib.speculates(params)
        else label
    )
    by_load = contrib.stops_paying(levels, what)
    return levels, by_load, f"By load: {contrib.stops_paying(levels, what, figures=False)}" if by_load else ""


def _speculation(champion: Champion) -> str:
    """The champion's speculation in words ("EAGLE-3")."""
    return str(champion.trial.params.get("speculative_algorithm") or "EAGLE3").replace("EAGLE3", "EAGLE-3")


def _level(port: Port, measured: rounds.Measured, a_name: str, b_name: str) -> contrib.Interval | None:
    """A against B at one other level, over the rounds that measured both."""
    if a_name not in measured.values or b_name not in measured.values:
        return None
    return contrib.compare(
        *contrib.paired(measured.values[a_name], measured.values[b_name]),
        direction=port.spec.objective.direction,
        noise=contrib.pair_noise(measured.values, a_name, b_name),
    )
