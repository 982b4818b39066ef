"""The search space: its models (a knob's choices or range, `when` conditions) and the pure walks
over it (the order of its knobs, which are active, every distinct point)."""

from __future__ import annotations

import graphlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Annotated

from pydantic import Field, StrictBool, StrictInt, model_validator

from orchestrator.errors import SpecError
from orchestrator.records import Frozen, ParamValue

Scalar = str | int | float | bool | None


class Strict(Frozen):
    """A frozen model that refuses unknown keys (every model of the experiment is one)."""


class ParamSpec(Strict):
    """One dimension: either `choices` or an integer range `low`..`high` (optionally `step`, `log`)."""

    choices: tuple[Scalar, ...] | None = Field(None, max_length=10_000)
    low: StrictInt | None = None
    high: StrictInt | None = None
    step: Annotated[int, Field(strict=True, le=1 << 30)] = 1
    log: StrictBool = False
    when: dict[str, Scalar | Annotated[list[Scalar], Field(max_length=1000)]] = Field(default_factory=dict)
    """Active only when these knobs have these values, e.g. {speculative_algorithm: EAGLE3}."""

    @model_validator(mode="after")
    def _one_form(self) -> ParamSpec:
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either `choices` or `low`/`high`, not both; keep one form")
            if not self.choices:
                raise ValueError("`choices` must not be empty")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError(f"`choices` has duplicates: {list(self.choices)}; list each value once")
        else:
            if self.low is None or self.high is None:
                raise ValueError("give `choices: [...]` or both `low` and `high`")
            if self.low > self.high:
                raise ValueError(f"`low <= high` must hold, but got (low={self.low}, high={self.high}); swap them")
            if self.step < 1:
                raise ValueError(f"`step` must be >= 1, but got {self.step}")
            if self.log and (self.low < 1 or self.step != 1):
                raise ValueError(f"`log: true` needs low >= 1 and step 1, but got (low={self.low}, step={self.step})")
        return self

    def values(self) -> Sequence[Scalar]:
        """Every value this dimension can take (a range stays a lazy `range`: it may hold a million)."""
        if self.choices is not None:
            return self.choices
        assert self.low is not None and self.high is not None  # guaranteed by _one_form
        return range(self.low, self.high + 1, self.step)


class SearchSpace(Strict):
    name: str = "space"
    description: str = ""
    params: dict[str, ParamSpec]


def when_order(space: SearchSpace) -> list[str]:
    """Parameter names with every `when` dependency before its dependents, otherwise in space order
    (the sampler draws in this order, so it is kept stable); graphlib.CycleError on a cycle.

    Names go in rounds: a name joins the first round in which all its dependencies come before it
    (an earlier round, or earlier in the space in the same round).
    """
    index = {name: i for i, name in enumerate(space.params)}
    deps = {name: [d for d in param.when if d in index] for name, param in space.params.items()}
    rounds: dict[str, int] = {}
    for name in graphlib.TopologicalSorter(deps).static_order():
        rounds[name] = max((rounds[d] + (index[d] > index[name]) for d in deps[name]), default=0)
    return sorted(space.params, key=lambda n: (rounds[n], index[n]))


def is_active(param: ParamSpec, chosen: Mapping[str, ParamValue]) -> bool:
    """A conditional parameter exists only when every `when` knob has one of the given values."""
    for knob, wanted in param.when.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        if chosen.get(knob) not in options:
            return False
    return True


def complete(space: SearchSpace, chosen: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """Every knob of the space, inactive ones as None (not set), in space order."""
    return {name: chosen.get(name) for name in space.params}


def points(space: SearchSpace) -> Iterator[dict[str, ParamValue]]:
    """Every distinct point of the space (inactive knobs None), feasible or not."""
    names = when_order(space)
    seen: set[tuple[tuple[str, str], ...]] = set()

    def expand(i: int, chosen: dict[str, ParamValue]) -> Iterator[dict[str, ParamValue]]:
        if i == len(names):
            key = tuple(sorted((k, repr(v)) for k, v in chosen.items()))
            if key not in seen:
                seen.add(key)
                yield complete(space, chosen)
            return
        name = names[i]
        param = space.params[name]
        if not is_active(param, chosen):
            yield from expand(i + 1, {**chosen, name: None})
            return
        for v in param.values():
            yield from expand(i + 1, {**chosen, name: v})

    yield from expand(0, {})


MAX_ENUMERATED = 2_000_000
"""Most points `points` walks (a grid sampler's order, the simulator's truth): beyond this, refuse."""
MAX_CLASSES = 1_000_000
"""Most classes of points `weighted_points` walks before it refuses the space as too entangled."""


def _classes(space: SearchSpace, name: str, keep: Collection[str]) -> list[tuple[Scalar, int]]:
    """The values of one knob as (representative, how many values it stands for): values no `when`
    condition tells apart are one class, except for the knobs in `keep`, whose every value counts."""
    values = space.params[name].values()
    if name in keep:
        return [(v, 1) for v in values]
    wanted = _conditions_on(space, name)
    if not wanted:
        return [(values[0], len(values))]
    classes: dict[tuple[bool, ...], list] = {}
    for v in _named_values(values, wanted):
        sig = tuple(v in w for w in wanted)
        if any(sig):
            classes.setdefault(sig, [v, 0])[1] += 1
    others = len(values) - sum(n for _, n in classes.values())
    if others:
        rep = next(v for v in values if not any(v in w for w in wanted))
        classes[(False,) * len(wanted)] = [rep, others]
    return [(v, n) for v, n in classes.values()]


def _conditions_on(space: SearchSpace, name: str) -> list[set[Scalar]]:
    """The value sets the `when` conditions of other knobs ask of `name`: membership as `is_active` tests it
    (1 == 1.0 == True hash alike), without a scan per value."""
    return [
        set(w) if isinstance(w, list) else {w} for p in space.params.values() for d, w in p.when.items() if d == name
    ]


def _named_values(values: Sequence[Scalar], wanted: list[set[Scalar]]) -> Sequence[Scalar]:
    """The values worth a look: of a range only those a condition names, each once (the rest is one class)."""
    if not isinstance(values, range):
        return values
    return sorted({int(v) for w in wanted for v in w if isinstance(v, (int, float)) and v in values})


def weighted_points(space: SearchSpace, keep: Collection[str] = ()) -> Iterator[tuple[dict[str, ParamValue], int]]:
    """The distinct points of the space in classes: (a representative point, how many points it stands
    for). Values of a knob that no `when` condition tells apart form one class, so the walk is as long
    as the conditions are many, not as the ranges are wide; the knobs in `keep` (those a rule reads)
    are walked value by value. The weights sum to the number of distinct points."""
    names = when_order(space)
    classes = {name: _classes(space, name, keep) for name in names}
    walked = 0

    def expand(i: int, chosen: dict[str, ParamValue], weight: int) -> Iterator[tuple[dict[str, ParamValue], int]]:
        nonlocal walked
        if i == len(names):
            walked += 1
            if walked > MAX_CLASSES:
                raise SpecError(
                    f"space {space.name}: its `when` conditions split it into more than "
                    f"{MAX_CLASSES:,} cases, too many to count; condition fewer knobs on "
                    f"fewer distinct values"
                )
            yield complete(space, chosen), weight
            return
        name = names[i]
        if not is_active(space.params[name], chosen):
            yield from expand(i + 1, {**chosen, name: None}, weight)
            return
        for v, n in classes[name]:
            yield from expand(i + 1, {**chosen, name: v}, weight * n)

    yield from expand(0, {}, 1)


def size(space: SearchSpace) -> int:
    """The number of distinct points of the space, counted without enumerating them."""
    return sum(n for _, n in weighted_points(space))


def check_enumerable(space: SearchSpace, what: str) -> None:
    """SpecError when walking every point (`what`: a grid, the simulator's truth) would exceed MAX_ENUMERATED."""
    n = size(space)
    if n > MAX_ENUMERATED:
        raise SpecError(
            f"{what} walks every point of the space, but it has {n:.3g} points, more than "
            f"{MAX_ENUMERATED:,}; narrow the ranges (larger `step`, fewer choices) or use a sampler"
        )


def stratified(
    draws: Iterable[dict[str, ParamValue]], by: str, values: Sequence[Scalar], limit: int
) -> list[dict[str, ParamValue]]:
    """Up to `limit` distinct points of `draws`, the first point of each of `by`'s `values` first (so `sweep
    plan` shows one launch per speculative algorithm), then the other draws in order. Stops reading `draws`
    once `limit` points are kept and every value has one."""
    firsts: dict[Scalar, dict[str, ParamValue]] = {}
    rest: list[dict[str, ParamValue]] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for p in draws:
        key = tuple(sorted((k, repr(v)) for k, v in p.items()))
        if key in seen:
            continue
        seen.add(key)
        if p.get(by) in values and p.get(by) not in firsts:
            firsts[p.get(by)] = p
        elif len(rest) < limit:
            rest.append(p)
        if len(firsts) == len(values) and len(firsts) + len(rest) >= limit:
            break
    chosen = [firsts[v] for v in values if v in firsts]
    return (chosen + rest)[:limit]
