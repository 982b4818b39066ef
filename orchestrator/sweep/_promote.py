"""The end of a sweep: champion, interleaved confirmation against the baseline (through the same
executor as the trials), promotion to the registry alias, the env file, and the summary."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.errors import TrackingError
from orchestrator.fsio import write_atomic, write_json
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialStatus, speculation_knob
from orchestrator.results import contrib, formats, report, select, sequential
from orchestrator.search import space as sp
from orchestrator.sweep import _confirm
from orchestrator.sweep._context import Context
from orchestrator.sweep._loop import act_on_interrupts
from orchestrator.sweep.state import BaselineDrift, Outcome, StopKind, SweepSummary, TrackingWait
from orchestrator.trial import observe
from orchestrator.trial import plan as planner

log = logging.getLogger("sweep")

MLFLOW_WAIT_AT_END_S = 60.0
"""At the end, how long results waiting in the outbox wait for MLflow to return before promotion gives up."""


def finish(ctx: Context) -> SweepSummary:
    """Promote unless interrupted or the baseline failed; log the summary to MLflow; write summary.json."""
    p = ctx.progress
    act_on_interrupts(ctx)
    status = "stopped" if ctx.interrupts.pressed else "finished"
    fields: dict[str, Any] = {
        "workdir": str(ctx.paths.root), "stop_reason": p.stop_text, "stop_kind": p.stop.kind if p.stop else None,
        "parent_run_id": ctx.parent_run_id, "launched": p.launched, "complete": p.complete, "failed": p.failed,
        "failures": dict(p.failures), "skipped": p.skipped, "champion": None, "promoted": False,
        "stopped_by_failure": p.stopped_by_failure}
    previous = _previous_verdict(ctx)
    if previous is not None:
        fields.update(previous)
    elif not ctx.interrupts.pressed and p.stop and p.stop.kind is not StopKind.baseline_failed:
        fields.update(promote(ctx))
    fields["importances"] = ctx.study.importances()
    # After the promotion gate: its interleaved baselines are the end-of-sweep measurement.
    drift, flagged = select.drift(p.baselines, threshold=ctx.spec.budget.baseline_drift_threshold)
    fields["baseline_drift"] = BaselineDrift(max_relative_change=drift, flagged=flagged, baselines=p.baselines)
    changed = fingerprint_changes(ctx.outcomes)
    fields["fingerprint_changes"] = changed
    summary = SweepSummary(**fields)
    confirmed = summary.confirmed.metrics() if summary.confirmed else {}
    confirmed.update({f"importance_{k}": v for k, v in summary.importances.items()})
    ctx.track.log_sweep_summary(
        ctx.parent_run_id or "", metrics={**report.parent_metrics(summary.to_json(), ctx.outcomes), **confirmed},
        tags={"sweep.stop_reason": p.stop_text[:250], "sweep.baseline_drift_flagged": str(flagged),
              "sweep.verdict": summary.outcome.value if summary.outcome else "none",
              "sweep.status": status, "sweep.fingerprint_changed": str(bool(changed)),
              **({"sweep.fingerprint_changes": "; ".join(changed)[:1000]} if changed else {})},
        table=report.results_table(ctx.spec, ctx.outcomes, p.baselines),
        figures=report.figures(ctx.spec, ctx.outcomes, p.baselines),
    )
    ctx.track.end_sweep(ctx.parent_run_id or "", "FINISHED" if status == "finished" else "KILLED")
    ctx.write_state(status)
    write_json(ctx.paths.summary, summary.to_json())
    return summary


_PROMOTION_FIELDS = ("champion", "promoted", "verdict", "outcome", "confirmed", "search_value", "contributions",
                     "promoted_config", "concurrency", "concurrency_verdict", "gate", "confirmations",
                     "model_version", "env_file", "run_id")


def _previous_verdict(ctx: Context) -> dict[str, Any] | None:
    """Resuming a sweep that already reached a verdict, with nothing new measured since: that verdict,
    neither measured again nor registered again (None otherwise)."""
    if not ctx.resume or not ctx.paths.summary.exists():
        return None
    try:
        before = SweepSummary.model_validate_json(ctx.paths.summary.read_text())
    except ValueError:
        return None
    p = ctx.progress
    if (before.launched, before.complete, before.failed) != (p.launched, p.complete, p.failed):
        return None
    rounds = int((before.gate or {}).get("rounds") or 0)
    decided = before.outcome in (Outcome.promoted, Outcome.unconfirmed, Outcome.not_better) or (
        before.outcome is Outcome.undecided and rounds >= ctx.spec.promotion.max_rounds)
    if before.outcome is None or not decided:
        return None  # interrupted, cut short by the wall time, or not registered: confirm (again) now
    log.info("the sweep had already reached its verdict and nothing new was measured: not confirmed or "
             "registered again (%s)", before.outcome.value)
    kept = before.model_dump(include=set(_PROMOTION_FIELDS), exclude_unset=True)
    kept["verdict"] = (f"already decided before this --resume, nothing measured or registered again: "
                       f"{before.verdict or before.outcome.value}")
    return kept


def promote(ctx: Context) -> dict[str, Any]:
    """Champion -> sequential interleaved confirmation against the baseline (with the arms that say
    why it won and at which load) -> verdict -> registry alias -> env file.
    Returns the summary's promotion fields (outcome, verdict, champion, confirmed, contributions, ...)."""
    spec = ctx.spec
    metric, direction = spec.objective.metric, spec.objective.direction
    constraints: dict[str, tuple[float | None, float | None]] = {
        k: (b.min, b.max) for k, b in spec.objective.constraints.items()}
    feasible = [o for o in ctx.outcomes if o.role is TrialRole.search]
    champion = select.pick_champion(feasible, metric=metric, direction=direction, constraints=constraints)
    baseline = next((o for o in reversed(ctx.outcomes)
                     if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE), None)
    if champion is None or baseline is None:
        why = ("no feasible trial to promote: every trial failed or broke a constraint; see `sweep status` and "
               "widen the space or relax objective.constraints" if champion is None else "no baseline measured")
        return {"verdict": why, "outcome": Outcome.no_champion}
    run_id = _run_id_of(ctx, champion)
    if run_id is None:
        return {"outcome": Outcome.no_champion,
                "verdict": f"not promoted: trial {champion.number} is not in MLflow yet ({ctx.track.pending()} "
                           f"result(s) wait in the outbox); when MLflow is reachable run `sweep sync` and "
                           f"{ctx.resume_hint} to promote"}
    search_value = getattr(champion.metrics, metric)
    result: dict[str, Any] = {
        "champion": {"number": champion.number, "params": {k: v for k, v in champion.params.items() if v is not None},
                     f"search_{metric}": search_value},
        "search_value": search_value}
    base_params = sp.baseline_params(spec.space)
    level = spec.benchmark.concurrency
    named = _gate_level_named(ctx)
    if not spec.promotion.max_rounds:
        base_value = getattr(baseline.metrics, metric)
        figures = contrib.unconfirmed(search_value, base_value, metric, direction, concurrency=level)
        at = f" at {contrib.streams(level)}" if named is not None else ""
        verdict = (f"UNCONFIRMED: promotion.max_rounds is 0, so the search-phase champion is promoted without a "
                   f"gate: {search_value:.2f} vs baseline {base_value:.2f} {metric}, {figures.gain * 100:+.1f}% from one "
                   f"measurement each{at}, the best of many (optimistic); set promotion.max_rounds (e.g. 12) to confirm")
        log.warning(verdict)
        return result | _register(ctx, champion, champion.params, run_id, figures, verdict, Outcome.unconfirmed,
                                  "champion")
    plan = sequential.RoundsPlan(spec.promotion.min_rounds, spec.promotion.max_rounds, spec.promotion.min_gain)
    arms = _arms(ctx, champion, base_params, constraints)
    more, counterpart, fixed = _confirm.steps_arms(spec, champion, ctx.outcomes, constraints)
    arms += more
    measured = _confirm.run_rounds(ctx, arms, plan)
    result["confirmations"] = measured.rows
    if ctx.interrupts.pressed:
        act_on_interrupts(ctx)
        return result | {"verdict": f"not promoted: interrupted during the confirmation rounds; {ctx.resume_hint} "
                                    f"measures them again"}
    decision = measured.decision
    if decision is None or decision.evidence is None:
        failed = sum(1 for r in measured.rows if r["status"] != "COMPLETE")
        return result | {"outcome": Outcome.undecided,
                         "verdict": contrib.at_level(
                             f"undecided: {failed} of {len(measured.rows)} confirmation runs failed, too few rounds "
                             f"for an interval; see {ctx.paths.root / 'confirm'}", named, metric)}
    result["gate"] = {"passed": decision.verdict is sequential.Verdict.promoted, "gain": decision.evidence.gain,
                      "ci_low": decision.evidence.low, "ci_high": decision.evidence.high,
                      "min_gain": plan.min_gain, "rounds": decision.evidence.rounds}
    figures = contrib.confirmed(decision.evidence, metric, concurrency=level)
    speculation = str(champion.params.get("speculative_algorithm") or "speculation").replace("EAGLE3", "EAGLE-3")
    sole = speculation if contrib.speculates(champion.params) else "NCCL settings"
    parts = contrib.contributions(measured.values, speculation=speculation, sole_part=sole, direction=direction)
    # The promotion.concurrency levels; without them, the gate's own level when adaptive and fixed
    # steps were compared there.
    listed = sorted(spec.promotion.concurrency) or ([level] if counterpart else [])
    levels = [contrib.LevelGain(concurrency=c, interval=iv, steps=contrib.steps_gain(
        measured.values, c, level, counterpart=counterpart, fixed=fixed, direction=direction)
        if counterpart else None) for c, iv in _levels(ctx, measured, listed)]
    what = f"{speculation} (with the champion's NCCL settings)" if contrib.speculates(champion.params) \
        else "the champion"
    if spec.promotion.concurrency:
        by_load = contrib.stops_paying(levels, what)
        after = f"By load: {contrib.stops_paying(levels, what, figures=False)}" if by_load else ""
    else:
        levels = [lv for lv in levels if lv.steps is not None]  # the gate's level is there for the steps alone
        by_load = after = contrib.steps_sentence(levels)
    result.update(confirmed=figures, contributions=parts, concurrency=levels, concurrency_verdict=by_load or None)
    why = "; ".join(p.text() for p in parts)
    others = [lv for lv in levels if lv.concurrency != level]
    verdict = contrib.verdict_text(decision.message, concurrency=named, metric=metric, others=others, why=why,
                                   after=after)
    if decision.verdict is not sequential.Verdict.promoted:
        verdict_kind = Outcome(decision.verdict.value) if decision.verdict is not None else Outcome.undecided
        log.warning("no promotion: %s", verdict)
        return result | {"outcome": verdict_kind, "verdict": verdict}
    promoted_params, chosen = dict(champion.params), "champion"
    simpler = contrib.simpler_choice(measured.values, parts, plan, direction=direction)
    if simpler is not None:
        chosen, simple_decision = simpler
        promoted_params = next(a.params for a in arms if a.name == chosen)
        if simple_decision.evidence is not None:
            figures = contrib.confirmed(simple_decision.evidence, metric, concurrency=level)
        left = "speculation" if chosen == "no_speculation" else "the NCCL settings"
        verdict = (f"promoted the simpler configuration without {left}: it adds nothing significant "
                   f"({next(p.text() for p in parts if p.b == chosen)}), and without it "
                   f"{contrib.at_level(simple_decision.message, named, metric)}. Champion: {verdict}")
    return result | _register(ctx, champion, promoted_params, run_id, figures, verdict, Outcome.promoted, chosen)


def _arms(ctx: Context, champion: TrialOutcome, base_params: dict[str, ParamValue],
          constraints: dict[str, tuple[float | None, float | None]]) -> list[_confirm.Arm]:
    """The champion and the baseline (the main pair), the ablations (promotion.explain) and the
    pair at each other promotion.concurrency level."""
    spec = ctx.spec
    level = spec.benchmark.concurrency
    arms = [_confirm.Arm("champion", dict(champion.params), champion.number, level, main=True),
            _confirm.Arm("baseline", base_params, -1, level, main=True)]
    if spec.promotion.explain:
        set_knobs = {k for k, v in champion.params.items() if v != base_params.get(k)}
        if contrib.speculates(champion.params) and any(not speculation_knob(k) for k in set_knobs):
            arms.append(_confirm.Arm("no_speculation", contrib.without_speculation(champion.params, base_params),
                                     champion.number, level))
            arms.append(_confirm.Arm("default_communication",
                                     contrib.with_default_communication(champion.params, base_params),
                                     champion.number, level))
        other = contrib.runner_up(ctx.outcomes, champion, metric=spec.objective.metric,
                                  direction=spec.objective.direction, constraints=constraints)
        if other is not None:
            arms.append(_confirm.Arm("runner_up", dict(other.params), other.number, level))
    for c in spec.promotion.concurrency:
        if c != level:
            arms.append(_confirm.Arm(f"champion@{c}", dict(champion.params), champion.number, c))
            arms.append(_confirm.Arm(f"baseline@{c}", base_params, -1, c))
    return arms


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


def _register(ctx: Context, champion: TrialOutcome, params: dict[str, ParamValue], run_id: str,
              figures: contrib.Confirmed, verdict: str, outcome: Outcome, chosen: str) -> dict[str, Any]:
    """Register the promoted configuration under the alias and write the sweep's champion.env."""
    spec = ctx.spec
    config = planner.serving_config(
        spec, params, trial_number=champion.number, run_id=run_id,
        metrics={**figures.metrics(), f"search_{spec.objective.metric}": getattr(champion.metrics, spec.objective.metric)},
        fingerprint_hash=champion.fingerprint_hash)
    try:
        version = ctx.track.promote(run_id, model_name=spec.promotion.model_name, serving_config=config.model_dump(),
                                    alias=spec.promotion.alias, description=f"{figures.text()}. {verdict}"[:5000])
    except TrackingError as exc:
        log.warning("champion not promoted: %s", exc)
        return {"outcome": Outcome.no_champion, "verdict": f"{verdict}; but not promoted: {exc}",
                "confirmed": figures}
    env_path = ctx.paths.root / "champion.env"
    write_atomic(env_path, formats.render_for(config.model_copy(update={"model_version": version}), "env"))
    log.info("promoted trial %d (%s) as %s@%s (version %s): %s", champion.number, chosen, spec.promotion.model_name,
             spec.promotion.alias, version, verdict)
    return {"outcome": outcome, "verdict": verdict, "confirmed": figures, "promoted": True, "model_version": version,
            "env_file": str(env_path), "run_id": run_id, "promoted_config": chosen}


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
