"""The proposal policy: ask the study for a point and settle, without a launch, what needs none.

An infeasible point is told as a failure with its rule; a point in the core of a failed trial's region
(search/regions.py: the same speculation shape past an out-of-memory, the same NCCL setting past a hang,
the protocol past changed outputs) is told as a failure the sampler learns from, naming that trial; an exact repeat of a finished point is told
that point's result again (its values, or its failure), unless it was queued to be measured again
(REMEASURE_ATTR); a repeat of a point in flight is dropped.
The sweep's loop and bench/search_efficiency.py both use it, so the benchmark measures the search
the driver really runs.

Stage two's local refinement is the study's sampler's own (search/sampler.py, StageTwoSampler).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.records import ParamValue
from orchestrator.search import regions
from orchestrator.search import space as sp
from orchestrator.search.study import Study

REMEASURE_ATTR = "near_tie_of"
"""The attribute of a search trial queued to measure an earlier one's point again (sampler.remeasure_every):
the earlier trial's number. Such a trial is launched, not settled as a repeat."""


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
    in_failed_region = "in_failed_region"


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

    def __init__(self, study: Study):
        self.study = study
        self._known: dict[str, _Known] = {}

    def remember(
        self, params: Mapping[str, ParamValue], number: int, values: Sequence[float] | None, *, learn: bool = False
    ) -> None:
        """A finished measurement (values) or failure (None; `learn`: one the sampler learns from) of
        `params`; the first one counts."""
        self._known.setdefault(
            sp.key(params), _Known(number, tuple(values) if values is not None else None, learn and values is None)
        )

    def next(self, in_flight: Mapping[str, int] | None = None) -> Proposal | Settled | None:
        """Ask once: a Proposal to launch, a Settled proposal, or None when a grid has nothing left.

        `in_flight` maps the key (`space.key`) of each searched point being measured to its trial number.
        """
        asked = self.study.ask()
        if asked is None:
            return None
        number, params, attrs = asked
        role = str(attrs.get("role", "search"))
        why = sp.infeasible_reason(params)
        if why is not None:
            self.study.tell_failed(number, {"failure_kind": "infeasible", "reason": why, "skipped": True})
            return Settled(number, params, Settlement.infeasible, why)
        if role == "search" and REMEASURE_ATTR not in attrs:
            settled = self._settle_region(number, params) or self._settle_repeat(number, params, in_flight or {})
            if settled is not None:
                return settled
        return Proposal(number, params, role, attrs)

    def _settle_region(self, number: int, params: dict[str, ParamValue]) -> Settled | None:
        """A point a failed trial's region holds (search/regions.py), told as a failure the sampler learns."""
        region = regions.holding(regions.regions_of(self.study.trials()), params)
        if region is None:
            return None
        detail = regions.describe(region)
        self.study.tell_failed(
            number, {"failure_kind": Settlement.in_failed_region.value, "skipped": True, "reason": detail}, learn=True
        )
        return Settled(number, params, Settlement.in_failed_region, detail)

    def _settle_repeat(
        self, number: int, params: dict[str, ParamValue], in_flight: Mapping[str, int]
    ) -> Settled | None:
        key = sp.key(params)
        known = self._known.get(key)
        if known is not None and known.values is None:
            detail = f"same parameters as failed trial {known.number}"
            self.study.tell_failed(
                number, {"failure_kind": "duplicate_of_failed", "skipped": True, "reason": detail}, learn=known.learn
            )
            return Settled(number, params, Settlement.duplicate_of_failed, detail)
        if known is not None and known.values is not None:
            self.study.tell_complete(number, list(known.values), {"duplicate_of": known.number, "skipped": True})
            return Settled(number, params, Settlement.duplicate_of_complete, f"same parameters as trial {known.number}")
        running = in_flight.get(key)
        if running is not None:
            detail = f"same parameters as trial {running}, in flight"
            self.study.tell_failed(number, {"failure_kind": "duplicate_of_running", "skipped": True, "reason": detail})
            return Settled(number, params, Settlement.duplicate_of_running, detail)
        return None
