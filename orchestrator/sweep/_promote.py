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
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import TrackingError
from orchestrator.fsio import write_atomic, write_json
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialStatus, speculation_knob
from orchestrator.results import contrib, formats, report, select, sequential
from orchestrator.search import space as sp
from orchestrator.sweep import _confirm, schedule
from orchestrator.sweep._context import Context
from orchestrator.sweep._loop import act_on_interrupts
from orchestrator.sweep._promotion import Arms, Champion, Choice, Decided, Gate, Promotion, Registered
from orchestrator.sweep.state import ArmDropped, BaselineDrift, Outcome, StopKind, SweepSummary, TrackingWait
from orchestrator.trial import observe
from orchestrator.trial import plan as planner

log = logging.getLogger("sweep")

MLFLOW_WAIT_AT_END_S = 60.0
"""At the end, how long results waiting in the outbox wait for MLflow to return before promotion gives up."""

DECISION_ATTR = "promotion_decision"
"""The study attribute that keeps the promotion's outcome (a Decided), so a --resume finds it without summary.json."""

Constraints = dict[str, tuple[float | None, float | None]]


def finish(ctx: Context) -> SweepSummary:
    """Promote unless interrupted or the baseline failed; log the summary to MLflow; write summary.json."""
    act_on_interrupts(ctx)
    status = "stopped" if ctx.interrupts.pressed else "finished"
    earlier = _already_decided(ctx)
    promotion: dict[str, Any] = {}
    if earlier is not None:
        promotion = earlier
    elif _promotes(ctx):
        promoted = promote(ctx)
        _remember(ctx, promoted)
        promotion = promoted.summary_fields(ctx.spec.objective.metric)
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
        workdir=str(ctx.paths.root), stop_reason=p.stop_text, stop_kind=p.stop.kind if p.stop else None,
        parent_run_id=ctx.parent_run_id, launched=p.launched, complete=p.complete, failed=p.failed,
        failures=dict(p.failures), skipped=p.skipped, stopped_by_failure=p.stopped_by_failure, **fields,
        importances=ctx.study.importances(),
        baseline_drift=BaselineDrift(max_relative_change=drift, flagged=flagged, baselines=p.baselines),
        fingerprint_changes=fingerprint_changes(ctx.outcomes))


def _log_summary(ctx: Context, summary: SweepSummary, status: str) -> None:
    """The summary on the parent run: its metrics, tags, results table and figures."""
    p = ctx.progress
    confirmed = summary.confirmed.metrics() if summary.confirmed else {}
    confirmed.update({f"importance_{k}": v for k, v in summary.importances.items()})
    changed = summary.fingerprint_changes
    figures = report.figures(ctx.spec, ctx.outcomes, p.baselines)
    try:
        ctx.track.log_sweep_summary(
            ctx.parent_run_id or "", metrics={**report.parent_metrics(summary.to_json(), ctx.outcomes), **confirmed},
            tags={"sweep.stop_reason": p.stop_text[:250],
                  "sweep.baseline_drift_flagged": str(summary.baseline_drift.flagged),
                  "sweep.verdict": summary.outcome.value if summary.outcome else "none",
                  "sweep.status": status, "sweep.fingerprint_changed": str(bool(changed)),
                  **({"sweep.fingerprint_changes": "; ".join(changed)[:1000]} if changed else {})},
            table=report.results_table(ctx.spec, ctx.outcomes, p.baselines), figures=figures)
    finally:
        import matplotlib.pyplot as plt  # deferred: report.figures imported it already

        for figure in figures.values():
            plt.close(figure)  # pyplot keeps every figure it made open: sweeps in one process would pile them up


# ------------------------------------------------------------------------------ --resume of a decided sweep


_PROMOTION_FIELDS = ("champion", "promoted", "verdict", "outcome", "confirmed", "search_value", "contributions",
                     "promoted_config", "concurrency", "concurrency_verdict", "gate", "confirmations",
                     "model_version", "env_file", "run_id")


def _already_decided(ctx: Context) -> dict[str, Any] | None:
    """Resuming a sweep that already reached a verdict, with nothing new measured since: that verdict's
    summary fields, neither measured again nor registered again (None otherwise). The verdict is read
    from summary.json, or, when that is missing or unreadable, from the study (DECISION_ATTR)."""
    if not ctx.resume:
        return None
    before = _summary_before(ctx)
    decided = _decided_in_study(ctx) if before is None else _decided_in_summary(before)
    if decided is None or not _final(ctx, decided):
        return None  # interrupted, cut short by the wall time, or not registered: confirm (again) now
    log.info("the sweep had already reached its verdict and nothing new was measured: not confirmed or "
             "registered again (%s)", decided.outcome.value)
    kept = before.model_dump(include=set(_PROMOTION_FIELDS), exclude_unset=True) if before is not None \
        else decided.summary_fields()
    kept["verdict"] = (f"already decided before this --resume, nothing measured or registered again: "
                       f"{decided.verdict or decided.outcome.value}")
    return kept


def _summary_before(ctx: Context) -> SweepSummary | None:
    """The summary.json of the run before, or None when missing or unreadable."""
    try:
        return SweepSummary.model_validate_json(ctx.paths.summary.read_text())
    except (OSError, ValueError):
        return None


def _decided_in_summary(before: SweepSummary) -> Decided | None:
    """The promotion's outcome summary.json holds, or None (no promotion ended there)."""
    if before.outcome is None:
        return None
    return Decided(outcome=before.outcome, verdict=before.verdict or "",
                   rounds=int((before.gate or {}).get("rounds") or 0), launched=before.launched,
                   complete=before.complete, failed=before.failed)


def _decided_in_study(ctx: Context) -> Decided | None:
    """The promotion's outcome the study keeps, or None (never decided, or not readable)."""
    kept = ctx.study.get_attr(DECISION_ATTR)
    if kept is None:
        return None
    try:
        return Decided.model_validate(kept)
    except ValidationError:
        log.warning("the study's %s is not a promotion decision: promoting again", DECISION_ATTR)
        return None


def _final(ctx: Context, decided: Decided) -> bool:
    """Whether the verdict stands: reached at the counts of now, and not one more rounds could change."""
    p = ctx.progress
    if (decided.launched, decided.complete, decided.failed) != (p.launched, p.complete, p.failed):
        return False
    return decided.outcome in (Outcome.promoted, Outcome.unconfirmed, Outcome.not_better) or (
        decided.outcome is Outcome.undecided and decided.rounds >= ctx.spec.promotion.max_rounds)


def _remember(ctx: Context, promotion: Promotion) -> None:
    """Keep the promotion's outcome in the study, which --resume reads when summary.json is unreadable."""
    if promotion.outcome is None:
        return  # interrupted: nothing decided
    p = ctx.progress
    r = promotion.registered
    decided = Decided(outcome=promotion.outcome, verdict=promotion.verdict, rounds=promotion.rounds,
                      model_version=r.model_version if r else None, run_id=r.run_id if r else None,
                      env_file=r.env_file if r else None, promoted_config=r.promoted_config if r else None,
                      champion=promotion.champion.summary() if promotion.champion else None,
                      launched=p.launched, complete=p.complete, failed=p.failed)
    ctx.study.set_attr(DECISION_ATTR, decided.model_dump(mode="json"))


# ------------------------------------------------------------------------------ the pipeline


def promote(ctx: Context) -> Promotion:
    """Champion -> sequential interleaved confirmation against the baseline (with the arms that say
    why it won and at which load) -> verdict -> registry alias -> env file."""
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
        return Promotion(Outcome.undecided, f"undecided: the night left no time for the confirmation ({why}); "
                                            f"{ctx.resume_hint} with a longer --timeout confirms it", picked,
                         not_measured=measuring.dropped)
    measured = _confirm.run_rounds(ctx, list(measuring.arms), plan)
    gate = decide(ctx, picked, measuring, measured, plan)
    if isinstance(gate, Promotion):
        return gate
    if not gate.passed:
        log.warning("no promotion: %s", gate.verdict)
        return Promotion(gate.outcome, gate.verdict, picked, measured.rows, gate, gate.figures,
                         not_measured=measuring.dropped)
    promoted = register(ctx, picked, choose(ctx, measuring, measured, gate, plan))
    return Promotion(promoted.outcome, promoted.verdict, picked, measured.rows, gate, promoted.confirmed,
                     promoted.registered, not_measured=measuring.dropped)


def fitted(ctx: Context, measuring: Arms) -> Arms:
    """The arms that fit the time left of the night (sweep.schedule.plan: the gate's pair first, then by
    value), each one left out said in a line; the step comparison dropped with its arms."""
    spec = ctx.spec
    planned = schedule.plan([(a.name, a.concurrency, a.main) for a in measuring.arms],
                            seconds=schedule.run_seconds(spec, ctx.outcomes), left_s=ctx.remaining(),
                            share_s=ctx.remaining(), min_rounds=spec.promotion.min_rounds,
                            gate_level=spec.benchmark.concurrency, slots=max(ctx.executor.idle(), 1))
    kept = {a.name for a in planned.arms}
    for d in planned.dropped:
        log.warning("confirmation: %s not measured: %s", d.name, d.why)
        ctx.emit(ArmDropped(name=d.name, why=d.why))
    out = tuple(a for a in measuring.arms if a.name in kept)
    steps_left = any(a.name.split("@")[0] == measuring.counterpart for a in out)
    return Arms(arms=out, counterpart=measuring.counterpart if steps_left else "",
                fixed=measuring.fixed if steps_left else "",
                dropped=tuple(f"{d.name}: {d.why}" for d in planned.dropped))


def _constraints(ctx: Context) -> Constraints:
    return {k: (b.min, b.max) for k, b in ctx.spec.objective.constraints.items()}


def _plan(ctx: Context) -> sequential.RoundsPlan | None:
    """The rounds the confirmation may take; None without a gate (promotion.max_rounds: 0)."""
    p = ctx.spec.promotion
    return sequential.RoundsPlan(p.min_rounds, p.max_rounds, p.min_gain) if p.max_rounds else None


def pick(ctx: Context) -> Champion | Promotion:
    """The champion of the search, with the baseline and its MLflow run; or why there is none to promote."""
    spec = ctx.spec
    metric = spec.objective.metric
    feasible = [o for o in ctx.outcomes if o.role is TrialRole.search]
    champion = select.pick_champion(feasible, metric=metric, direction=spec.objective.direction,
                                    constraints=_constraints(ctx))
    baseline = next((o for o in reversed(ctx.outcomes)
                     if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE), None)
    if champion is None or baseline is None:
        return Promotion(Outcome.no_champion, _no_champion(feasible) if champion is None else "no baseline measured")
    run_id = _run_id_of(ctx, champion)
    if run_id is None:
        return Promotion(Outcome.no_champion,
                         f"not promoted: trial {champion.number} is not in MLflow yet ({ctx.track.pending()} "
                         f"result(s) wait in the outbox); when MLflow is reachable run `sweep sync` and "
                         f"{ctx.resume_hint} to promote")
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
        what = (f"{complete} search trial(s) measured, each breaking an objective constraint"
                + (f", {failed} failed" if failed else ""))
    return (f"no feasible trial to promote: {what}; see `sweep status` and widen the space, raise the budget "
            f"or relax objective.constraints")


def ungated(ctx: Context, champion: Champion) -> Choice | Promotion:
    """Without a gate (promotion.max_rounds: 0): the champion on its one search-phase measurement against
    the baseline's, promoted as unconfirmed when that shows promotion.min_gain, refused otherwise."""
    spec = ctx.spec
    metric, level = champion.metric, spec.benchmark.concurrency
    value, base_value = champion.search_value, float(getattr(champion.baseline.metrics, metric))
    figures = contrib.unconfirmed(value, base_value, metric, spec.objective.direction, concurrency=level)
    at = f" at {contrib.streams(level)}" if _gate_level_named(ctx) is not None else ""
    measured = (f"{value:.2f} vs baseline {base_value:.2f} {metric}, {figures.gain * 100:+.1f}% from one "
                f"measurement each{at}")
    if figures.gain < spec.promotion.min_gain:
        verdict = (f"not better: promotion.max_rounds is 0, so the search-phase champion is judged without a gate: "
                   f"{measured}, below the required {spec.promotion.min_gain * 100:+.1f}% (promotion.min_gain); "
                   f"not promoted; set promotion.max_rounds (e.g. 12) to confirm it in interleaved rounds")
        log.warning("no promotion: %s", verdict)
        return Promotion(Outcome.not_better, verdict, champion, confirmed=figures)
    verdict = (f"UNCONFIRMED: promotion.max_rounds is 0, so the search-phase champion is promoted without a "
               f"gate: {measured}, the best of many (optimistic); set promotion.max_rounds (e.g. 12) to confirm")
    log.warning(verdict)
    return Choice("champion", dict(champion.trial.params), figures, verdict, Outcome.unconfirmed)


def arms(ctx: Context, champion: Champion) -> Arms:
    """The champion and the baseline (the main pair), the ablations (promotion.explain), the pair at each
    other promotion.concurrency level, and the champion as the other kind of step control."""
    spec = ctx.spec
    trial, level = champion.trial, spec.benchmark.concurrency
    base_params = sp.baseline_params(spec.space)
    out = [_confirm.Arm("champion", dict(trial.params), trial.number, level, main=True),
           _confirm.Arm("baseline", base_params, -1, level, main=True)]
    if spec.promotion.explain:
        out += _ablations(ctx, trial, base_params)
    for c in spec.promotion.concurrency:
        if c != level:
            out.append(_confirm.Arm(f"champion@{c}", dict(trial.params), trial.number, c))
            out.append(_confirm.Arm(f"baseline@{c}", base_params, -1, c))
    steps, counterpart, fixed = _confirm.steps_arms(spec, trial, ctx.outcomes, _constraints(ctx))
    return Arms(arms=tuple(out + steps), counterpart=counterpart, fixed=fixed)


def _ablations(ctx: Context, trial: TrialOutcome, base_params: dict[str, ParamValue]) -> list[_confirm.Arm]:
    """The champion without each of its parts (when it sets both), and the runner-up from another region."""
    spec = ctx.spec
    level = spec.benchmark.concurrency
    out = []
    set_knobs = {k for k, v in trial.params.items() if v != base_params.get(k)}
    if contrib.speculates(trial.params) and any(not speculation_knob(k) for k in set_knobs):
        out.append(_confirm.Arm("no_speculation", contrib.without_speculation(trial.params, base_params),
                                trial.number, level))
        out.append(_confirm.Arm("default_communication",
                                contrib.with_default_communication(trial.params, base_params), trial.number, level))
    other = contrib.runner_up(ctx.outcomes, trial, metric=spec.objective.metric, direction=spec.objective.direction,
                              constraints=_constraints(ctx))
    if other is not None:
        out.append(_confirm.Arm("runner_up", dict(other.params), other.number, level))
    return out


def decide(ctx: Context, champion: Champion, measuring: Arms, measured: _confirm.Measured,
           plan: sequential.RoundsPlan) -> Gate | Promotion:
    """The gate's decision on the main pair with its figures, the contributions and the gain per load;
    or, interrupted or without an interval, the Promotion that says so."""
    spec = ctx.spec
    metric, direction = champion.metric, spec.objective.direction
    named = _gate_level_named(ctx)
    if ctx.interrupts.pressed:
        act_on_interrupts(ctx)
        return Promotion(None, f"not promoted: interrupted during the confirmation rounds; {ctx.resume_hint} "
                               f"measures them again", champion, measured.rows)
    decision = measured.decision
    if decision is None or decision.evidence is None:
        return Promotion(Outcome.undecided, contrib.at_level(
            f"undecided: {measured.failed()} of {len(measured.rows)} confirmation runs failed, too few rounds "
            f"for an interval; see {ctx.paths.root / 'confirm'}", named, metric), champion, measured.rows)
    speculation = _speculation(champion)
    sole = speculation if contrib.speculates(champion.trial.params) else "NCCL settings"
    parts = contrib.contributions(measured.values, speculation=speculation, sole_part=sole, direction=direction)
    levels, by_load, after = _by_load(ctx, champion, measuring, measured)
    others = [lv for lv in levels if lv.concurrency != spec.benchmark.concurrency]
    verdict = contrib.verdict_text(decision.message, concurrency=named, metric=metric, others=others,
                                   why="; ".join(p.text() for p in parts), after=after)
    return Gate(decision=decision, evidence=decision.evidence, min_gain=plan.min_gain,
                figures=contrib.confirmed(decision.evidence, metric, concurrency=spec.benchmark.concurrency),
                contributions=tuple(parts), levels=tuple(levels), by_load=by_load, verdict=verdict)


def _by_load(ctx: Context, champion: Champion, measuring: Arms,
             measured: _confirm.Measured) -> tuple[list[contrib.LevelGain], str, str]:
    """The champion's gain at each promotion.concurrency level (without them, the gate's own level when
    adaptive and fixed steps were compared there), the sentence about them, and what the verdict ends with."""
    spec = ctx.spec
    direction, level = spec.objective.direction, spec.benchmark.concurrency
    counterpart = measuring.counterpart
    listed = sorted(spec.promotion.concurrency) or ([level] if counterpart else [])
    levels = [contrib.LevelGain(concurrency=c, interval=iv, steps=contrib.steps_gain(
        measured.values, c, level, counterpart=counterpart, fixed=measuring.fixed, direction=direction)
        if counterpart else None) for c, iv in _levels(ctx, measured, listed)]
    if not spec.promotion.concurrency:
        levels = [lv for lv in levels if lv.steps is not None]  # the gate's level is there for the steps alone
        said = contrib.steps_sentence(levels)
        return levels, said, said
    what = f"{_speculation(champion)} (with the champion's NCCL settings)" \
        if contrib.speculates(champion.trial.params) else "the champion"
    by_load = contrib.stops_paying(levels, what)
    return levels, by_load, f"By load: {contrib.stops_paying(levels, what, figures=False)}" if by_load else ""


def _speculation(champion: Champion) -> str:
    """The champion's speculation in words ("EAGLE-3")."""
    return str(champion.trial.params.get("speculative_algorithm") or "speculation").replace("EAGLE3", "EAGLE-3")


def choose(ctx: Context, measuring: Arms, measured: _confirm.Measured, gate: Gate,
           plan: sequential.RoundsPlan) -> Choice:
    """The configuration to promote after the gate passed: the champion, or the simpler arm without a
    part that adds nothing significant, when that one passes the gate as well."""
    spec = ctx.spec
    simpler = contrib.simpler_choice(measured.values, gate.contributions, plan, direction=spec.objective.direction)
    champion_params = measuring.params_of("champion")
    if simpler is None:
        return Choice("champion", champion_params, gate.figures, gate.verdict, Outcome.promoted)
    chosen, decision = simpler
    figures = gate.figures if decision.evidence is None else contrib.confirmed(
        decision.evidence, spec.objective.metric, concurrency=spec.benchmark.concurrency)
    left = "speculation" if chosen == "no_speculation" else "the NCCL settings"
    verdict = (f"promoted the simpler configuration without {left}: it adds nothing significant "
               f"({next(p.text() for p in gate.contributions if p.b == chosen)}), and without it "
               f"{contrib.at_level(decision.message, _gate_level_named(ctx), spec.objective.metric)}. "
               f"Champion: {gate.verdict}")
    return Choice(chosen, measuring.params_of(chosen), figures, verdict, Outcome.promoted)


def register(ctx: Context, champion: Champion, choice: Choice) -> Promotion:
    """Register the chosen configuration under the alias and write the sweep's champion.env."""
    spec = ctx.spec
    trial = champion.trial
    config = planner.serving_config(
        spec, choice.params, trial_number=trial.number, run_id=champion.run_id,
        metrics={**choice.figures.metrics(), f"search_{champion.metric}": champion.search_value},
        fingerprint_hash=trial.fingerprint_hash)
    try:
        version = ctx.track.promote(champion.run_id, model_name=spec.promotion.model_name, serving_config=config,
                                    alias=spec.promotion.alias,
                                    description=f"{choice.figures.text()}. {choice.verdict}"[:5000])
    except TrackingError as exc:
        log.warning("champion not promoted: %s", exc)
        return Promotion(Outcome.no_champion, f"{choice.verdict}; but not promoted: {exc}", champion,
                         confirmed=choice.figures)
    env_path = ctx.paths.root / "champion.env"
    write_atomic(env_path, formats.render_for(config.model_copy(update={"model_version": version}), "env"))
    log.info("promoted trial %d (%s) as %s@%s (version %s): %s", trial.number, choice.name, spec.promotion.model_name,
             spec.promotion.alias, version, choice.verdict)
    return Promotion(choice.outcome, choice.verdict, champion, confirmed=choice.figures,
                     registered=Registered(model_version=version, env_file=str(env_path), run_id=champion.run_id,
                                           promoted_config=choice.name))


def _gate_level_named(ctx: Context) -> int | None:
    """The level the gate decides at, when the verdict must name it (not one stream, or other levels
    reported beside it); None otherwise."""
    spec = ctx.spec
    level = spec.benchmark.concurrency
    return level if level != 1 or spec.promotion.concurrency else None


def _levels(ctx: Context, measured: _confirm.Measured, listed: list[int]) -> list[tuple[int, contrib.Interval]]:
    """Champion vs baseline at each listed level, over min_rounds rounds at each (the gate's level too)."""
    direction = ctx.spec.objective.direction
    out = []
    for c in listed:
        a_name, b_name = ("champion", "baseline") if c == ctx.spec.benchmark.concurrency \
            else (f"champion@{c}", f"baseline@{c}")
        if a_name in measured.values and b_name in measured.values:
            a, b = contrib.paired(measured.values[a_name], measured.values[b_name])
            if a_name == "champion":
                a, b = a[:ctx.spec.promotion.min_rounds], b[:ctx.spec.promotion.min_rounds]  # like the other levels
            interval = contrib.compare(a, b, direction=direction)
            if interval is not None:
                out.append((c, interval))
    return out


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
