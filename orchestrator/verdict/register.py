"""Registering the chosen configuration: the registry version under the alias with its description
(rendered from the Verdict it is about to reach), champion.env, the MLflow run that measured it.
"""

from __future__ import annotations

import logging

from orchestrator.errors import TrackingError
from orchestrator.fsio import write_atomic
from orchestrator.records import TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import formats
from orchestrator.sweep import _confirm
from orchestrator.sweep._context import Context
from orchestrator.sweep._promotion import Champion, Choice, Gate, Promotion, Registered
from orchestrator.sweep.state import Outcome, TrackingWait
from orchestrator.trial import observe
from orchestrator.trial import plan as planner
from orchestrator.verdict import render as verdict_render
from orchestrator.verdict.value import Verdict

log = logging.getLogger("sweep")

MLFLOW_WAIT_AT_END_S = 60.0
"""At the end, how long results waiting in the outbox wait for MLflow to return before promotion gives up."""


Constraints = dict[str, tuple[float | None, float | None]]


def constraints(ctx: Context) -> Constraints:
    return ctx.spec.objective.bounds()


def gate_level_named(ctx: Context) -> int | None:
    """The level the gate decides at, when the verdict must name it (not one stream, or other levels
    reported beside it); None otherwise."""
    spec = ctx.spec
    level = spec.benchmark.concurrency
    return level if level != 1 or spec.promotion.concurrency else None


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
        run_id = run_id_of(ctx, trial)
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


def run_id_of(ctx: Context, outcome: TrialOutcome) -> str | None:
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
