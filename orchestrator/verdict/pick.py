"""The promotion's first steps: the search's pick with its baseline and MLflow run (or why there is
none), the verdict without a gate, and the arms the confirmation measures.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from orchestrator.config import eagle
from orchestrator.config.experiment import SweepSpec
from orchestrator.probe.run import default_speculation
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialStatus, speculation_knob
from orchestrator.results import contrib, select
from orchestrator.search import space as sp
from orchestrator.verdict import contender, rounds
from orchestrator.verdict.arm import Arm
from orchestrator.verdict.port import Port
from orchestrator.verdict.register import constraints, gate_level_named
from orchestrator.verdict.steps import Arms, Champion, Choice, Promotion
from orchestrator.verdict.value import Outcome

log = logging.getLogger("sweep")


def pick(port: Port) -> Champion | Promotion:
    """The champion of the search, with the baseline and its MLflow run; or why there is none to promote."""
    spec = port.spec
    metric = spec.objective.metric
    feasible = [o for o in port.outcomes if o.role is TrialRole.search]
    champion = select.pick_champion(
        feasible,
        metric=metric,
        direction=spec.objective.direction,
        constraints=constraints(port),
        concurrency=spec.benchmark.concurrency,
    )
    baseline = next(
        (o for o in reversed(port.outcomes) if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE), None
    )
    if champion is None or baseline is None:
        return Promotion(Outcome.no_champion, _no_champion(feasible) if champion is None else "no baseline measured")
    contender.note_run_speed(port)
    run_id = port.run_id_of(champion)  # the port sends the outbox first: its run may be created there
    if run_id is None:
        return Promotion(
            Outcome.no_champion,
            f"not promoted: trial {champion.number} is not in MLflow yet ({port.pending()} "
            f"result(s) wait in the outbox); when MLflow is reachable run `sweep sync` and "
            f"{port.resume_hint} to promote",
        )
    return Champion(trial=champion, baseline=baseline, run_id=run_id, metric=metric)


def _no_champion(searched: list[TrialOutcome]) -> str:
    """Why no search trial can be promoted, counted: none ran, all failed, or the measured ones broke a
    constraint (the baseline's own success is not the search's)."""
    complete = sum(o.status is TrialStatus.COMPLETE for o in searched)
    failed = len(searched) - complete
    if not searched:
        what = "no search trial was measured (only the baseline ran)"
    elif not complete:
        what = f"every search trial failed ({failed} of {len(searched)})"
    else:
        changed = sum(bool(o.outputs_changed) for o in searched)
        what = (
            f"{complete} search trial(s) measured, each breaking an objective constraint"
            + (f" or changing the outputs ({changed}, promotion.correctness.screen)" if changed else "")
            + (f", {failed} failed" if failed else "")
        )
    return (
        f"no feasible trial to promote: {what}; see `sweep status` and widen the space, raise the budget "
        f"or relax objective.constraints"
    )


def ungated(port: Port, champion: Champion) -> Choice | Promotion:
    """Without a gate (promotion.max_rounds: 0): the champion on its one search-phase measurement against
    the baseline's, promoted as unconfirmed when that shows promotion.min_gain, refused otherwise."""
    spec = port.spec
    metric, level = champion.metric, spec.benchmark.concurrency
    value, base_value = champion.search_value, float(getattr(champion.baseline.metrics, metric))
    figures = contrib.unconfirmed(value, base_value, metric, spec.objective.direction, concurrency=level)
    at = f" at {contrib.streams(level)}" if gate_level_named(port) is not None else ""
    measured = (
        f"{value:.2f} vs baseline {base_value:.2f} {metric}, {figures.gain * 100:+.1f}% from one measurement each{at}"
    )
    if figures.gain < spec.promotion.min_gain:
        verdict = (
            f"not better: promotion.max_rounds is 0, so the search-phase champion is judged without a gate: "
            f"{measured}, below the required {spec.promotion.min_gain * 100:+.1f}% (promotion.min_gain); "
            f"not promoted; set promotion.max_rounds (e.g. 12) to confirm it in interleaved rounds"
        )
        log.warning("no promotion: %s", verdict)
        return Promotion(Outcome.not_better, verdict, champion, confirmed=figures)
    verdict = (
        f"UNCONFIRMED: promotion.max_rounds is 0, so the search-phase champion is promoted without a "
        f"gate: {measured}, the best of many (optimistic); set promotion.max_rounds (e.g. 12) to confirm"
    )
    log.warning(verdict)
    return Choice(
        "champion", dict(champion.trial.params), figures, verdict, Outcome.unconfirmed, number=champion.trial.number
    )


def arms(port: Port, champion: Champion) -> Arms:
    """The champion and the baseline (the main pair), the ablations (promotion.explain), the pair at each
    other promotion.concurrency level, and the champion as the other kind of step control."""
    spec = port.spec
    trial, level = champion.trial, spec.benchmark.concurrency
    base_params = sp.baseline_params(spec.space)
    out = [
        Arm("champion", dict(trial.params), trial.number, level, main=True),
        Arm("baseline", base_params, -1, level, main=True),
    ]
    if spec.promotion.explain:
        out += _ablations(port, trial, base_params)
    for c in spec.promotion.concurrency:
        if c != level:
            out.append(Arm(f"champion@{c}", dict(trial.params), trial.number, c))
            out.append(Arm(f"baseline@{c}", base_params, -1, c))
    steps, counterpart, fixed = rounds.steps_arms(
        spec, trial.params, trial.number, port.outcomes, constraints(port), spec.promotion.concurrency or (level,)
    )
    return Arms(arms=tuple(out + steps), counterpart=counterpart, fixed=fixed)


def _ablations(port: Port, trial: TrialOutcome, base_params: dict[str, ParamValue]) -> list[Arm]:
    """The champion without each of its parts (when it sets both), and the runner-up from another region."""
    spec = port.spec
    level = spec.benchmark.concurrency
    out = []
    set_knobs = {k for k, v in trial.params.items() if v != base_params.get(k)}
    if contrib.speculates(trial.params) and any(not speculation_knob(k) for k in set_knobs):
        out.append(Arm("no_speculation", contrib.without_speculation(trial.params, base_params), trial.number, level))
        out.append(
            Arm(
                "default_communication",
                contrib.with_default_communication(trial.params, base_params),
                trial.number,
                level,
            )
        )
    elif not contrib.speculates(trial.params):
        donor = contrib.best_speculating(
            port.outcomes,
            metric=spec.objective.metric,
            direction=spec.objective.direction,
            constraints=constraints(port),
            concurrency=spec.benchmark.concurrency,
        )
        best = contrib.with_speculation_of(trial.params, donor.params) if donor is not None else None
        if best is not None:
            out.append(Arm("with_speculation", best, trial.number, level))
        default = sglang_default_speculation(spec, trial.params)
        if contrib.speculates(default) and default != best:
            out.append(Arm("with_default_speculation", default, trial.number, level))
    other = contrib.runner_up(
        port.outcomes,
        trial,
        metric=spec.objective.metric,
        direction=spec.objective.direction,
        constraints=constraints(port),
        concurrency=spec.benchmark.concurrency,
    )
    if other is not None:
        out.append(Arm("runner_up", dict(other.params), other.number, level))
    return out


def sglang_default_speculation(spec: SweepSpec, base: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """`base` with the model's default EAGLE-3 speculation switched on (the steps, top-k and draft tokens its
    profile ships with: what SGLang runs for it when told only the algorithm), where the space has it and
    the rules allow; `base` unchanged otherwise. The probe stage warm-starts from it; the verdict judges
    speculation against it as well as against the best speculating trial."""
    params = dict(base)
    space = spec.space.params
    algo = space.get("speculative_algorithm")
    if algo is None or algo.choices is None or "EAGLE3" not in algo.choices:
        return params
    steps, topk, draft = default_speculation(spec)
    trial = {**params, "speculative_algorithm": "EAGLE3"}
    for name, value in (
        ("speculative_num_steps", steps),
        ("speculative_eagle_topk", topk),
        ("speculative_num_draft_tokens", draft),
    ):
        param = space.get(name)
        if param is not None and value in param.values():
            trial[name] = value
    for name in sp.ordered(spec.space):  # a knob whose `when` no longer holds is not set
        if not sp.is_active(space[name], trial):
            trial[name] = None
    trial = sp.complete(spec.space, trial)
    return trial if eagle.infeasible(trial) is None else params
