"""Registering the chosen configuration: the registry version under the alias with its description
(rendered from the Verdict it is about to reach), champion.env, the MLflow run that measured it.
"""

from __future__ import annotations

import logging

from orchestrator.errors import TrackingError
from orchestrator.records import TrialOutcome, TrialRole, TrialStatus
from orchestrator.verdict import render as verdict_render
from orchestrator.verdict.arm import ConfirmationRow
from orchestrator.verdict.port import Chosen, Port
from orchestrator.verdict.steps import Champion, Choice, Gate, Promotion, Registered
from orchestrator.verdict.value import Outcome, Verdict

log = logging.getLogger("sweep")


def register(
    port: Port,
    champion: Champion,
    choice: Choice,
    rows: tuple[ConfirmationRow, ...] = (),
    gate: Gate | None = None,
) -> Promotion:
    """Register the chosen configuration under the alias and write the sweep's champion.env: its own
    knobs, figures and MLflow run (a derived configuration's first confirmation run at the gate's level;
    no search-phase figure, which was measured with other knobs)."""
    spec = port.spec
    source = _source(port, champion, choice, rows)
    if source is None:
        return Promotion(
            Outcome.no_champion,
            f"{choice.verdict}; but not promoted: the MLflow run of {choice.label} is not found "
            f"({port.pending()} result(s) wait in the outbox); when MLflow is reachable run "
            f"`sweep sync` and {port.resume_hint} to promote",
            champion,
            confirmed=choice.figures,
        )
    run_id, trial = source
    metrics = choice.figures.metrics()
    if not choice.derived:
        metrics[f"search_{champion.metric}"] = float(getattr(trial.metrics, champion.metric))
    chosen = Chosen(
        run_id=run_id,
        params=dict(choice.params),
        number=choice.number,
        metrics=metrics,
        fingerprint_hash=trial.fingerprint_hash,
        allreduce_backend="" if choice.derived else trial.allreduce_path,
        derivation=choice.derivation,
        description=_version_description(port, champion, choice, gate),
    )
    try:
        version, env_path = port.register(chosen)
    except TrackingError as exc:
        log.warning("not promoted: %s", exc)
        return Promotion(
            Outcome.no_champion, f"{choice.verdict}; but not promoted: {exc}", champion, confirmed=choice.figures
        )
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


def _version_description(port: Port, champion: Champion, choice: Choice, gate: Gate | None) -> str:
    """The registry version's description: the Verdict the promotion is about to reach, rendered as every
    view renders it (orchestrator.verdict.render)."""
    fields = Promotion(
        choice.outcome, choice.verdict, champion, gate=gate, confirmed=choice.figures, choice=choice
    ).summary_fields(champion.metric)
    about = Verdict.of(fields, champion.metric)
    return "\n\n".join(verdict_render.markdown(about))[:5000]


def _source(
    port: Port, champion: Champion, choice: Choice, rows: tuple[ConfirmationRow, ...]
) -> tuple[str, TrialOutcome] | None:
    """The MLflow run that measured the chosen configuration, with the trial it is (or comes from):
    the champion's or the runner-up's search run; a derived one's first complete confirmation run."""
    if choice.name == "champion":
        return champion.run_id, champion.trial
    trial = next((o for o in port.outcomes if o.number == choice.number and o.role is TrialRole.search), champion.trial)
    if not choice.derived:
        run_id = port.run_id_of(trial)
        return None if run_id is None else (run_id, trial)
    first = next((r for r in rows if r.who == choice.name and r.status is TrialStatus.COMPLETE), None)
    if first is None:
        return None
    run_id = port.confirm_run_id(choice.number, port.arm_dir(first.round, choice.name))
    return None if run_id is None else (run_id, trial)
