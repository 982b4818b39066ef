"""The arms the confirmation measures, as values, built from the search's trials once its pick is known:
the champion and the baseline (the gate's pair), the ablations that say why it won (the champion without
speculation, its speculation with NCCL at defaults; for a champion that does not speculate, the best
speculating trial's speculation and SGLang's default for the model on its NCCL settings), the runner-up from
another region (verdict.pick), the pair at each other promotion.concurrency level, and the champion as the
other kind of step control (adaptive against a fixed count, `steps_arms`; without promotion.explain the
pick's rival, verdict.pick.rival, takes the step control's place when one is found); then fitted to the night's time
left (`fitted`, verdict.schedule), each arm left out named in a line.

Measuring arms in the same rounds pairs them in time, so a host drifting during the night cancels out
(`verdict.gate`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from orchestrator.config import eagle, knobs
from orchestrator.config.experiment import SweepSpec
from orchestrator.config.knobs import ADAPTIVE_CANDIDATE_STEPS, ADAPTIVE_INITIAL_STEPS
from orchestrator.probe.run import default_algorithm, default_speculation
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialStatus, speculation_knob
from orchestrator.results import select
from orchestrator.search import space as sp
from orchestrator.verdict import schedule
from orchestrator.verdict.arm import Arm
from orchestrator.verdict.port import Port
from orchestrator.verdict.steps import Arms, Champion, Promotion
from orchestrator.verdict.value import Outcome

Direction = select.Direction

log = logging.getLogger("sweep")

ADAPTIVE, FIXED = "adaptive", "fixed"
"""Names of the arm that answers "adaptive or fixed steps?": the champion as whichever it is not."""
STEPS_ARMS = (ADAPTIVE, FIXED)


def fitted(port: Port, champion: Champion, measuring: Arms) -> Arms | Promotion:
    """The arms that fit the time left of the night (verdict.schedule.plan: the gate's pair first, then by
    value), each one left out said in a line; the step comparison dropped with its arms. When not even the
    gate's pair fits, the Promotion that says so."""
    spec = port.spec
    planned = schedule.plan(
        [(a.name, a.concurrency, a.main) for a in measuring.arms],
        seconds=schedule.run_seconds(spec, port.outcomes),
        left_s=port.remaining(),
        share_s=port.remaining(),
        min_rounds=spec.promotion.min_rounds,
        gate_level=spec.benchmark.concurrency,
        slots=max(port.slots(), 1),
    )
    kept = {a.name for a in planned.arms}
    for d in planned.dropped:
        log.warning("confirmation: %s not measured: %s", d.name, d.why)
        port.dropped(d.name, d.why)
    out = tuple(a for a in measuring.arms if a.name in kept)
    dropped = tuple(f"{d.name}: {d.why}" for d in planned.dropped)
    if not any(a.main for a in out):
        return Promotion(
            Outcome.undecided,
            f"undecided: the night left no time for the confirmation ({'; '.join(dropped)}); "
            f"{port.resume_hint} with a longer --timeout confirms it",
            champion,
            not_measured=dropped,
        )
    steps_left = any(a.name.split("@")[0] == measuring.counterpart for a in out)
    return Arms(
        arms=out,
        counterpart=measuring.counterpart if steps_left else "",
        fixed=measuring.fixed if steps_left else "",
        dropped=dropped,
    )


def arms(port: Port, champion: Champion) -> Arms:
    """The champion and the baseline (the main pair), the ablations (promotion.explain), the pair at each
    other promotion.concurrency level, and the champion as the other kind of step control. Without
    promotion.explain, a rival of the pick (pick.rival: a near-tie the search measured once or twice)
    takes the step control's place at every level: the one arm beside the pair is the one likelier to
    change what is deployed, and the night measures no more than `schedule.candidate_arms` planned (its
    worst case: the step control at every level, the rival in the gate level's seat)."""
    spec = port.spec
    trial, level = champion.trial, spec.benchmark.concurrency
    base_params = sp.baseline_params(spec.space)
    out = [
        Arm("champion", dict(trial.params), trial.number, level, main=True),
        Arm("baseline", base_params, -1, level, main=True),
    ]
    if spec.promotion.explain:
        out += _ablations(port, champion, base_params)
    elif champion.runner_up is not None:
        out.append(Arm("runner_up", dict(champion.runner_up.params), champion.runner_up.number, level))
    for c in spec.promotion.concurrency:
        if c != level:
            out.append(Arm(f"champion@{c}", dict(trial.params), trial.number, c))
            out.append(Arm(f"baseline@{c}", base_params, -1, c))
    if not spec.promotion.explain and champion.runner_up is not None:
        return Arms(arms=tuple(out), counterpart="", fixed="")
    steps, counterpart, fixed = steps_arms(
        spec,
        trial.params,
        trial.number,
        port.outcomes,
        spec.objective.bounds(),
        spec.promotion.concurrency or (level,),
    )
    return Arms(arms=tuple(out + steps), counterpart=counterpart, fixed=fixed)


def _ablations(port: Port, champion: Champion, base_params: dict[str, ParamValue]) -> list[Arm]:
    """The champion without each of its parts (when it sets both), and the runner-up from another region."""
    spec = port.spec
    trial, level = champion.trial, spec.benchmark.concurrency
    out = []
    set_knobs = {k for k, v in trial.params.items() if v != base_params.get(k)}
    if speculates(trial.params) and any(not speculation_knob(k) for k in set_knobs):
        out.append(Arm("no_speculation", without_speculation(trial.params, base_params), trial.number, level))
        out.append(
            Arm(
                "default_communication",
                with_default_communication(trial.params, base_params),
                trial.number,
                level,
            )
        )
    elif not speculates(trial.params):
        donor = best_speculating(
            port.outcomes,
            metric=spec.objective.metric,
            direction=spec.objective.direction,
            constraints=spec.objective.bounds(),
            concurrency=spec.benchmark.concurrency,
        )
        best = with_speculation_of(trial.params, donor.params) if donor is not None else None
        if best is not None:
            out.append(Arm("with_speculation", best, trial.number, level))
        default = sglang_default_speculation(spec, trial.params)
        if speculates(default) and default != best:
            out.append(Arm("with_default_speculation", default, trial.number, level))
    other = champion.runner_up
    if other is not None:
        out.append(Arm("runner_up", dict(other.params), other.number, level))
    return out


def sglang_default_speculation(spec: SweepSpec, base: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """`base` with the model's default speculation (its algorithm from the registry) switched on (the steps, top-k and draft tokens its
    profile ships with: what SGLang runs for it when told only the algorithm), where the space has it and
    the rules allow; `base` unchanged otherwise. The probe stage warm-starts from it; the verdict judges
    speculation against it as well as against the best speculating trial."""
    params = dict(base)
    space = spec.space.params
    steps, topk, draft = default_speculation(spec)
    algo, default = space.get("speculative_algorithm"), default_algorithm(spec)
    if algo is None or algo.choices is None or default is None or default not in algo.choices:
        return params
    trial = {**params, "speculative_algorithm": default}
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


def steps_arms(
    spec: SweepSpec,
    params: Mapping[str, ParamValue],
    number: int,
    outcomes: list[TrialOutcome],
    constraints: dict[str, tuple[float | None, float | None]],
    levels: Sequence[int],
) -> tuple[list[Arm], str, str]:
    """The arms that tell adaptive from fixed steps for the configuration `params` (of trial `number`)
    at each of `levels`, the counterpart's kind (ADAPTIVE or FIXED) and the fixed side in words;
    ([], "", "") when it does not speculate or the SGLang version lacks the flag."""
    if spec.sglang_version not in knobs.ADAPTIVE_VERSIONS:
        return [], "", ""
    best = best_fixed_steps(
        outcomes,
        metric=spec.objective.metric,
        direction=spec.objective.direction,
        constraints=constraints,
        concurrency=spec.benchmark.concurrency,
    )
    found = steps_counterpart(params, best)
    if found is None or eagle.infeasible(found[1]) is not None:
        return [], "", ""
    kind, counterpart, fixed = found
    level = spec.benchmark.concurrency
    return [Arm(arm_name(kind, c, level), counterpart, number, c) for c in levels], kind, fixed


def speculates(params: Mapping[str, ParamValue]) -> bool:
    return params.get("speculative_algorithm") is not None


def without_speculation(params: Mapping[str, ParamValue], baseline: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """The champion with speculation off (its baseline values), its communication settings kept."""
    return {k: (baseline.get(k) if speculation_knob(k) else v) for k, v in params.items()}


def with_default_communication(
    params: Mapping[str, ParamValue], baseline: Mapping[str, ParamValue]
) -> dict[str, ParamValue]:
    """The champion's speculation with NCCL and the all-reduce path at their baseline values."""
    return {k: (v if speculation_knob(k) else baseline.get(k)) for k, v in params.items()}


def with_speculation_of(params: Mapping[str, ParamValue], donor: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """A non-speculating champion's communication settings with `donor`'s speculation (the best
    speculating trial's): what speculation would add on top of the tuned NCCL settings."""
    return {k: (donor.get(k) if speculation_knob(k) else params.get(k)) for k in {*params, *donor}}


def best_speculating(
    outcomes: Sequence[TrialOutcome],
    *,
    metric: str,
    direction: Direction,
    constraints: Mapping[str, tuple[float | None, float | None]],
    concurrency: int,
) -> TrialOutcome | None:
    """The best eligible searched trial that speculates (select.pick_champion at the trials' `concurrency`),
    or None."""
    found = [
        o for o in outcomes if o.role is TrialRole.search and o.status is TrialStatus.COMPLETE and speculates(o.params)
    ]
    return select.pick_champion(
        found, metric=metric, direction=direction, constraints=constraints, concurrency=concurrency
    )


def knobs_set(params: Mapping[str, ParamValue], baseline: Mapping[str, ParamValue]) -> int:
    """How many knobs differ from the baseline (a simpler configuration sets fewer)."""
    return sum(1 for k, v in params.items() if v != baseline.get(k))


def arm_name(kind: str, level: int, main_level: int) -> str:
    """An arm's name at a concurrency level: bare at the level the gate decides on, `kind@level` elsewhere."""
    return kind if level == main_level else f"{kind}@{level}"


def best_fixed_steps(
    outcomes: Sequence[TrialOutcome],
    *,
    metric: str,
    direction: Direction,
    constraints: Mapping[str, tuple[float | None, float | None]],
    concurrency: int,
) -> int | None:
    """The step count of the best searched chain (top-k 1) without adaptive steps (select.pick_champion at
    the trials' `concurrency`), or None."""
    chains = [
        o
        for o in outcomes
        if o.role is TrialRole.search
        and o.status is TrialStatus.COMPLETE
        and speculates(o.params)
        and not o.params.get("speculative_adaptive")
        and o.params.get("speculative_eagle_topk") == 1
        and o.params.get("speculative_num_steps") is not None
    ]
    best = select.pick_champion(
        chains, metric=metric, direction=direction, constraints=constraints, concurrency=concurrency
    )
    return None if best is None else int(best.params["speculative_num_steps"] or 0)


def steps_counterpart(
    params: Mapping[str, ParamValue], best_fixed: int | None
) -> tuple[str, dict[str, ParamValue], str] | None:
    """The arm that tells whether adaptive steps beat a fixed count, for a speculating champion:
    (name, params, the fixed side in words). A fixed champion is measured again with adaptive steps
    (a chain starting at the candidate nearest its steps); an adaptive champion with a fixed chain of
    `best_fixed` steps (the best the search measured; else its initial steps). None without speculation."""
    if not speculates(params):
        return None
    chain = {"speculative_eagle_topk": 1, "speculative_num_draft_tokens": None}
    if params.get("speculative_adaptive"):
        steps = int(best_fixed or params.get("speculative_num_steps") or ADAPTIVE_INITIAL_STEPS)
        return (
            FIXED,
            {**params, **chain, "speculative_adaptive": None, "speculative_num_steps": steps},
            f"fixed {steps} steps",
        )
    steps = int(params.get("speculative_num_steps") or ADAPTIVE_INITIAL_STEPS)
    topk = params.get("speculative_eagle_topk")
    fixed = f"fixed {steps} steps" + (f" x top-k {topk}" if topk not in (None, 1) else "")
    start = min(ADAPTIVE_CANDIDATE_STEPS, key=lambda s: (abs(s - steps), s))
    return ADAPTIVE, {**params, **chain, "speculative_adaptive": True, "speculative_num_steps": start}, fixed
