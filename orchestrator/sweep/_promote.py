"""The end of a sweep: the promotion (orchestrator.verdict, through the sweep's port), the Verdict kept in
summary.json, the summary on the parent MLflow run.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.errors import TrackingError
from orchestrator.fsio import write_json
from orchestrator.records import TrialOutcome
from orchestrator.results import report, select
from orchestrator.sweep._context import Context
from orchestrator.sweep._decided import already_decided, remember
from orchestrator.sweep._loop import act_on_interrupts
from orchestrator.sweep._port import SweepPort
from orchestrator.sweep.state import BaselineDrift, Outcome, StopKind, SweepSummary
from orchestrator.sweep.status import recorded_speedups
from orchestrator.trial import observe
from orchestrator.verdict.promote import promote
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
        promoted = promote(SweepPort(ctx))
        remember(ctx, promoted)
        promotion = promoted.summary_fields(ctx.spec.objective.metric)
        if promoted.outcome in (Outcome.not_better, Outcome.undecided, Outcome.outputs_changed):
            promotion["verdict"] = promoted.verdict + _withdrawn(ctx)
    importances = ctx.study.importances()  # fANOVA over every trial: computed once, for both
    if "outcome" in promotion or "verdict" in promotion:
        promotion["decision"] = Verdict.of(promotion, ctx.spec.objective.metric, importances)
    summary = _summary(ctx, promotion, importances)
    _log_summary(ctx, summary, status)
    ctx.track.end_sweep(ctx.parent_run_id or "", "FINISHED" if status == "finished" else "KILLED")
    ctx.write_state(status)
    write_json(ctx.paths.summary, summary.to_json())
    return summary


def _withdrawn(ctx: Context) -> str:
    """Where an earlier driver of this sweep set the alias (and wrote champion.env) before it was killed,
    and this run reached a verdict that promotes nothing: the alias is removed and champion.env with it,
    so the registry, the env file and the verdict agree; the sentence that says so ("" when nothing was)."""
    p = ctx.spec.promotion
    try:
        version = ctx.track.withdraw(p.model_name, p.alias, ctx.parent_run_id or "")
    except TrackingError as exc:
        log.warning("could not check %s@%s against this verdict: %s", p.model_name, p.alias, exc)
        return f". {p.model_name}@{p.alias} was not checked against this verdict ({exc}): check it before deploying"
    env = ctx.paths.root / "champion.env"
    if version is None:
        return ""
    env.unlink(missing_ok=True)
    log.warning(
        "%s@%s (version %s, set before the resume) withdrawn: this verdict promotes nothing",
        p.model_name,
        p.alias,
        version,
    )
    return (
        f". {p.model_name}@{p.alias} no longer points at version {version}, which this sweep registered before "
        f"it was stopped: this verdict promotes nothing, so the alias and champion.env were removed"
    )


def _promotes(ctx: Context) -> bool:
    """Whether the sweep ended in a way that promotes: not interrupted, and the baseline did not fail."""
    stop = ctx.progress.stop
    return not ctx.interrupts.pressed and stop is not None and stop.kind is not StopKind.baseline_failed


def _summary(ctx: Context, promotion: dict[str, Any], importances: dict[str, float]) -> SweepSummary:
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
        importances=importances,
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
