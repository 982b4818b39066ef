"""The deployed configuration, once the choice (and the correctness gate) settled it: it and the baseline at
each other promotion.concurrency level and its adaptive-or-fixed counterpart, measured in rounds numbered after
the gate's (`load_arms`, `run_more`); its gain per load and the verdict in words about it (`explain`); and its
registration (verdict.register). With nothing to deploy, the same about the champion the verdict is about.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from orchestrator.records import ParamValue
from orchestrator.results.figures import Interval, LevelGain, StepsGain, streams
from orchestrator.search import space as sp
from orchestrator.verdict import arms, rounds
from orchestrator.verdict.arm import Arm
from orchestrator.verdict.choose import at_level, confirmed
from orchestrator.verdict.gate import Direction, Evidence, compare, interval_of, pair_noise, paired
from orchestrator.verdict.pick import gate_level_named
from orchestrator.verdict.port import Port
from orchestrator.verdict.register import register
from orchestrator.verdict.steps import Arms, Champion, Choice, Gate, Promotion

log = logging.getLogger("sweep")


def conclude(
    port: Port, champion: Champion, measuring: Arms, measured: rounds.Measured, gate: Gate, choice: Choice | None
) -> Promotion:
    """The deployed configuration measured at each load, the verdict in words about it, and its registration;
    with nothing to deploy (`choice` None), the champion the verdict is about, and no promotion."""
    # The loads measure what is deployed; with nothing to deploy, the champion the verdict is about.
    subject = choice or Choice(
        "champion",
        measuring.params_of("champion"),
        gate.figures,
        "",
        gate.outcome,
        number=champion.trial.number,
        decision=gate.decision,
    )
    stale = [n for n in measured.values if subject.name != "champion" and n.split("@")[0] in arms.STEPS_ARMS]
    measured = run_more(port, *load_arms(port, champion, measuring, subject), measured, fresh=stale)
    gate = explain(port, champion, measuring, measured, gate, subject)
    if choice is None:
        log.warning("no promotion: %s", gate.verdict)
        return Promotion(
            gate.outcome, gate.verdict, champion, measured.rows, gate, gate.figures, not_measured=measuring.dropped
        )
    note = choice.verdict.strip(". ")
    choice = replace(choice, verdict=f"{gate.verdict}. {note}" if note else gate.verdict, figures=gate.figures)
    promoted = register(port, champion, choice, measured.rows, gate)
    return Promotion(
        promoted.outcome,
        promoted.verdict,
        champion,
        measured.rows,
        gate,
        promoted.confirmed,
        promoted.registered,
        not_measured=measuring.dropped,
        choice=choice,
    )


def run_more(
    port: Port, later: list[Arm], count: int, measured: rounds.Measured, *, fresh: Sequence[str] = ()
) -> rounds.Measured:
    """The arms measured after the deployed configuration was decided (it and the baseline at the
    other loads, its adaptive-or-fixed counterpart), `count` interleaved rounds numbered after the
    gate's, added to `measured`; the arms named in `fresh` lose what the gate's rounds measured under
    that name (another configuration's counterpart). A round starts only when it fits the wall time."""
    if not later:
        return measured
    values = {k: ({} if k in fresh else dict(v)) for k, v in measured.values.items()}
    for a in later:
        values.setdefault(a.name, {})
    rows = list(measured.rows)
    timing = rounds.timing_of(port)
    first = measured.rounds
    for j in range(count):
        i = first + j
        if port.interrupted() or port.elapsed() + timing.round_s(later) > port.timeout_s:
            if not port.interrupted():
                log.warning("confirmation: no time left for round %d of %s", j + 1, ", ".join(a.name for a in later))
            break
        order = later if j % 2 == 0 else list(reversed(later))
        rows += [rounds.row(port, run, i, values) for run in port.run_round(order, i, first + count)]
    return replace(measured, values=values, rows=tuple(rows))


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
    steps_levels = sorted({a.concurrency for a in measuring.arms if a.name.split("@")[0] in arms.STEPS_ARMS})
    if choice.name != "champion" and level in steps_levels and arms.speculates(choice.params):
        out.append(Arm(choice.name, dict(choice.params), choice.number, level))
    else:
        steps_levels = [c for c in steps_levels if c != level]
    steps, _, _ = arms.steps_arms(
        spec, choice.params, choice.number, port.outcomes, port.spec.objective.bounds(), steps_levels
    )
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
    head = at_level(message, named, metric)
    why = "; ".join(p.text() for p in gate.contributions)
    if why and who.name == "runner_up":  # the parts measured are the search's pick's, not the deployed one's
        why = f"trial {champion.trial.number}'s parts (the search's pick): {why}"
    if gate.checks:  # the equivalence test: what decides between the champion and a simpler configuration
        why += ". Simpler only when shown equivalent: " + "; ".join(c.text() for c in gate.checks)
    verdict = verdict_text(head, concurrency=None, metric=metric, others=others, why=why, after=after)
    if who.why:
        verdict = f"{verdict}. Promoted {who.label} and not trial {champion.trial.number} as searched: {who.why}"
    return replace(
        gate,
        decision=decision,
        evidence=evidence,
        levels=tuple(levels),
        by_load=by_load,
        verdict=verdict,
        figures=confirmed(evidence, metric, concurrency=level),
    )


def _by_load(
    port: Port,
    champion: Champion,
    measured: rounds.Measured,
    name: str,
    params: Mapping[str, ParamValue],
    evidence: Evidence,
    label: str,
) -> tuple[list[LevelGain], str, str]:
    """The deployed configuration's gain at each promotion.concurrency level (at the gate's level: the
    gate's own figures, so "promoted" and "stops paying" cannot disagree; without levels listed, the
    gate's own level when adaptive and fixed steps were compared there), the sentence about them, and
    what the verdict ends with."""
    spec = port.spec
    direction, level = spec.objective.direction, spec.benchmark.concurrency
    found = arms.steps_counterpart(
        params,
        arms.best_fixed_steps(
            port.outcomes,
            metric=spec.objective.metric,
            direction=direction,
            constraints=port.spec.objective.bounds(),
            concurrency=level,
        ),
    )
    kind, fixed = (found[0], found[2]) if found is not None else ("", "")
    listed = sorted(spec.promotion.concurrency) or [level]
    levels = []
    for c in listed:
        iv = interval_of(evidence) if c == level else _level(port, measured, f"{name}@{c}", f"baseline@{c}")
        if iv is None:
            continue
        steps = (
            steps_gain(measured.values, c, level, counterpart=kind, fixed=fixed, direction=direction, deployed=name)
            if kind
            else None
        )
        levels.append(LevelGain(concurrency=c, interval=iv, steps=steps))
    if not spec.promotion.concurrency:
        levels = [lv for lv in levels if lv.steps is not None]  # the gate's level is there for the steps alone
        said = steps_sentence(levels)
        return levels, said, said
    what = (
        f"{rounds.speculation_name(champion.trial.params)} (with its NCCL settings)"
        if name == "champion" and arms.speculates(params)
        else label
    )
    by_load = stops_paying(levels, what)
    return levels, by_load, f"By load: {stops_paying(levels, what, figures=False)}" if by_load else ""


def _level(port: Port, measured: rounds.Measured, a_name: str, b_name: str) -> Interval | None:
    """A against B at one other level, over the rounds that measured both."""
    if a_name not in measured.values or b_name not in measured.values:
        return None
    return compare(
        *paired(measured.values[a_name], measured.values[b_name]),
        direction=port.spec.objective.direction,
        noise=pair_noise(measured.values, a_name, b_name),
    )


def steps_gain(
    values: Mapping[str, Mapping[int, float]],
    level: int,
    main_level: int,
    *,
    counterpart: str,
    fixed: str,
    direction: Direction,
    deployed: str = "champion",
) -> StepsGain | None:
    """Adaptive against fixed steps at `level` from the rounds that measured both (the `deployed` arm
    and its counterpart), or None."""
    other, champion = arms.arm_name(counterpart, level, main_level), arms.arm_name(deployed, level, main_level)
    if other not in values or champion not in values:
        return None
    a, b = (other, champion) if counterpart == arms.ADAPTIVE else (champion, other)
    interval = compare(*paired(values[a], values[b]), direction=direction, noise=pair_noise(values, a, b))
    return None if interval is None else StepsGain(fixed=fixed, interval=interval)


def stops_paying(levels: Sequence[LevelGain], what: str, *, figures: bool = True) -> str:
    """One sentence: where the champion's gain over the baseline holds and where it stops paying
    (and, when measured, whether adaptive steps beat the fixed count at each level). `figures=False`
    leaves the per-level gains out (the verdict states them beside the gate's own figures)."""
    if not levels:
        return ""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    gains = f" ({'; '.join(lv.text() for lv in ordered)})" if figures else ""
    lost = next((lv for lv in ordered if not lv.interval.low > 0.0), None)
    if lost is None:
        sentence = f"{what} pays at every level measured{gains}"
    else:
        paying = [lv.concurrency for lv in ordered if lv.concurrency < lost.concurrency and lv.interval.low > 0.0]
        where = f"pays up to concurrency {paying[-1]} and " if paying else ""
        sentence = f"{what} {where}stops paying from concurrency {lost.concurrency}{gains}"
    steps = steps_sentence(ordered)
    return f"{sentence}. {steps}" if steps else sentence


def steps_sentence(levels: Sequence[LevelGain]) -> str:
    """Whether adaptive steps beat the fixed count, at each level that measured both ("" if none did)."""
    steps = [(lv.concurrency, lv.steps) for lv in sorted(levels, key=lambda lv: lv.concurrency) if lv.steps is not None]
    if not steps:
        return ""
    return f"Adaptive steps (--speculative-adaptive) against {steps[0][1].fixed}: " + ", ".join(
        g.text(c) for c, g in steps
    )


def verdict_text(
    message: str,
    *,
    concurrency: int | None,
    metric: str,
    others: Sequence[LevelGain] = (),
    why: str = "",
    after: str = "",
) -> str:
    """The verdict in words: the gate's decision at the level it decided at (`concurrency`; None leaves
    it unnamed), the champion's gain at the other promotion.concurrency levels beside it, why it won
    (the contributions), then `after` (where the gain stops paying; adaptive or fixed steps)."""
    text = at_level(message, concurrency, metric)
    if others:
        ordered = sorted(others, key=lambda lv: lv.concurrency)
        fewest = min(lv.interval.rounds for lv in ordered)
        text += (
            "; "
            + "; ".join(f"at {streams(lv.concurrency, short=True)} {lv.interval.text()}" for lv in ordered)
            + f" (promotion.concurrency: 95% intervals over {fewest} rounds)"
        )
    if why:
        text += f". Why (95% intervals): {why}"
    if after:
        text += f". {after}"
    return text
