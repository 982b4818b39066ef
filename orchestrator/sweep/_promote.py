"""The end of a sweep: champion, interleaved confirmation against the baseline (through the same
executor as the trials), promotion to the registry alias, the env file, and the summary.

The promotion is a pipeline of values, each step a function returning a frozen one:

    pick -> Champion           the trial to confirm, the baseline, its MLflow run
    arms -> Arms               what the rounds measure (the main pair, ablations, levels, steps)
    rounds -> Measured         _confirm.run_rounds: the values and the rows of every run
    decide -> Gate             the main pair's decision, the figures, the contributions, the loads
    choose -> Choice           the configuration to register (the champion or a simpler one)
    register -> Promotion      the registry version and champion.env, or why not

Any step may end the promotion instead: it then returns the Promotion saying why. `finish` builds
the SweepSummary from the Promotion.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from orchestrator.errors import TrackingError
from orchestrator.fsio import write_atomic, write_json
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialStatus, speculation_knob
from orchestrator.results import contrib, formats, report, select, sequential
from orchestrator.search import space as sp
from orchestrator.stats import Contrast
from orchestrator.sweep import _confirm, _contender, _correctness, schedule
from orchestrator.sweep._context import Context
from orchestrator.sweep._decided import already_decided, remember
from orchestrator.sweep._loop import act_on_interrupts
from orchestrator.sweep._promotion import Arms, Champion, Choice, Gate, Promotion, Registered
from orchestrator.sweep.state import ArmDropped, BaselineDrift, Outcome, StopKind, SweepSummary, TrackingWait
from orchestrator.sweep.status import recorded_speedups
from orchestrator.trial import observe
from orchestrator.trial import plan as planner
from orchestrator.verdict import render as verdict_render
from orchestrator.verdict.value import Verdict

log = logging.getLogger("sweep")

MLFLOW_WAIT_AT_END_S = 60.0
"""At the end, how long results waiting in the outbox wait for MLflow to return before promotion gives up."""

Constraints = dict[str, tuple[float | None, float | None]]


def finish(ctx: Context) -> SweepSummary:
    """Promote unless interrupted or the baseline failed; log the summary to MLflow; write summary.json."""
    act_on_interrupts(ctx)
    status = "stopped" if ctx.interrupts.pressed else "finished"
    earlier = already_decided(ctx)
    promotion: dict[str, Any] = {}
    if earlier is not None:
        promotion = earlier
    elif _promotes(ctx):
        promoted = promote(ctx)
        remember(ctx, promoted)
        promotion = promoted.summary_fields(ctx.spec.objective.metric)
    if "outcome" in promotion or "verdict" in promotion:
        promotion["decision"] = Verdict.of(promotion, ctx.spec.objective.metric, ctx.study.importances())
    summary = _summary(ctx, promotion)
    _log_summary(ctx, summary, status)
    ctx.track.end_sweep(ctx.parent_run_id or "", "FINISHED" if status == "finished" else "KILLED")
    ctx.write_state(status)
    write_json(ctx.paths.summary, summary.to_json())
    return summary


def _promotes(ctx: Context) -> bool:
    """Whether the sweep ended in a way that promotes: not interrupted, and the baseline did not fail."""
    stop = ctx.progress.stop
    return not ctx.interrupts.pressed and stop is not None and stop.kind is not StopKind.baseline_failed


def _summary(ctx: Context, promotion: dict[str, Any]) -> SweepSummary:
    """The summary of the sweep: its counts, the promotion's fields, importances, drift, fingerprints."""
    p = ctx.progress
    # After the promotion gate: its interleaved baselines are the end-of-sweep measurement.
    drift, flagged = select.drift(p.baselines, threshold=ctx.spec.budget.baseline_drift_threshold)
    fields: dict[str, Any] = {"champion": None, "promoted": False, **promotion}
    return SweepSummary(
        workdir=str(ctx.paths.root),
        stop_reason=p.stop_text,
        stop_kind=p.stop.kind if p.stop else None,
        parent_run_id=ctx.parent_run_id,
        launched=p.launched,
        complete=p.complete,
        failed=p.failed,
        failures=dict(p.failures),
        skipped=p.skipped,
        stopped_by_failure=p.stopped_by_failure,
        **fields,
        importances=ctx.study.importances(),
        baseline_drift=BaselineDrift(max_relative_change=drift, flagged=flagged, baselines=p.baselines),
        fingerprint_changes=fingerprint_changes(ctx.outcomes),
    )


def _log_summary(ctx: Context, summary: SweepSummary, status: str) -> None:
    """The summary on the parent run: its metrics, tags, results table and figures."""
    p = ctx.progress
    confirmed = summary.confirmed.metrics() if summary.confirmed else {}
    confirmed.update({f"importance_{k}": v for k, v in summary.importances.items()})
    changed = summary.fingerprint_changes
    figures = report.figures(ctx.spec, ctx.outcomes, p.baselines)
    try:
        ctx.track.log_sweep_summary(
            ctx.parent_run_id or "",
            metrics={**report.parent_metrics(summary.to_json(), ctx.outcomes), **confirmed},
            tags={
                "sweep.stop_reason": p.stop_text[:250],
                "sweep.baseline_drift_flagged": str(summary.baseline_drift.flagged),
                "sweep.verdict": summary.outcome.value if summary.outcome else "none",
                "sweep.status": status,
                "sweep.fingerprint_changed": str(bool(changed)),
                **({"sweep.fingerprint_changes": "; ".join(changed)[:1000]} if changed else {}),
            },
            table=report.results_table(ctx.spec, ctx.outcomes, p.baselines, recorded_speedups(ctx.study.trials())),
            figures=figures,
        )
    finally:
        import matplotlib.pyplot as plt  # deferred: report.figures imported it already

        for figure in figures.values():
            plt.close(figure)  # pyplot keeps every figure it made open: sweeps in one process would pile them up


# ------------------------------------------------------------------------------ the pipeline


def promote(ctx: Context) -> Promotion:
    """Champion -> sequential interleaved confirmation against the baseline (with the arms that say
    why it won) -> the configuration to deploy -> it at each load -> verdict -> registry alias -> env file."""
    picked = pick(ctx)
    if isinstance(picked, Promotion):
        return picked
    plan = _plan(ctx)
    if plan is None:
        chosen = ungated(ctx, picked)
        return chosen if isinstance(chosen, Promotion) else register(ctx, picked, chosen)
    measuring = fitted(ctx, arms(ctx, picked))
    if not any(a.main for a in measuring.arms):
        why = "; ".join(measuring.dropped)
        return Promotion(
            Outcome.undecided,
            f"undecided: the night left no time for the confirmation ({why}); "
            f"{ctx.resume_hint} with a longer --timeout confirms it",
            picked,
            not_measured=measuring.dropped,
        )
    level = ctx.spec.benchmark.concurrency
    at_gate = [a for a in measuring.arms if a.concurrency == level]
    later = _later_s(ctx, [a for a in measuring.arms if a.concurrency != level])
    search = _contender.search_contrast(ctx, picked, measuring)
    measured = _confirm.run_rounds(
        ctx,
        at_gate,
        plan,
        more=lambda values: _open_parts(ctx, picked, values, plan),
        contends=lambda values: _contender.contending(ctx, values, plan, search),
        hold_s=later,
    )
    gate = decide(ctx, picked, measuring, measured, plan)
    if isinstance(gate, Promotion):
        return gate
    choice = choose(ctx, picked, measuring, measured, gate, plan, search)
    # The correctness gate's slot: after the choice and before the loads measure it, so that what it
    # settles on is what the loads measure and the registry holds (its note stays in choice.verdict).
    if choice is not None:
        checked = _correctness.gate(
            ctx, picked, measuring, measured, gate, plan, choice
        )  # outputs still the baseline's?
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
    measured = _confirm.run_more(ctx, *load_arms(ctx, picked, measuring, subject), measured, fresh=stale)
    gate = explain(ctx, picked, measuring, measured, gate, subject)
    if choice is None:
        log.warning("no promotion: %s", gate.verdict)
        return Promotion(
            gate.outcome, gate.verdict, picked, measured.rows, gate, gate.figures, not_measured=measuring.dropped
        )
    note = choice.verdict.strip(". ")
    choice = replace(choice, verdict=f"{gate.verdict}. {note}" if note else gate.verdict, figures=gate.figures)
    promoted = register(ctx, picked, choice, measured.rows, gate)
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


def _later_s(ctx: Context, later: list[_confirm.Arm]) -> float:
    """Seconds the arms measured after the deployed configuration is decided are expected to take (their
    min_rounds rounds, as the night planned them): the gate's extra rounds leave them that."""
    seconds = schedule.run_seconds(ctx.spec, ctx.outcomes)
    return sum(seconds(a.concurrency) for a in later) * ctx.spec.promotion.min_rounds / max(ctx.executor.idle(), 1)


def fitted(ctx: Context, measuring: Arms) -> Arms:
    """The arms that fit the time left of the night (sweep.schedule.plan: the gate's pair first, then by
    value), each one left out said in a line; the step comparison dropped with its arms."""
    spec = ctx.spec
    planned = schedule.plan(
        [(a.name, a.concurrency, a.main) for a in measuring.arms],
        seconds=schedule.run_seconds(spec, ctx.outcomes),
        left_s=ctx.remaining(),
        share_s=ctx.remaining(),
        min_rounds=spec.promotion.min_rounds,
        gate_level=spec.benchmark.concurrency,
        slots=max(ctx.executor.idle(), 1),
    )
    kept = {a.name for a in planned.arms}
    for d in planned.dropped:
        log.warning("confirmation: %s not measured: %s", d.name, d.why)
        ctx.emit(ArmDropped(name=d.name, why=d.why))
    out = tuple(a for a in measuring.arms if a.name in kept)
    steps_left = any(a.name.split("@")[0] == measuring.counterpart for a in out)
    return Arms(
        arms=out,
        counterpart=measuring.counterpart if steps_left else "",
        fixed=measuring.fixed if steps_left else "",
        dropped=tuple(f"{d.name}: {d.why}" for d in planned.dropped),
    )


def _constraints(ctx: Context) -> Constraints:
    return ctx.spec.objective.bounds()


def _plan(ctx: Context) -> sequential.RoundsPlan | None:
    """The rounds the confirmation may take; None without a gate (promotion.max_rounds: 0)."""
    p = ctx.spec.promotion
    return sequential.RoundsPlan(p.min_rounds, p.max_rounds, p.min_gain) if p.max_rounds else None


def pick(ctx: Context) -> Champion | Promotion:
    """The champion of the search, with the baseline and its MLflow run; or why there is none to promote."""
    spec = ctx.spec
    metric = spec.objective.metric
    feasible = [o for o in ctx.outcomes if o.role is TrialRole.search]
    champion = select.pick_champion(
        feasible,
        metric=metric,
        direction=spec.objective.direction,
        constraints=_constraints(ctx),
        concurrency=spec.benchmark.concurrency,
    )
    baseline = next(
        (o for o in reversed(ctx.outcomes) if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE), None
    )
    if champion is None or baseline is None:
        return Promotion(Outcome.no_champion, _no_champion(feasible) if champion is None else "no baseline measured")
    _contender.note_run_speed(ctx)
    run_id = _run_id_of(ctx, champion)
    if run_id is None:
        return Promotion(
            Outcome.no_champion,
            f"not promoted: trial {champion.number} is not in MLflow yet ({ctx.track.pending()} "
            f"result(s) wait in the outbox); when MLflow is reachable run `sweep sync` and "
            f"{ctx.resume_hint} to promote",
        )
    return Champion(trial=champion, baseline=baseline, run_id=run_id, metric=metric)


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


def ungated(ctx: Context, champion: Champion) -> Choice | Promotion:
    """Without a gate (promotion.max_rounds: 0): the champion on its one search-phase measurement against
    the baseline's, promoted as unconfirmed when that shows promotion.min_gain, refused otherwise."""
    spec = ctx.spec
    metric, level = champion.metric, spec.benchmark.concurrency
    value, base_value = champion.search_value, float(getattr(champion.baseline.metrics, metric))
    figures = contrib.unconfirmed(value, base_value, metric, spec.objective.direction, concurrency=level)
    at = f" at {contrib.streams(level)}" if _gate_level_named(ctx) is not None else ""
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


def arms(ctx: Context, champion: Champion) -> Arms:
    """The champion and the baseline (the main pair), the ablations (promotion.explain), the pair at each
    other promotion.concurrency level, and the champion as the other kind of step control."""
    spec = ctx.spec
    trial, level = champion.trial, spec.benchmark.concurrency
    base_params = sp.baseline_params(spec.space)
    out = [
        _confirm.Arm("champion", dict(trial.params), trial.number, level, main=True),
        _confirm.Arm("baseline", base_params, -1, level, main=True),
    ]
    if spec.promotion.explain:
        out += _ablations(ctx, trial, base_params)
    for c in spec.promotion.concurrency:
        if c != level:
            out.append(_confirm.Arm(f"champion@{c}", dict(trial.params), trial.number, c))
            out.append(_confirm.Arm(f"baseline@{c}", base_params, -1, c))
    steps, counterpart, fixed = _confirm.steps_arms(
        spec, trial.params, trial.number, ctx.outcomes, _constraints(ctx), spec.promotion.concurrency or (level,)
    )
    return Arms(arms=tuple(out + steps), counterpart=counterpart, fixed=fixed)


def _ablations(ctx: Context, trial: TrialOutcome, base_params: dict[str, ParamValue]) -> list[_confirm.Arm]:
    """The champion without each of its parts (when it sets both), and the runner-up from another region."""
    spec = ctx.spec
    level = spec.benchmark.concurrency
    out = []
    set_knobs = {k for k, v in trial.params.items() if v != base_params.get(k)}
    if contrib.speculates(trial.params) and any(not speculation_knob(k) for k in set_knobs):
        out.append(
            _confirm.Arm("no_speculation", contrib.without_speculation(trial.params, base_params), trial.number, level)
        )
        out.append(
            _confirm.Arm(
                "default_communication",
                contrib.with_default_communication(trial.params, base_params),
                trial.number,
                level,
            )
        )
    elif not contrib.speculates(trial.params):
        donor = contrib.best_speculating(
            ctx.outcomes,
            metric=spec.objective.metric,
            direction=spec.objective.direction,
            constraints=_constraints(ctx),
            concurrency=spec.benchmark.concurrency,
        )
        if donor is not None:
            out.append(
                _confirm.Arm(
                    "with_speculation", contrib.with_speculation_of(trial.params, donor.params), trial.number, level
                )
            )
    other = contrib.runner_up(
        ctx.outcomes,
        trial,
        metric=spec.objective.metric,
        direction=spec.objective.direction,
        constraints=_constraints(ctx),
        concurrency=spec.benchmark.concurrency,
    )
    if other is not None:
        out.append(_confirm.Arm("runner_up", dict(other.params), other.number, level))
    return out


def decide(
    ctx: Context, champion: Champion, measuring: Arms, measured: _confirm.Measured, plan: sequential.RoundsPlan
) -> Gate | Promotion:
    """The gate's decision on the main pair with the contributions of the champion's parts and the
    equivalence test of each; or, interrupted or without an interval, the Promotion that says so. The
    figures, levels and verdict become the deployed configuration's in `explain`, once it is known."""
    spec = ctx.spec
    metric, direction = champion.metric, spec.objective.direction
    named = _gate_level_named(ctx)
    if ctx.interrupts.pressed:
        act_on_interrupts(ctx)
        return Promotion(
            None,
            f"not promoted: interrupted during the confirmation rounds; {ctx.resume_hint} measures them again",
            champion,
            measured.rows,
        )
    decision = measured.decision
    if decision is None or decision.evidence is None:
        return Promotion(
            Outcome.undecided,
            contrib.at_level(
                f"undecided: {measured.failed()} of {len(measured.rows)} confirmation runs failed, too few rounds "
                f"for an interval; see {ctx.paths.root / 'confirm'}",
                named,
                metric,
            ),
            champion,
            measured.rows,
        )
    speculation = _speculation(champion)
    parts = contrib.contributions(
        measured.values, speculation=speculation, sole_part=_sole_part(ctx, champion), direction=direction
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


def _sole_part(ctx: Context, champion: Champion) -> str:
    """What the champion's whole gain is credited to when its parts were not measured apart."""
    base = sp.baseline_params(ctx.spec.space)
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


def _open_parts(
    ctx: Context, champion: Champion, values: Mapping[str, Mapping[int, float]], plan: sequential.RoundsPlan
) -> list[str]:
    """The arms whose question is still open, for which the rounds go on (beside the main pair) while
    the night allows: the ablations whose part is neither shown to add less than
    promotion.equivalence_margin nor significant, and the runner-up while its near-tie with the
    champion is neither settled nor shown equivalent (which of the two is deployed depends on it)."""
    margin, direction = ctx.spec.promotion.equivalence_margin, ctx.spec.objective.direction
    checks = contrib.part_checks(
        values, speculation=_speculation(champion), margin=margin, level=plan.level, direction=direction
    )
    runner = ["runner_up"] if contrib.contender_open(values, "runner_up", margin=margin, direction=direction) else []
    return runner + contrib.open_parts(checks)


def choose(
    ctx: Context,
    champion: Champion,
    measuring: Arms,
    measured: _confirm.Measured,
    gate: Gate,
    plan: sequential.RoundsPlan,
    search: Contrast | None,
) -> Choice | None:
    """The configuration to deploy, before it is measured at the other loads: the runner-up when it
    measured better than the champion on the rounds and the search's contrast of the two (`search`,
    _contender.search_contrast) and passes the gate itself (a near-tie settled
    by measurement); else, when the champion passed, the simpler arm whose left-out part is shown to add
    less than promotion.equivalence_margin and which passes the gate too, or the champion. None: nothing passes."""
    spec = ctx.spec
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
            f"(the search's pick) in the same rounds{_contender.with_search(values, search, direction)}, and "
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


def load_arms(ctx: Context, champion: Champion, measuring: Arms, choice: Choice) -> tuple[list[_confirm.Arm], int]:
    """What is measured of the deployed configuration once it is known, with the rounds: it and the
    baseline at each other promotion.concurrency level the night kept, and its adaptive-or-fixed
    counterpart (at the gate's level too when it is not the champion, whose counterpart ran beside it)."""
    spec = ctx.spec
    level = spec.benchmark.concurrency
    base = sp.baseline_params(spec.space)
    levels = sorted({a.concurrency for a in measuring.arms if a.name.split("@")[0] == "champion"} - {level})
    out: list[_confirm.Arm] = []
    for c in levels:
        out += [
            _confirm.Arm(f"{choice.name}@{c}", dict(choice.params), choice.number, c),
            _confirm.Arm(f"baseline@{c}", base, -1, c),
        ]
    steps_levels = sorted({a.concurrency for a in measuring.arms if a.name.split("@")[0] in contrib.STEPS_ARMS})
    if choice.name != "champion" and level in steps_levels and contrib.speculates(choice.params):
        out.append(_confirm.Arm(choice.name, dict(choice.params), choice.number, level))
    else:
        steps_levels = [c for c in steps_levels if c != level]
    steps, _, _ = _confirm.steps_arms(spec, choice.params, choice.number, ctx.outcomes, _constraints(ctx), steps_levels)
    return out + steps, spec.promotion.min_rounds


def explain(
    ctx: Context, champion: Champion, measuring: Arms, measured: _confirm.Measured, gate: Gate, who: Choice
) -> Gate:
    """The gate with the figures of `who` (the deployed configuration; the champion when nothing
    passes), its gain per load and the verdict in words, all about it."""
    spec = ctx.spec
    metric, level = champion.metric, spec.benchmark.concurrency
    named = _gate_level_named(ctx)
    name, params = who.name, who.params
    decision = who.decision or gate.decision
    evidence = decision.evidence or gate.evidence
    levels, by_load, after = _by_load(ctx, champion, measured, name, params, evidence, who.label)
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
    ctx: Context,
    champion: Champion,
    measured: _confirm.Measured,
    name: str,
    params: Mapping[str, ParamValue],
    evidence: sequential.Evidence,
    label: str,
) -> tuple[list[contrib.LevelGain], str, str]:
    """The deployed configuration's gain at each promotion.concurrency level (at the gate's level: the
    gate's own figures, so "promoted" and "stops paying" cannot disagree; without levels listed, the
    gate's own level when adaptive and fixed steps were compared there), the sentence about them, and
    what the verdict ends with."""
    spec = ctx.spec
    direction, level = spec.objective.direction, spec.benchmark.concurrency
    found = contrib.steps_counterpart(
        params,
        contrib.best_fixed_steps(
            ctx.outcomes,
            metric=spec.objective.metric,
            direction=direction,
            constraints=_constraints(ctx),
            concurrency=level,
        ),
    )
    kind, fixed = (found[0], found[2]) if found is not None else ("", "")
    listed = sorted(spec.promotion.concurrency) or [level]
    levels = []
    for c in listed:
        iv = contrib.interval_of(evidence) if c == level else _level(ctx, measured, f"{name}@{c}", f"baseline@{c}")
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


def _level(ctx: Context, measured: _confirm.Measured, a_name: str, b_name: str) -> contrib.Interval | None:
    """A against B at one other level, over the rounds that measured both."""
    if a_name not in measured.values or b_name not in measured.values:
        return None
    return contrib.compare(
        *contrib.paired(measured.values[a_name], measured.values[b_name]),
        direction=ctx.spec.objective.direction,
        noise=contrib.pair_noise(measured.values, a_name, b_name),
    )


def register(
    ctx: Context,
    champion: Champion,
    choice: Choice,
    rows: tuple[_confirm.ConfirmationRow, ...] = (),
    gate: Gate | None = None,
) -> Promotion:
    """Register the chosen configuration under the alias and write the sweep's champion.env: its own
    knobs, figures and MLflow run (a derived configuration's first confirmation run at the gate's level;
    no search-phase figure, which was measured with other knobs)."""
    spec = ctx.spec
    source = _source(ctx, champion, choice, rows)
    if source is None:
        return Promotion(
            Outcome.no_champion,
            f"{choice.verdict}; but not promoted: the MLflow run of {choice.label} is not found "
            f"({ctx.track.pending()} result(s) wait in the outbox); when MLflow is reachable run "
            f"`sweep sync` and {ctx.resume_hint} to promote",
            champion,
            confirmed=choice.figures,
        )
    run_id, trial = source
    metrics = choice.figures.metrics()
    if not choice.derived:
        metrics[f"search_{champion.metric}"] = float(getattr(trial.metrics, champion.metric))
    config = planner.serving_config(
        spec,
        choice.params,
        trial_number=choice.number,
        run_id=run_id,
        metrics=metrics,
        fingerprint_hash=trial.fingerprint_hash,
        allreduce_backend="" if choice.derived else trial.allreduce_path,
    )
    config = config.model_copy(update={"derivation": choice.derivation})
    try:
        version = ctx.track.promote(
            run_id,
            model_name=spec.promotion.model_name,
            serving_config=config,
            alias=spec.promotion.alias,
            description=_version_description(ctx, champion, choice, gate),
        )
    except TrackingError as exc:
        log.warning("not promoted: %s", exc)
        return Promotion(
            Outcome.no_champion, f"{choice.verdict}; but not promoted: {exc}", champion, confirmed=choice.figures
        )
    env_path = ctx.paths.root / "champion.env"
    write_atomic(env_path, formats.render_for(config.model_copy(update={"model_version": version}), "env"))
    log.info(
        "promoted %s as %s@%s (version %s): %s",
        choice.label,
        spec.promotion.model_name,
        spec.promotion.alias,
        version,
        choice.verdict,
    )
    return Promotion(
        choice.outcome,
        choice.verdict,
        champion,
        confirmed=choice.figures,
        registered=Registered(
            model_version=version, env_file=str(env_path), run_id=run_id, promoted_config=choice.name
        ),
        choice=choice,
    )


def _version_description(ctx: Context, champion: Champion, choice: Choice, gate: Gate | None) -> str:
    """The registry version's description: the Verdict the promotion is about to reach, rendered as every
    view renders it (orchestrator.verdict.render)."""
    fields = Promotion(
        choice.outcome, choice.verdict, champion, gate=gate, confirmed=choice.figures, choice=choice
    ).summary_fields(champion.metric)
    about = Verdict.of(fields, champion.metric)
    return "\n\n".join(verdict_render.markdown(about))[:5000]


def _source(
    ctx: Context, champion: Champion, choice: Choice, rows: tuple[_confirm.ConfirmationRow, ...]
) -> tuple[str, TrialOutcome] | None:
    """The MLflow run that measured the chosen configuration, with the trial it is (or comes from):
    the champion's or the runner-up's search run; a derived one's first complete confirmation run."""
    if choice.name == "champion":
        return champion.run_id, champion.trial
    trial = next((o for o in ctx.outcomes if o.number == choice.number and o.role is TrialRole.search), champion.trial)
    if not choice.derived:
        run_id = _run_id_of(ctx, trial)
        return None if run_id is None else (run_id, trial)
    first = next((r for r in rows if r.who == choice.name and r.status is TrialStatus.COMPLETE), None)
    if first is None or not _send_outbox(ctx, wait_s=MLFLOW_WAIT_AT_END_S):
        return None
    folder = ctx.paths.confirm_dir(first.round, choice.name)
    try:
        run_id = ctx.track.find_trial(ctx.parent_run_id or "", choice.number, TrialRole.confirm.value, str(folder))
    except TrackingError as exc:
        log.warning("cannot find the MLflow run of %s: %s", choice.label, exc)
        return None
    return None if run_id is None else (run_id, trial)


def _gate_level_named(ctx: Context) -> int | None:
    """The level the gate decides at, when the verdict must name it (not one stream, or other levels
    reported beside it); None otherwise."""
    spec = ctx.spec
    level = spec.benchmark.concurrency
    return level if level != 1 or spec.promotion.concurrency else None


def _run_id_of(ctx: Context, outcome: TrialOutcome) -> str | None:
    """The trial's MLflow run, after sending what waits in the outbox (its run may be created there)."""
    if not _send_outbox(ctx, wait_s=MLFLOW_WAIT_AT_END_S):
        return None
    for t in ctx.study.trials():
        if t.number == outcome.number and t.attrs.get("mlflow_run_id"):
            return str(t.attrs["mlflow_run_id"])
    try:
        return ctx.track.find_trial(ctx.parent_run_id or "", outcome.number, outcome.role.value)
    except TrackingError as exc:  # MLflow down: reported as "not promoted"
        log.warning("cannot find the MLflow run of trial %d: %s", outcome.number, exc)
        return None


def _send_outbox(ctx: Context, wait_s: float) -> bool:
    """Replay the MLflow outbox, retrying for up to `wait_s` while MLflow is unreachable; True once empty."""
    deadline = ctx.clock.monotonic() + wait_s
    _, pending = ctx.track.replay_outbox()
    if pending:
        log.warning("MLflow unreachable with %d result(s) in the outbox: waiting up to %.0fs for it", pending, wait_s)
        ctx.emit(TrackingWait(pending=pending, wait_s=wait_s))
    while pending and ctx.clock.monotonic() < deadline and not ctx.interrupts.pressed:
        ctx.clock.sleep(min(5.0, max(deadline - ctx.clock.monotonic(), 0.0)))
        _, pending = ctx.track.replay_outbox()
    return not pending


def fingerprint_changes(outcomes: list[TrialOutcome]) -> list[str]:
    """Hosts whose stable fingerprint changed during the sweep (a driver update, another NCCL...),
    one line per change. Different hosts of a cluster differ by nature and are not a change."""
    first: dict[str, TrialOutcome] = {}
    changes: list[str] = []
    for o in sorted((o for o in outcomes if o.fingerprint_hash), key=lambda o: o.started_at):
        host = str(o.fingerprint.get("host") or o.node)
        seen = first.setdefault(host, o)
        if o.fingerprint_hash != seen.fingerprint_hash:
            what = ", ".join(observe.fingerprint_diff(seen.fingerprint, o.fingerprint)) or "fingerprint"
            changes.append(f"{host}: trial {o.number} differs from trial {seen.number}: {what}")
            first[host] = o
    return changes
