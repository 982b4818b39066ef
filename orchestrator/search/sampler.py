"""The samplers of the study, on Optuna's public sampler API (BaseSampler: infer_relative_search_space,
sample_relative, sample_independent; Study.get_trials, Study.user_attrs).

FailureAwareTPE: Optuna's TPE builds its densities from COMPLETE and PRUNED trials only, so a FAIL is
invisible to it, while a trial whose constraints are violated goes to its "above" (bad) density. It
hands TPE a copy of the study in memory (optuna.create_study, add_trials, create_trial) in which the
failures told with FAILED_CONSTRAINT are complete trials with that constraint violated: TPE proposes
the failing region less, and the real storage keeps them FAIL for everything else (status, resume).

StageTwoSampler (a two-stage sweep, once the probe kept NCCL settings): the local refinement
(search/refine.py: the edge of the latest failed region, search/regions.py, else the next untried
neighbour of the best measured points, never a point a failed region's core holds) proposes every fresh
trial until `startup_trials` points it chose itself were measured (the enqueued baseline and warm start
do not count: a TPE fitted on them alone samples all but at random), then two of every TPE_EVERY; the
failure-aware TPE proposes the rest and keeps exploring in between.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.study import Study as OptunaStudy
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from orchestrator.config.experiment import SearchSpace
from orchestrator.records import ParamValue, prefill_group, prefill_x, split_point
from orchestrator.search import space as sp
from orchestrator.search.refine import Refinement
from orchestrator.search.regions import regions_of
from orchestrator.stats import covariate_adjusted

NCCL_SETTING = "probe.nccl_rank"
"""The one integer that replaces the NCCL knobs once a probe kept some settings: the setting's rank in
the probe's ranking (1 = fastest), so TPE can learn that low ranks are good; `TrialView.params`
shows the knobs again."""
PROBE_SETTINGS_ATTR = "probe_settings"
"""Study attribute: {label: {NCCL knob: value}} of the kept settings, so a resumed study asks the same way."""
PROBE_LATENCY_ATTR = "probe_latency"
"""Study attribute: {kept label: {size label (decode, verify-<n>): median us}}, what the refinement reads."""
PROBE_FIXED_ATTR = "probe_fixed"
"""Study attribute: {knob: value} the probe left one value of (sweep/_probe_stage.fixed_backend): fresh
proposals take it and the refinement proposes no point with another value."""
FAILED_CONSTRAINT = "failed"
"""The constraint a failure the sampler learns from is told with (1.0: violated)."""
OUTPUTS_CHANGED_ATTR = "outputs_changed"
"""Trial attribute: why the search's correctness screen found the trial's greedy outputs changed
(sweep/_screen.py). The trial stays COMPLETE with its values; the samplers read it as FAILED_CONSTRAINT
violated (TPE's bad density), and the refinement does not start from it."""
RUN_TTFT_ATTR = "run_ttft_ms"
"""Trial attribute: the run's TTFT (ms, median) where the objective is a decode rate (results.select.run_speed):
the refinement ranks its points with each run's own speed taken out (adjusted)."""
TPE_EVERY = 3
"""Every third fresh proposal of stage two is TPE's; the other two are the refinement's."""


def point_of(params: Mapping[str, Any], settings: Mapping[str, Mapping[str, ParamValue]]) -> dict[str, ParamValue]:
    """A trial's Optuna params in our terms: the kept setting's rank replaced by its NCCL knobs."""
    point = dict(params)
    rank = point.pop(NCCL_SETTING, None)
    kept = list(settings.values())
    if isinstance(rank, int) and 1 <= rank <= len(kept):
        point.update(kept[rank - 1])
    return point


def distributions(space: SearchSpace, settings: Mapping[str, Mapping[str, ParamValue]]) -> dict[str, BaseDistribution]:
    """The distribution each name is asked with: the kept setting's rank instead of the NCCL knobs
    when there are kept settings, every other knob of the space as itself."""
    out: dict[str, BaseDistribution] = {}
    nccl: set[str] = set()
    if settings:
        out[NCCL_SETTING] = IntDistribution(1, len(settings))
        nccl = set(next(iter(settings.values())))
    for name in sp.ordered(space):
        if name not in nccl:
            out[name] = sp.distribution(space.params[name])
    return out


def _learned_failure(t: FrozenTrial) -> bool:
    return t.state == TrialState.FAIL and t.constraints.get(FAILED_CONSTRAINT, 0.0) > 0


class FailureAwareTPE(BaseSampler):
    """Multivariate, grouped TPE with constant liar that also learns from failures told with
    FAILED_CONSTRAINT (module doc). Random for the first `n_startup_trials` complete trials."""

    def __init__(self, *, seed: int | None, n_startup_trials: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # multivariate+group model the interactions between knobs and handle conditional ones;
            # constant_liar keeps concurrent trials from being proposed the same point.
            self._tpe = TPESampler(seed=seed, n_startup_trials=0, multivariate=True, group=True, constant_liar=True)
        self._random = RandomSampler(seed=seed)
        self._startup = n_startup_trials
        self._copy: tuple[int, OptunaStudy, FrozenTrial] | None = None

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()
        self._random.reseed_rng()

    def _started(self, study: OptunaStudy) -> bool:
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))) >= self._startup

    def _view(self, study: OptunaStudy, trial: FrozenTrial) -> tuple[OptunaStudy, FrozenTrial]:
        """The study as TPE should read it, in memory, and the trial being asked in it (one per trial)."""
        if self._copy is not None and self._copy[0] == trial.number:
            return self._copy[1], self._copy[2]
        copy = optuna.create_study(directions=study.directions, sampler=RandomSampler(seed=0))
        shown: list[FrozenTrial] = []
        for t in study.get_trials(deepcopy=False):
            if t.number == trial.number:
                continue
            failed = _learned_failure(t)
            if failed or (t.state == TrialState.COMPLETE and t.user_attrs.get(OUTPUTS_CHANGED_ATTR)):
                # TPE splits off a violated constraint before it reads any value (a failure has none)
                values = [0.0] * len(study.directions) if failed else t.values
                shown.append(
                    optuna.trial.create_trial(
                        params=t.params,
                        distributions=t.distributions,
                        values=values,
                        constraints={FAILED_CONSTRAINT: 1.0},
                    )
                )
            elif t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING):
                shown.append(
                    optuna.trial.create_trial(
                        state=t.state,
                        params=t.params,
                        distributions=t.distributions,
                        values=t.values,
                        intermediate_values=t.intermediate_values,
                        constraints=t.constraints or None,
                    )
                )
        copy.add_trials(shown)
        copy.ask()
        asked = copy.get_trials(deepcopy=False)[-1]
        self._copy = (trial.number, copy, asked)
        return copy, asked

    def infer_relative_search_space(self, study: OptunaStudy, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if not self._started(study):
            return {}
        copy, asked = self._view(study, trial)
        return self._tpe.infer_relative_search_space(copy, asked)

    def sample_relative(
        self, study: OptunaStudy, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or not self._started(study):
            return {}
        copy, asked = self._view(study, trial)
        return self._tpe.sample_relative(copy, asked, search_space)

    def sample_independent(
        self, study: OptunaStudy, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        if not self._started(study):
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        copy, asked = self._view(study, trial)
        return self._tpe.sample_independent(copy, asked, param_name, param_distribution)

    def after_trial(self, study: OptunaStudy, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        if self._copy is not None and self._copy[0] == trial.number:
            self._copy = None


class StageTwoSampler(FailureAwareTPE):
    """FailureAwareTPE that, once the study holds the probe's kept NCCL settings, gives the local
    refinement TPE's random start and then two of every TPE_EVERY fresh proposals (module doc). Enqueued trials (baseline, warm
    start, re-measures: they carry a role) take their fixed parameters and are not counted."""

    def __init__(self, space: SearchSpace, *, seed: int | None, n_startup_trials: int, breadth: bool = True):
        super().__init__(seed=seed, n_startup_trials=n_startup_trials)
        self._space = space
        self._breadth = breadth
        """A short search (refine.SHORT_SEARCH): the refinement goes breadth first and TPE waits for its own
        start-up points; a longer one keeps the plain order and TPE's start as Optuna counts it."""
        self._turn = 0
        self._refinement: Refinement | None = None
        self._chosen: tuple[int, dict[str, Any]] | None = None
        """(trial number, its Optuna params) when the refinement proposes the trial being asked."""

    def infer_relative_search_space(self, study: OptunaStudy, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if "role" in trial.user_attrs:  # enqueued: its parameters are fixed
            return {}
        self._turn += 1
        settings = study.user_attrs.get(PROBE_SETTINGS_ATTR) or {}
        due = self._tpe_due(study) if self._breadth else self._started(study)
        if settings and (self._turn % TPE_EVERY != 0 or not due):
            point = self._neighbour(study, settings)
            if point is not None:
                chosen = _optuna_params(self._space, point, settings)
                if chosen is not None:
                    self._chosen = (trial.number, chosen)
                    dists = distributions(self._space, settings)
                    return {name: dists[name] for name in chosen}
        self._chosen = None
        return super().infer_relative_search_space(study, trial)

    def _tpe_due(self, study: OptunaStudy) -> bool:
        """Whether TPE takes its turns: once `n_startup_trials` points the sampler chose itself (not enqueued:
        baseline, warm start, re-measures) were measured, so TPE's first model is more than the warm start."""
        own = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if "fixed_params" not in t.system_attrs and not t.user_attrs.get("skipped")
        ]
        return len(own) >= self._startup

    def sample_relative(
        self, study: OptunaStudy, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._chosen is not None and self._chosen[0] == trial.number:
            return dict(self._chosen[1])
        return super().sample_relative(study, trial, search_space)

    def _neighbour(
        self, study: OptunaStudy, settings: Mapping[str, Mapping[str, ParamValue]]
    ) -> dict[str, ParamValue] | None:
        refinement = self._refinement_for(study, settings)
        sign = 1.0 if study.directions[0] == StudyDirection.MAXIMIZE else -1.0
        measured: list[tuple[float, dict[str, ParamValue]]] = []
        ttft: list[Any] = []
        tried: set[str] = set()
        seen: list[Seen] = []
        refused: dict[int, float] = {}
        for t in study.get_trials(deepcopy=False):
            if t.state == TrialState.WAITING:
                continue
            point = sp.complete(self._space, point_of(t.params, settings))
            tried.add(sp.key(point))
            seen.append(Seen(t.number, t.state.name, point, t.user_attrs))
            if _measured(t):
                measured.append((t.values[0], point))
                ttft.append(t.user_attrs.get(RUN_TTFT_ATTR))
            elif t.state == TrialState.COMPLETE and t.values and t.user_attrs.get(OUTPUTS_CHANGED_ATTR):
                refused[t.number] = sign * t.values[0]
        if not measured:
            return None
        best = max(sign * v for v, _ in measured)
        slow = [n for n, v in refused.items() if v < best]  # no lead: its edge is not worth a launch
        measured = [(sign * v, p) for v, p in adjusted(measured, ttft)]
        return refinement.next(measured, tried, regions_of(seen), [s.params for s in seen], slow)

    def _refinement_for(self, study: OptunaStudy, settings: Mapping[str, Mapping[str, ParamValue]]) -> Refinement:
        """The refinement over the study's kept settings, latencies and fixed knobs (made again when they
        change, keeping its turn among the parents)."""
        latency = study.user_attrs.get(PROBE_LATENCY_ATTR) or {}
        fixed = study.user_attrs.get(PROBE_FIXED_ATTR) or {}
        old = self._refinement
        if old is not None and old.settings == settings and old.latency == latency and old.fixed == fixed:
            return old
        fresh = Refinement(self._space, settings, latency, fixed, breadth=self._breadth)
        if old is not None:
            fresh._rr = old._rr
        self._refinement = fresh
        return fresh


@dataclass(frozen=True)
class Seen:
    """A trial as search/regions.py reads it: number, state name, point (NCCL knobs restored), attributes."""

    number: int
    state: str
    params: dict[str, ParamValue]
    attrs: Mapping[str, Any]


def _measured(t: FrozenTrial) -> bool:
    """A measurement the refinement starts from: complete, launched, outputs unchanged."""
    return bool(
        t.state == TrialState.COMPLETE
        and t.values
        and not t.user_attrs.get("skipped")
        and not t.user_attrs.get(OUTPUTS_CHANGED_ATTR)
    )


def adjusted(
    measured: list[tuple[float, dict[str, ParamValue]]], ttft: list[Any]
) -> list[tuple[float, dict[str, ParamValue]]]:
    """The measured values with each run's own speed taken out where it recorded its TTFT (RUN_TTFT_ATTR:
    a trial of a study begun before it was kept has none and stays as measured) and the TTFT moves with
    the objective (stats.covariate_adjusted, as the pick's results.select.run_speed); as measured otherwise."""
    if not measured or not all(v > 0 for v, _ in measured):
        return measured
    x = [prefill_x(t) for t in ttft]
    out, found = covariate_adjusted(
        [math.log(v) for v, _ in measured],
        x,
        [(split_point(p),) for _, p in measured],
        [prefill_group(p) for _, p in measured],
    )
    if found is None or not found.applied:
        return measured
    return [(v if t is None else math.exp(y), p) for y, (v, p), t in zip(out, measured, x)]


def _optuna_params(
    space: SearchSpace, point: Mapping[str, ParamValue], settings: Mapping[str, Mapping[str, ParamValue]]
) -> dict[str, Any] | None:
    """`point` as the Optuna params a trial asks (its NCCL knobs as their kept setting's rank), unset knobs
    left out; None when its NCCL knobs are no kept setting."""
    ranks = [i + 1 for i, v in enumerate(settings.values()) if all(point.get(k) == x for k, x in v.items())]
    if not ranks:
        return None
    dists = distributions(space, settings)
    out: dict[str, Any] = {NCCL_SETTING: ranks[0]}
    for name, dist in dists.items():
        value = point.get(name)
        if name != NCCL_SETTING and (
            value is not None or (isinstance(dist, CategoricalDistribution) and None in dist.choices)
        ):
            out[name] = value
    return out
