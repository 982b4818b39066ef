"""The gate's decision and the choice it leads to: the main pair's decision with what each of the champion's
parts adds (`decide`), then the configuration to deploy (`choose`): the runner-up when it measured better on
all the evidence and passes the gate itself (a near-tie settled by measurement), else, when the champion
passed, the simpler arm whose left-out part is shown to add less than promotion.equivalence_margin, or the
champion; with the figures users read of it (`confirmed`) and the sentences that say why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from orchestrator.records import ParamValue, speculation_knob
from orchestrator.results.figures import Confirmed, Contribution, PartCheck, PartVerdict, streams
from orchestrator.search import space as sp
from orchestrator.stats import Contrast, Covariate
from orchestrator.verdict import arms, rounds
from orchestrator.verdict.gate import (
    Decision,
    Direction,
    Evidence,
    RoundsPlan,
    Verdict,
    compare,
    contender_wins,
    gate_of,
    pair_noise,
    paired,
    settled,
)
from orchestrator.verdict.pick import gate_level_named
from orchestrator.verdict.port import Port
from orchestrator.verdict.steps import Arms, Champion, Choice, Gate, Promotion
from orchestrator.verdict.value import Outcome


def _speculating(champion: Champion, measuring: Arms) -> Mapping[str, ParamValue]:
    """The configuration whose speculation the parts name: the champion's own, or for a champion that does
    not speculate, the speculating arm measured on top of it (the best speculating trial's settings, else
    SGLang's default for the model)."""
    if champion.trial.params.get("speculative_algorithm"):
        return champion.trial.params
    names = {a.name for a in measuring.arms}
    arm = next((n for n in ("with_speculation", "with_default_speculation") if n in names), None)
    return measuring.params_of(arm) if arm is not None else champion.trial.params


def decide(
    port: Port, champion: Champion, measuring: Arms, measured: rounds.Measured, plan: RoundsPlan
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
            at_level(
                f"undecided: {measured.failed()} of {len(measured.rows)} confirmation runs failed, too few rounds "
                f"for an interval; see {port.workdir / 'confirm'}",
                named,
                metric,
            ),
            champion,
            measured.rows,
        )
    speculation = rounds.speculation_name(_speculating(champion, measuring))
    found = contributions(
        measured.values,
        speculation=speculation,
        sole_part=sole_part_name(port, champion),
        direction=direction,
        fair=measured.fair,
    )
    checks = rounds.part_checks(
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
        figures=confirmed(decision.evidence, metric, concurrency=spec.benchmark.concurrency),
        contributions=tuple(found),
        levels=(),
        by_load="",
        verdict=decision.message,
        checks=tuple(checks),
    )


def choose(
    port: Port,
    champion: Champion,
    measuring: Arms,
    measured: rounds.Measured,
    gate: Gate,
    plan: RoundsPlan,
    search: Contrast | None,
) -> Choice | None:
    """The configuration to deploy, before it is measured at the other loads: the runner-up when it
    measured better than the champion on the rounds and the search's contrast of the two (`search`,
    pick.pick) and passes the gate itself (a near-tie settled
    by measurement); else, when the champion passed, the simpler arm whose left-out part is shown to add
    less than promotion.equivalence_margin and which passes the gate too, or the champion. None: nothing passes."""
    spec = port.spec
    direction, metric, level = spec.objective.direction, champion.metric, spec.benchmark.concurrency
    values = measured.values
    fair = measured.values if measured.fair is None else measured.fair  # each run's own speed out: verdict.speed
    won = contender_wins(fair, "runner_up", direction=direction, search=search)
    runner = gate_of(values, "runner_up", plan, direction=direction) if won is not None else None
    if won is not None and runner is not None and runner.verdict is Verdict.promoted and runner.evidence is not None:
        number = next(a.number for a in measuring.arms if a.name == "runner_up")
        return Choice(
            "runner_up",
            measuring.params_of("runner_up"),
            confirmed(runner.evidence, metric, concurrency=level),
            "",
            Outcome.promoted,
            number=number,
            decision=runner,
            why=f"trial {number} (the runner-up) measured {won.text()} over trial {champion.trial.number} "
            f"(the search's pick) in the same rounds{speed_said(measured.speed)}{with_search(fair, search, direction)}, and "
            f"passes the gate itself",
        )
    if not gate.passed:
        return None
    simpler = simpler_choice(values, gate.checks, plan, direction=direction)
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
    figures = gate.figures if decision.evidence is None else confirmed(decision.evidence, metric, concurrency=level)
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


def contributions(
    values: Mapping[str, Mapping[int, float]],
    *,
    speculation: str,
    sole_part: str,
    direction: Direction,
    fair: Mapping[str, Mapping[int, float]] | None = None,
) -> list[Contribution]:
    """Each part's contribution from the arms measured (champion, baseline, no_speculation,
    default_communication, runner_up), its interval on the noise of every arm in the pair's rounds
    (pair_noise), as the gate's; parts whose arms were not measured are left out. `sole_part`
    names the champion's whole gain when it sets only one part. The champion over the runner-up is
    taken from `fair` where given (rounds.Measured.fair: the values `choose` decides the two on, each run's
    own speed taken out, which its name then says)."""
    spec_name = speculation or "speculation"
    parts = [
        ("NCCL settings", "no_speculation", "baseline"),
        (f"{spec_name} on top", "champion", "no_speculation"),
        (f"{spec_name} alone (NCCL at defaults)", "default_communication", "baseline"),
        (f"NCCL settings on top of {spec_name}", "champion", "default_communication"),
        ("champion over the runner-up", "champion", "runner_up"),
    ]
    with_spec = (
        f"{spec_name} on top of the champion's NCCL settings (the best speculating trial's settings)",
        "with_speculation",
        "champion",
    )
    with_default = (
        f"{spec_name} on top of the champion's NCCL settings (SGLang's default for the model)",
        "with_default_speculation",
        "champion",
    )
    if "no_speculation" not in values and "default_communication" not in values:
        # At most one part is set: the champion's whole gain is that part's.
        parts = [(sole_part, "champion", "baseline"), parts[-1]]
    parts += [with_spec, with_default]
    out = []
    for part, a, b in parts:
        source = fair if fair is not None and b == "runner_up" else values
        if source is fair:
            part += f" ({SPEED_OUT})"
        if a not in source or b not in source:
            continue
        interval = compare(*paired(source[a], source[b]), direction=direction, noise=pair_noise(source, a, b))
        if interval is not None:
            out.append(Contribution(part=part, a=a, b=b, interval=interval))
    return out


def sole_part_name(port: Port, champion: Champion) -> str:
    """What the champion's whole gain is credited to when its parts were not measured apart."""
    base = sp.baseline_params(port.spec.space)
    params = champion.trial.params
    communication = sum(1 for k, v in params.items() if not speculation_knob(k) and v != base.get(k))
    if not arms.speculates(params):
        return "NCCL settings"
    if not communication:
        return rounds.speculation_name(champion.trial.params)
    return (
        f"{rounds.speculation_name(champion.trial.params)} with {communication} communication setting(s) (not measured apart: "
        f"promotion.explain is false)"
    )


def simpler_choice(
    values: Mapping[str, Mapping[int, float]],
    checks: Sequence[PartCheck],
    plan: RoundsPlan,
    *,
    direction: Direction,
) -> tuple[str, Decision] | None:
    """The simpler arm to promote instead of the champion: the part it leaves out is shown to add less
    than promotion.equivalence_margin (PartVerdict.negligible, not merely "not significant"), and the
    configuration without it passes the gate against the baseline too; None to promote the champion.

    Speculation off is preferred (fewer moving parts in production), then NCCL at defaults."""
    by_arm = {c.arm: c for c in checks}
    for arm in ("no_speculation", "default_communication"):
        check = by_arm.get(arm)
        if check is None or check.verdict is not PartVerdict.negligible:
            continue
        decision = gate_of(values, arm, plan, direction=direction)
        if decision is not None and decision.verdict is Verdict.promoted:
            return arm, decision
    return None


def simpler_choice_before(
    values: Mapping[str, Mapping[int, float]],
    contribs: Sequence[Contribution],
    plan: RoundsPlan,
    *,
    direction: Direction,
) -> tuple[str, Decision] | None:
    """The rule before promotion.equivalence_margin (kept for bench/gate_power.py's comparison): a part
    was dropped when its 95% interval merely included zero ("not significant")."""
    by_arm = {c.b: c for c in contribs if c.a == "champion"}
    for arm in ("no_speculation", "default_communication"):
        part = by_arm.get(arm)
        if part is None or part.interval.low > 0.0:
            continue
        decision = gate_of(values, arm, plan, direction=direction)
        if decision is not None and decision.verdict is Verdict.promoted:
            return arm, decision
    return None


def with_search(values: Mapping[str, Mapping[int, float]], search: Contrast | None, direction: Direction) -> str:
    """The verdict's "; with the search's measurements of both (...), x% +- y%" when the search's estimate
    took part in the decision, else nothing."""
    both = settled(values, "runner_up", direction=direction, search=search) if search is not None else None
    if search is None or both is None:
        return ""
    return (
        f"; with the search's measurements of both (pooled fit {math.expm1(search.diff) * 100:+.1f}%), "
        f"{math.expm1(both.diff) * 100:+.1f}% +- {both.se * 100:.1f}%"
    )


SPEED_OUT = "each run's own speed taken out"
"""What the verdict says of values speed.run_speed_adjusted changed."""


def speed_said(covariate: Covariate | None) -> str:
    """The verdict's words for speed.run_speed_adjusted: ", each run's own speed taken out (its TTFT, slope
    ...)" when it applied, else nothing."""
    if covariate is None or not covariate.applied:
        return ""
    return f", {SPEED_OUT} (its TTFT, slope {covariate.slope:.2f} +- {covariate.se:.2f})"


def confirmed(ev: Evidence, metric: str, concurrency: int | None = None) -> Confirmed:
    return Confirmed(
        label="confirmed",
        metric=metric,
        champion_median=ev.champion_median,
        baseline_median=ev.baseline_median,
        rounds=ev.rounds,
        gain=ev.gain,
        low=ev.low,
        high=ev.high,
        concurrency=concurrency,
    )


def at_level(message: str, concurrency: int | None, metric: str) -> str:
    """A decision's message ("promoted: +12.4% [...] ...", "not better: ...", "undecided after 8
    rounds: ...") with the load it was decided at after its head: "promoted at 32 concurrent streams
    (objective output_tok_s): +12.4% ...". Unchanged when `concurrency` is None (the level goes
    unnamed) or the message has no head."""
    head, sep, rest = message.partition(": ")
    if concurrency is None or not sep:
        return message
    return f"{head} at {streams(concurrency)} (objective {metric}): {rest}"
