"""The search space: its models (a knob's choices or range, `when` conditions) and the pure walks
over it (the order of its knobs, which are active, every distinct point)."""

from __future__ import annotations

import graphlib
from collections.abc import Iterator, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.records import ParamValue

Scalar = str | int | float | bool | None


class Strict(BaseModel):
    """A frozen model that refuses unknown keys (every model of the experiment is one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ParamSpec(Strict):
    """One dimension: either `choices` or an integer range `low`..`high` (optionally `step`, `log`)."""

    choices: tuple[Scalar, ...] | None = None
    low: int | None = None
    high: int | None = None
    step: int = 1
    log: bool = False
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
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

    def values(self) -> tuple[Scalar, ...]:
        """Every value this dimension can take (ranges expanded)."""
        if self.choices is not None:
            return self.choices
        assert self.low is not None and self.high is not None  # guaranteed by _one_form
        return tuple(range(self.low, self.high + 1, self.step))


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
