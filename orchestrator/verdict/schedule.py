"""One clock for the night: what the confirmation will cost, held back before the first launch.

`--timeout` is the whole run. Before the first launch (and again as trials finish and their real
start-up and benchmark seconds replace the cost model's), the confirmation is planned: the gate's own
two arms (champion, baseline) for min_rounds rounds are always held back; the other arms (runner-up,
ablations, the adaptive-or-fixed counterpart, other load levels) are added by value while they fit in
`promotion.confirm_share` of the night and leave the search its floor: promotion.min_search_trials
(default 1.5 x sampler.startup_trials), enough to find the optimum and measure it again. So the split
scales with the night: on a long one the share binds, on a short one the floor does, and the arms of
least value go first (other load levels, the step comparison, the ablations, then the runner-up), each
with a line in `sweep plan`. The search launches a trial only when it is expected to end before that
reserve begins. At the confirmation, the arms are fitted again to the time really left:
an arm that does not fit is dropped with a line saying so, the gate's pair last.

Seconds per run come from the trials this sweep measured (median start-up + benchmark, scaled to
the arm's load by the cost model's ratio) and, before any finished, from the cost model
(results.cost, simulator.cost.trial_cost) over the baseline, the slowest configuration a sweep
measures (so the reserve errs long). On the simulated engine the model's load seconds are scaled by
simulator.time_scale, as the simulated server sleeps them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from orchestrator.config import knobs
from orchestrator.config.experiment import SweepSpec
from orchestrator.records import TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import cost as cost_mod
from orchestrator.results.cost import TrialCost
from orchestrator.search import space as sp

VALUE_ORDER = ("runner_up", "no_speculation", "default_communication", "with_speculation", "with_default_speculation")
"""The other arms at the gate's level, most useful first: the runner-up can still win (a near-tie is
settled by measurement), the ablations decide the simpler configuration and say why it won; with a
champion that does not speculate, the best speculation on its NCCL settings says what speculation adds."""

COUNTERPARTS = ("steps", "adaptive", "fixed")
"""Names of the adaptive-or-fixed arms (before the champion is known: steps@<level>)."""


@dataclass(frozen=True)
class PlannedArm:
    """One arm of the confirmation with its expected cost."""

    name: str
    concurrency: int
    main: bool
    run_s: float
    """Expected seconds of one run of this arm."""
    rounds: int

    @property
    def total_s(self) -> float:
        return self.run_s * self.rounds


@dataclass(frozen=True)
class Dropped:
    name: str
    why: str


@dataclass(frozen=True)
class ConfirmationPlan:
    """The arms that fit, those that do not, and the seconds the kept ones take."""

    arms: tuple[PlannedArm, ...]
    dropped: tuple[Dropped, ...]
    slots: int = 1
    pair_s: float = 0.0
    """The gate's pair's min_rounds rounds with the baseline at its own measured seconds: the least held back."""

    @property
    def seconds(self) -> float:
        """Expected seconds of the kept arms' rounds, `slots` runs at a time (at least the pair's own)."""
        return max(sum(a.total_s for a in self.arms) / max(self.slots, 1), self.pair_s)

    @property
    def fits(self) -> bool:
        """Whether the gate's own pair is kept (without it nothing can be decided)."""
        return {a.name for a in self.arms if a.main} >= set(PAIR)

    def lines(self) -> list[str]:
        """What `sweep plan` and the console say of it."""
        out = [
            f"confirmation: {a.name} at {a.concurrency} stream(s), {a.rounds} round(s) x {a.run_s / 60:.1f} min"
            f" = {a.total_s / 3600:.2f} h"
            for a in self.arms
        ]
        out += [f"confirmation: {d.name} not measured: {d.why}" for d in self.dropped]
        if self.pair_s > sum(a.total_s for a in self.arms) / max(self.slots, 1):
            out.append(
                f"confirmation: {self.pair_s / 3600:.2f} h held back: the gate's pair with the baseline at its "
                "own measured seconds (slower than the search's median trial)"
            )
        return out


PAIR = ("champion", "baseline")


def value_rank(name: str, concurrency: int, gate_level: int) -> tuple[int, int, int]:
    """Sort key of the unit an arm belongs to, by value: the gate's pair; the other arms at the
    gate's level in VALUE_ORDER; the adaptive-or-fixed counterpart there; then each other level
    (lowest first), its pair before its counterpart."""
    base = name.split("@")[0]
    if concurrency == gate_level:
        if base in PAIR:
            return (0, 0, 0)
        if base in VALUE_ORDER:
            return (1, VALUE_ORDER.index(base), 0)
        return (2, 0, 0)
    return (3, concurrency, 1 if base in COUNTERPARTS else 0)  # the deployed arm and the baseline: the pair


def candidate_arms(spec: SweepSpec) -> list[tuple[str, int, bool]]:
    """The arms a confirmation of `spec` may measure, before the champion is known: the worst case
    (a champion that speculates and sets NCCL knobs, a runner-up found). (name, concurrency, main).
    Without promotion.explain a rival of the pick takes the step control's place (verdict.arms.arms): the
    gate level's step control is listed as the seat both may take ("runner_up or steps@<level>"), and the
    rival has a seat of its own only where there is none (no speculation, an SGLang version without
    adaptive steps, or the gate's level not among promotion.concurrency)."""
    level = spec.benchmark.concurrency
    algo = spec.space.params.get("speculative_algorithm")
    speculates = algo is not None and any(v is not None for v in algo.values())
    steps = speculates and spec.sglang_version in knobs.ADAPTIVE_VERSIONS
    arms = [("champion", level, True), ("baseline", level, True), *_beside_pair(spec, speculates, steps)]
    for c in spec.promotion.concurrency or (level,):
        if c != level:
            arms += [(f"champion@{c}", c, False), (f"baseline@{c}", c, False)]
        if steps:  # without explain, the gate level's seat is the rival's when one is found
            seat = "runner_up or steps" if c == level and not spec.promotion.explain else "steps"
            arms.append((f"{seat}@{c}", c, False))
    return arms


def _beside_pair(spec: SweepSpec, speculates: bool, steps: bool) -> list[tuple[str, int, bool]]:
    """candidate_arms' other arms at the gate's level: the runner-up and the ablations (promotion.explain),
    or the rival where no step control holds its seat."""
    level = spec.benchmark.concurrency
    steps_here = steps and level in (spec.promotion.concurrency or (level,))
    if not spec.promotion.explain:
        return [] if steps_here else [("runner_up", level, False)]
    arms = [("runner_up", level, False)]
    if speculates:
        arms += [("no_speculation", level, False), ("default_communication", level, False)]
    if steps_here:
        # A deployed configuration other than the champion (the runner-up, or its speculation at NCCL
        # defaults) is measured again at the gate's level beside its own adaptive-or-fixed counterpart.
        arms.append(("steps-deployed", level, False))
    return arms


def _model_cost(spec: SweepSpec, concurrency: int) -> TrialCost | None:
    """The cost model's seconds of one baseline run at `concurrency` streams (None when unknown)."""
    params = sp.baseline_params(spec.space)
    return cost_mod.expected_cost(at_concurrency(spec, concurrency), params).cost


def _load_s(spec: SweepSpec, cost: TrialCost | None) -> float:
    if cost is None:
        return 1800.0
    if spec.engine == "simulator":
        return max(spec.simulator.time_scale * cost.load_s, cost_mod.SIMULATED_START_S)
    return cost.load_s


def _model_bench_s(spec: SweepSpec, concurrency: int) -> float | None:
    cost = _model_cost(spec, concurrency)
    return None if cost is None else cost.warmup_s + cost.benchmark_s


def at_concurrency(spec: SweepSpec, level: int) -> SweepSpec:
    """The experiment benchmarked at `level` concurrent requests (at least one request per stream): what
    a confirmation arm at that level runs, and what its cost is planned from."""
    if level == spec.benchmark.concurrency:
        return spec
    bench = spec.benchmark.model_copy(update={"concurrency": level, "requests": max(spec.benchmark.requests, level)})
    return spec.model_copy(update={"benchmark": bench})


def run_seconds(spec: SweepSpec, measured: Iterable[TrialOutcome]) -> Callable[[int], float]:
    """Expected seconds of one run at a given concurrency: the measured median start-up + benchmark
    of this sweep's complete trials at the gate's level, scaled to other levels by the cost model's
    ratio; the cost model alone before any trial finished (an hour per run when even that is unknown)."""
    starts, benches = [], []
    for o in measured:
        if (
            o.status is TrialStatus.COMPLETE
            and o.role is not TrialRole.confirm
            and o.timings.get("server_start") is not None
            and o.timings.get("bench") is not None
        ):
            starts.append(float(o.timings["server_start"]))
            # A search trial's output capture (the correctness screen) is part of its cost.
            benches.append(float(o.timings["bench"]) + float(o.timings.get("outputs") or 0.0))
    level = spec.benchmark.concurrency
    at_level = _model_bench_s(spec, level)
    cache: dict[int, float] = {}

    def seconds(concurrency: int) -> float:
        if concurrency not in cache:
            modelled = _model_bench_s(spec, concurrency)
            if benches:
                ratio = (modelled / at_level) if modelled and at_level else 1.0
                cache[concurrency] = statistics.median(starts) + statistics.median(benches) * ratio
            else:
                cache[concurrency] = _load_s(spec, _model_cost(spec, concurrency)) + (
                    modelled if modelled is not None else 3600.0
                )
        return cache[concurrency]

    return seconds


def plan(
    arms: Sequence[tuple[str, int, bool]],
    *,
    seconds: Callable[[int], float],
    left_s: float,
    share_s: float,
    min_rounds: int,
    gate_level: int,
    slots: int = 1,
    floor: SearchFloor | None = None,
) -> ConfirmationPlan:
    """Fit `arms` into `left_s` seconds by unit (a level's champion/baseline pair together; a
    counterpart only beside its level's champion): the gate's pair first (dropped only when even it does
    not fit, and everything with it), then the others by value while their total stays within
    `share_s`, everything within `left_s` and, with a `floor`, within `left_s` less the search's floor."""
    slots = max(slots, 1)
    units: dict[tuple[int, int, int], list[PlannedArm]] = {}
    for name, concurrency, main in arms:  # a main arm beside the pair (a leading runner-up) is of its unit
        units.setdefault((0, 0, 0) if main else value_rank(name, concurrency, gate_level), []).append(
            PlannedArm(name, concurrency, main, seconds(concurrency), min_rounds)
        )
    kept: list[PlannedArm] = []
    dropped: list[Dropped] = []
    used = others = 0.0
    levels_kept = {gate_level}
    for key in sorted(units):
        unit = units[key]
        cost = sum(a.total_s for a in unit) / slots
        names = " + ".join(a.name for a in unit)
        if key[0] == 0:
            if used + cost > left_s:
                why = (
                    f"the gate's pair ({names}) needs {cost / 3600:.2f} h for {min_rounds} rounds, "
                    f"{left_s / 3600:.2f} h left"
                )
                return ConfirmationPlan((), tuple(Dropped(a[0], why) for a in arms), slots)
            kept += unit
            used += cost
            continue
        left_out = _left_out(
            key, cost, levels_kept, used=used, others=others, left_s=left_s, share_s=share_s, floor=floor
        )
        if left_out is not None:
            dropped += [Dropped(a.name, left_out) for a in unit]
            continue
        kept += unit
        used += cost
        others += cost
        if key[0] == 3:
            levels_kept.add(key[1])
    return ConfirmationPlan(tuple(kept), tuple(dropped), slots)


def _left_out(
    key: tuple[int, int, int],
    cost: float,
    levels_kept: set[int],
    *,
    used: float,
    others: float,
    left_s: float,
    share_s: float,
    floor: SearchFloor | None = None,
) -> str | None:
    """Why a unit other than the gate's pair is left out (its level's pair not measured, the night's time,
    the other arms' share, the search's floor), or None when it fits."""
    if key[0] == 3 and key[2] == 1 and key[1] not in levels_kept:
        return f"its level's champion and baseline ({key[1]} streams) are not measured"
    if used + cost > left_s:
        return f"{cost / 3600:.2f} h does not fit the {max(left_s - used, 0) / 3600:.2f} h left of the night"
    if others + cost > share_s:
        return f"{cost / 3600:.2f} h would take the other arms past promotion.confirm_share ({share_s / 3600:.2f} h)"
    if floor is not None and used + cost > left_s - floor.seconds:
        return (
            f"{cost / 3600:.2f} h would leave the search fewer than {floor.trials} trials "
            f"({floor.seconds / 3600:.2f} h, promotion.min_search_trials)"
        )
    return None


@dataclass(frozen=True)
class SearchFloor:
    """The search trials a night keeps before the confirmation's other arms get time, and their seconds."""

    trials: int
    seconds: float


def search_floor_trials(spec: SweepSpec) -> int:
    """promotion.min_search_trials, by default one and a half times sampler.startup_trials (the start-up,
    then half as many trials led by the model, among them a re-measure of a near-tie); never above
    budget.trials."""
    wanted = spec.promotion.min_search_trials
    return min(3 * spec.sampler.startup_trials // 2 if wanted is None else wanted, spec.budget.trials)


def reserve(
    spec: SweepSpec, measured: Iterable[TrialOutcome], *, wall_s: float | None = None, slots: int = 1
) -> ConfirmationPlan:
    """The confirmation held back from the start of a night of `wall_s` seconds (default
    budget.wall_time): the worst-case arms of `spec` that fit beside the search's floor (the gate's pair
    always), never less than the gate's pair at the baseline's own measured seconds; nothing without a
    gate (max_rounds 0)."""
    wall = spec.budget.wall_time if wall_s is None else wall_s
    if not spec.promotion.max_rounds:
        return ConfirmationPlan((), (), slots)
    measured = list(measured)
    seconds = run_seconds(spec, measured)
    trials = search_floor_trials(spec)
    planned = plan(
        candidate_arms(spec),
        seconds=seconds,
        left_s=wall,
        share_s=spec.promotion.confirm_share * wall,
        min_rounds=spec.promotion.min_rounds,
        gate_level=spec.benchmark.concurrency,
        slots=slots,
        floor=SearchFloor(trials, trials * seconds(spec.benchmark.concurrency) / max(slots, 1)),
    )
    if not planned.fits:
        return planned
    # The baseline is the slowest configuration measured: its own runs, not the search's median (whose
    # trials speculate), say what the gate's rounds take (before it finished, the cost model's, which is
    # the baseline's). The other arms give way to the pair at the confirmation, so they may cover its
    # difference; a reserve of the pair alone must hold it.
    level = spec.benchmark.concurrency
    of_baseline = run_seconds(spec, [o for o in measured if o.role is TrialRole.baseline])
    pair_s = spec.promotion.min_rounds * (seconds(level) + of_baseline(level)) / max(slots, 1)
    return replace(planned, pair_s=pair_s)


@dataclass(frozen=True)
class NightPlan:
    """`sweep plan`'s schedule of the night: probe, search, confirmation."""

    wall_s: float
    probe_s: float
    confirmation: ConfirmationPlan
    trial_s: float
    slots: int

    @property
    def search_s(self) -> float:
        return max(self.wall_s - self.probe_s - self.confirmation.seconds, 0.0)

    @property
    def trials(self) -> int:
        return int(self.search_s // self.trial_s) * self.slots if self.trial_s > 0 else 0

    @property
    def fits(self) -> bool:
        return self.confirmation.fits and self.search_s >= self.trial_s

    def lines(self) -> list[str]:
        out = [
            f"night: {self.wall_s / 3600:.2f} h = probe {self.probe_s / 3600:.2f} h + search "
            f"{self.search_s / 3600:.2f} h (about {self.trials} trial(s) of {self.trial_s / 60:.1f} min) + "
            f"confirmation {self.confirmation.seconds / 3600:.2f} h"
        ]
        out += self.confirmation.lines()
        if not self.fits:
            out.append(
                "this plan does not fit: lower promotion.min_rounds, promotion.concurrency or "
                "benchmark.requests / repeats, or raise budget.wall_time"
            )
        return out


def night_plan(spec: SweepSpec, *, probe_settings: int = 0, wall_s: float | None = None) -> NightPlan:
    """The schedule a sweep of `spec` starts with, from the cost model."""
    slots = spec.budget.concurrent_trials
    wall = spec.budget.wall_time if wall_s is None else wall_s
    confirmation = reserve(spec, (), wall_s=wall, slots=slots)
    probe_s = cost_mod.probe_seconds(spec, probe_settings) if spec.probe.enabled else 0.0
    if spec.engine == "simulator":
        probe_s *= spec.simulator.time_scale
    trial_s = run_seconds(spec, ())(spec.benchmark.concurrency)
    return NightPlan(wall, probe_s, confirmation, trial_s, slots)


def rounds_fit(left_s: float, round_s: float) -> int:
    """Whole rounds of `round_s` seconds that fit in `left_s`."""
    return max(int(math.floor(left_s / round_s)), 0) if round_s > 0 else 0
