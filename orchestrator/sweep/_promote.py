"""The end of a sweep: champion, interleaved confirmation against the baseline (through the same
executor as the trials), promotion to the registry alias, the env file, and the summary."""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator.errors import TrackingError
from orchestrator.execute.base import Finished
from orchestrator.fsio import write_atomic, write_json
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialSpec, TrialStatus
from orchestrator.results import export, report, select
from orchestrator.search import space as sp
from orchestrator.sweep._context import Context
from orchestrator.sweep._loop import WAIT_S, act_on_interrupts, keep_files
from orchestrator.sweep.state import BaselineDrift, ConfirmationRun, StopKind, SweepSummary, TrackingWait
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
    if not ctx.interrupts.pressed and p.stop and p.stop.kind is not StopKind.baseline_failed:
        fields.update(promote(ctx))
    # After the promotion gate: its interleaved baselines are the end-of-sweep measurement.
    drift, flagged = select.drift(p.baselines, threshold=ctx.spec.budget.baseline_drift_threshold)
    fields["baseline_drift"] = BaselineDrift(max_relative_change=drift, flagged=flagged, baselines=p.baselines)
    changed = fingerprint_changes(ctx.outcomes)
    fields["fingerprint_changes"] = changed
    summary = SweepSummary(**fields)
    ctx.track.log_sweep_summary(
        ctx.parent_run_id or "", metrics=report.parent_metrics(summary.to_json(), ctx.outcomes),
        tags={"sweep.stop_reason": p.stop_text[:250], "sweep.baseline_drift_flagged": str(flagged),
              "sweep.status": status, "sweep.fingerprint_changed": str(bool(changed)),
              **({"sweep.fingerprint_changes": "; ".join(changed)[:1000]} if changed else {})},
        table=report.results_table(ctx.spec, ctx.outcomes, p.baselines),
        figures=report.figures(ctx.spec, ctx.outcomes, p.baselines),
    )
    ctx.track.end_sweep(ctx.parent_run_id or "", "FINISHED" if status == "finished" else "KILLED")
    ctx.write_state(status)
    write_json(ctx.paths.summary, summary.to_json())
    return summary


def promote(ctx: Context) -> dict[str, Any]:
    """Champion -> interleaved confirmation against the baseline -> registry alias -> env file.
    Returns the summary's promotion fields (verdict, champion, gate, confirmations, promoted, ...)."""
    spec = ctx.spec
    constraints: dict[str, tuple[float | None, float | None]] = {
        k: (b.min, b.max) for k, b in spec.objective.constraints.items()}
    feasible = [o for o in ctx.outcomes if o.role is TrialRole.search]
    champion = select.pick_champion(feasible, metric=spec.objective.metric, direction=spec.objective.direction,
                                    constraints=constraints)
    baseline = next((o for o in reversed(ctx.outcomes)
                     if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE), None)
    if champion is None or baseline is None:
        return {"verdict": "no feasible trial to promote" if champion is None else "no baseline measured"}
    run_id = _run_id_of(ctx, champion)
    if run_id is None:
        return {"verdict": f"not promoted: trial {champion.number} is not in MLflow yet ({ctx.track.pending()} "
                           f"result(s) wait in the outbox); when MLflow is reachable run `sweep sync` and "
                           f"{ctx.resume_hint} to promote"}
    metric = spec.objective.metric
    champ_samples = [getattr(m, metric) for m in champion.repeats or (champion.metrics,)]
    base_samples = [getattr(m, metric) for m in baseline.repeats or (baseline.metrics,)]
    confirm_log: list[dict[str, Any]] = []
    if spec.promotion.confirm_repeats:
        champ_samples, base_samples, confirm_log = _confirm(ctx, champion, spec.promotion.confirm_repeats)
        if ctx.interrupts.pressed:
            act_on_interrupts(ctx)
            return {"verdict": "not promoted: interrupted during the confirmation runs", "confirmations": confirm_log}
    if len(champ_samples) < 2 or len(base_samples) < 2:
        failed = sum(1 for r in confirm_log if r["status"] != "COMPLETE")
        return {"verdict": f"not promoted: {failed} of {len(confirm_log)} confirmation runs failed or were "
                           f"skipped, leaving {len(champ_samples)} champion and {len(base_samples)} baseline "
                           f"measurement(s); see {ctx.paths.root / 'confirm'}",
                "confirmations": confirm_log}
    gate = select.promotion_gate(champ_samples, base_samples, min_gain=spec.promotion.min_gain,
                                 direction=spec.objective.direction)
    result: dict[str, Any] = {
        "champion": {"number": champion.number, "params": {k: v for k, v in champion.params.items() if v is not None},
                     metric: getattr(champion.metrics, metric)},
        "gate": gate.model_dump(mode="json"), "confirmations": confirm_log, "verdict": gate.reason,
    }
    if not gate.passed:
        log.warning("no promotion: %s", gate.reason)
        return result
    config = planner.serving_config(
        spec, champion.params, trial_number=champion.number, run_id=run_id or "",
        metrics={metric: float(sum(champ_samples) / len(champ_samples)),
                 "baseline_" + metric: float(sum(base_samples) / len(base_samples)), "gain": gate.gain},
        fingerprint_hash=champion.fingerprint_hash)
    try:
        version = ctx.track.promote(run_id, model_name=spec.promotion.model_name, serving_config=config.model_dump(),
                                    alias=spec.promotion.alias, description=gate.reason)
    except TrackingError as exc:
        log.warning("champion not promoted: %s", exc)
        result["verdict"] = f"{gate.reason}; but not promoted: {exc}"
        return result
    env_path = ctx.paths.root / "champion.env"
    write_atomic(env_path, export.render(config.model_copy(update={"model_version": version}), "env"))
    result.update(promoted=True, model_version=version, env_file=str(env_path), run_id=run_id)
    log.info("promoted trial %d as %s@%s (version %s): %s", champion.number, spec.promotion.model_name,
             spec.promotion.alias, version, gate.reason)
    return result


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
    deadline = time.monotonic() + wait_s
    _, pending = ctx.track.replay_outbox()
    if pending:
        log.warning("MLflow unreachable with %d result(s) in the outbox: waiting up to %.0fs for it", pending, wait_s)
        ctx.emit(TrackingWait(pending=pending, wait_s=wait_s))
    while pending and time.monotonic() < deadline and not ctx.interrupts.pressed:
        time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
        _, pending = ctx.track.replay_outbox()
    return not pending


def _confirm(ctx: Context, champion: TrialOutcome, n: int) -> tuple[list[float], list[float], list[dict[str, Any]]]:
    """Champion and baseline measured again, interleaved A B A B ..., one run at a time."""
    metric = ctx.spec.objective.metric
    champ: list[float] = []
    base: list[float] = []
    rows: list[dict[str, Any]] = []
    baseline_params = sp.baseline_params(ctx.spec.space)
    # The wall-time budget covers the confirmation too: each round needs about two trials' time.
    round_s = 2 * max((o.finished_at - o.started_at for o in ctx.outcomes if o.finished_at), default=0.0)
    for i in range(n):
        if i and time.time() - ctx.started_at + round_s > ctx.timeout_s:
            rows.append({"round": i, "who": "both", "status": "SKIPPED",
                         "reason": "the wall-time budget leaves no time for another round"})
            break
        runs: tuple[tuple[str, dict[str, ParamValue]], ...] = (("champion", champion.params),
                                                               ("baseline", baseline_params))
        for who, params in runs:
            if ctx.interrupts.pressed:
                break
            tdir = ctx.paths.confirm_dir(i, who)
            spec = TrialSpec(number=champion.number if who == "champion" else -1, params=params,
                             role=TrialRole.confirm, repeats=ctx.spec.benchmark.repeats, trial_dir=str(tdir),
                             seed=ctx.spec.sampler.seed * 7919 + i * 2 + (who == "baseline"),
                             sweep_started_at=ctx.started_at, experiment=ctx.spec)
            ctx.emit(ConfirmationRun(round=i + 1, of=n, who=who))
            finished = _run_one(ctx, spec)
            if finished.lost is not None:
                rows.append({"round": i, "who": who, "status": "FAILED", "reason": finished.lost[:200]})
                continue
            outcome = finished.outcome
            keep_files(tdir, finished.files)
            ctx.track.log_trial(ctx.parent_run_id or "", outcome, run_id=None, extra_metrics={},
                                extra_tags={"sweep.confirm_round": str(i), "sweep.confirm_of": who})
            values = [getattr(m, metric) for m in outcome.repeats] if outcome.status is TrialStatus.COMPLETE else []
            (champ if who == "champion" else base).extend(v for v in values if v is not None)
            if who == "baseline" and values and values[0] is not None:
                ctx.progress.baselines.append((outcome.finished_at, float(values[0])))  # the end-of-sweep baseline
            rows.append({"round": i, "who": who, "status": outcome.status.value, metric: values})
    return champ, base, rows


def _run_one(ctx: Context, spec: TrialSpec) -> Finished:
    """Run one confirmation on the executor and wait for it; a second Ctrl-C aborts it like a trial."""
    executor = ctx.executor
    handle = executor.submit(spec)
    while True:
        for finished in executor.wait(WAIT_S):
            if finished.handle == handle:
                return finished
        if ctx.interrupts.pressed >= 2 and not ctx.abort_reason:
            ctx.abort_reason = "aborted by a second Ctrl-C"
            executor.abort(handle)


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
