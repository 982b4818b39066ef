"""Sequential confirmation: interleaved rounds of the champion, the baseline and the arms that say
why the champion won and at which load, through the sweep's executor, until the evidence decides.

Each round measures every open arm once, in an order that reverses from round to round (A B C, then
C B A, see `verdict.gate.round_order`), up to the executor's free slots at a time. The main
pair (champion, baseline) continues until `verdict.gate.decide` returns a verdict; the other
arms (ablations, other concurrency levels) are measured for `min_rounds` rounds only, which keeps
their cost bounded while giving each an interval; once the pair promoted, the arms whose question is still
open (`still_open`: a part the equivalence test, `part_checks`, shows neither negligible nor significant,
the runner-up while its near-tie with the champion is open) go on beside it while the night allows. Before
min_rounds each round keeps back the time of the gate's later rounds that the noise so far says it will
need (`rounds_needed`).

The arms: verdict.arms. Each run's TTFT is kept with its row for `judge` (verdict.speed).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.config import speculation as speculation_registry
from orchestrator.records import ParamValue, TrialOutcome, TrialStatus
from orchestrator.results.figures import PartCheck, PartVerdict
from orchestrator.stats import Covariate
from orchestrator.verdict import gate, schedule
from orchestrator.verdict.arm import Arm, ConfirmationRow
from orchestrator.verdict.port import Port, Run

log = logging.getLogger("sweep")
Values = Mapping[str, Mapping[int, float]]


@dataclass(frozen=True)
class Measured:
    """What the rounds measured: per arm, the objective value of each round that completed."""

    values: Mapping[str, Mapping[int, float]]
    """Arm name -> round -> value (rounds that failed are absent)."""
    rows: tuple[ConfirmationRow, ...]
    decision: gate.Decision | None
    """The main pair's last decision; None with fewer than two complete rounds."""
    rounds: int
    stopped: str = ""
    """Why the rounds stopped before a verdict (interrupted, the wall time), or empty."""
    fair: Mapping[str, Mapping[int, float]] | None = None
    """The runner-up's question's values, each run's own speed out (`judge`, the slope in `speed`)."""
    speed: Covariate | None = None

    def main(self) -> tuple[list[float], list[float]]:
        return _main(self.values)

    def failed(self) -> int:
        return sum(1 for r in self.rows if r.status is not TrialStatus.COMPLETE)


def ttft_of(rows: Sequence[ConfirmationRow]) -> dict[tuple[str, int], float]:
    """(arm, round) -> the TTFT of each run that gave a value and recorded one (verdict.speed)."""
    return {(r.who, r.round): r.ttft_ms for r in rows if r.ttft_ms is not None}


def held_for(port: Port, later: list[Arm]) -> float:
    """Seconds the arms measured after the deployed configuration is decided are expected to take (their
    min_rounds rounds, as the night planned them): the gate's extra rounds leave them that."""
    seconds = schedule.run_seconds(port.spec, port.outcomes)
    return sum(seconds(a.concurrency) for a in later) * port.spec.promotion.min_rounds / max(port.slots(), 1)


Judge = Callable[[Values, Mapping[tuple[str, int], float]], tuple[Values | None, Covariate | None]]
"""From the values and the runs' TTFT (ttft_of): the values less each run's own speed (None where the slope
did not apply) and the slope (verdict.speed)."""
More = Callable[[Values, Values | None], Sequence[str]]
"""From the values as measured and as `judge` gives them: the arms still open (`more`), or that would be
deployed (`contends`)."""


def run_rounds(
    port: Port,
    arms: list[Arm],
    plan: gate.RoundsPlan,
    *,
    more: More | None = None,
    contends: More | None = None,
    judge: Judge | None = None,
    hold_s: float = 0.0,
) -> Measured:
    """Measure the arms round after round until the main pair decides, max_rounds, the wall time or an
    interruption. A round starts only when it is expected to end inside the wall time (one clock for the
    night, sweep.schedule): short of time before min_rounds, the other arms are left out by value (the
    runner-up kept longest, _fitting_round) and the main pair goes on alone while it fits. Rounds past
    min_rounds also leave `hold_s` for what is measured after
    (the deployed configuration at the other loads), which the night planned for, unless only that time
    would let the undecided gate take another round (nothing to describe without a decision). Once the main pair
    promoted, rounds go on for the arms `more` names (with the pair) while they fit and max_rounds allows;
    the pair's decision stays the one first reached. From the second round to min_rounds, the arms
    `contends` names (a runner-up that measured better than the champion, whose own gate has not decided:
    it would be deployed) join the gate's pair, kept and held for as the pair is, so that their own gate
    has its min_rounds; past min_rounds the undecided pair goes on alone, and once it decided they are
    measured on while the night allows."""
    values: dict[str, dict[int, float]] = {a.name: {} for a in arms}
    rows: list[ConfirmationRow] = []
    stopped, rounds = "", 0
    decision: gate.Decision | None = None
    timing = timing_of(port)
    for i in range(plan.max_rounds):
        fair, _ = judged(values, rows, judge)  # once a round, for both questions
        chosen = _round_arms(arms, values, fair, plan, i, decision, more, contends)
        if chosen is None:
            break
        wanted, extra = chosen
        held = hold_s if i >= plan.min_rounds else _gate_hold(port, values, wanted, plan, timing, i)
        open_arms = _open_arms(port, wanted, timing, i, held, undecided=decision is None, after=rounds, plan=plan)
        if extra and not extra & {a.name for a in open_arms}:
            log.warning("confirmation: no time left for round %d of %s", i + 1, ", ".join(sorted(extra)))
            break
        if not open_arms:
            stopped = (
                f"the wall-time budget ({port.timeout_s / 60:.0f} min for this run) leaves no time for round {i + 1}"
            )
            break
        order = open_arms if i % 2 == 0 else list(reversed(open_arms))
        rows += [row(port, run, i, values) for run in port.run_round(order, i, plan.max_rounds)]
        rounds = i + 1
        if port.interrupted():
            stopped = "interrupted during the confirmation rounds"
            break
        if decision is None:
            decision = _decided(port, values, plan)
    return _measured(port, values, tuple(rows), plan, decision, rounds, stopped, judge)


def _measured(
    port: Port,
    values: dict[str, dict[int, float]],
    rows: tuple[ConfirmationRow, ...],
    plan: gate.RoundsPlan,
    decision: gate.Decision | None,
    rounds: int,
    stopped: str,
    judge: Judge | None,
) -> Measured:
    """What the rounds measured, with the values `judge` gives the runner-up's question (each run's own speed
    out, where the slope applied) and the undecided verdict where the pair did not decide or was interrupted."""
    fair, speed = judged(values, rows, judge)
    if decision is None or port.interrupted():
        decision = _undecided(port, values, plan, rounds, stopped)
    else:
        stopped = ""
    return Measured(values, rows, decision, rounds, stopped=stopped, fair=fair, speed=speed)


def judged(
    values: Values, rows: Sequence[ConfirmationRow], judge: Judge | None
) -> tuple[Values | None, Covariate | None]:
    """What `judge` makes of the rounds so far; (None, None) without one."""
    return judge(values, ttft_of(rows)) if judge is not None else (None, None)


def _round_arms(
    arms: list[Arm],
    values: Values,
    fair: Values | None,
    plan: gate.RoundsPlan,
    i: int,
    decision: gate.Decision | None,
    more: More | None,
    contends: More | None,
) -> tuple[list[Arm], set[str]] | None:
    """The arms round `i` wants (a leading contender as part of the pair) and the extra arms it is for once
    the pair decided; None when the pair decided and nothing is left open (the rounds end)."""
    extra: set[str] = set()
    # A contender joins the pair up to min_rounds and after the pair decided; while the pair is undecided
    # past min_rounds, its rounds are the gate's alone (an undecided gate deploys nothing).
    joins = contends is not None and 0 < i and (i < plan.min_rounds or decision is not None)
    leading = set(contends(values, fair)) if joins and contends is not None else set()
    if decision is not None:
        promoted = more is not None and decision.verdict is gate.Verdict.promoted
        extra = set(more(values, fair)) if promoted and more is not None else set()
        extra |= leading
        if not extra:
            return None
    return _wanted(arms, leading, extra, decided=decision is not None, early=i < plan.min_rounds), extra


def _wanted(arms: list[Arm], leading: set[str], extra: set[str], *, decided: bool, early: bool) -> list[Arm]:
    """The pair, the leading contenders (measured as part of the pair), and the other arms: before
    min_rounds all of them (`early`), once the pair decided those still open (`extra`)."""
    return [
        replace(a, main=True) if a.name in leading else a
        for a in arms
        if a.main or a.name in leading or (a.name in extra if decided else early)
    ]


def _open_arms(
    port: Port,
    wanted: list[Arm],
    timing: _Timing,
    i: int,
    held: float,
    *,
    undecided: bool,
    after: int,
    plan: gate.RoundsPlan,
) -> list[Arm]:
    """The arms of round `i` that fit, with `held` seconds kept back; when none fit and the gate is still
    undecided, the time held is the gate's (nothing is deployed yet to measure after it)."""
    open_arms = _fitting_round(port, wanted, timing, i, held)
    if not open_arms and held and undecided:
        # Undecided, nothing is deployed and the arms measured after it have nothing to describe: the
        # gate's next round takes their time (they are dropped with a line if none is left). Before
        # min_rounds the time kept for the gate's later rounds never stops its own pair.
        open_arms = _fitting_round(port, wanted, timing, i)
        if open_arms and i >= plan.min_rounds:
            log.warning(
                "confirmation: the gate is still undecided after %d rounds; round %d takes the time "
                "held for the arms measured after the decision",
                after,
                i + 1,
            )
    return open_arms


def _fitting_round(port: Port, open_arms: list[Arm], timing: _Timing, i: int, hold_s: float = 0.0) -> list[Arm]:
    """The arms of round `i` that fit the time left (less `hold_s`), chosen as the night's plan chooses
    them (schedule.plan, one round): the main pair, then the other arms by value (the runner-up, which can
    still win, before the ablations) while they fit; none when the pair itself does not. Each arm left
    out is named in one line. A contender measured as part of the pair (run_rounds' `contends`) that
    leaves the pair no room is measured by value instead, after the pair."""

    def fitted(arms: list[Arm]) -> schedule.ConfirmationPlan:
        return schedule.plan(
            [(a.name, a.concurrency, a.main) for a in arms],
            seconds=timing.seconds,
            left_s=port.timeout_s - hold_s - port.elapsed(),
            share_s=math.inf,
            min_rounds=1,
            gate_level=port.spec.benchmark.concurrency,
            slots=timing.slots,
        )

    fit = fitted(open_arms)
    if not fit.arms and any(a.main and a.name not in schedule.PAIR for a in open_arms):
        fit = fitted([replace(a, main=a.name in schedule.PAIR) if a.main else a for a in open_arms])
    kept = {a.name for a in fit.arms}
    if kept and fit.dropped:
        held = f", {hold_s / 3600:.2f} h held back" if hold_s > 0 else ""
        log.warning(
            "confirmation: round %d leaves out %s%s", i + 1, "; ".join(f"{d.name} ({d.why})" for d in fit.dropped), held
        )
    return [a for a in open_arms if a.name in kept]


def _gate_hold(
    port: Port,
    values: Mapping[str, Mapping[int, float]],
    arms: Sequence[Arm],
    plan: gate.RoundsPlan,
    timing: _Timing,
    i: int,
) -> float:
    """Seconds round `i` (before min_rounds) keeps for the gate's rounds past min_rounds that the noise
    measured so far says it will need (rounds_needed): the other arms of this round give way
    to them, the runner-up last. Zero before two rounds are in, or when min_rounds should decide; never
    so much that this round's own pair would not fit."""
    if i < 2 or i >= plan.min_rounds:
        return 0.0
    champ, base = _main(values)
    noise = gate.pair_noise(values)
    if noise is None or len(champ) < 2:
        return 0.0
    gain = gate.evidence(champ, base, direction=port.spec.objective.direction, level=plan.level, noise=noise).gain
    extra = rounds_needed(gain, noise, plan) - plan.min_rounds
    if extra <= 0:
        return 0.0
    pair_s = timing.round_s([a for a in arms if a.main])
    # The rounds up to min_rounds keep at least their pair (a second's margin against rounding).
    left_s = port.timeout_s - port.elapsed() - (plan.min_rounds - i) * pair_s - 1.0
    hold = min(extra * pair_s, max(left_s, 0.0))
    if hold > 0:
        log.warning(
            "confirmation: the rounds so far measure %.1f%% run-to-run noise and a %s gain, so the gate "
            "is expected to need %d rounds (%.0f%% chance of a verdict); round %d keeps %.2f h for them",
            noise.sigma * 100,
            _pct(gain),
            plan.min_rounds + extra,
            POWER * 100,
            i + 1,
            hold / 3600,
        )
    return hold


def _decided(port: Port, values: Mapping[str, Mapping[int, float]], plan: gate.RoundsPlan) -> gate.Decision | None:
    """The gate's decision once min_rounds are in and it reaches a verdict; None to measure on."""
    decision = gate.gate_of(values, "champion", plan, direction=port.spec.objective.direction)
    return decision if decision is not None and decision.verdict is not None else None


@dataclass(frozen=True)
class _Timing:
    """How long runs take: each arm's expected run at its load (sweep.schedule, from this sweep's measured
    trials), the arms measured `slots` at a time."""

    seconds: Callable[[int], float]
    slots: int

    def round_s(self, arms: Sequence[Arm]) -> float:
        return sum(self.seconds(a.concurrency) for a in arms) / self.slots


def timing_of(port: Port) -> _Timing:
    return _Timing(schedule.run_seconds(port.spec, port.outcomes), max(port.slots(), 1))


def row(port: Port, run: Run, i: int, values: dict[str, dict[int, float]]) -> ConfirmationRow:
    """One finished confirmation run (kept and logged by the port) as a row; its value goes into `values`."""
    arm, outcome = run.arm, run.outcome
    if outcome is None:
        return ConfirmationRow(round=i, who=arm.name, status=TrialStatus.FAILED, reason=(run.lost or "lost")[:200])
    value = value_of(outcome, port.spec.objective.metric)
    if value is not None:
        values[arm.name][i] = value
    ttft = value_of(outcome, "ttft_ms_p50") if value is not None else None  # a complete run's positive TTFT
    return ConfirmationRow(
        round=i,
        who=arm.name,
        status=outcome.status,
        concurrency=arm.concurrency,
        value=value,
        reason=None if value is not None else outcome.reason[:200],
        ttft_ms=ttft if ttft is not None and math.isfinite(ttft) else None,
    )


def value_of(outcome: TrialOutcome, metric: str) -> float | None:
    """The objective's value of a complete run, when positive; None otherwise."""
    raw = getattr(outcome.metrics, metric) if outcome.metrics is not None else None
    return float(raw) if outcome.status is TrialStatus.COMPLETE and raw is not None and raw > 0 else None


def _main(values: Mapping[str, Mapping[int, float]]) -> tuple[list[float], list[float]]:
    """The champion's and the baseline's values of the rounds that measured both, in round order."""
    return gate.paired(values.get("champion", {}), values.get("baseline", {}))


def _undecided(
    port: Port, values: Mapping[str, Mapping[int, float]], plan: gate.RoundsPlan, rounds: int, stopped: str
) -> gate.Decision | None:
    """Stopped early or rounds failed: the evidence so far, and no verdict but "undecided" (None
    with fewer than two complete rounds)."""
    champ, base = _main(values)
    if len(champ) < 2:
        return None
    ev = gate.evidence(
        champ, base, direction=port.spec.objective.direction, level=plan.level, noise=gate.pair_noise(values)
    )
    why = stopped or f"{rounds - len(champ)} of {rounds} rounds failed"
    return gate.Decision(
        gate.Verdict.undecided,
        ev,
        f"undecided after {len(champ)} complete round(s): {_pct(ev.gain)} [{_pct(ev.low)}, {_pct(ev.high)}]; "
        f"{why}; see {port.workdir / 'confirm'}, then {port.resume_hint} or raise budget.wall_time",
    )


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


# ------------------------------------------------------------------------------ the questions still open


def still_open(
    port: Port, params: Mapping[str, ParamValue], values: Values, plan: gate.RoundsPlan, fair: Values | None
) -> list[str]:
    """The arms whose question is still open, for which the rounds go on (beside the main pair) while
    the night allows: the ablations whose part is neither shown to add less than
    promotion.equivalence_margin nor significant, and the runner-up while its near-tie with the
    champion (of knobs `params`) is neither settled nor shown equivalent (which of the two is deployed
    depends on it; asked of `fair` where given: verdict.speed)."""
    margin, direction = port.spec.promotion.equivalence_margin, port.spec.objective.direction
    checks = part_checks(
        values, speculation=speculation_name(params), margin=margin, level=plan.level, direction=direction
    )
    judged = values if fair is None else fair
    runner = ["runner_up"] if contender_open(judged, "runner_up", margin=margin, direction=direction) else []
    return runner + open_parts(checks)


def speculation_name(params: Mapping[str, ParamValue]) -> str:
    """A configuration's speculation in words: its algorithm's label in the registry ("EAGLE-3"), the value
    itself for one the registry does not know, "speculation" for none."""
    name = params.get("speculative_algorithm")
    algo = speculation_registry.ALGORITHMS.get(str(name)) if name else None
    return (algo.label or algo.name) if algo is not None else str(name or "speculation")


def part_checks(
    values: Mapping[str, Mapping[int, float]],
    *,
    speculation: str,
    margin: float,
    level: float,
    direction: gate.Direction,
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
        a, b = gate.paired(values["champion"], values[arm])
        if len(a) < 2:
            continue
        ev = gate.evidence(a, b, direction=direction, level=level, noise=gate.pair_noise(values, "champion", arm))
        out.append(
            PartCheck(part=part, arm=arm, gain=ev.gain, low=ev.low, high=ev.high, rounds=ev.rounds, margin=margin)
        )
    return out


def contender_open(
    values: Mapping[str, Mapping[int, float]], contender: str, *, margin: float, direction: gate.Direction
) -> bool:
    """Whether the near-tie between the champion and `contender` is still open after the rounds so far:
    neither is significantly better (the 95% interval of their paired ratio holds zero) and they are not
    shown equivalent either (the interval reaches past +-margin); more rounds could settle which to deploy."""
    if contender not in values or "champion" not in values:
        return False
    interval = gate.compare(
        *gate.paired(values[contender], values["champion"]),
        direction=direction,
        noise=gate.pair_noise(values, contender, "champion"),
    )
    if interval is None:
        return False
    tie = interval.low <= 0.0 <= interval.high
    equivalent = -margin < interval.low and interval.high < margin
    return tie and not equivalent


def open_parts(checks: Sequence[PartCheck]) -> list[str]:
    """The ablation arms whose part is neither shown negligible nor significant: more rounds could settle them."""
    return [c.arm for c in checks if c.verdict is PartVerdict.open]


# ------------------------------------------------------------------------------ the rounds the gate will need


POWER = 0.99
"""The chance of a verdict the confirmation plans its gate's rounds for (`rounds_needed`)."""


def gate_df(noise: gate.RoundNoise, n: int) -> int:
    """The degrees of freedom the gate's bound can count on at round `n` (evidence): the pair's own
    n - 1, or, with other arms in the rounds so far, theirs and one for each later round of the pair.
    The other arms' later rounds are not counted: the time this plan holds for the gate is what they
    give way to (_gate_hold)."""
    if noise.arms <= 2 or noise.rounds < 2:
        return n - 1
    return max(n - 1, noise.df + max(n - noise.rounds, 0))


def rounds_needed(gain: float, noise: gate.RoundNoise, plan: gate.RoundsPlan, *, power: float = POWER) -> int:
    """The fewest rounds (min_rounds to max_rounds) at which the gate reaches a verdict with chance
    `power`, were the pair's true gain `gain` (relative, as Evidence.gain) and one run's noise `noise`:
    the one-sided t test each look makes, its power from the noncentral t on the degrees of freedom the
    bound will have (gate_df: the sample spread of a few rounds is itself uncertain, which is why 3
    rounds of the pair alone at 4% noise miss a +60% gain about one time in ten: t(2) at 99.5% is 9.9).
    max_rounds when none reaches it."""
    from scipy import stats  # deferred, as in gate.evidence()

    margin = abs(math.log1p(gain) - math.log1p(plan.min_gain))
    sigma_d = max(noise.sigma, 1e-9) * math.sqrt(2.0)  # one round's log ratio: two runs
    for n in range(plan.min_rounds, plan.max_rounds + 1):
        df = gate_df(noise, n)
        crit = float(stats.t.ppf(plan.level, df))
        if float(stats.nct.sf(crit, df, margin * math.sqrt(n) / sigma_d)) >= power:
            return n
    return plan.max_rounds
