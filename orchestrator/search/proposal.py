"""The proposal policy: ask the study for a point and settle, without a launch, what needs none.

An infeasible point is told as a failure with its rule; an exact repeat of a finished point is told
that point's result again (its values, or its failure); a repeat of a point in flight is dropped.
The sweep's loop and bench/search_efficiency.py both use it, so the benchmark measures the search
the driver really runs.

Stage two of a two-stage sweep (the study searches the probe's kept NCCL settings, TPE sampler)
alternates the sampler with a local refinement: two of every three proposals are the next untried
feasible neighbour of the best measured points (PARENTS of them take turns, ranked by their pooled
score, so one lucky measurement does not decide where the refinement looks). A point's neighbours,
in order: the same point under the kept NCCL setting the probe measured fastest at this point's own
verify size (draft tokens x hidden size: the NCCL setting that wins depends on it), then each
speculation knob moved to the adjacent value of its list (a knob that becomes active starts
mid-list), then the NCCL setting moved to the next-ranked kept one. Decode speed is smooth in the
speculation knobs, so the incumbents' neighbourhoods are where the last percents are; TPE keeps
exploring in between.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config import eagle
from orchestrator.records import ParamValue, split_point
from orchestrator.search import space as sp
from orchestrator.search.study import Study
from orchestrator.stats import pooled_scores

PARENTS = 2
"""The best measured points whose neighbourhoods the refinement explores in turn."""
TPE_EVERY = 3
"""Every third proposal of stage two is the sampler's; the other two are the refinement's."""


@dataclass(frozen=True)
class Proposal:
    """A point to measure."""

    number: int
    params: dict[str, ParamValue]
    role: str
    """search | baseline (enqueued) | ..., from the attributes it was enqueued with."""
    attrs: dict[str, Any]


class Settlement(str, enum.Enum):
    infeasible = "infeasible"
    duplicate_of_complete = "duplicate_of_complete"
    duplicate_of_failed = "duplicate_of_failed"
    duplicate_of_running = "duplicate_of_running"


@dataclass(frozen=True)
class Settled:
    """A proposal already told to the study: no launch needed."""

    number: int
    params: dict[str, ParamValue]
    how: Settlement
    detail: str


@dataclass(frozen=True)
class _Known:
    number: int
    values: tuple[float, ...] | None
    """The objective values told for it; None when it failed."""
    learn: bool = False
    """A failure the sampler learns from (Study.tell_failed(learn=True)); its repeats are told the same way."""


class ProposalPolicy:
    """Asks `study` and settles infeasible points and exact repeats; remembers what was measured."""

    def __init__(self, study: Study, *, refine: bool | None = None):
        """`refine`: alternate TPE with the local refinement; None: in stage two of a two-stage sweep."""
        self.study = study
        self._known: dict[str, _Known] = {}
        self._refine = refine
        self._latency: dict[str, dict[str, float]] = {}
        self._measured: list[tuple[float, dict[str, ParamValue]]] = []
        self._queues: dict[str, list[dict[str, ParamValue]]] = {}
        self._rr = 0
        self._turn = 0

    @property
    def refining(self) -> bool:
        if self._refine is not None:
            return self._refine
        return bool(self.study.nccl_settings) and self.study.sampler_cfg.kind == "tpe"

    def remember(self, params: Mapping[str, ParamValue], number: int, values: Sequence[float] | None, *,
                 learn: bool = False) -> None:
        """A finished measurement (values) or failure (None; `learn`: one the sampler learns from) of
        `params`; the first one counts."""
        self._known.setdefault(sp.key(params), _Known(number, tuple(values) if values is not None else None,
                                                      learn and values is None))
        if values is not None and values and self.refining:
            sign = 1.0 if self.study.directions[0] == "maximize" else -1.0
            self._measured.append((sign * values[0], dict(params)))

    def next(self, in_flight: Mapping[str, int] | None = None) -> Proposal | Settled | None:
        """Ask once: a Proposal to launch, a Settled proposal, or None when a grid has nothing left.

        `in_flight` maps the key (`space.key`) of each searched point being measured to its trial number.
        """
        self._turn += 1
        if self.refining and self._turn % TPE_EVERY != 0:
            point = self._next_neighbour(set(in_flight or {}))
            if point is not None:
                self.study.enqueue(point, {"role": "search", "refine": True})
        asked = self.study.ask()
        if asked is None:
            return None
        number, params, attrs = asked
        role = str(attrs.get("role", "search"))
        why = sp.infeasible_reason(params)
        if why is not None:
            self.study.tell_failed(number, {"failure_kind": "infeasible", "reason": why, "skipped": True})
            return Settled(number, params, Settlement.infeasible, why)
        if role == "search":
            settled = self._settle_repeat(number, params, in_flight or {})
            if settled is not None:
                return settled
        return Proposal(number, params, role, attrs)

    def _settle_repeat(self, number: int, params: dict[str, ParamValue],
                       in_flight: Mapping[str, int]) -> Settled | None:
        key = sp.key(params)
        known = self._known.get(key)
        if known is not None and known.values is None:
            detail = f"same parameters as failed trial {known.number}"
            self.study.tell_failed(number, {"failure_kind": "duplicate_of_failed", "skipped": True, "reason": detail},
                                   learn=known.learn)
            return Settled(number, params, Settlement.duplicate_of_failed, detail)
        if known is not None and known.values is not None:
            self.study.tell_complete(number, list(known.values), {"duplicate_of": known.number, "skipped": True})
            return Settled(number, params, Settlement.duplicate_of_complete,
                           f"same parameters as trial {known.number}")
        running = in_flight.get(key)
        if running is not None:
            detail = f"same parameters as trial {running}, in flight"
            self.study.tell_failed(number, {"failure_kind": "duplicate_of_running", "skipped": True, "reason": detail})
            return Settled(number, params, Settlement.duplicate_of_running, detail)
        return None

    def _next_neighbour(self, running: set[str]) -> dict[str, ParamValue] | None:
        """The next untried neighbour of the best measured points: the top PARENTS take turns (a single
        noisy best would otherwise decide where the whole refinement looks); when their neighbours are
        used up, the next best measured point's (best-first)."""
        ranked = self._ranked()
        top = ranked[:PARENTS]
        order = [top[(self._rr + i) % len(top)] for i in range(len(top))] + ranked[PARENTS:]
        for params in order:
            queue = self._queues.setdefault(sp.key(params), self.neighbours(params))
            while queue:
                point = queue.pop(0)
                if sp.key(point) not in self._known and sp.key(point) not in running:
                    self._rr += 1
                    return point
        return None

    def _ranked(self) -> list[dict[str, ParamValue]]:
        """The measured points, best first by their pooled score (stats.pooled_scores: each point's
        measurement pooled with those sharing its speculation or its NCCL settings, less one standard
        error), the order the sweep's pick (results.select.pick_champion) uses too."""
        unique: dict[str, tuple[list[float], dict[str, ParamValue]]] = {}
        for value, params in self._measured:
            unique.setdefault(sp.key(params), ([], params))[0].append(value)
        points = [params for _, params in unique.values()]
        if not all(v > 0 for vs, _ in unique.values() for v in vs):  # minimizing: signed values, no log
            return [p for _, p in sorted(((-max(vs), i), p) for i, (vs, p) in enumerate(unique.values()))]
        fit = pooled_scores([(*split_point(p), math.log(v)) for v, p in self._measured])
        score = {sp.key(params): f.score for (_, params), f in zip(self._measured, fit)}
        return sorted(points, key=lambda p: -score[sp.key(p)])

    def fastest_nccl(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue] | None:
        """The kept NCCL setting the probe measured fastest at `params`' own all-reduce size (its
        verify pass: draft tokens per request; a decode step without speculation), or None."""
        if not self._latency:  # kept in the study by the probe stage, which may run after this policy exists
            self._latency = self.study.get_attr("probe_latency") or {}
        latency = self._latency
        eff = eagle.effective(dict(params))
        draft = eff.get("speculative_num_draft_tokens") if eff.get("speculative_algorithm") else None
        size = f"verify-{draft}" if draft else "decode"
        timed = [(by_size[size], label) for label, by_size in latency.items() if size in by_size]
        settings = self.study.nccl_settings
        if not timed:
            return None
        _, label = min(timed)
        return settings.get(label)

    def neighbours(self, params: Mapping[str, ParamValue]) -> list[dict[str, ParamValue]]:
        """The feasible one-step neighbours of `params` (module doc), nearest knobs of the space first."""
        space = self.study.space
        kept = list(self.study.nccl_settings.values())
        rank = next((i for i, v in enumerate(kept) if all(params.get(k) == x for k, x in v.items())), None)
        out: list[dict[str, ParamValue]] = []
        fastest = self.fastest_nccl(params)
        if fastest is not None:
            out.append({**params, **fastest})
        nccl = set(kept[0]) if kept else set()
        for name in sp.ordered(space):
            if name in nccl or params.get(name) is None and not sp.is_active(space.params[name], params):
                continue
            values = list(space.params[name].values()) if space.params[name].choices is not None else None
            if values is None:
                lo, hi = space.params[name].low, space.params[name].high
                current = params.get(name)
                steps = [current + d for d in (1, -1)] if isinstance(current, int) else []
                moves: list[ParamValue] = [v for v in steps if lo is not None and hi is not None and lo <= v <= hi]
            else:
                i = values.index(params.get(name)) if params.get(name) in values else None
                moves = [values[j] for j in ((i + 1, i - 1) if i is not None else ()) if 0 <= j < len(values)]
            for value in moves:
                out.append(_settle_activity(space, {**params, name: value}))
        if rank is not None:
            for r in (rank + 1, rank - 1):
                if 0 <= r < len(kept):
                    out.append({**params, **kept[r]})
        return [p for p in out if sp.infeasible_reason(p) is None and sp.key(p) != sp.key(params)]


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
