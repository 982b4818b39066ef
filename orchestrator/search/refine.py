"""Stage two's local refinement: the edge of the latest failed region (search/regions.py: one draft token
fewer past an out-of-memory, the next NCCL protocol or no speculation past a hang), else the next untried
feasible neighbour of the best measured points; never a point a failed region's core holds.

PARENTS of the best measured points take turns, ranked by their pooled score (stats.pooled_scores),
so one lucky measurement does not decide where the refinement looks. A point's neighbours, in
order: the same point under the kept NCCL setting the probe measured fastest at this point's own
all-reduce size (its verify pass: draft tokens per request; a decode step without speculation),
then the pattern moves (a knob whose last measured step gained, one step further the same way: `continuations`),
then each speculation knob moved to the adjacent value of its list (a knob that becomes active
starts mid-list; the moves that change fewest active knobs first, so speculation switched off comes after
the moves within it), then the NCCL setting moved to the next-ranked kept one. Decode speed is smooth in
the speculation knobs, so the incumbents' neighbourhoods are where the last percents are. A speculation
shape nothing measured yet comes before a tried shape under another NCCL setting (the warm start measures
one shape under three settings; a short night has a few trials to find the shape the probe cannot see),
and a point the correctness screen refused that measured slower than the best is avoided, not explored.

Pure: the stage-two sampler (search/sampler.py) hands it what the study holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from orchestrator.config import eagle
from orchestrator.config.experiment import SearchSpace
from orchestrator.records import ParamValue, split_point
from orchestrator.search import space as sp
from orchestrator.search.regions import Region, holding
from orchestrator.stats import pooled_scores

PARENTS = 2
"""The best measured points whose neighbourhoods the refinement explores in turn."""
SHORT_SEARCH = 30
"""A search of at most this many trials (budget.trials) goes breadth first (`Refinement.breadth`): new
speculation shapes before tried ones, each knob moved once before a weak step is followed, the smallest
moves first. A longer night keeps the plain order, which the failure worlds of docs/benchmarks.md measure
better (fastest-hang: 10/10 against 5/10 at the same seeds with the breadth-first order)."""
CLEAR_GAIN = 0.04
"""A step's gain (log of the ratio of mean values) that one run's noise does not explain: at 2% per run
the difference of two runs has about 2.8% standard deviation. A weaker step is not followed before every
knob was moved once (breadth first)."""


class Refinement:
    """Neighbours of the best measured points of `space`, searched under the probe's kept NCCL `settings`
    ({label: {knob: value}}, fastest first) with its `latency` ({label: {size: us}})."""

    def __init__(
        self,
        space: SearchSpace,
        settings: Mapping[str, Mapping[str, ParamValue]],
        latency: Mapping[str, Mapping[str, float]] | None = None,
        fixed: Mapping[str, ParamValue] | None = None,
        breadth: bool = True,
    ):
        self.space = space
        self.breadth = breadth
        """New shapes and untouched knobs first (a short night, SHORT_SEARCH); else the plain order."""
        self.settings = {label: dict(v) for label, v in settings.items()}
        self.latency = {label: dict(v) for label, v in (latency or {}).items()}
        self.fixed = dict(fixed or {})
        """Knobs the probe left one value of: no neighbour takes another."""
        self._rr = 0

    def next(
        self,
        measured: Sequence[tuple[float, Mapping[str, ParamValue]]],
        tried: Collection[str],
        regions: Sequence[Region] = (),
        tried_points: Sequence[Mapping[str, ParamValue]] = (),
        slow: Collection[int] = (),
    ) -> dict[str, ParamValue] | None:
        """The next point whose key (`space.key`) is not in `tried` (measured, failed or in flight) and no
        failed region's core holds (search/regions.py); `measured` are (value, higher better, point).
        First the edges of the failed regions, latest failure first (a failure is the starting point for
        its neighbours), except those of the trials numbered in `slow` (points the correctness screen
        refused that measured slower than the best measured point: no lead, though still avoided); then
        the neighbours of the top PARENTS in turn, first those whose speculation shape (split_point) no
        measured point nor `tried_points` (failed or in flight) has, or the best point under its fastest
        NCCL setting, then any; when those are used up, the next best measured point's (best-first).
        None when every one is tried."""
        if not self.breadth:
            slow = ()
        for region in sorted((r for r in regions if r.number not in slow), key=lambda r: -r.number):
            for point in region.edge(self.space, self.settings):
                if self._open(point, tried, regions):
                    return point
        ranked = ranked_points(measured)
        top = ranked[:PARENTS]
        order = [top[(self._rr + i) % len(top)] for i in range(len(top))] + ranked[PARENTS:]
        means = _log_means(measured)
        if not self.breadth:
            return self._first(order, means, tried, regions, lambda _, __: True)
        shapes = {split_point(p)[0] for p in (*(q for _, q in measured), *tried_points)}
        fastest = self.fastest_nccl(ranked[0], regions) if ranked else None
        own = sp.key({**ranked[0], **fastest}) if fastest is not None else None  # the best, its fastest setting

        def fresh(parent: Mapping[str, ParamValue], point: Mapping[str, ParamValue]) -> bool:
            return split_point(point)[0] not in shapes or sp.key(point) == own

        def untouched(parent: Mapping[str, ParamValue], point: Mapping[str, ParamValue]) -> bool:
            """A pattern move whose step gained more than the noise, or a new shape one knob away along a
            knob no tried shape moved alone from the parent's."""
            strong = continuations(self.space, parent, means, skip=set(self._nccl()), min_gain=CLEAR_GAIN)
            if any(sp.key(point) == sp.key(c) for c in strong):
                return sp.key(point) not in tried
            knob = self._moved(parent, point)
            done = {self._moved(parent, dict(shape)) for shape in shapes}
            return len(knob) == 1 and split_point(point)[0] not in shapes and knob not in done

        # a new shape along an untouched knob, then any new shape, from the top parents; then any move, best-first
        parents = order[: len(top)]
        return (
            self._first(parents, means, tried, regions, untouched)
            or self._first(parents, means, tried, regions, fresh)
            or self._first(order, means, tried, regions, lambda _, __: True)
        )

    def _nccl(self) -> list[str]:
        return list(next(iter(self.settings.values()), {}))

    def _moved(self, parent: Mapping[str, ParamValue], point: Mapping[str, ParamValue]) -> frozenset[str]:
        """The speculation knobs active at `parent` whose value `point` changes (NCCL knobs aside)."""
        a, b = dict(split_point(parent)[0]), dict(split_point(point)[0])
        return frozenset(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and self._active(k, parent))

    def _first(
        self,
        parents: Sequence[Mapping[str, ParamValue]],
        means: Mapping[str, float],
        tried: Collection[str],
        regions: Sequence[Region],
        wanted: Callable[[Mapping[str, ParamValue], Mapping[str, ParamValue]], bool],
    ) -> dict[str, ParamValue] | None:
        """The first open (`_open`) neighbour of `parents`, in their order, that is `wanted` (parent, point)."""
        for params in parents:
            for point in self.neighbours(params, means, regions):
                if wanted(params, point) and self._open(point, tried, regions):
                    self._rr += 1
                    return point
        return None

    def _open(self, point: Mapping[str, ParamValue], tried: Collection[str], regions: Sequence[Region]) -> bool:
        """Untried, the probe's fixed knobs kept, and in no failed region's core."""
        return (
            sp.key(point) not in tried
            and all(point.get(k) == v for k, v in self.fixed.items())
            and holding(regions, point) is None
        )

    def fastest_nccl(
        self, params: Mapping[str, ParamValue], regions: Sequence[Region] = ()
    ) -> dict[str, ParamValue] | None:
        """The kept NCCL setting the probe measured fastest at `params`' own all-reduce size that puts
        `params` in no failed region's core, or None."""
        eff = eagle.effective(dict(params))
        draft = eff.get("speculative_num_draft_tokens") if eff.get("speculative_algorithm") else None
        size = f"verify-{draft}" if draft else "decode"
        timed = sorted((by_size[size], label) for label, by_size in self.latency.items() if size in by_size)
        for _, label in timed:
            values = self.settings.get(label)
            if values is not None and holding(regions, {**params, **values}) is None:
                return values
        return None

    def neighbours(
        self,
        params: Mapping[str, ParamValue],
        means: Mapping[str, float] | None = None,
        regions: Sequence[Region] = (),
    ) -> list[dict[str, ParamValue]]:
        """The feasible one-step neighbours of `params` (module doc), nearest knobs of the space first;
        with `means` ({point key: mean log value} of the measured points), the steps that go on the way
        a knob's last step gained come right after the fastest NCCL setting (`continuations`), the fastest
        outside the failed `regions`."""
        kept = list(self.settings.values())
        nccl = set(kept[0]) if kept else set()
        active = any(sp.is_active(self.space.params[k], params) for k in nccl if k in self.space.params)
        out: list[dict[str, ParamValue]] = []
        fastest = self.fastest_nccl(params, regions) if active else None
        if fastest is not None:
            out.append({**params, **fastest})
        out.extend(continuations(self.space, params, means or {}, skip=nccl))
        out.extend(self._knob_moves(params, nccl))
        if active:  # NCCL carries something here (the knobs' `when`): the next-ranked kept settings
            out.extend(_rank_moves(params, kept))
        return self._distinct(out, params)

    def _distinct(
        self, points: Sequence[dict[str, ParamValue]], params: Mapping[str, ParamValue]
    ) -> list[dict[str, ParamValue]]:
        """`points` that are feasible, keep the probe's fixed knobs and are not `params`, each once."""
        out = [
            p for p in points if sp.infeasible_reason(p) is None and all(p.get(k) == v for k, v in self.fixed.items())
        ]
        keys = [sp.key(p) for p in out]  # a continuation is also a plain move: kept at its first place
        return [p for i, (p, k) in enumerate(zip(out, keys)) if k != sp.key(params) and k not in keys[:i]]

    def _knob_moves(self, params: Mapping[str, ParamValue], nccl: Collection[str]) -> list[dict[str, ParamValue]]:
        """Each active non-NCCL knob moved to the adjacent values of its list, the moves that change fewest of
        the knobs active at `params` first (speculation switched off, which unsets every speculation knob,
        after the steps within it; a knob a move makes active does not count)."""
        out: list[dict[str, ParamValue]] = []
        for name in sp.ordered(self.space):
            if name in nccl or params.get(name) is None and not sp.is_active(self.space.params[name], params):
                continue
            for value in _moves(self.space, name, params.get(name)):
                out.append(_settle_activity(self.space, {**params, name: value}))
        if not self.breadth:
            return out
        return sorted(
            out, key=lambda p: sum(p.get(k) != params.get(k) for k in self.space.params if self._active(k, params))
        )

    def _active(self, name: str, params: Mapping[str, ParamValue]) -> bool:
        return sp.is_active(self.space.params[name], params)


def _rank_moves(
    params: Mapping[str, ParamValue], kept: Sequence[Mapping[str, ParamValue]]
) -> list[dict[str, ParamValue]]:
    """`params` under the kept NCCL settings ranked next to its own (one after, one before), if it has one."""
    rank = next((i for i, v in enumerate(kept) if all(params.get(k) == x for k, x in v.items())), None)
    if rank is None:
        return []
    return [{**params, **kept[r]} for r in (rank + 1, rank - 1) if 0 <= r < len(kept)]


def ranked_points(measured: Sequence[tuple[float, Mapping[str, ParamValue]]]) -> list[dict[str, ParamValue]]:
    """The measured points, best first by their pooled score (stats.pooled_scores: each point's
    measurement pooled with those sharing its speculation or its NCCL settings, less one standard
    error), the order the sweep's pick (results.select.pick_champion) uses too; by their best value
    where some value is not positive (no logarithm)."""
    unique: dict[str, tuple[list[float], dict[str, ParamValue]]] = {}
    for value, params in measured:
        unique.setdefault(sp.key(params), ([], dict(params)))[0].append(value)
    points = [params for _, params in unique.values()]
    if not all(v > 0 for vs, _ in unique.values() for v in vs):
        return [p for _, p in sorted(((-max(vs), i), p) for i, (vs, p) in enumerate(unique.values()))]
    fit = pooled_scores([(*split_point(p), math.log(v)) for v, p in measured])
    score = {sp.key(params): f.score for (_, params), f in zip(measured, fit)}
    return sorted(points, key=lambda p: -score[sp.key(p)])


def continuations(
    space: SearchSpace,
    params: Mapping[str, ParamValue],
    means: Mapping[str, float],
    skip: Collection[str] = (),
    min_gain: float = 0.0,
) -> list[dict[str, ParamValue]]:
    """The pattern moves from `params`: for each measured point one step of one knob away (the knob's
    adjacent value, everything else equal) whose mean (`means`: {point key: mean log value}) is below
    `params`' own, that knob one step further the same way, the largest gain first. Decode speed is
    smooth in the speculation knobs: where 7 draft tokens beat 6, 8 (then 12, 16) is the likeliest
    better point, and the walk up a long list takes a trial a step instead of a whole neighbourhood. Steps
    that gained `min_gain` or less are left out."""
    here = means.get(sp.key(params))
    if here is None:
        return []
    found: list[tuple[float, dict[str, ParamValue]]] = []
    for name in sp.ordered(space):
        current = params.get(name)
        if name in skip or current is None:
            continue
        values = list(space.params[name].values())
        if current not in values:
            continue
        i = values.index(current)
        for j, k in ((i - 1, i + 1), (i + 1, i - 1)):  # from the value behind, one step on past `current`
            if not (0 <= j < len(values) and 0 <= k < len(values)):
                continue
            behind = means.get(sp.key(_settle_activity(space, {**params, name: values[j]})))
            if behind is not None and behind < here - min_gain:
                found.append((here - behind, _settle_activity(space, {**params, name: values[k]})))
    return [p for _, p in sorted(found, key=lambda f: -f[0])]


def _log_means(measured: Sequence[tuple[float, Mapping[str, ParamValue]]]) -> dict[str, float]:
    """{point key: mean log value} of the measured points with positive values."""
    logs: dict[str, list[float]] = {}
    for value, params in measured:
        if value > 0:
            logs.setdefault(sp.key(params), []).append(math.log(value))
    return {k: sum(v) / len(v) for k, v in logs.items()}


def _moves(space: SearchSpace, name: str, current: ParamValue) -> list[ParamValue]:
    """The adjacent values of knob `name` from `current`: next in its list first, then previous."""
    param = space.params[name]
    if param.choices is None:
        lo, hi = param.low, param.high
        steps = [current + d for d in (1, -1)] if isinstance(current, int) else []
        return [v for v in steps if lo is not None and hi is not None and lo <= v <= hi]
    values = list(param.values())
    i = values.index(current) if current in values else None
    return [values[j] for j in ((i + 1, i - 1) if i is not None else ()) if 0 <= j < len(values)]


def _settle_activity(space: Any, point: dict[str, ParamValue]) -> dict[str, ParamValue]:
    """Knobs whose `when` no longer holds unset; knobs that became active set to the middle of their list."""
    for name in sp.ordered(space):
        param = space.params[name]
        if not sp.is_active(param, point):
            point[name] = None
        elif point.get(name) is None and None not in param.values():
            values = param.values()
            point[name] = values[len(values) // 2]
    return sp.complete(space, point)
