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
from dataclasses import replace
from typing import Any

from orchestrator.fsio import write_json
from orchestrator.results import contrib, report, select, sequential
from orchestrator.sweep import _confirm, _contender, _correctness, schedule
from orchestrator.sweep._choose import choose, decide, explain, load_arms, open_parts
from orchestrator.sweep._context import Context
from orchestrator.sweep._decided import already_decided, remember
from orchestrator.sweep._loop import act_on_interrupts
from orchestrator.sweep._pick import arms, pick, ungated
from orchestrator.sweep._promotion import Arms, Champion, Choice, Promotion
from orchestrator.sweep._register import fingerprint_changes, register
from orchestrator.sweep.state import ArmDropped, BaselineDrift, Outcome, StopKind, SweepSummary
from orchestrator.sweep.status import recorded_speedups
from orchestrator.verdict.value import Verdict

log = logging.getLogger("sweep")


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
    return _confirmed(ctx, picked, measuring, plan)


def _confirmed(ctx: Context, picked: Champion, measuring: Arms, plan: sequential.RoundsPlan) -> Promotion:
    """The rounds, the gate's decision, the configuration to deploy (checked for correctness), it at each
    load, and its registration."""
    level = ctx.spec.benchmark.concurrency
    at_gate = [a for a in measuring.arms if a.concurrency == level]
    later = _later_s(ctx, [a for a in measuring.arms if a.concurrency != level])
    search = _contender.search_contrast(ctx, picked, measuring)
    measured = _confirm.run_rounds(
        ctx,
        at_gate,
        plan,
        more=lambda values: open_parts(ctx, picked, values, plan),
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
        checked = _correctness.gate(ctx, picked, measuring, measured, gate, plan, choice)  # outputs unchanged?
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


def _plan(ctx: Context) -> sequential.RoundsPlan | None:
    """The rounds the confirmation may take; None without a gate (promotion.max_rounds: 0)."""
    p = ctx.spec.promotion
    return sequential.RoundsPlan(p.min_rounds, p.max_rounds, p.min_gain) if p.max_rounds else None
