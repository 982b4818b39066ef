"""Recording a finished trial (Optuna first, then MLflow), and the rules that follow from it: the
failure budget, best so far, the baseline re-measured every k trials, when to stop launching."""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.config.experiment import SweepSpec
from orchestrator.records import FailureKind, TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import select
from orchestrator.search import space as sp
from orchestrator.search.proposal import REMEASURE_ATTR
from orchestrator.search.sampler import OUTPUTS_CHANGED_ATTR, RUN_TTFT_ATTR
from orchestrator.sweep import _screen, schedule
from orchestrator.sweep._context import Context
from orchestrator.sweep._workdir import write_json
from orchestrator.sweep.state import StopKind, StopReason, TrialFinished
from orchestrator.verdict.arms import sglang_default_speculation

log = logging.getLogger("sweep")

NOT_THE_PARAMETERS = frozenset({FailureKind.worker_lost, FailureKind.port_in_use, FailureKind.internal_error})
"""Failure kinds that say nothing about the configuration: never blacklisted, measured again once."""
LEARNED_FAILURES = frozenset(
    {FailureKind.oom, FailureKind.nccl_hang, FailureKind.startup_timeout, FailureKind.server_crash}
)
"""Failures the configuration causes and the sampler is told to avoid (a violated constraint for TPE):
it proposes that region less. Others are only blacklisted as exact points."""
FINISHED_AT_ATTR = "finished_at"
"""The study attribute that keeps when a trial was measured, on the sweep's clock (the outcome's
`finished_at`): --resume places a baseline at it when outcome.json is unreadable."""


def objective_values(ctx: Context, outcome: TrialOutcome) -> list[float] | None:
    """The values Optuna is told (objective, then the secondary one), or None if any is missing."""
    m = outcome.metrics
    if m is None:
        return None
    objective = ctx.spec.objective
    names = [objective.metric] + ([objective.secondary] if objective.secondary else [])
    values = [getattr(m, n) for n in names]
    return None if any(v is None for v in values) else [float(v) for v in values]


def duration(seconds: float) -> str:
    """30 s, 45 min, 8.0 h: a budget the way a user wrote it, roughly."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


# ------------------------------------------------------------------ the progress counters: written here only


def stop(ctx: Context, reason: StopReason) -> None:
    """Launch nothing more, for `reason` (what sweep.json, the console and the summary show)."""
    ctx.progress.stop = reason


def launched(ctx: Context) -> None:
    """A trial's server was launched (or, resumed, one the killed driver launched is counted)."""
    ctx.progress.launched += 1
    ctx.progress.consecutive_skips = 0


def skipped(ctx: Context) -> int:
    """A proposal was settled without a launch; returns how many in a row."""
    ctx.progress.skipped += 1
    ctx.progress.consecutive_skips += 1
    return ctx.progress.consecutive_skips


def baseline_measured_at(ctx: Context, at: float, value: float) -> None:
    """A measurement of the baseline (a search-phase baseline trial, or a confirmation round), at the
    outcome's `finished_at`; kept in the order measured, so a --resume rebuilds the same list."""
    bisect.insort(ctx.progress.baselines, (at, value))


def recovered(ctx: Context, *, complete: bool, failure_kind: str | None) -> None:
    """A trial settled by the killed driver, counted again on --resume."""
    p = ctx.progress
    if complete:
        p.complete += 1
    else:
        p.failed += 1
        p.failures[failure_kind or "unknown"] += 1
    p.launched += 1
    p.finished += 1


def should_launch(ctx: Context) -> bool:
    """Whether another trial may start; on the trial or wall-time budget, say why not (once)."""
    p = ctx.progress
    if ctx.interrupts.pressed or p.stop:
        return False
    if p.launched >= ctx.budget_trials:
        p.stop = StopReason(StopKind.trial_budget, f"trial budget reached ({ctx.budget_trials})")
        return False
    if ctx.deadline_passed():
        p.stop = StopReason(
            StopKind.wall_time, f"wall-time budget reached ({duration(ctx.timeout_s)}); trials in flight finished"
        )
        return False
    if ctx.reserve is None and ctx.spec.promotion.max_rounds:
        plan_reserve(ctx)  # before the first launch: sweep.json and `sweep status` show the plan from the start
    if p.launched and not _search_fits(ctx):
        held = ctx.reserve.seconds if ctx.reserve else 0.0
        p.stop = StopReason(
            StopKind.wall_time,
            (
                f"wall-time budget reached for the search after {duration(ctx.elapsed())} of "
                f"{duration(ctx.timeout_s)}: {duration(held)} held back for the confirmation "
                f"({len(ctx.reserve.arms) if ctx.reserve else 0} arm(s) x {ctx.spec.promotion.min_rounds} rounds); "
                f"trials in flight finished"
            ),
        )
        return False
    return True


def plan_reserve(ctx: Context) -> None:
    """Plan (again) the confirmation held back from the search, from this sweep's measured trials."""
    ctx.reserve = schedule.reserve(
        ctx.spec, ctx.outcomes, wall_s=ctx.timeout_s, slots=ctx.spec.budget.concurrent_trials
    )


def _search_fits(ctx: Context) -> bool:
    """Whether one more search trial is expected to end before the confirmation's reserve begins."""
    if not ctx.spec.promotion.max_rounds:
        return True
    if ctx.reserve is None:
        plan_reserve(ctx)
    held = ctx.reserve.seconds if ctx.reserve else 0.0
    trial_s = schedule.run_seconds(ctx.spec, ctx.outcomes)(ctx.spec.benchmark.concurrency)
    return ctx.elapsed() + trial_s + held <= ctx.timeout_s


def abort_in_flight(ctx: Context, reason: str) -> None:
    """Kill the servers of the trials in flight; their outcomes come back as interrupted."""
    if ctx.abort_reason:
        return
    ctx.abort_reason = reason
    for handle, flight in ctx.in_flight.items():
        log.warning("aborting trial %d: %s", flight.spec.number, reason)
        ctx.executor.abort(handle)


def record(ctx: Context, outcome: TrialOutcome, run_id: str | None, *, written: bool = True) -> None:
    """Tell Optuna, then MLflow (or its outbox). `written`: outcome.json holds this outcome already
    (the trial runner wrote it); otherwise, or when the objective is missing, it is written here first."""
    tdir = Path(outcome.trial_dir) if outcome.trial_dir else ctx.paths.trial_dir(outcome.number)
    values = objective_values(ctx, outcome) if outcome.status is TrialStatus.COMPLETE else None
    if outcome.status is TrialStatus.COMPLETE and values is None:  # objective missing from a measurement
        outcome = outcome.model_copy(
            update={
                "status": TrialStatus.FAILED,
                "failure_kind": FailureKind.metric_missing,
                "reason": f"objective {ctx.spec.objective.metric} missing",
            }
        )
        written = False
    screened = _screen.judge(ctx, outcome, tdir)
    if screened is not outcome:  # its outputs changed: kept with why, never a candidate
        outcome, written = screened, False
    if not written:
        tdir.mkdir(parents=True, exist_ok=True)
        write_json(tdir / "outcome.json", outcome.model_dump(mode="json"))
    t_tell = time.perf_counter()
    extra: dict[str, float] = {}
    _tell(ctx, outcome, values, _attrs(outcome), extra, tdir)
    if outcome.failure_kind is not FailureKind.interrupted:
        ctx.progress.finished += 1
        ctx.outcomes.append(outcome)
        if outcome.status is TrialStatus.COMPLETE:
            plan_reserve(ctx)  # measured seconds replace the cost model's
    tell_s = time.perf_counter() - t_tell
    t_log = time.perf_counter()
    tags: dict[str, str] = {"sweep.engine": ctx.spec.engine}
    if outcome.outputs_changed:
        tags["sweep.outputs_changed"] = outcome.outputs_changed[:500]
    ctx.track.log_trial(ctx.parent_run_id or "", outcome, run_id=run_id or None, extra_metrics=extra, extra_tags=tags)
    _keep_overhead(ctx, outcome.number, tell_s=tell_s, mlflow_log_s=time.perf_counter() - t_log)
    _check_failure_budget(ctx)
    _maybe_remeasure_baseline(ctx)
    if outcome.role is TrialRole.search and outcome.status is TrialStatus.COMPLETE:
        _maybe_remeasure_near_tie(ctx)
    ctx.emit(TrialFinished(outcome=outcome, speedup=extra.get("speedup_vs_baseline")))
    ctx.write_state("running")


def _attrs(outcome: TrialOutcome) -> dict[str, Any]:
    """The trial's attributes in the study, with its measured cost (`sweep status` estimates from the
    real start-up and benchmark times)."""
    attrs: dict[str, Any] = {
        "role": outcome.role.value,
        "status": outcome.status.value,
        "fingerprint_hash": outcome.fingerprint_hash,
        "node": outcome.node,
        FINISHED_AT_ATTR: outcome.finished_at,
    }
    if outcome.outputs_changed:
        attrs[OUTPUTS_CHANGED_ATTR] = outcome.outputs_changed[:500]
    attrs.update(
        {
            f"{phase}_s": round(float(outcome.timings[phase]), 3)
            for phase in ("server_start", "bench")
            if outcome.timings.get(phase) is not None
        }
    )
    return attrs


def _tell(
    ctx: Context,
    outcome: TrialOutcome,
    values: list[float] | None,
    attrs: dict[str, Any],
    extra: dict[str, float],
    tdir: Path,
) -> None:
    """Tell the study: a measurement, an interruption (measured again) or a failure."""
    if values is not None:
        _told_complete(ctx, outcome, values, attrs, extra)
    elif outcome.failure_kind is FailureKind.interrupted:
        # Not a verdict on the parameters: nothing counts, they are measured again (once per interruption).
        ctx.study.tell_failed(
            outcome.number, {**attrs, "failure_kind": FailureKind.interrupted.value, "reason": outcome.reason[:500]}
        )
        ctx.study.enqueue(outcome.params, {"role": outcome.role.value, "remeasure_of": outcome.number})
        log.warning(
            "trial %d interrupted (%s); its parameters are queued to be measured again", outcome.number, outcome.reason
        )
    else:
        _told_failed(ctx, outcome, attrs, tdir)


def _keep_overhead(ctx: Context, number: int, **timings: float) -> None:
    """The trial's orchestration timings, appended to overhead.jsonl (bench/orchestration_overhead.py)."""
    timing = ctx.overhead.pop(number, None)
    if timing is not None and "dispatch_s" in timing:
        timing.update(timings)
        with open(ctx.paths.overhead, "a", encoding="utf-8") as f:
            f.write(json.dumps(timing) + "\n")


def _told_complete(
    ctx: Context, outcome: TrialOutcome, values: list[float], attrs: dict[str, Any], extra: dict[str, float]
) -> None:
    p = ctx.progress
    ttft = outcome.metrics.ttft_ms_p50 if outcome.metrics is not None else None
    if ttft is not None and select.run_speed_metric(ctx.spec.objective.metric, ctx.spec.benchmark.concurrency):
        attrs[RUN_TTFT_ATTR] = ttft
    if outcome.role is TrialRole.baseline:
        baseline_measured_at(ctx, outcome.finished_at, values[0])
    base = select.nearest_baseline(outcome.finished_at, p.baselines)
    if base:
        extra["speedup_vs_baseline"] = select.speedup(values[0], base, direction=ctx.spec.objective.direction)
        attrs["speedup_vs_baseline"] = extra["speedup_vs_baseline"]
    ctx.study.tell_complete(outcome.number, values, attrs)
    p.complete += 1
    p.consecutive_failures = 0
    ctx.policy.remember(outcome.params, outcome.number, values)
    if not outcome.outputs_changed:
        update_best(ctx, outcome.number, values[0], outcome.params, outcome.role.value)


def _told_failed(ctx: Context, outcome: TrialOutcome, attrs: dict[str, Any], tdir: Path) -> None:
    p = ctx.progress
    kind = outcome.failure_kind.value if outcome.failure_kind else FailureKind.metric_missing.value
    learn = outcome.failure_kind in LEARNED_FAILURES and outcome.role is TrialRole.search
    ctx.study.tell_failed(outcome.number, {**attrs, "failure_kind": kind, "reason": outcome.reason[:500]}, learn=learn)
    p.failed += 1
    p.consecutive_failures += 1
    p.failures[kind] += 1
    if outcome.failure_kind in NOT_THE_PARAMETERS:
        # The machine, not the configuration, failed: measure these parameters again once.
        if outcome.number not in ctx.requeued and outcome.role is TrialRole.search:
            ctx.requeued.add(outcome.number)
            ctx.study.enqueue(outcome.params, {"role": outcome.role.value, "remeasure_of": outcome.number})
    else:
        ctx.policy.remember(outcome.params, outcome.number, None, learn=learn)
    log.warning("trial %d failed: %s: %s", outcome.number, kind, outcome.reason)
    if outcome.role is TrialRole.baseline:
        p.stop = StopReason(
            StopKind.baseline_failed,
            f"the baseline failed ({kind}: {outcome.reason}); nothing can be compared "
            f"against it: fix the server set-up first (see {tdir / 'server.log'})",
        )
        abort_in_flight(ctx, "aborted: the baseline failed")


def update_best(ctx: Context, number: int, value: float | None, params: dict[str, Any], role: str) -> None:
    p = ctx.progress
    if value is None or role != TrialRole.search.value:
        return
    better = p.best_value is None or (
        value > p.best_value if ctx.spec.objective.direction == "maximize" else value < p.best_value
    )
    if better:
        p.best_number, p.best_value, p.best_params = number, value, dict(params)


def _check_failure_budget(ctx: Context) -> None:
    """Stop launching when the set-up, not the search, is broken (issue 34): the default configuration
    failed, or the search's failures, past budget.max_consecutive_failures in a row or
    budget.max_failure_rate of budget.min_trials_for_failure_rate or more, are one kind regardless of the
    parameters. Failures the parameters explain never stop the night: the search learns the region and
    spends the time outside it. (A failed baseline stops the sweep where it is told: _told_failed.)"""
    p, b = ctx.progress, ctx.spec.budget
    if p.stop:  # the first reason to stop is the one to report; trials in flight still finish
        return
    searched = [o for o in ctx.outcomes if o.role is TrialRole.search]
    failed = [o for o in searched if o.status is TrialStatus.FAILED]
    broken = _defaults_failed(ctx, failed)
    if broken is None and p.consecutive_failures >= b.max_consecutive_failures:
        run = failed[-p.consecutive_failures :]
        if (why := unexplained(run, ctx.outcomes)) is not None:
            broken = StopReason(
                StopKind.consecutive_failures,
                f"the set-up is broken: {len(run)} trials failed in a row "
                f"(budget.max_consecutive_failures={b.max_consecutive_failures}), {why}; "
                f"failures by kind: {dict(p.failures)}",
            )
    if (
        broken is None
        and len(searched) >= b.min_trials_for_failure_rate
        and len(failed) / len(searched) > b.max_failure_rate
        and (why := unexplained(failed, ctx.outcomes)) is not None
    ):
        broken = StopReason(
            StopKind.failure_rate,
            f"the set-up is broken: {len(failed)} of {len(searched)} search trials failed, above "
            f"budget.max_failure_rate={b.max_failure_rate:g}, {why}; failures by kind: {dict(p.failures)}",
        )
    if broken is not None:
        p.stop = broken


def default_configuration(spec: SweepSpec) -> dict[str, Any] | None:
    """What the server runs untuned: the model's default speculation, every other knob at the engine's
    default (verdict.pick.sglang_default_speculation on the baseline); None where the space has no speculation
    (the default configuration is then the baseline)."""
    base = sp.baseline_params(spec.space)
    start = sglang_default_speculation(spec, base)
    return None if start == base else start


def _defaults_failed(ctx: Context, failed: list[TrialOutcome]) -> StopReason | None:
    """The stop when the default configuration was measured and failed for a reason of its own (not the
    machine's: NOT_THE_PARAMETERS, which is measured again)."""
    default = default_configuration(ctx.spec)
    if default is None:
        return None
    key = sp.key(default)
    hit = next((o for o in failed if o.failure_kind not in NOT_THE_PARAMETERS and sp.key(o.params) == key), None)
    if hit is None:
        return None
    kind = hit.failure_kind.value if hit.failure_kind else "unknown"
    return StopReason(
        StopKind.defaults_failed,
        f"the set-up is broken: the default configuration (the model's default speculation, engine defaults "
        f"elsewhere) failed in trial {hit.number} ({kind}: {hit.reason[:300]}); no tuned configuration can be "
        f"trusted over it: fix the server set-up first (see {ctx.paths.trial_dir(hit.number) / 'server.log'})",
    )


def unexplained(failures: Sequence[TrialOutcome], outcomes: Sequence[TrialOutcome]) -> str | None:
    """Why `failures` (search trials) say the set-up is broken rather than their parameters, or None when
    their parameters explain them (or nothing is measured yet to tell).

    Failures of NOT_THE_PARAMETERS kinds are never explained; more than one kind always is (the parameters
    make the difference). One kind is explained, while no search trial was measured, by a knob value all
    the failures share and a measured trial (the baseline) runs without; once search trials were
    measured, by any failure that a measured trial does not match in some two of its knob values (a
    region, however shaped, that the search can leave)."""
    if not failures:
        return None
    kinds = {o.failure_kind for o in failures}
    names = ", ".join(sorted(k.value if k else "unknown" for k in kinds))
    if kinds <= NOT_THE_PARAMETERS:
        return f"all {names}: failures of the machine, not of any configuration"
    ok = [o for o in outcomes if o.status is TrialStatus.COMPLETE]
    if len(kinds) > 1 or not ok:
        return None
    return _one_kind(failures, ok, names)


def _one_kind(failures: Sequence[TrialOutcome], ok: Sequence[TrialOutcome], kind: str) -> str | None:
    """unexplained's rule for failures of one `kind` beside the measured trials `ok`."""
    measured = [o.params for o in ok]
    if not any(o.role is TrialRole.search for o in ok):
        if _shared_region(failures, measured):
            return None
        return f"all {kind} with nothing in their parameters that the measured trials run without"
    if all(_matched(o.params, measured) for o in failures):
        return f"all {kind} in configurations that measured trials match value for value, two knobs at a time"
    return None


def _shared_region(failures: Sequence[TrialOutcome], ok: Sequence[dict[str, Any]]) -> bool:
    """Whether all `failures` share a knob's value that a measured point of `ok` runs without."""
    first = failures[0].params
    return any(
        all(o.params.get(name) == value for o in failures) and any(q.get(name) != value for q in ok)
        for name, value in first.items()
    )


def _matched(point: dict[str, Any], ok: Sequence[dict[str, Any]]) -> bool:
    """Whether every two knob values of `point` are found together in some measured point of `ok`."""
    names = sorted(point)
    pairs = list(itertools.combinations(names, 2)) or [(n, n) for n in names]
    return all(any(q.get(a) == point[a] and q.get(b) == point[b] for q in ok) for a, b in pairs)


def _maybe_remeasure_baseline(ctx: Context) -> None:
    k = ctx.spec.budget.baseline_every
    if k and ctx.progress.finished and ctx.progress.finished % k == 0 and should_launch(ctx):
        ctx.study.enqueue(sp.baseline_params(ctx.spec.space), {"role": TrialRole.baseline.value})


def _maybe_remeasure_near_tie(ctx: Context) -> None:
    """Every sampler.remeasure_every-th complete search trial after the start-up trials, queue the best
    point or its rival again when the two are not told apart (results.select.near_tie)."""
    k = ctx.spec.sampler.remeasure_every
    if not k:
        return
    done = [o for o in ctx.outcomes if o.role is TrialRole.search and o.status is TrialStatus.COMPLETE]
    if len(done) < ctx.spec.sampler.startup_trials or not should_launch(ctx):
        return
    objective = ctx.spec.objective
    eligible = select.eligible_values(done, metric=objective.metric, constraints=objective.bounds())
    adjustable = select.run_speed_metric(objective.metric, ctx.spec.benchmark.concurrency)
    k = select.remeasure_interval(k, eligible, direction=objective.direction, adjust=adjustable)
    if len(done) % k:
        return
    again = select.near_tie(eligible, direction=objective.direction, adjust=adjustable)
    if again is not None:
        ctx.study.enqueue(again.params, {"role": TrialRole.search.value, REMEASURE_ATTR: again.number})
        log.info(
            "the next trial measures trial %d's parameters again: a near-tie with the best point "
            "(sampler.remeasure_every)",
            again.number,
        )


def baseline_measured(ctx: Context) -> bool:
    return any(o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE for o in ctx.outcomes)
