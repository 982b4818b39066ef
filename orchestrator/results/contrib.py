"""Why the champion won, and at which load: the confirmed figures, the contribution of each of its
parts and its gain per concurrency level, each with its interval, from the interleaved rounds.

The confirmation measures, in the same rounds as the champion and the baseline, the champion with
speculation off (its NCCL settings kept), its speculation with NCCL at defaults, and the best
runner-up from another region; and, for a speculating champion at each promotion.concurrency level,
its speculation with SGLang's --speculative-adaptive against a fixed step count (whichever of the two
the champion is not). Comparing arms measured in the same rounds pairs them in time, so a
host drifting during the night cancels out (as in `results.sequential`).

Pure: numbers and parameters in, figures and sentences out. The driver owns the measuring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from orchestrator.config.knobs import ADAPTIVE_CANDIDATE_STEPS, ADAPTIVE_INITIAL_STEPS
from orchestrator.records import ParamValue, TrialOutcome, TrialRole, TrialStatus, speculation_knob
from orchestrator.results import select, sequential

# The values and sentences of a verdict live in their own modules; contrib re-exports them, so a caller
# reads every rule of the parts and their figures as `contrib.<name>`.
from orchestrator.results.figures import LEVEL as LEVEL
from orchestrator.results.figures import Confirmed as Confirmed
from orchestrator.results.figures import Contribution as Contribution
from orchestrator.results.figures import Interval as Interval
from orchestrator.results.figures import LevelGain as LevelGain
from orchestrator.results.figures import PartCheck as PartCheck
from orchestrator.results.figures import PartVerdict as PartVerdict
from orchestrator.results.figures import StepsGain as StepsGain
from orchestrator.results.figures import streams as streams
from orchestrator.results.wording import at_level as at_level
from orchestrator.results.wording import steps_sentence as steps_sentence
from orchestrator.results.wording import stops_paying as stops_paying
from orchestrator.results.wording import verdict_text as verdict_text
from orchestrator.stats import Contrast

Direction = Literal["maximize", "minimize"]


RUNNER_UP_DISTANCE = 2
"""A runner-up is from another region when at least this many knobs differ from the champion's."""


# ------------------------------------------------------------------------------ the arms


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


def distance(a: Mapping[str, ParamValue], b: Mapping[str, ParamValue]) -> int:
    return sum(1 for k in set(a) | set(b) if a.get(k) != b.get(k))


def runner_up(
    outcomes: Sequence[TrialOutcome],
    champion: TrialOutcome,
    *,
    metric: str,
    direction: Direction,
    constraints: Mapping[str, tuple[float | None, float | None]],
    concurrency: int,
) -> TrialOutcome | None:
    """The best eligible searched trial at least RUNNER_UP_DISTANCE knobs away from the champion, ranked
    as the champion pick ranks (select.PICK_Z below its pooled estimate) in the fit over every eligible
    searched trial: a point of another region is estimated from its parts as measured anywhere, as the
    champion was, not from the other region's trials alone (which left a point with a part measured
    mostly beside the champion barely known, and the runner-up a near-copy of the champion's family).
    `concurrency`: the trials' benchmark load (select.run_speed_metric)."""
    far = {
        o.number
        for o in outcomes
        if o.role is TrialRole.search
        and o.status is TrialStatus.COMPLETE
        and o.number != champion.number
        and distance(o.params, champion.params) >= RUNNER_UP_DISTANCE
    }
    eligible = select.eligible_values(
        [o for o in outcomes if o.role is TrialRole.search], metric=metric, constraints=constraints
    )
    fit = select.pooled_fit(eligible, direction=direction, adjust=select.run_speed_metric(metric, concurrency))
    if fit is None:
        return select.pick_champion(
            [o for o, _ in eligible if o.number in far],
            metric=metric,
            direction=direction,
            constraints=constraints,
            concurrency=concurrency,
            pooled=False,
        )
    sign = 1.0 if direction == "maximize" else -1.0
    scored = [(p.score, sign * value, -o.number, o) for (o, value), p in zip(eligible, fit) if o.number in far]
    return max(scored, key=lambda t: t[:3])[3] if scored else None


# ------------------------------------------------------------------------------ the figures


def common_rounds(a: Mapping[int, float], b: Mapping[int, float]) -> list[int]:
    """The rounds that measured both arms, in order."""
    return sorted(set(a) & set(b))


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[float], list[float]]:
    """The values of the rounds that measured both arms, in round order."""
    rounds = common_rounds(a, b)
    return [a[i] for i in rounds], [b[i] for i in rounds]


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    direction: Direction,
    level: float = LEVEL,
    noise: sequential.RoundNoise | None = None,
) -> Interval | None:
    """A's gain over B with its two-sided interval (on `noise`, the noise of every arm in their rounds,
    where given: sequential.evidence); None with fewer than 2 paired rounds."""
    if len(a) < 2 or len(a) != len(b):
        return None
    ev = sequential.evidence(a, b, direction=direction, level=1.0 - (1.0 - level) / 2.0, noise=noise)
    return Interval(
        gain=ev.gain,
        low=ev.low,
        high=ev.high,
        rounds=ev.rounds,
        a_median=ev.champion_median,
        b_median=ev.baseline_median,
    )


def interval_of(ev: sequential.Evidence) -> Interval:
    """The gate's evidence as an Interval (its bounds: the gate's level, each side)."""
    return Interval(
        gain=ev.gain,
        low=ev.low,
        high=ev.high,
        rounds=ev.rounds,
        a_median=ev.champion_median,
        b_median=ev.baseline_median,
    )


def confirmed(ev: sequential.Evidence, metric: str, concurrency: int | None = None) -> Confirmed:
    return Confirmed(
        label="confirmed",
        metric=metric,
        champion_median=ev.champion_median,
        baseline_median=ev.baseline_median,
        rounds=ev.rounds,
        gain=ev.gain,
        low=ev.low,
        high=ev.high,
        concurrency=concurrency,
    )


def unconfirmed(
    champion: float, baseline: float, metric: str, direction: Direction, concurrency: int | None = None
) -> Confirmed:
    gain = champion / baseline - 1.0 if direction == "maximize" else baseline / champion - 1.0
    return Confirmed(
        label="unconfirmed",
        metric=metric,
        champion_median=champion,
        baseline_median=baseline,
        rounds=0,
        gain=gain,
        concurrency=concurrency,
    )


def contributions(
    values: Mapping[str, Mapping[int, float]], *, speculation: str, sole_part: str, direction: Direction
) -> list[Contribution]:
    """Each part's contribution from the arms measured (champion, baseline, no_speculation,
    default_communication, runner_up), its interval on the noise of every arm in the pair's rounds
    (pair_noise), as the gate's; parts whose arms were not measured are left out. `sole_part`
    names the champion's whole gain when it sets only one part."""
    spec_name = speculation or "speculation"
    parts = [
        ("NCCL settings", "no_speculation", "baseline"),
        (f"{spec_name} on top", "champion", "no_speculation"),
        (f"{spec_name} alone (NCCL at defaults)", "default_communication", "baseline"),
        (f"NCCL settings on top of {spec_name}", "champion", "default_communication"),
        ("champion over the runner-up", "champion", "runner_up"),
    ]
    with_spec = (
        f"{spec_name} on top of the champion's NCCL settings (the best speculating trial's settings)",
        "with_speculation",
        "champion",
    )
    with_default = (
        f"{spec_name} on top of the champion's NCCL settings (SGLang's default for the model)",
        "with_default_speculation",
        "champion",
    )
    if "no_speculation" not in values and "default_communication" not in values:
        # At most one part is set: the champion's whole gain is that part's.
        parts = [(sole_part, "champion", "baseline"), parts[-1]]
    parts += [with_spec, with_default]
    out = []
    for part, a, b in parts:
        if a not in values or b not in values:
            continue
        interval = compare(*paired(values[a], values[b]), direction=direction, noise=pair_noise(values, a, b))
        if interval is not None:
            out.append(Contribution(part=part, a=a, b=b, interval=interval))
    return out


ABLATION_PARTS = (("no_speculation", "on top"), ("default_communication", "NCCL settings on top of"))


def part_checks(
    values: Mapping[str, Mapping[int, float]], *, speculation: str, margin: float, level: float, direction: Direction
) -> list[PartCheck]:
    """The equivalence test of each part whose ablation arm was measured (champion against it, paired)."""
    names = {
        "no_speculation": f"{speculation} on top",
        "default_communication": f"NCCL settings on top of {speculation}",
    }
    out = []
    for arm, part in names.items():
        if arm not in values or "champion" not in values:
            continue
        a, b = paired(values["champion"], values[arm])
        if len(a) < 2:
            continue
        ev = sequential.evidence(a, b, direction=direction, level=level, noise=pair_noise(values, "champion", arm))
        out.append(
            PartCheck(part=part, arm=arm, gain=ev.gain, low=ev.low, high=ev.high, rounds=ev.rounds, margin=margin)
        )
    return out


def simpler_choice(
    values: Mapping[str, Mapping[int, float]],
    checks: Sequence[PartCheck],
    plan: sequential.RoundsPlan,
    *,
    direction: Direction,
) -> tuple[str, sequential.Decision] | None:
    """The simpler arm to promote instead of the champion: the part it leaves out is shown to add less
    than promotion.equivalence_margin (PartVerdict.negligible, not merely "not significant"), and the
    configuration without it passes the gate against the baseline too; None to promote the champion.

    Speculation off is preferred (fewer moving parts in production), then NCCL at defaults."""
    by_arm = {c.arm: c for c in checks}
    for arm in ("no_speculation", "default_communication"):
        check = by_arm.get(arm)
        if check is None or check.verdict is not PartVerdict.negligible:
            continue
        decision = gate_of(values, arm, plan, direction=direction)
        if decision is not None and decision.verdict is sequential.Verdict.promoted:
            return arm, decision
    return None


def simpler_choice_before(
    values: Mapping[str, Mapping[int, float]],
    contribs: Sequence[Contribution],
    plan: sequential.RoundsPlan,
    *,
    direction: Direction,
) -> tuple[str, sequential.Decision] | None:
    """The rule before promotion.equivalence_margin (kept for bench/gate_power.py's comparison): a part
    was dropped when its 95% interval merely included zero ("not significant")."""
    by_arm = {c.b: c for c in contribs if c.a == "champion"}
    for arm in ("no_speculation", "default_communication"):
        part = by_arm.get(arm)
        if part is None or part.interval.low > 0.0:
            continue
        decision = gate_of(values, arm, plan, direction=direction)
        if decision is not None and decision.verdict is sequential.Verdict.promoted:
            return arm, decision
    return None


def gate_of(
    values: Mapping[str, Mapping[int, float]], arm: str, plan: sequential.RoundsPlan, *, direction: Direction
) -> sequential.Decision | None:
    """The gate's decision on `arm` against the baseline, from the rounds that measured both (None
    with fewer than min_rounds of them), its bound on the noise of every arm in those rounds (pair_noise)."""
    if arm not in values or "baseline" not in values:
        return None
    a, b = paired(values[arm], values["baseline"])
    if len(a) < plan.min_rounds:
        return None
    return sequential.decide(a, b, plan, direction=direction, noise=pair_noise(values, arm))


def pair_noise(
    values: Mapping[str, Mapping[int, float]], arm: str = "champion", against: str = "baseline"
) -> sequential.RoundNoise | None:
    """The run-to-run noise of every arm measured at the pair's load in the rounds that measured both `arm`
    and `against` (sequential.round_noise; arms at another load, `name@level`, left out: their noise need
    not be the pair's): what the gate's bound on that pair takes (sequential.evidence)."""
    load = arm.partition("@")[2]
    same = {k: v for k, v in values.items() if k.partition("@")[2] == load}
    return sequential.round_noise(same, common_rounds(values.get(arm, {}), values.get(against, {})))


def open_parts(checks: Sequence[PartCheck]) -> list[str]:
    """The ablation arms whose part is neither shown negligible nor significant: more rounds could settle them."""
    return [c.arm for c in checks if c.verdict is PartVerdict.open]


def contender_open(
    values: Mapping[str, Mapping[int, float]], contender: str, *, margin: float, direction: Direction
) -> bool:
    """Whether the near-tie between the champion and `contender` is still open after the rounds so far:
    neither is significantly better (the 95% interval of their paired ratio holds zero) and they are not
    shown equivalent either (the interval reaches past +-margin); more rounds could settle which to deploy."""
    if contender not in values or "champion" not in values:
        return False
    interval = compare(
        *paired(values[contender], values["champion"]),
        direction=direction,
        noise=pair_noise(values, contender, "champion"),
    )
    if interval is None:
        return False
    tie = interval.low <= 0.0 <= interval.high
    equivalent = -margin < interval.low and interval.high < margin
    return tie and not equivalent


def contender_wins(
    values: Mapping[str, Mapping[int, float]], contender: str, *, direction: Direction, search: Contrast | None = None
) -> Interval | None:
    """The contender's gain over the champion in the same rounds when, on all the evidence, it is the
    better of the two; None when it is not, or was not measured twice beside it.

    All the evidence (`settled`): the rounds' paired mean log ratio, combined by inverse variance with
    `search`, the search's own pooled estimate of the same difference (select.search_contrast: positive
    when the contender is better). A few rounds at several percent of noise alone flip a near-tie often
    (3 rounds at 4%: a 3.7% gap read the wrong way about one time in eight); the search measured the two
    points' parts several times more. Without `search` the rounds alone decide."""
    interval = compare(
        *paired(values.get(contender, {}), values.get("champion", {})),
        direction=direction,
        noise=pair_noise(values, contender, "champion"),
    )
    if interval is None:
        return None
    both = settled(values, contender, direction=direction, search=search)
    return interval if both is not None and both.diff > 0.0 else None


def settled(
    values: Mapping[str, Mapping[int, float]], contender: str, *, direction: Direction, search: Contrast | None
) -> Contrast | None:
    """The contender's log gain over the champion from the paired rounds and, when given, the search's
    contrast, weighted by inverse variance. The rounds' standard error rests on the noise the gate's
    bound takes (sequential.BoundNoise over pair_noise: every arm at the pair's load in those rounds,
    never below the pair's own spread). None with fewer than 2 paired rounds."""
    a, b = paired(values.get(contender, {}), values.get("champion", {}))
    if len(a) < 2:
        return None
    d = sequential.log_ratios(a, b, direction)
    bound = sequential.BoundNoise.of(d, pair_noise(values, contender, "champion"))
    own = Contrast(float(d.mean()), max(bound.sigma * math.sqrt(2.0 / d.size), 1e-9))
    if search is None or not search.se > 0:
        return own
    w_own, w_search = 1.0 / own.se**2, 1.0 / search.se**2
    return Contrast(
        (own.diff * w_own + search.diff * w_search) / (w_own + w_search), math.sqrt(1.0 / (w_own + w_search))
    )


# ------------------------------------------------------------------------------ the verdict in words


# ------------------------------------------------------------------------------ adaptive or fixed steps

ADAPTIVE, FIXED = "adaptive", "fixed"
"""Names of the arm that answers "adaptive or fixed steps?": the champion as whichever it is not."""
STEPS_ARMS = (ADAPTIVE, FIXED)


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


def steps_gain(
    values: Mapping[str, Mapping[int, float]],
    level: int,
    main_level: int,
    *,
    counterpart: str,
    fixed: str,
    direction: Direction,
    deployed: str = "champion",
) -> StepsGain | None:
    """Adaptive against fixed steps at `level` from the rounds that measured both (the `deployed` arm
    and its counterpart), or None."""
    other, champion = arm_name(counterpart, level, main_level), arm_name(deployed, level, main_level)
    if other not in values or champion not in values:
        return None
    a, b = (other, champion) if counterpart == ADAPTIVE else (champion, other)
    interval = compare(*paired(values[a], values[b]), direction=direction, noise=pair_noise(values, a, b))
    return None if interval is None else StepsGain(fixed=fixed, interval=interval)
