"""--resume: end what a killed driver left running, rebuild the counters from the study, settle the
trials it left RUNNING, and log to MLflow what never got there."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from pydantic import ValidationError

from orchestrator.errors import StateFileError, TrackingError
from orchestrator.execute.processes import reap_processes, valid_records
from orchestrator.records import FailureKind, TrialOutcome, TrialRole, TrialStatus
from orchestrator.search import space as sp
from orchestrator.search.sampler import OUTPUTS_CHANGED_ATTR
from orchestrator.search.study import TrialView
from orchestrator.sweep._context import Context
from orchestrator.sweep._record import (
    FINISHED_AT_ATTR,
    LEARNED_FAILURES,
    baseline_measured_at,
    launched,
    record,
    recovered,
    update_best,
)
from orchestrator.sweep._workdir import Paths
from orchestrator.trial import server as srv

log = logging.getLogger("sweep")

CONFIRM_BASELINE = re.compile(r"\d+-baseline")
"""A confirmation round's baseline run at the gate's load (Paths.confirm_dir(i, "baseline")); the other
loads' (NN-baseline-c8) are not among the sweep's baselines, as the live sweep keeps them."""


def reap_previous_driver(paths: Paths) -> None:
    """End what a killed driver left behind: its local Ray processes and its trial servers.

    We hold the work directory's lock, so the driver that wrote these records is gone.
    """
    if paths.ray_processes.is_dir():
        raise StateFileError(
            f"{paths.ray_processes} is a directory, where the sweep keeps a file (the Ray processes it "
            "started); remove it and run the same command again"
        )
    if paths.ray_processes.exists() or paths.ray_processes.is_symlink():
        try:
            data = json.loads(paths.ray_processes.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            data = None
        recorded = valid_records(data)
        if recorded is None:
            log.warning(
                "%s is unreadable or not a list of processes: ending none of them (if the previous "
                "driver's Ray processes still run, end them yourself: ps -ef | grep ray)",
                paths.ray_processes,
            )
        elif not (isinstance(data, dict) and data.get("driver_pid") == os.getpid()):
            ended = reap_processes(recorded)
            if ended:
                log.info("ended %d Ray process(es) the previous driver left: %s", len(ended), ", ".join(ended))
        paths.ray_processes.unlink(missing_ok=True)
    pid_files = [*paths.root.glob("trials/*/server.pid"), *paths.root.glob("confirm/*/server.pid")]
    for pid_file in sorted(pid_files):
        if reaped := srv.reap_orphan(pid_file.parent):
            log.info(reaped)


def recover(ctx: Context) -> None:
    """Rebuild counters from the storage, then settle the trials a killed driver left RUNNING."""
    trials = ctx.study.trials()
    for t in trials:
        if t.state in ("COMPLETE", "FAIL"):
            _count_existing(ctx, t)
    _confirmation_baselines(ctx)
    replayed, pending = ctx.track.replay_outbox()
    if replayed or pending:
        log.info("MLflow outbox: replayed %d, still pending %d", replayed, pending)
    if not pending:
        _reconcile_mlflow(ctx, trials)
    for t in trials:
        if t.state == "RUNNING":
            _recover_running(ctx, t)


def _recover_running(ctx: Context, t: TrialView) -> None:
    """A trial the killed driver never settled: told from its outcome.json if the worker wrote
    one, else closed as interrupted (Optuna FAIL, MLflow KILLED) and queued to be measured again."""
    tdir = ctx.paths.trial_dir(t.number)
    run_id = t.attrs.get("mlflow_run_id") or None
    outcome = _read_outcome(tdir / "outcome.json", "it is measured again")
    if outcome is not None:
        log.info("trial %d finished before the driver died; telling it from outcome.json", t.number)
        launched(ctx)
        record(ctx, outcome, run_id)
        return
    log.info("trial %d was running when the driver died: closing it as interrupted", t.number)
    record(
        ctx,
        TrialOutcome(
            number=t.number,
            params=sp.complete(ctx.spec.space, t.params),
            role=TrialRole(t.role),
            status=TrialStatus.FAILED,
            failure_kind=FailureKind.interrupted,
            reason="the driver stopped while this trial ran; its parameters are measured again",
            trial_dir=str(tdir),
            started_at=t.start or 0.0,
            finished_at=ctx.clock.time(),
        ),
        run_id,
        written=False,
    )


def _count_existing(ctx: Context, t: TrialView) -> None:
    kind = t.attrs.get("failure_kind")
    if t.attrs.get("skipped") or kind == FailureKind.interrupted.value:
        return
    params = sp.complete(ctx.spec.space, t.params)
    outcome = _read_outcome(
        ctx.paths.trial_dir(t.number) / "outcome.json",
        "the study keeps its result, but the report and the champion's pick leave it out",
    )
    if t.role == TrialRole.baseline.value and t.state == "COMPLETE" and t.values:
        baseline_measured_at(ctx, _measured_at(t, outcome), float(t.values[0]))
    recovered(ctx, complete=t.state == "COMPLETE", failure_kind=kind)
    if t.state == "COMPLETE":
        ctx.policy.remember(params, t.number, t.values or ())
        if not t.attrs.get(OUTPUTS_CHANGED_ATTR):  # the correctness screen refused it: never the best
            update_best(ctx, t.number, float(t.values[0]) if t.values else None, t.params, t.role)
    else:
        # A failure the sampler learned from stays one after a resume, so its repeats are told the same way.
        learn = kind in {k.value for k in LEARNED_FAILURES} and t.role == TrialRole.search.value
        ctx.policy.remember(params, t.number, None, learn=learn)
    if outcome is not None:
        ctx.outcomes.append(outcome)


def _measured_at(t: TrialView, outcome: TrialOutcome | None) -> float:
    """When a trial was measured, on the sweep's clock, as the live sweep kept it: its outcome's
    `finished_at`, else the study's copy of it; Optuna's completion time only as the last resort (it is
    when Optuna was told, on the machine's clock, which is not the sweep's on a virtual clock)."""
    if outcome is not None:
        return outcome.finished_at
    kept = t.attrs.get(FINISHED_AT_ATTR)
    if isinstance(kept, (int, float)) and not isinstance(kept, bool):
        return float(kept)
    log.warning(
        "trial %d (a baseline) has no readable outcome.json and the study keeps no %s: its time is "
        "the study's completion time, so the baseline nearest a trial may be another",
        t.number,
        FINISHED_AT_ATTR,
    )
    return t.end or 0.0


def _confirmation_baselines(ctx: Context) -> None:
    """The baselines the confirmation rounds measured (confirm/NN-baseline/outcome.json), which the live
    sweep kept among its baselines (the end-of-sweep measurement): counted again, as it counted them."""
    for folder in sorted(ctx.paths.root.glob("confirm/*-baseline")):
        if not CONFIRM_BASELINE.fullmatch(folder.name):
            continue
        outcome = _read_outcome(folder / "outcome.json", "the sweep's baselines leave this round out")
        metrics = outcome.metrics if outcome is not None else None
        raw = getattr(metrics, ctx.spec.objective.metric, None) if metrics is not None else None
        if outcome is not None and outcome.status is TrialStatus.COMPLETE and raw is not None and raw > 0:
            baseline_measured_at(ctx, outcome.finished_at, float(raw))


def _read_outcome(path: Path, consequence: str) -> TrialOutcome | None:
    """A trial's outcome.json, or None (with a warning saying what follows) when it is missing or unreadable."""
    try:
        return TrialOutcome.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc.errors()[0]["msg"]
        log.warning("%s is unreadable (%s): %s", path, why, consequence)
        return None


def _reconcile_mlflow(ctx: Context, trials: list[TrialView]) -> None:
    """Log the finished trials MLflow lacks: a driver killed between telling Optuna and logging."""
    try:
        runs = ctx.track.child_runs(ctx.parent_run_id or "")
    except TrackingError as exc:
        log.warning("cannot compare MLflow with the study: %s", exc)
        return
    logged = {
        (int(n), str(r))
        for n, r, st in zip(runs.get("trial_number", []), runs.get("role", []), runs.get("status", []))
        if st != "RUNNING"
    }
    speedups = {t.number: t.attrs.get("speedup_vs_baseline") for t in trials}
    for o in ctx.outcomes:
        if (o.number, o.role.value) not in logged:
            log.info("trial %d is in the study but not in MLflow: logging it now", o.number)
            speedup = speedups.get(o.number)
            extra = {"speedup_vs_baseline": float(speedup)} if speedup else {}
            ctx.track.log_trial(
                ctx.parent_run_id or "",
                o,
                run_id=None,
                extra_metrics=extra,
                extra_tags={"sweep.engine": ctx.spec.engine},
            )
