"""Sequential confirmation: interleaved rounds of the champion, the baseline and the arms that say
why the champion won and at which load, through the sweep's executor, until the evidence decides.

Each round measures every open arm once, in an order that reverses from round to round (A B C, then
C B A, see `results.sequential.round_order`), up to the executor's free slots at a time. The main
pair (champion, baseline) continues until `results.sequential.decide` returns a verdict; the other
arms (ablations, other concurrency levels) are measured for `min_rounds` rounds only, which keeps
their cost bounded while giving each an interval.

With a speculating champion (on an SGLang version that has --speculative-adaptive), each
promotion.concurrency level, or the gate's own level when none is listed, also measures the champion
as the other kind of step control: adaptive when it runs a fixed count, the best fixed count of the
search when it is adaptive (`steps_arms`); `results.contrib.steps_gain` turns them into "adaptive
x1.04 over fixed 3 steps".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import eagle, knobs
from orchestrator.config.experiment import SweepSpec
from orchestrator.execute.base import Finished
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialSpec, TrialStatus
from orchestrator.results import contrib, sequential
from orchestrator.sweep._context import Context
from orchestrator.sweep._loop import WAIT_S, keep_files
from orchestrator.sweep.state import ConfirmationRun

log = logging.getLogger("sweep")


@dataclass(frozen=True)
class Arm:
    """One configuration measured in the rounds."""

    name: str
    """champion | baseline | no_speculation | default_communication | runner_up | champion@8 | baseline@8 ..."""
    params: dict[str, ParamValue]
    number: int
    """The trial it comes from (-1: the baseline)."""
    concurrency: int
    main: bool = False
    """The champion/baseline pair the verdict is about: measured until decided."""


@dataclass
class Measured:
    """What the rounds measured: per arm, the objective value of each round that completed."""

    values: dict[str, dict[int, float]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    decision: sequential.Decision | None = None
    rounds: int = 0
    stopped: str = ""
    """Why the rounds stopped before a verdict (interrupted, the wall time), or empty."""

    def main(self) -> tuple[list[float], list[float]]:
        champ, base = self.values.get("champion", {}), self.values.get("baseline", {})
        rounds = sorted(set(champ) & set(base))
        return [champ[i] for i in rounds], [base[i] for i in rounds]


def at_concurrency(spec: SweepSpec, level: int) -> SweepSpec:
    """The experiment benchmarked at `level` concurrent requests (at least one request per stream)."""
    if level == spec.benchmark.concurrency:
        return spec
    bench = spec.benchmark.model_copy(update={"concurrency": level, "requests": max(spec.benchmark.requests, level)})
    return spec.model_copy(update={"benchmark": bench})


def steps_arms(spec: SweepSpec, champion: TrialOutcome, outcomes: list[TrialOutcome],
               constraints: dict[str, tuple[float | None, float | None]]) -> tuple[list[Arm], str, str]:
    """The arms that tell adaptive from fixed steps at each promotion.concurrency level (at the
    gate's own level when none is listed: one arm), the counterpart's kind (contrib.ADAPTIVE or FIXED)
    and the fixed side in words; ([], "", "") when the champion does not speculate or the SGLang
    version lacks the flag."""
    if spec.sglang_version not in knobs.ADAPTIVE_VERSIONS:
        return [], "", ""
    best = contrib.best_fixed_steps(outcomes, metric=spec.objective.metric, direction=spec.objective.direction,
                                    constraints=constraints)
    found = contrib.steps_counterpart(champion.params, best)
    if found is None or eagle.infeasible(found[1]) is not None:
        return [], "", ""
    kind, params, fixed = found
    level = spec.benchmark.concurrency
    levels = spec.promotion.concurrency or (level,)
    return [Arm(contrib.arm_name(kind, c, level), params, champion.number, c) for c in levels], kind, fixed


def run_rounds(ctx: Context, arms: list[Arm], plan: sequential.RoundsPlan) -> Measured:
    """Measure the arms round after round until the main pair decides, max_rounds, the wall time
    (beyond min_rounds: the minimum is always measured) or an interruption."""
    spec = ctx.spec
    metric, direction = spec.objective.metric, spec.objective.direction
    out = Measured(values={a.name: {} for a in arms})
    # This run's own time counts (not the first start's, after --resume): a round takes about as long
    # as the slowest trial of this sweep, times the arms measured one slot after another.
    trial_s = max((o.finished_at - o.started_at for o in ctx.outcomes if o.finished_at), default=0.0)
    slots = max(ctx.executor.idle(), 1)
    for i in range(plan.max_rounds):
        open_arms = [a for a in arms if a.main or i < plan.min_rounds]
        round_s = trial_s * -(-len(open_arms) // slots)
        if i >= plan.min_rounds and ctx.elapsed() + round_s > ctx.timeout_s:
            out.stopped = (f"the wall-time budget ({ctx.timeout_s / 60:.0f} min for this run) leaves no time "
                           f"for round {i + 1}")
            break
        order = open_arms if i % 2 == 0 else list(reversed(open_arms))
        for arm, finished in _measure(ctx, order, i, plan.max_rounds):
            if finished.lost is not None:
                out.rows.append({"round": i, "who": arm.name, "status": "FAILED", "reason": finished.lost[:200]})
                continue
            outcome = finished.outcome
            keep_files(ctx.paths.confirm_dir(i, arm.name.replace("@", "-c")), finished.files)
            ctx.track.log_trial(ctx.parent_run_id or "", outcome, run_id=None, extra_metrics={},
                                extra_tags={"sweep.confirm_round": str(i), "sweep.confirm_of": arm.name,
                                            "sweep.confirm_concurrency": str(arm.concurrency)})
            raw = getattr(outcome.metrics, metric) if outcome.metrics is not None else None
            value = float(raw) if outcome.status is TrialStatus.COMPLETE and raw is not None and raw > 0 else None
            ok = value is not None
            if value is not None:
                out.values[arm.name][i] = value
                if arm.name == "baseline":
                    ctx.progress.baselines.append((outcome.finished_at, value))  # the end-of-sweep baseline
            out.rows.append({"round": i, "who": arm.name, "concurrency": arm.concurrency,
                             "status": outcome.status.value, metric: value,
                             **({} if ok else {"reason": outcome.reason[:200]})})
        out.rounds = i + 1
        if ctx.interrupts.pressed:
            out.stopped = "interrupted during the confirmation rounds"
            break
        champ, base = out.main()
        if len(champ) >= plan.min_rounds:
            out.decision = sequential.decide(champ, base, plan, direction=direction)
            if out.decision.verdict is not None:
                return out
    champ, base = out.main()
    if len(champ) >= 2:
        # Stopped early or rounds failed: the evidence so far, and no verdict but "undecided".
        ev = sequential.evidence(champ, base, direction=direction, level=plan.level)
        why = out.stopped or f"{out.rounds - len(champ)} of {out.rounds} rounds failed"
        out.decision = sequential.Decision(
            sequential.Verdict.undecided, ev,
            f"undecided after {len(champ)} complete round(s): {_pct(ev.gain)} [{_pct(ev.low)}, {_pct(ev.high)}]; "
            f"{why}; see {ctx.paths.root / 'confirm'}, then {ctx.resume_hint} or raise budget.wall_time")
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _measure(ctx: Context, order: list[Arm], i: int, of: int) -> Iterator[tuple[Arm, Finished]]:
    """Run the arms of round `i` in `order`, as many at a time as the executor has free slots."""
    executor = ctx.executor
    pending = list(order)
    running: dict[int, Arm] = {}
    while pending or running:
        while pending and executor.idle() > 0 and not ctx.interrupts.pressed:
            arm = pending.pop(0)
            tdir = ctx.paths.confirm_dir(i, arm.name.replace("@", "-c"))
            spec = TrialSpec(number=arm.number, params=arm.params, role=TrialRole.confirm,
                             repeats=ctx.spec.benchmark.repeats, trial_dir=str(tdir),
                             seed=ctx.spec.sampler.seed * 7919 + i * 64 + order.index(arm),
                             sweep_started_at=ctx.started_at, experiment=at_concurrency(ctx.spec, arm.concurrency))
            ctx.emit(ConfirmationRun(round=i + 1, of=of, who=arm.name))
            running[executor.submit(spec)] = arm
        if ctx.interrupts.pressed:
            pending.clear()
        if not running:
            return
        for finished in executor.wait(WAIT_S):
            arm_done = running.pop(finished.handle, None)
            if arm_done is not None:
                yield arm_done, finished
        if ctx.interrupts.pressed >= 2 and not ctx.abort_reason:
            ctx.abort_reason = "aborted by a second Ctrl-C"
            for handle in running:
                executor.abort(handle)
