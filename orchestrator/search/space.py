"""The search space as Optuna distributions: random points, size and the census of infeasible points.

The space's models and its enumeration (`points`, `complete`, `is_active`, `ordered`) are config.space's
and SGLang's EAGLE rules config.eagle's; they are re-exported here for the search's callers.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from optuna.distributions import CategoricalDistribution, IntDistribution

from orchestrator.config import eagle
from orchestrator.config.allreduce import CommContext
from orchestrator.config.space import (
    ParamSpec,
    Scalar,
    SearchSpace,
    complete,
    is_active,
    points,
    weighted_points,
    when_order,
)
from orchestrator.records import ParamValue

__all__ = [
    "Collapse",
    "baseline_params",
    "census",
    "collapse_all",
    "collapse_inert",
    "complete",
    "distribution",
    "infeasible_reason",
    "is_active",
    "key",
    "ordered",
    "points",
    "random_point",
]


def distribution(param: ParamSpec) -> CategoricalDistribution | IntDistribution:
    """The Optuna distribution of one dimension: categorical for `choices`, integer for a range."""
    if param.choices is not None:
        return CategoricalDistribution(param.choices)
    assert param.low is not None and param.high is not None
    return IntDistribution(param.low, param.high, step=param.step, log=param.log)


ordered = when_order
"""Parameter names with every `when` dependency before its dependents (stable otherwise)."""


def baseline_params(space: SearchSpace) -> dict[str, ParamValue]:
    """No speculation, no NCCL variables, engine defaults everywhere: every knob None."""
    return {name: None for name in space.params}


def infeasible_reason(params: Mapping[str, ParamValue]) -> str | None:
    """The rule a point breaks, in words, or None when SGLang would run it as asked (config.eagle.infeasible's
    sentence, for callers that only show it)."""
    why = eagle.infeasible(params)
    return why.detail if why is not None else None


def random_point(space: SearchSpace, rng: random.Random) -> dict[str, ParamValue]:
    """One point drawn uniformly per dimension (inactive knobs None); may be infeasible."""
    chosen: dict[str, ParamValue] = {}
    for name in ordered(space):
        param = space.params[name]
        chosen[name] = rng.choice(param.values()) if is_active(param, chosen) else None
    return complete(space, chosen)


def _components(space: SearchSpace) -> list[list[str]]:
    """Groups of knobs linked by `when` conditions or by the EAGLE feasibility rules."""
    parent = {n: n for n in space.params}

    def find(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for name, param in space.params.items():
        for dep in param.when:
            if dep in parent:
                union(name, dep)
    rule_knobs = [k for k in eagle.RULE_KNOBS if k in parent]
    for a, b in zip(rule_knobs, rule_knobs[1:]):
        union(a, b)
    groups: dict[str, list[str]] = {}
    for name in space.params:
        groups.setdefault(find(name), []).append(name)
    return list(groups.values())


def census(space: SearchSpace, comm: CommContext | None = None) -> tuple[int, int, Counter[str]]:
    """(distinct points, feasible points, infeasible count per rule).

    Feasibility only involves the EAGLE knobs, so the space is split into independent groups and
    only the group holding those knobs is walked value by value (with `comm`, the host known, an
    all_reduce_backend it cannot take counts as infeasible too); the other groups multiply the counts,
    and values no condition tells apart are counted as one class (config.space.weighted_points).
    """
    total, feasible = 1, 1
    reasons: Counter[str] = Counter()
    for names in _components(space):
        sub = SearchSpace(params={n: space.params[n] for n in names})
        n_total = n_feasible = 0
        sub_reasons: Counter[str] = Counter()
        for p, n in weighted_points(sub, keep=eagle.RULE_KNOBS):
            n_total += n
            why = eagle.infeasible(p, comm)
            if why is None:
                n_feasible += n
            else:
                sub_reasons[why.rule.value] += n
        total *= n_total
        feasible *= n_feasible
        reasons = Counter({rule: count * n_total for rule, count in reasons.items()})
        reasons.update({rule: count * (total // n_total) for rule, count in sub_reasons.items()})
    return total, feasible, reasons


def key(params: Mapping[str, ParamValue]) -> str:
    """A stable identity for a point, to find repeats of failed or measured configurations."""
    return ";".join(f"{k}={params[k]!r}" for k in sorted(params))


def collapse_inert(space: SearchSpace, names: Collection[str], when: Mapping[str, Sequence[Scalar]]) -> SearchSpace:
    """The space with knobs `names` dropped (`when` empty: they change nothing anywhere) or active only under
    `when` (e.g. the NCCL knobs only at all_reduce_backend nccl, where NCCL carries the messages the
    objective depends on), so the search spends no trials on dimensions that touch nothing."""
    params: dict[str, ParamSpec] = {}
    for name, param in space.params.items():
        if name not in names:
            params[name] = param
        elif when:
            params[name] = param.model_copy(update={"when": {**param.when, **{k: list(v) for k, v in when.items()}}})
    return space.model_copy(update={"params": params})


class Collapse(Protocol):
    """A dimension the communication path makes inert (probe/comm.Inert): its knobs, and the values of other
    knobs under which they still matter (empty: nowhere)."""

    @property
    def knobs(self) -> Collection[str]: ...

    @property
    def when(self) -> Mapping[str, Sequence[Scalar]]: ...


def collapse_all(space: SearchSpace, inert: Iterable[Collapse]) -> SearchSpace:
    """`space` with each inert dimension collapsed (collapse_inert): what the sweep searches."""
    for i in inert:
        space = collapse_inert(space, i.knobs, i.when)
    return space
