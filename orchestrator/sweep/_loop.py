"""The scheduling loop: keep every slot busy until a budget, a failure rule or Ctrl-C says stop."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from orchestrator.config import eagle
from orchestrator.execute.base import Finished
from orchestrator.records import FailureKind, TrialRole, TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.search.proposal import Proposal, Settled, Settlement
from orchestrator.sweep import _screen
from orchestrator.sweep._context import Context, InFlight
from orchestrator.sweep._probe_stage import run_probe_stage
from orchestrator.sweep._record import (
    abort_in_flight,
    baseline_measured,
    launched,
    record,
    should_launch,
    skipped,
    stop,
)
from orchestrator.sweep.state import Interrupted, StopKind, StopReason, Tick, TrialLaunched, TrialSkipped

log = logging.getLogger("sweep")

MAX_SKIPPED_PROPOSALS = 200
"""Consecutive proposals that need no launch (infeasible, already measured) before the space counts as exhausted."""

WAIT_S = 0.5
"""How long one wait for a finished trial lasts before the loop looks at Ctrl-C and budgets again."""


def act_on_interrupts(ctx: Context) -> None:
    """First Ctrl-C (or SIGTERM): launch nothing more; second: abort the trials in flight."""
    for press in ctx.interrupts.new_presses():
        how = ctx.interrupts.how
        if press == 1:
            stop(
                ctx,
                StopReason(
                    StopKind.interrupted,
                    (
                        f"interrupted ({how}): no new trials launched, the trials in flight finished; "
                        f"continue with {ctx.resume_hint}"
                    ),
                ),
            )
        else:
            stop(
                ctx,
                StopReason(
                    StopKind.aborted,
                    (
                        f"interrupted twice ({how}): the trials in flight were aborted and will be measured "
                        f"again; continue with {ctx.resume_hint}"
                    ),
                ),
            )
            abort_in_flight(ctx, f"aborted by a second {how}")
        ctx.emit(Interrupted(press=press))


def run_loop(ctx: Context) -> None:
    """Stage one (the probe, when enabled), then launch while slots are free and budgets allow;
    record each trial as it ends."""
    run_probe_stage(ctx)
    while True:
        act_on_interrupts(ctx)
        while ctx.executor.idle() and should_launch(ctx):
            if not _launch_next(ctx):
                break
        if not ctx.in_flight:
            if not should_launch(ctx):
                break
            continue
        for finished in ctx.executor.wait(WAIT_S):
            _collect(ctx, finished)
        ctx.emit(
            Tick(
                launched=ctx.progress.launched,
                finished=ctx.progress.finished,
                in_flight=tuple(f.spec.number for f in ctx.in_flight.values()),
            )
        )


def _launch_next(ctx: Context) -> bool:
    """Ask for a point and launch it, or settle it without a launch; False when nothing can be asked."""
    t_ask = time.perf_counter()
    running = {sp.key(f.spec.params): f.spec.number for f in ctx.in_flight.values() if f.spec.role is TrialRole.search}
    proposal = ctx.policy.next(running)
    if proposal is None:
        stop(ctx, StopReason(StopKind.grid_exhausted, "grid exhausted: every feasible point was measured"))
        return False
    if not isinstance(proposal, Proposal):
        log.info("trial %d %s, not launched: %s", proposal.number, proposal.how.value, proposal.detail)
        ctx.emit(TrialSkipped(number=proposal.number, why=_skip_line(proposal)))
        return _skipped(ctx)
    number, params, role = proposal.number, proposal.params, TrialRole(proposal.role)
    ask_s = time.perf_counter() - t_ask
    tdir = ctx.paths.trial_dir(number)
    effective = eagle.effective(params)  # what the server runs: SGLang's forced values filled in
    spec = TrialSpec(
        number=number,
        params=params,
        effective_params=effective,
        role=role,
        repeats=ctx.spec.benchmark.repeats,
        trial_dir=str(tdir),
        seed=ctx.spec.sampler.seed * 100_003 + number,
        sweep_started_at=ctx.started_at,
        experiment=ctx.spec,
        outputs=_screen.request(ctx, role),
    )
    tdir.mkdir(parents=True, exist_ok=True)  # spec.json is the trial runner's to write
    t_mlflow = time.perf_counter()
    run_id = ctx.track.start_trial(
        ctx.parent_run_id or "",
        number=number,
        params=effective,
        role=role.value,
        tags={"sweep.engine": ctx.spec.engine},
    )
    ctx.overhead[number] = {"number": number, "ask_s": ask_s, "mlflow_start_s": time.perf_counter() - t_mlflow}
    ctx.study.set_trial_attrs(number, {"role": role.value, "mlflow_run_id": run_id or "", "trial_dir": str(tdir)})
    ctx.overhead[number]["submitted_at"] = ctx.clock.time()
    handle = ctx.executor.submit(spec)
    ctx.in_flight[handle] = InFlight(spec, run_id)
    launched(ctx)
    log.info("trial %d launched (%s): %s", number, role.value, {k: v for k, v in params.items() if v is not None})
    ctx.emit(TrialLaunched(number=number, role=role.value, params=params))
    ctx.write_state("running")
    return True


def _skip_line(settled: Settled) -> str:
    """Why a proposal was not launched, short enough for one console line: an infeasible point's rule
    (its numbers are in sweep.log), a repeat's trial."""
    if settled.how is Settlement.infeasible and (why := eagle.infeasible(settled.params)) is not None:
        return f"infeasible ({why.rule.value})"
    return settled.detail


def _skipped(ctx: Context) -> bool:
    if skipped(ctx) >= MAX_SKIPPED_PROPOSALS:
        stop(
            ctx,
            StopReason(
                StopKind.space_exhausted,
                f"search space exhausted: {MAX_SKIPPED_PROPOSALS} proposals in a row were "
                f"infeasible or already measured",
            ),
        )
        return False
    return True


def keep_files(trial_dir: Path, files: dict[str, bytes]) -> None:
    """Files from a worker on another host; a file already here (same host) is whole, the copy may be a tail."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = trial_dir / name
        if not target.exists():
            target.write_bytes(data)


def _collect(ctx: Context, finished: Finished) -> None:
    flight = ctx.in_flight.pop(finished.handle)
    spec, outcome = flight.spec, finished.outcome
    timing = ctx.overhead.get(spec.number, {})
    collected_at = ctx.clock.time()
    t_files = time.perf_counter()
    written = finished.lost is None
    if ctx.abort_reason and outcome.status is not TrialStatus.COMPLETE:
        outcome = outcome.model_copy(update={"failure_kind": FailureKind.interrupted, "reason": ctx.abort_reason})
        written = False
    keep_files(Path(spec.trial_dir), finished.files)
    if timing and outcome.started_at:
        timing.update(
            dispatch_s=max(outcome.started_at - timing.pop("submitted_at"), 0.0),
            return_s=max(collected_at - outcome.finished_at, 0.0) if outcome.finished_at else 0.0,
            files_s=time.perf_counter() - t_files,
        )
    if _baseline_in_flight(ctx) and outcome.status is TrialStatus.COMPLETE:
        # Recorded once the baseline is, so its speed-up is known (outcome.json is already written).
        ctx.waiting_for_baseline.append((outcome, flight.run_id))
        return
    record(ctx, outcome, flight.run_id, written=written)
    if outcome.role is TrialRole.baseline:
        while ctx.waiting_for_baseline:
            record(ctx, *ctx.waiting_for_baseline.pop(0))


def _baseline_in_flight(ctx: Context) -> bool:
    """The first baseline is still being measured (so no trial has a speed-up yet)."""
    return not baseline_measured(ctx) and any(f.spec.role is TrialRole.baseline for f in ctx.in_flight.values())
